"""FFN-as-memory sweep (ReLUFormer section 3, docs/METHODS.md section 2): train the ``relu``,
``softmax`` and ``softmax_ln`` FFN variants at slot counts from 32 to 4096 on a real corpus with
one fixed small budget, then score BLEU on held-out talks and the memory diagnostics
(top-score ratio, anisotropy) of every run; write a table (markdown + JSON) and a plot.
``reluformer-sweep`` (:mod:`reluformer_mt.cli.sweep`) is the command.

Without a binarised directory the corpus is built from ``../shared/data/docmt_ende/IWSLT2017``
(TED talks, en->de) with the package's docmt reader: the dev talks train, their last
``valid_size`` pairs validate, the test talks are scored; lowercased, word level, one joined
dictionary of ``nwords`` words. Finished runs (``runs/<variant>_<slots>.json``) are reused, so an
interrupted sweep resumes.
"""
if __name__ == "__main__":  # the old command line, said before the imports (fairseq's notices)
    from reluformer_mt.experiments.moved import say_moved

    raise SystemExit(say_moved("reluformer_mt.experiments.sweep", "reluformer-sweep"))

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from reluformer_mt.fairseq_runner import run_fairseq
from reluformer_mt.data.readers import Report, read_docmt
from reluformer_mt.data.textfiles import write_text_atomically
from reluformer_mt.evaluation.bleu import corpus_sbleu, read_fairseq_generate, read_lines
from reluformer_mt.evaluation.reports import format_table, write_json
from reluformer_mt.experiments.run import PACKAGE_DIR, Phase, TrainingRun, train_args

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CORPUS = Path(os.environ.get("RELUFORMER_SHARED_DATA", REPO.parent / "shared" / "data")) / "docmt_ende" / "IWSLT2017"
USER_DIR = str(PACKAGE_DIR)
# reluformer_mt.memory.ffn.FFN_VARIANTS without its torch import, so that reluformer-sweep --help and
# a bad option answer at once (tests/test_cli_help_speed.py compares the two)
FFN_VARIANTS = ("relu", "softmax", "softmax_ln")


def sweep_training(arch: str = "softmax_tiny", max_update: int = 2000, **fields) -> TrainingRun:
    """The training of every sweep run: fairseq's translation task on the word-level pairs, one
    validation at the end of ``max_update`` updates; ``fields`` change the rest (lr, seed, ...)."""
    fields = {**dict(lr=2e-3, warmup_updates=200, max_tokens=2000), **fields}
    return TrainingRun(arch=arch, phases=(Phase("sweep", "sentence", max_update),), task="translation",
                       langs=("en", "de"), share_embeddings=False, device="auto", validations=1, eval_bleu=False,
                       save_at_validation=False, log_interval=max(1, max_update // 5), progress_bar=False, **fields)


@dataclass
class SweepOptions:
    out: Path
    variants: Sequence[str] = FFN_VARIANTS
    slots: Sequence[int] = (32, 64, 128, 256, 512, 1024, 2048, 3072, 4096)
    data_bin: Optional[Path] = None
    corpus: Path = DEFAULT_CORPUS
    valid_size: int = 300
    test_size: int = 500
    nwords: int = 8000
    max_words: int = 40
    training: TrainingRun = field(default_factory=sweep_training)  # each run adds its FFN variant and slots
    beam: int = 4
    top_percent: Sequence[float] = (1.0,)
    stats_batches: int = 10
    keep_checkpoints: bool = False
    progress: Optional[bool] = None  # a training bar on a terminal; False: none (--no-progress)

    @property
    def max_update(self) -> int:
        return self.training.phases[0].updates

    def check(self) -> None:
        from reluformer_mt.memory.ffn import MemoryOptionError

        for v in self.variants:
            if v not in FFN_VARIANTS:
                raise MemoryOptionError(f"--variants: got {v!r}, expected a comma list of {', '.join(FFN_VARIANTS)}")
        if self.training.warmup_updates >= self.max_update:  # a budget shorter than the warm-up would never reach the lr
            self.training = replace(self.training, warmup_updates=max(1, self.max_update // 4))


# ---------------------------------------------------------------------------------------------- data

def read_pairs(corpus: Path, split: str, max_words: int) -> List[Tuple[str, str]]:
    """Lowercased, space-normalised sentence pairs of a docmt_ende ``concatenated_en2de_{split}``
    pair (documents flattened; pairs with a side longer than ``max_words`` words dropped)."""
    en, de = (corpus / f"concatenated_en2de_{split}_{lang}.txt" for lang in ("en", "de"))
    for path in (en, de):
        if not path.is_file():
            raise FileNotFoundError(f"--corpus: {path} not found")
    pairs = [(" ".join(e.split()).lower(), " ".join(d.split()).lower())
             for doc in read_docmt(en, de, Report()) for e, d in zip(doc.src, doc.tgt)]
    return [(e, d) for e, d in pairs if len(e.split()) <= max_words and len(d.split()) <= max_words]


def prepare_corpus(o: SweepOptions) -> Path:
    """Raw and binarised train/valid/test under ``o.out``; returns the binarised directory."""
    bin_dir = o.out / "data-bin"
    if (bin_dir / "test.en-de.de.bin").is_file():
        return bin_dir
    train = read_pairs(o.corpus, "dev", o.max_words)
    test = read_pairs(o.corpus, "test", o.max_words)[:o.test_size]
    splits = {"train": train[:-o.valid_size], "valid": train[-o.valid_size:], "test": test}
    raw = o.out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        for i, lang in enumerate(("en", "de")):
            (raw / f"{split}.{lang}").write_text("\n".join(r[i] for r in rows) + "\n", encoding="utf-8")
    run_fairseq("preprocess", ["--source-lang", "en", "--target-lang", "de", "--trainpref", raw / "train",
                               "--validpref", raw / "valid", "--testpref", raw / "test", "--destdir", bin_dir,
                               "--joined-dictionary", "--nwordssrc", o.nwords, "--workers", "1"])
    return bin_dir


# ---------------------------------------------------------------------------------------------- runs

class _Capture(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def train(data: Path, save: Path, variant: str, slots: int, o: SweepOptions) -> Tuple[float, List[float], List[float]]:
    """Train one model; (seconds, train losses, valid losses) read from fairseq's json log lines."""
    capture = _Capture()
    logging.getLogger().addHandler(capture)
    start = time.perf_counter()
    from reluformer_mt.experiments.progress import TrainingProgress, last_updates

    try:  # fairseq's json log lines, captured here, say how far it is
        with TrainingProgress(lambda: last_updates("\n".join(capture.lines[-20:])), o.max_update,
                              f"train {variant} {slots}", enabled=o.progress):
            run = replace(o.training, ffn_variant=variant, ffn_slots=slots)
            run_fairseq("train", train_args(run, run.phases[0], data, save))
    finally:
        logging.getLogger().removeHandler(capture)
    seconds = time.perf_counter() - start
    log = "\n".join(capture.lines)
    losses = [[float(x) for x in re.findall(rf'"{kind}_loss": "([0-9.]+)"', log)] for kind in ("train", "valid")]
    return seconds, losses[0], losses[1]


def bleu_on_test(data: Path, ckpt: Path, generated: Path, refs: Optional[Path], beam: int) -> float:
    """fairseq-generate on the test split (its output kept in ``generated``), scored with the
    package's s-BLEU against the raw references (NaN without them)."""
    gen = run_fairseq("generate", [data, "--user-dir", USER_DIR, "--path", ckpt, "--source-lang", "en",
                                   "--target-lang", "de", "--gen-subset", "test", "--beam", beam,
                                   "--max-len-a", "1.2", "--max-len-b", "10", "--max-tokens", 4000,
                                   "--num-workers", "0"], capture=True)
    generated.write_text(gen, encoding="utf-8")
    if refs is None:
        return float("nan")
    samples = read_fairseq_generate(generated, pieces="no")  # word-level data: texts as they are
    return corpus_sbleu([samples[i].hypothesis for i in sorted(samples)], read_lines(refs)).score


def one_run(data: Path, variant: str, slots: int, o: SweepOptions) -> dict:
    """Train one (variant, slots) model, then BLEU on test and diagnostics on valid."""
    # torch and fairseq: only when a run starts
    from reluformer_mt.checkpoints import checkpoint_info  # the one loader and its weights_only policy
    from reluformer_mt.memory.maintenance.stats import memory_stats_report

    save = o.out / "checkpoints" / f"{variant}_{slots}"
    seconds, train_loss, valid_loss = train(data, save, variant, slots, o)
    ckpt = save / "checkpoint_last.pt"  # the model at the fixed budget
    n_params = checkpoint_info(ckpt).parameters  # first: a refused checkpoint stops here, in one line
    # references: the raw test side written by prepare_corpus (beside --data-bin when given)
    refs = next((r for r in (o.out / "raw" / "test.de", data.parent / "raw" / "test.de") if r.is_file()), None)
    bleu = bleu_on_test(data, ckpt, o.out / "runs" / f"{variant}_{slots}.generate.txt", refs, o.beam)
    stats = memory_stats_report(ckpt, data, "valid", o.top_percent, max_batches=o.stats_batches, quiet=True)
    if not o.keep_checkpoints:
        for f in save.glob("*.pt"):
            f.unlink()
    return {"variant": variant, "slots": slots, "bleu": bleu, "train_loss": train_loss[-1] if train_loss else None,
            "valid_loss": valid_loss[-1] if valid_loss else None, "train_seconds": seconds, "parameters": n_params,
            "top_score_ratio": stats["mean"]["top_score_ratio"], "anisotropy": stats["mean"]["anisotropy"],
            "zero_fraction": stats["mean"]["zero_fraction"], "layers": stats["layers"]}


# ---------------------------------------------------------------------------------------------- report

def table(results: Sequence[dict], p0: str) -> str:
    headers = ["variant", "slots", "BLEU", "valid loss", f"top {p0}% ratio", "anisotropy", "zeros", "train s"]
    nan = float("nan")
    rows = [(r["variant"], r["slots"], r["bleu"], nan if r["valid_loss"] is None else r["valid_loss"],
             r["top_score_ratio"][p0], r["anisotropy"], r["zero_fraction"], round(r["train_seconds"]))
            for r in results]
    return format_table(headers, rows, digits=3)


def write_report(o: SweepOptions, results: List[dict]) -> str:
    from reluformer_mt.evaluation.plots import plot_sweep  # matplotlib: only for the report

    p0 = str(o.top_percent[0])
    t = o.training
    settings = (f"arch {t.arch}, {o.max_update} updates of <= {t.max_tokens} tokens, lr {t.lr}, "
                f"beam {o.beam}; data {o.data_bin or o.corpus}")
    text = table(results, p0)
    write_text_atomically(o.out / "results.md", f"# FFN-as-memory sweep\n\n{settings}\n\n```\n{text}\n```\n")
    write_json(o.out / "results.json", {"settings": settings, "results": results})
    panels = [("bleu", "BLEU"), ("valid_loss", "valid loss"), ("top_score_ratio", f"top {p0}% score ratio"),
              ("anisotropy", "anisotropy (mean pairwise cosine)")]
    series = {key: {v: sorted(((r["slots"], r[key][p0] if key == "top_score_ratio" else r[key])
                               for r in results if r["variant"] == v)) for v in FFN_VARIANTS} for key, _ in panels}
    plot_sweep(series, dict(panels), o.out / "sweep.png", xlabel="memory slots (FFN width)")
    return text


def run_sweep(o: SweepOptions, say=print) -> List[dict]:
    """Every (variant, slots) run, reusing finished ones; writes results.md/json and sweep.png."""
    o.check()
    (o.out / "runs").mkdir(parents=True, exist_ok=True)
    data = Path(o.data_bin) if o.data_bin else prepare_corpus(o)
    results = []
    for variant in o.variants:
        for s in o.slots:
            path = o.out / "runs" / f"{variant}_{s}.json"
            if path.is_file():
                results.append(json.loads(path.read_text()))
                continue
            say(f"== {variant}, {s} slots")
            result = one_run(data, variant, s, o)
            write_text_atomically(path, json.dumps(result, indent=1, allow_nan=True) + "\n")
            results.append(result)
            say(f"   BLEU {result['bleu']:.2f}, valid loss {result['valid_loss']}, {result['train_seconds']:.0f} s")
    say(write_report(o, results))
    return results
