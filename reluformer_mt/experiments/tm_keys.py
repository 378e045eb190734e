"""Learned vs TF-IDF translation-memory keys on the bible (docs/TRANSLATION_MEMORY.md).

Trains the demo's quick softmax model with memory attention (``--tm-fusion attention --tm-k 2``)
on the bible's verses with the learned keys' in-batch retrieval loss (``--tm-key-loss``), then
re-keys a copy of the prepared directory with the checkpoint (``reluformer-memory rekey``, once
with pure MIPS and once with the fuzzy rerank) and prints recall@k of the exact best fuzzy match
and the s-BLEU of copying the top-1 match, learned beside TF-IDF.

    python -m reluformer_mt.experiments.tm_keys --out runs/tmkeys --updates 400 --key-loss 1
"""
import argparse
import shutil
import sys
import time
from pathlib import Path

from reluformer_mt.evaluation.reports import write_json
from reluformer_mt.experiments.demo import PRESETS, DemoOptions, prepare_corpus
from reluformer_mt.experiments.run import train_args
from reluformer_mt.experiments.tm_study import memory_study_run
from reluformer_mt.fairseq_runner import run_fairseq


def train(o: DemoOptions, data_dir: Path, name: str, updates: int, extra) -> Path:
    save = o.out / "checkpoints" / name
    log = o.out / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    if not (save / "train_seconds.txt").exists():
        start = time.time()
        run = memory_study_run(o, "softmax+attention", updates, extra)
        run_fairseq("train", train_args(run, run.phases[0], data_dir, save, log, positions=1024))
        (save / "train_seconds.txt").write_text(f"{time.time() - start:.1f}\n")
    return save / "checkpoint_last.pt"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/tmkeys")
    p.add_argument("--updates", type=int, default=400, help="sentence-level updates")
    p.add_argument("--key-loss", type=float, default=1.0, help="--tm-key-loss of the run")
    p.add_argument("--key-temperature", type=float, default=0.05)
    p.add_argument("--bible-root", default=None)
    args = p.parse_args(argv)
    from reluformer_mt.checkpoints import load_model
    from reluformer_mt.memory.maintenance.rekey import format_report, rekey
    from reluformer_mt.plugin import register

    register()
    o = DemoOptions(out=Path(args.out), families=["softmax+attention"], tm_fusion="attention", bible_root=args.bible_root,
                    **PRESETS["quick"])
    o.tm_k = 2
    data = prepare_corpus(o)["sentence"]
    name = f"softmax.keyloss{args.key_loss:g}.u{args.updates}"
    checkpoint = train(o, data, name, args.updates, ["--disable-validation", "--tm-key-loss", str(args.key_loss),
                                                     "--tm-key-temperature", str(args.key_temperature)])
    results = {"updates": args.updates, "key_loss": args.key_loss, "checkpoint": str(checkpoint), "rekey": {}}
    for rerank in ("none", "fuzzy"):
        copy = o.out / "data" / f"rekeyed.{name}.{rerank}"
        if copy.exists():
            shutil.rmtree(copy)
        shutil.copytree(data, copy)
        loaded = load_model(checkpoint, copy)
        start = time.time()
        report = rekey(copy, loaded.model, loaded.task.source_dictionary, rerank=rerank, checkpoint=str(checkpoint))
        report["seconds"] = round(time.time() - start, 1)
        results["rekey"][rerank] = report
        print(format_report(report), flush=True)
        write_json(o.out / f"{name}.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
