"""FFN-as-memory sweep (ReLUFormer section 3, METHODS.md section 2): train the ``relu``,
``softmax`` and ``softmax_ln`` FFN variants at slot counts from 32 to 4096 on a real corpus with
one fixed small budget, then score BLEU on held-out talks and the memory diagnostics
(top-score ratio, anisotropy) of every run; write a table (markdown + JSON) and a plot.

    python -m reluformer_mt.cli.sweep --out runs/ffn_sweep --slots 32,256,1024,4096 --max-update 300

Without ``--data-bin`` the corpus is built from ``../shared/data/docmt_ende/IWSLT2017``
(TED talks, en->de): the dev talks train, their last ``--valid-size`` pairs validate, the test
talks are scored; lowercased, word level, one joined dictionary of ``--nwords`` words. Finished
runs (``runs/<variant>_<slots>.json``) are reused, so an interrupted sweep resumes.
"""
import argparse
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from reluformer_mt.cli.inprocess import run_fairseq
from reluformer_mt.data.documents import is_doc_marker
from reluformer_mt.memory.ffn import FFN_VARIANTS, MemoryOptionError

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CORPUS = Path(os.environ.get("RELUFORMER_SHARED_DATA", REPO.parent / "shared" / "data")) / "docmt_ende" / "IWSLT2017"
USER_DIR = str(Path(__file__).resolve().parents[1])


# ---------------------------------------------------------------------------------------------- data

def read_pairs(corpus: Path, split: str, max_words: int) -> List[tuple]:
    """Sentence pairs of a docmt_ende ``concatenated_en2de_{split}_{en,de}.txt`` (document markers dropped)."""
    def lines(lang):
        path = corpus / f"concatenated_en2de_{split}_{lang}.txt"
        if not path.is_file():
            raise FileNotFoundError(f"--corpus: {path} not found")
        return [" ".join(l.split()).lower() for l in path.read_text(encoding="utf-8").splitlines()]
    en, de = lines("en"), lines("de")
    if len(en) != len(de):
        raise ValueError(f"--corpus: {split} has {len(en)} English but {len(de)} German lines")
    return [(e, d) for e, d in zip(en, de)
            if e and d and not is_doc_marker(e) and len(e.split()) <= max_words and len(d.split()) <= max_words]


def prepare_corpus(out: Path, corpus: Path, valid_size: int, test_size: int, nwords: int, max_words: int) -> Path:
    """Raw and binarised train/valid/test under ``out``; returns the binarised directory."""
    bin_dir = out / "data-bin"
    if (bin_dir / "test.en-de.de.bin").is_file():
        return bin_dir
    train = read_pairs(corpus, "dev", max_words)
    test = read_pairs(corpus, "test", max_words)[:test_size]
    splits = {"train": train[:-valid_size], "valid": train[-valid_size:], "test": test}
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        for i, lang in enumerate(("en", "de")):
            (raw / f"{split}.{lang}").write_text("\n".join(r[i] for r in rows) + "\n", encoding="utf-8")
    run_fairseq("preprocess", ["--source-lang", "en", "--target-lang", "de", "--trainpref", raw / "train",
                               "--validpref", raw / "valid", "--testpref", raw / "test", "--destdir", bin_dir,
                               "--joined-dictionary", "--nwordssrc", nwords, "--workers", "1"])
    return bin_dir


# ---------------------------------------------------------------------------------------------- runs

class _Capture(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def train_args(data: Path, save: Path, variant: str, slots: int, args) -> list:
    return [data, "--user-dir", USER_DIR, "--arch", args.arch, "--ffn-variant", variant, "--ffn-slots", slots,
            "--task", "translation", "--source-lang", "en", "--target-lang", "de",
            "--criterion", "reluformer_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0.1",
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", args.lr, "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", args.warmup, "--clip-norm", "1.0", "--max-tokens", args.max_tokens,
            "--max-update", args.max_update, "--num-workers", "0", "--seed", args.seed, "--save-dir", save,
            "--no-epoch-checkpoints", "--validate-interval-updates", args.max_update,
            "--log-format", "json", "--log-interval", max(1, args.max_update // 5), "--no-progress-bar",
            *args.extra]


def corpus_bleu_from_generate(out: str, ref_path: Path) -> float:
    import sacrebleu

    hyps = {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t[^\t]*\t(.*)$", out, re.M)}
    refs = ref_path.read_text(encoding="utf-8").splitlines()
    if len(hyps) != len(refs):
        raise RuntimeError(f"fairseq-generate gave {len(hyps)} hypotheses for {len(refs)} references of {ref_path}")
    return sacrebleu.corpus_bleu([hyps[i] for i in range(len(refs))], [refs]).score


def one_run(data: Path, out: Path, variant: str, slots: int, args) -> dict:
    """Train one (variant, slots) model, then BLEU on test and diagnostics on valid."""
    from reluformer_mt.evaluation.memory_stats import memory_stats_report

    from fairseq import checkpoint_utils

    save = out / "checkpoints" / f"{variant}_{slots}"
    # fairseq keeps the best validation loss in a function attribute: one run must not see another's
    if hasattr(checkpoint_utils.save_checkpoint, "best"):
        del checkpoint_utils.save_checkpoint.best
    capture = _Capture()
    logging.getLogger().addHandler(capture)
    start = time.perf_counter()
    try:
        run_fairseq("train", train_args(data, save, variant, slots, args))
    finally:
        logging.getLogger().removeHandler(capture)
    train_s = time.perf_counter() - start
    log = "\n".join(capture.lines)
    train_loss = [float(x) for x in re.findall(r'"train_loss": "([0-9.]+)"', log)]
    valid_loss = [float(x) for x in re.findall(r'"valid_loss": "([0-9.]+)"', log)]
    ckpt = save / "checkpoint_last.pt"  # the model at the fixed budget
    gen = run_fairseq("generate", [data, "--user-dir", USER_DIR, "--path", ckpt, "--source-lang", "en",
                                   "--target-lang", "de", "--gen-subset", "test", "--beam", args.beam,
                                   "--max-len-a", "1.2", "--max-len-b", "10", "--max-tokens", 4000,
                                   "--num-workers", "0"], capture=True)
    # references: the raw test side written by prepare_corpus (beside --data-bin when given)
    refs = [r for r in (out / "raw" / "test.de", data.parent / "raw" / "test.de") if r.is_file()]
    bleu = corpus_bleu_from_generate(gen, refs[0]) if refs else float("nan")
    stats = memory_stats_report(ckpt, data, "valid", args.top_percent, max_batches=args.stats_batches, quiet=True)
    n_params = None
    try:
        import torch

        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        n_params = sum(v.numel() for v in state["model"].values())
    except Exception:  # the count is a nicety; never fail a run on it
        pass
    if not args.keep_checkpoints:
        for f in save.glob("*.pt"):
            f.unlink()
    return {"variant": variant, "slots": slots, "bleu": bleu, "train_loss": train_loss[-1] if train_loss else None,
            "valid_loss": valid_loss[-1] if valid_loss else None, "train_seconds": train_s, "parameters": n_params,
            "top_score_ratio": stats["mean"]["top_score_ratio"], "anisotropy": stats["mean"]["anisotropy"],
            "zero_fraction": stats["mean"]["zero_fraction"], "layers": stats["layers"]}


# ---------------------------------------------------------------------------------------------- report

def write_report(out: Path, results: List[dict], args) -> None:
    from reluformer_mt.evaluation.reports import write_json

    p0 = str(args.top_percent[0])
    headers = ["variant", "slots", "BLEU", "valid loss", f"top {p0}% ratio", "anisotropy", "zeros", "train s"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    fmt = lambda v, d=3: "n/a" if v is None or v != v else f"{v:.{d}f}"  # noqa: E731
    for r in results:
        lines.append(f"| {r['variant']} | {r['slots']} | {fmt(r['bleu'], 2)} | {fmt(r['valid_loss'])} | "
                     f"{fmt(r['top_score_ratio'][p0])} | {fmt(r['anisotropy'])} | {fmt(r['zero_fraction'])} | "
                     f"{fmt(r['train_seconds'], 0)} |")
    settings = (f"arch {args.arch}, {args.max_update} updates of <= {args.max_tokens} tokens, lr {args.lr}, "
                f"beam {args.beam}; data {args.data_bin or args.corpus}")
    table = "\n".join(lines)
    (out / "results.md").write_text(f"# FFN-as-memory sweep\n\n{settings}\n\n{table}\n", encoding="utf-8")
    write_json(out / "results.json", {"settings": settings, "results": results})
    print(table)
    plot(out / "sweep.png", results, p0)


def plot(path: Path, results: List[dict], p0: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib.pyplot as plt

    panels = [("bleu", "BLEU"), ("valid_loss", "valid loss"), ("top_score_ratio", f"top {p0}% score ratio"),
              ("anisotropy", "anisotropy (mean pairwise cosine)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    for ax, (key, label) in zip(axes, panels):
        for variant in FFN_VARIANTS:
            rows = sorted((r for r in results if r["variant"] == variant), key=lambda r: r["slots"])
            if not rows:
                continue
            ys = [r[key][p0] if key == "top_score_ratio" else r[key] for r in rows]
            ax.plot([r["slots"] for r in rows], [float("nan") if y is None else y for y in ys], marker="o", label=variant)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("memory slots (FFN width)")
        ax.set_title(label)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reluformer-sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory (data, runs, results.md/json, sweep.png)")
    p.add_argument("--variants", default=",".join(FFN_VARIANTS))
    p.add_argument("--slots", default="32,64,128,256,512,1024,2048,3072,4096")
    p.add_argument("--data-bin", help="a binarised en-de directory (default: built from --corpus)")
    p.add_argument("--corpus", default=str(DEFAULT_CORPUS), help="docmt_ende corpus directory")
    p.add_argument("--valid-size", type=int, default=300)
    p.add_argument("--test-size", type=int, default=500)
    p.add_argument("--nwords", type=int, default=8000)
    p.add_argument("--max-words", type=int, default=40, help="drop pairs with longer sentences")
    p.add_argument("--arch", default="softmax_tiny", help="reluformer architecture (FFN width is set by --slots)")
    p.add_argument("--max-update", type=int, default=2000, help="the fixed budget of every run")
    p.add_argument("--max-tokens", type=int, default=2000)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--top-percent", default="1", help="comma list of p for the top-p%% ratio (the first is tabled)")
    p.add_argument("--stats-batches", type=int, default=10)
    p.add_argument("--keep-checkpoints", action="store_true")
    p.add_argument("extra", nargs="*", help="after --: more fairseq-train options for every run")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in FFN_VARIANTS:
            raise MemoryOptionError(f"--variants: got {v!r}, expected a comma list of {', '.join(FFN_VARIANTS)}")
    try:
        slots = [int(s) for s in args.slots.split(",") if s.strip()]
        args.top_percent = [float(x) for x in args.top_percent.split(",") if x.strip()]
    except ValueError:
        raise ValueError("--slots / --top-percent: expected comma lists of numbers") from None
    if args.warmup >= args.max_update:
        args.warmup = max(1, args.max_update // 4)
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    import reluformer_mt  # noqa: F401
    data = Path(args.data_bin) if args.data_bin else prepare_corpus(out, Path(args.corpus), args.valid_size,
                                                                    args.test_size, args.nwords, args.max_words)
    results = []
    for variant in variants:
        for s in slots:
            path = out / "runs" / f"{variant}_{s}.json"
            if path.is_file():
                results.append(json.loads(path.read_text()))
                continue
            print(f"== {variant}, {s} slots", flush=True)
            result = one_run(data, out, variant, s, args)
            path.write_text(json.dumps(result, indent=1, allow_nan=True) + "\n")
            results.append(result)
            print(f"   BLEU {result['bleu']:.2f}, valid loss {result['valid_loss']}, {result['train_seconds']:.0f} s", flush=True)
    write_report(out, results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
