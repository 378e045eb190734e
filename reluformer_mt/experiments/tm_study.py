"""The memory read-out study: softmax vs ReLUFormer vs ReLA as the weight function that reads a
translation memory, with k = 1, 4, 16 retrieved entries per sentence (k x ~40 value slots).

The ReLUFormer paper (Shen et al. 2023) finds ReLU better than softmax "when the number of value
slots is large"; here the slots are the retrieved translations' tokens. Each run trains the
demo's model (``--preset quick`` dimensions) on the bible's sentences with ``--tm-fusion
attention`` (memory attention with the copy distribution, ``--tm-encoder-layers 0`` so that the
cost stays linear in the slots) for the same number of updates, and translates the held-out
chapters verse by verse with its memory, without it, and beside copying the best match.

    python -m reluformer_mt.cli.tm_study --out runs/tm_study --families softmax,reluformer,rela --ks 1,4,16
"""
if __name__ == "__main__":  # the old command line, said before the imports (fairseq's notices)
    from reluformer_mt.experiments.moved import say_moved

    raise SystemExit(say_moved("reluformer_mt.experiments.tm_study", "python -m reluformer_mt.cli.tm_study"))

import time
from dataclasses import replace
from pathlib import Path
from typing import List

from reluformer_mt.evaluation.reports import format_table, write_json
from reluformer_mt.data.textfiles import write_text_atomically
from reluformer_mt.evaluation.bleu import corpus_sbleu
from reluformer_mt.experiments.demo import (PRESETS, DemoOptions, bleu_of_model, family_run, limit_chapters,
                                            prepare_corpus, read_split_documents)
from reluformer_mt.experiments.demo_translate import bands_of_modes
from reluformer_mt.experiments.run import Phase, TrainingRun, train_args
from reluformer_mt.fairseq_runner import run_fairseq

HEADERS = ["read-out", "k", "train min", "s-BLEU", "without memory", "copy of the match", "gain",
           "s-BLEU fuzzy >= 50", "n >= 50"]


def memory_study_run(o: DemoOptions, family: str, updates: int, extra: List[str]) -> TrainingRun:
    """The demo's run of ``family`` (a memory family), on sentences only for ``updates`` updates."""
    run = family_run(o, family)
    return replace(run, phases=(Phase("sentence", "sentence", updates),), extra=run.extra + tuple(extra))


def run_one(o: DemoOptions, family: str, k: int, updates: int, data_dir: Path, extra: List[str]) -> dict:
    name = f"{family}.k{k}"
    save = o.out / "checkpoints" / name
    log = o.out / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    o.tm_k = k
    run = memory_study_run(o, f"{family}+attention", updates, extra)
    argv = train_args(run, run.phases[0], data_dir, save, log, positions=1024)
    start = time.time()
    if not (save / "checkpoint_last.pt").exists() or not (save / "train_seconds.txt").exists():
        run_fairseq("train", argv)
        (save / "train_seconds.txt").write_text(f"{time.time() - start:.1f}\n")
    seconds = float((save / "train_seconds.txt").read_text())
    modes = {"with memory": bleu_of_model(o, save / "checkpoint_last.pt", data_dir),
             "without memory": bleu_of_model(o, save / "checkpoint_last.pt", data_dir, memory="none")}
    refs = [v for doc in limit_chapters(read_split_documents(data_dir, "test", "en"), o.eval_chapters).values() for v in doc]
    bands = bands_of_modes(refs, modes)
    copies = [m["copy"] or "" for m in modes["with memory"]["matches"]]
    close = next(b for b in bands["bands"] if b["band"] == ">=50")
    return {"family": family, "k": k, "train_seconds": seconds, "s_bleu": modes["with memory"]["s_bleu"],
            "without_memory": modes["without memory"]["s_bleu"], "copy": corpus_sbleu(copies, refs).score,
            "bands": bands["bands"], "close": close}


def run_tm_study(out: Path, families: List[str], ks: List[int], updates: int, bible_root=None) -> List[dict]:
    """Every (k, family) run, tm_study.json after each, then tm_study.md; the command is
    ``python -m reluformer_mt.cli.tm_study``."""
    from reluformer_mt.plugin import register

    register()
    o = DemoOptions(out=out, families=[f"{f}+attention" for f in families], tm_fusion="attention",
                    bible_root=bible_root, **PRESETS["quick"])
    o.validations = 1
    dirs = prepare_corpus(o)
    extra = ["--tm-encoder-layers", "0", "--disable-validation"]
    results = []
    for k in ks:
        for family in families:
            r = run_one(o, family, k, updates, dirs["sentence"], extra)
            results.append(r)
            print(f"[tm-study] {family} k={k}: s-BLEU {r['s_bleu']:.2f} (without memory {r['without_memory']:.2f}, "
                  f"copy {r['copy']:.2f}) in {r['train_seconds'] / 60:.1f} min", flush=True)
            write_json(out / "tm_study.json", {"updates": updates, "results": results})
    rows = [[r["family"], r["k"], round(r["train_seconds"] / 60, 1), r["s_bleu"], r["without_memory"], r["copy"],
             r["s_bleu"] - r["without_memory"], r["close"]["with memory"] if r["close"]["sentences"] else float("nan"),
             r["close"]["sentences"]] for r in results]
    table = format_table(HEADERS, rows)
    write_text_atomically(out / "tm_study.md", table + "\n")
    print(table)
    return results
