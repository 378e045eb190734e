"""``reluformer-demo`` (``make demo``): the toolkit's whole story on a real document-level corpus.

The corpus is the ``bible-alignments`` package from PyPI: the Greek New Testament (SBLGNT) with
the English Berean Standard Bible, chapters as documents, and a manual word alignment of every
verse. The demo

1. prepares document-level segments (``--segment-tokens``, default 128) and the sentence-level
   twin with one SentencePiece model, train/valid/test split by held-out chapters;
2. trains small models of several families (default ReLUFormer, ReLA and the softmax baseline)
   with the same budget (``--max-update``, or ``--budget-minutes`` of wall clock);
3. evaluates each: s-BLEU and d-BLEU of the held-out chapters translated with the document
   translator, AER of cross-attention against the manual gold alignments (every layer, best
   head and head average, normal and shifted), and attention sparsity / null rate;
4. translates one held-out chapter with ``reluformer-translate``;
5. prints one comparison table and writes a report folder (JSON of every number, the
   translated chapter, learning curves, attention heatmaps of one verse per model, AER per layer).

Seeds are fixed: a second run with the same options gives the same numbers on CPU.
"""
import argparse
import json
import logging
import os
import platform
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, List

from reluformer_mt.cli.inprocess import run_fairseq

logger = logging.getLogger("reluformer_mt.demo")

PACKAGE_DIR = Path(__file__).resolve().parents[1]
DEFAULT_FAMILIES = ("reluformer", "rela", "softmax")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reluformer-demo", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="runs/demo", help="working and report folder")
    p.add_argument("--families", default=",".join(DEFAULT_FAMILIES),
                   help="comma-separated families: softmax, reluformer, rela, pointwise, sparsemax, entmax15")
    p.add_argument("--size", default="tiny", choices=["tiny", "iwslt_de_en", "base"], help="architecture size")
    p.add_argument("--segment-tokens", default="128",
                   help="document segment length N in subword tokens (128 learns most within the CPU budget; "
                        "512-2048 as in ReLUFormer's study need longer training)")
    p.add_argument("--vocab-size", type=int, default=4000, help="joint SentencePiece vocabulary size")
    p.add_argument("--max-update", type=int, default=1500, help="training updates per model (the same budget for all)")
    p.add_argument("--budget-minutes", type=float, default=0,
                   help="instead of --max-update: wall-clock minutes per model (not reproducible across machines)")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup-updates", type=int, default=100)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--eval-chapters", type=int, default=0,
                   help="evaluate on the first K held-out chapters only (0 = all 13)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bible-root", default=None, help="a local copy of the bible-alignments data (default: the installed package)")
    p.add_argument("--force", action="store_true", help="redo every stage, even those already done")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    return p


class Stages:
    """Prints numbered stage headers with elapsed time and keeps the time of each stage."""

    def __init__(self, total: int):
        self.total, self.done, self.times = total, 0, {}

    @contextmanager
    def stage(self, name: str):
        self.done += 1
        print(f"\n[demo {self.done}/{self.total}] {name} ...", flush=True)
        start = time.time()
        yield
        self.times[name] = round(time.time() - start, 1)
        print(f"[demo {self.done}/{self.total}] {name}: done in {self.times[name]:.0f} s", flush=True)


def versions() -> Dict[str, str]:
    import fairseq
    import sacrebleu
    import torch

    import reluformer_mt

    return {"reluformer_mt": reluformer_mt.__version__, "fairseq": fairseq.__version__, "torch": torch.__version__,
            "sacrebleu": sacrebleu.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "cpus": str(os.cpu_count())}


# ------------------------------------------------------------------------------------ stages
def prepare_corpus(args, work: Path) -> Dict[str, Path]:
    """Document-level and sentence-level directories sharing one SentencePiece model."""
    from reluformer_mt.data.prepare import PrepareConfig, prepare

    doc_dir, sent_dir = work / f"data/doc{args.segment_tokens}", work / "data/sentence"
    common = dict(fmt="bible", src="grc", tgt="en", vocab_size=args.vocab_size, joined_dictionary=True,
                  bible_root=args.bible_root, force=args.force, workers=2)
    prepare(PrepareConfig(out=str(doc_dir), segment_tokens=args.segment_tokens, **common))
    prepare(PrepareConfig(out=str(sent_dir), segment_tokens=0, spm_models=[str(doc_dir / "spm.model")], **common))
    return {"doc": doc_dir, "sentence": sent_dir}


def train_argv(args, family: str, data_dir: Path, save_dir: Path, log_file: Path) -> List[str]:
    manifest = json.loads((data_dir / "prepared.json").read_text(encoding="utf-8"))
    positions = max(manifest["max_source_positions"], manifest["max_target_positions"])
    argv = [str(data_dir), "--user-dir", str(PACKAGE_DIR), "--task", "document_translation",
            "--arch", f"{family}_{args.size}", "--share-all-embeddings", "--dropout", str(args.dropout),
            "--max-source-positions", str(positions), "--max-target-positions", str(positions),
            "--criterion", "reluformer_cross_entropy", "--label-smoothing", "0.1",
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "1.0", "--lr", str(args.lr),
            "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(args.warmup_updates),
            "--max-tokens", str(args.max_tokens), "--seed", str(args.seed), "--num-workers", "0",
            "--save-dir", str(save_dir), "--no-epoch-checkpoints",
            "--log-format", "json", "--log-interval", "20", "--log-file", str(log_file)]
    if args.budget_minutes:
        argv += ["--stop-time-hours", str(args.budget_minutes / 60), "--max-update", "1000000"]
        argv += ["--validate-interval-updates", "100"]
    else:
        argv += ["--max-update", str(args.max_update),
                 "--validate-interval-updates", str(max(1, args.max_update // 6))]
    if args.device == "cpu":
        argv.append("--cpu")
    return argv


def read_learning_curve(log_file: Path) -> Dict[str, List]:
    """(update, loss) of training (every log interval) and validation from fairseq's JSON log."""
    curve = {"train": {}, "valid": {}}  # keyed by update: fairseq may write a line twice
    for line in log_file.read_text(encoding="utf-8").splitlines():
        start = line.find("{")
        if start < 0:
            continue
        try:
            record = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if "loss" in record and "num_updates" in record:  # a train_inner line (no prefix in the file)
            curve["train"][int(record["num_updates"])] = float(record["loss"])
        elif "valid_loss" in record:
            curve["valid"][int(record["valid_num_updates"])] = float(record["valid_loss"])
    return {part: sorted(points.items()) for part, points in curve.items()}


def plot_learning_curves(curves: Dict[str, Dict[str, List]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (family, curve) in enumerate(curves.items()):
        color = f"C{i}"
        if curve["train"]:
            ax.plot(*zip(*curve["train"]), color=color, alpha=0.6, label=f"{family} train")
        if curve["valid"]:
            ax.plot(*zip(*curve["valid"]), color=color, marker="o", linestyle="--", label=f"{family} valid")
    ax.set_xlabel("update")
    ax.set_ylabel("loss (base 2, label-smoothed + regularisers)")
    ax.set_title("Learning curves")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def read_split_documents(data_dir: Path, split: str, lang: str) -> Dict[str, List[str]]:
    """Verses of a split grouped by chapter (document id), in order, from the prepared word files."""
    words = (data_dir / f"{split}.words.{lang}").read_text(encoding="utf-8").splitlines()
    chapters = [line.split("\t")[1] for line in (data_dir / f"{split}.verses.tsv").read_text(encoding="utf-8").splitlines()]
    if len(words) != len(chapters):
        raise ValueError(f"{data_dir}: {split}.words.{lang} has {len(words)} lines, {split}.verses.tsv {len(chapters)}")
    docs: Dict[str, List[str]] = {}
    for chapter, verse in zip(chapters, words):
        docs.setdefault(chapter, []).append(verse)
    return docs


def limit_chapters(docs: Dict[str, List[str]], k: int) -> Dict[str, List[str]]:
    return dict(list(docs.items())[:k]) if k else docs


def bleu_of_model(args, checkpoint: Path, data_dir: Path) -> dict:
    """Translate every held-out chapter with the document translator; s-BLEU and d-BLEU."""
    from reluformer_mt.evaluation.bleu import corpus_dbleu, corpus_sbleu
    from reluformer_mt.inference.translator import DocumentTranslator

    sources = limit_chapters(read_split_documents(data_dir, "test", "grc"), args.eval_chapters)
    references = limit_chapters(read_split_documents(data_dir, "test", "en"), args.eval_chapters)
    translator = DocumentTranslator(checkpoint, data=data_dir, device=args.device, beam=args.beam)
    start = time.time()
    results = translator.translate(list(sources.values()), progress=True)
    seconds = time.time() - start
    hyp_docs = [[r.text for r in doc] for doc in results]
    ref_docs = list(references.values())
    s_bleu = corpus_sbleu([s for d in hyp_docs for s in d], [s for d in ref_docs for s in d])
    d_bleu = corpus_dbleu(hyp_docs, ref_docs)
    stats = translator.stats
    return {"s_bleu": s_bleu.score, "d_bleu": d_bleu.score, "s_bleu_signature": s_bleu.signature,
            "d_bleu_signature": d_bleu.signature, "chapters": len(hyp_docs), "verses": sum(map(len, hyp_docs)),
            "segments": stats["segments"],
            "fallbacks": stats["fallbacks: segment retranslated as halves"]
            + stats["fallbacks: segment retranslated sentence by sentence"],
            "translate_seconds": round(seconds, 1), "hypotheses": dict(zip(sources, hyp_docs))}


def alignment_and_stats(args, checkpoints: Dict[str, Path], data_dir: Path, report_dir: Path) -> dict:
    """AER per layer against the gold verse alignments, and attention statistics, all models at once."""
    from reluformer_mt.evaluation.align import run_align
    from reluformer_mt.evaluation.attn_stats import run_attn_stats

    names, paths = list(checkpoints), [str(p) for p in checkpoints.values()]
    text = dict(src=str(data_dir / "test.words.grc"), tgt=str(data_dir / "test.words.en"))
    aer = run_align(paths, names=names, data=str(data_dir), gold=str(data_dir / "test.gold.align"), gold_base=0,
                    layer="all", plot=str(report_dir / "aer_per_layer.png"), device=args.device, **text)
    stats = run_attn_stats(paths, names=names, data=str(data_dir), split=None, kinds=("encoder_self", "decoder_self", "cross"),
                           plot=str(report_dir / "sparsity_per_layer.png"), device=args.device, **text)
    return {"aer": aer, "attn_stats": stats}


def plot_heatmaps(args, checkpoints: Dict[str, Path], data_dir: Path, path: Path) -> Path:
    """Cross-attention of the last decoder layer on one short held-out verse, every head, every model."""
    from reluformer_mt.evaluation import extract
    from reluformer_mt.evaluation.plots import plot_attention_heatmaps

    sources = (data_dir / "test.words.grc").read_text(encoding="utf-8").splitlines()
    targets = (data_dir / "test.words.en").read_text(encoding="utf-8").splitlines()
    # the first verse short enough for readable labels
    verse = next((i for i, line in enumerate(sources) if 5 <= len(line.split()) <= 10), 0)
    src, tgt = sources[verse].split(), targets[verse].split()
    attn, labels = {}, None
    for name, ckpt in checkpoints.items():
        loaded = extract.load_checkpoint(str(ckpt), str(data_dir), device=args.device)
        pair = extract.encode_pairs(loaded, [src], [tgt])[0]
        attn[name] = extract.attention_of_pairs(loaded, [pair])[0]["cross"][-1]
        labels = ([loaded.src_dict[i] for i in pair.src.tolist()], [loaded.tgt_dict[i] for i in pair.tgt.tolist()])
    return plot_attention_heatmaps(attn, labels[0], labels[1], path,
                                   title=f"cross-attention, last layer, test verse {verse + 1}")


def translate_one_chapter(args, checkpoint: Path, data_dir: Path, report_dir: Path) -> dict:
    """The user's path: ``reluformer-translate`` on one raw held-out chapter (one verse per line)."""
    import subprocess

    chapter, verses = next(iter(read_split_documents(data_dir, "test", "grc").items()))
    source = report_dir / f"chapter_{chapter}.grc.txt"
    target = report_dir / f"chapter_{chapter}.en.txt"
    source.write_text("\n".join(verses) + "\n", encoding="utf-8")
    command = [str(Path(sys.executable).parent / "reluformer-translate"), "--checkpoint", str(checkpoint),
               "--data", str(data_dir), "--beam", str(args.beam), "--device", args.device, "--format", "lines",
               "--input", str(source), "--output", str(target)]
    start = time.time()
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"reluformer-translate failed: {result.stderr.strip().splitlines()[-1:]}")
    return {"chapter": chapter, "verses": len(verses), "seconds": round(time.time() - start, 1),
            "command": " ".join(command), "source": str(source), "translation": str(target),
            "summary": result.stderr.strip().splitlines()[-3:]}


# ------------------------------------------------------------------------------------ report
def comparison_rows(results: Dict[str, dict]) -> List[list]:
    rows = []
    for family, r in results.items():
        aer = r["aer"]["normal"]
        shifted = r["aer"]["shifted"]
        rows.append([family, r["params"], r["updates"], r["train_seconds"], r["valid_loss"], r["s_bleu"], r["d_bleu"],
                     min(aer["best_head"]), min(aer["head_average"]), min(shifted["best_head"]),
                     r["cross_sparsity"], r["cross_null"], r["fallbacks"]])
    return rows


TABLE_HEADERS = ["model", "params", "updates", "train s", "valid loss", "s-BLEU", "d-BLEU", "AER best head",
                 "AER head avg", "AER shifted best", "cross sparsity", "cross null", "fallbacks"]


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO, stream=sys.stderr)
    import reluformer_mt  # noqa: F401  (registers the models; fixes the fairseq traps)
    from reluformer_mt.evaluation.reports import format_table, write_json

    families = [f.strip() for f in args.families.split(",") if f.strip()]
    from reluformer_mt.models import FAMILIES

    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        print(f"reluformer-demo: error: --families: unknown {', '.join(unknown)}; expected some of {', '.join(FAMILIES)}",
              file=sys.stderr)
        return 2
    work = Path(args.out)
    report_dir = work / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    stages = Stages(total=3 + len(families) + 1)
    started = time.time()

    with stages.stage("prepare the bible corpus (Greek -> English, chapters as documents)"):
        dirs = prepare_corpus(args, work)

    results, checkpoints, curves = {}, {}, {}
    for family in families:
        save_dir = work / "checkpoints" / family
        log_file = work / "logs" / f"{family}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        checkpoint = save_dir / "checkpoint_last.pt"  # every model after the same budget
        budget = f"{args.budget_minutes:g} min" if args.budget_minutes else f"{args.max_update} updates"
        with stages.stage(f"train {family}_{args.size} ({budget})"):
            if args.force or not checkpoint.exists():
                if log_file.exists():
                    log_file.unlink()
                start = time.time()
                run_fairseq("train", train_argv(args, family, dirs["doc"], save_dir, log_file))
                (save_dir / "train_seconds.txt").write_text(f"{time.time() - start:.1f}\n")
            else:
                print(f"  {checkpoint} exists: skipped (use --force to retrain)")
        checkpoints[family] = checkpoint
        curves[family] = read_learning_curve(log_file)
        results[family] = {"train_seconds": float((save_dir / "train_seconds.txt").read_text()),
                           "valid_loss": min((v for _, v in curves[family]["valid"]), default=float("nan")),
                           "learning_curve": curves[family]}

    with stages.stage("evaluate: translate held-out chapters (s-BLEU, d-BLEU), AER vs gold, attention statistics"):
        import torch

        for family, checkpoint in checkpoints.items():
            state = torch.load(checkpoint, map_location="cpu", weights_only=True)
            results[family]["params"] = sum(v.numel() for k, v in state["model"].items() if not k.endswith("_float_tensor"))
            results[family]["updates"] = state["optimizer_history"][-1]["num_updates"]
            bleu = bleu_of_model(args, checkpoint, dirs["doc"])
            (report_dir / f"test_{family}.hyp.json").write_text(json.dumps(bleu.pop("hypotheses"), ensure_ascii=False, indent=0))
            results[family].update(bleu)
            print(f"  {family}: s-BLEU {bleu['s_bleu']:.2f}  d-BLEU {bleu['d_bleu']:.2f}  ({bleu['chapters']} chapters, "
                  f"{bleu['verses']} verses, {bleu['fallbacks']} fallbacks, {bleu['translate_seconds']} s)", flush=True)
        evaluation = alignment_and_stats(args, checkpoints, dirs["doc"], report_dir)
        for family in families:
            results[family]["aer"] = evaluation["aer"]["models"][family]["aer_per_layer"]
            cross = evaluation["attn_stats"]["models"][family]["stats"]["cross"]["all"]
            results[family]["cross_sparsity"] = cross["sparsity"]
            results[family]["cross_null"] = cross["null_rate"]
            results[family]["attention_statistics"] = evaluation["attn_stats"]["models"][family]["stats"]
        plot_learning_curves(curves, report_dir / "learning_curves.png")
        plot_heatmaps(args, checkpoints, dirs["doc"], report_dir / "attention_heatmaps.png")

    with stages.stage(f"translate one held-out chapter with reluformer-translate ({families[0]})"):
        translated = translate_one_chapter(args, checkpoints[families[0]], dirs["doc"], report_dir)
        print(f"  chapter {translated['chapter']}: {translated['verses']} verses in {translated['seconds']} s -> "
              f"{translated['translation']}")

    table = format_table(TABLE_HEADERS, comparison_rows(results))
    total = time.time() - started
    report = {"options": vars(args), "versions": versions(), "stage_seconds": stages.times,
              "total_seconds": round(total, 1), "data": {k: str(v) for k, v in dirs.items()},
              "definitions": {"s_bleu": "sacreBLEU over verses of the held-out chapters (detokenised; the reference "
                                        "is the BSB tokenised as the gold alignment's words)",
                              "d_bleu": "sacreBLEU over whole chapters (documents)",
                              "aer": "Och & Ney AER of cross-attention links vs the manual verse alignments, the "
                                     "minimum over layers; best head chosen on the same gold set",
                              "cross_sparsity": "share of exact zeros among visible cross-attention weights"},
              "models": results, "translated_chapter": translated, "table": table}
    write_json(report_dir / "report.json", report, command=" ".join(sys.argv))
    (report_dir / "table.md").write_text(table + "\n", encoding="utf-8")
    print("\n" + table)
    print(f"\nreport: {report_dir}/ (report.json, table.md, learning_curves.png, attention_heatmaps.png, "
          f"aer_per_layer.png, sparsity_per_layer.png, {Path(translated['translation']).name}); "
          f"total {total / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
