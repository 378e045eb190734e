"""``reluformer-sweep``: the FFN-as-memory sweep (:mod:`reluformer_mt.experiments.sweep`).

    reluformer-sweep --out runs/ffn_sweep --slots 32,256,1024,4096 --max-update 300

Without ``--data-bin`` the corpus is built from ``../shared/data/docmt_ende/IWSLT2017``; finished
runs are reused, so an interrupted sweep resumes.
"""
import argparse
import sys
from pathlib import Path
from typing import List, Optional

from reluformer_mt.experiments.sweep import DEFAULT_CORPUS, SweepOptions, run_sweep
from reluformer_mt.memory.ffn import FFN_VARIANTS


# ---------------------------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reluformer-sweep", description="FFN-as-memory sweep: FFN variants x slot "
                                "counts, a fixed budget each; test BLEU and memory diagnostics")
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


def _numbers(text: str, kind=int) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


def options_from_args(args) -> SweepOptions:
    try:
        slots, top_percent = _numbers(args.slots), _numbers(args.top_percent, float)
    except ValueError:
        raise ValueError("--slots / --top-percent: expected comma lists of numbers") from None
    return SweepOptions(
        out=Path(args.out), variants=[v.strip() for v in args.variants.split(",") if v.strip()], slots=slots,
        data_bin=Path(args.data_bin) if args.data_bin else None, corpus=Path(args.corpus), valid_size=args.valid_size,
        test_size=args.test_size, nwords=args.nwords, max_words=args.max_words, arch=args.arch,
        max_update=args.max_update, max_tokens=args.max_tokens, lr=args.lr, warmup=args.warmup, seed=args.seed,
        beam=args.beam, top_percent=top_percent, stats_batches=args.stats_batches,
        keep_checkpoints=args.keep_checkpoints, extra=args.extra)


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from reluformer_mt.plugin import register

    register()  # the entry point registers the plugin (models, criterion, task, fairseq fixes)
    try:
        run_sweep(options_from_args(args), say=lambda line: print(line, flush=True))
    except (FileNotFoundError, ValueError) as error:  # MemoryOptionError is a ValueError
        print(f"reluformer-sweep: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
