"""``reluformer-sweep``: the FFN-as-memory sweep (:mod:`reluformer_mt.experiments.sweep`).

    reluformer-sweep --out runs/ffn_sweep --slots 32,256,1024,4096 --max-update 300

Without ``--data-bin`` the corpus is built from ``../shared/data/docmt_ende/IWSLT2017``; finished
runs are reused, so an interrupted sweep resumes.
"""
import argparse
import logging
import sys
from pathlib import Path
from typing import List, Optional

# importing fairseq (below) logs at INFO and leaves the root logger at DEBUG, which lets
# matplotlib's import chatter through: quiet both, so a refused option is the only line
for _noisy in ("fairseq.tasks.text_to_speech", "matplotlib"):
    logging.getLogger(_noisy).setLevel(logging.WARNING)

from reluformer_mt.cli.checks import (DefaultsHelpFormatter, OneLineParser, check_input_folder, check_output_folder,
                                     percent_list, positive_int, positive_int_list, run_command)
from reluformer_mt.cli.run_options import add_progress_option, add_run_options
from reluformer_mt.experiments.sweep import DEFAULT_CORPUS, FFN_VARIANTS, SweepOptions, run_sweep, sweep_training


def variant_list(text) -> list:
    variants = [v.strip() for v in text.split(",") if v.strip()]
    if not variants or any(v not in FFN_VARIANTS for v in variants):
        raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(FFN_VARIANTS)}, got {text!r}")
    return variants


# ---------------------------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="reluformer-sweep", description="FFN-as-memory sweep: FFN variants x slot "
                      "counts, a fixed budget each; test BLEU and memory diagnostics",
                      formatter_class=DefaultsHelpFormatter)
    p.add_argument("--out", required=True, help="output directory (data, runs, results.md/json, sweep.png)")
    p.add_argument("--variants", type=variant_list, default=",".join(FFN_VARIANTS),
                   help="comma list of FFN variants: relu (the usual FFN), softmax over the slots, softmax_ln "
                        "(softmax followed by LayerNorm); docs/METHODS.md section 2")
    p.add_argument("--slots", type=positive_int_list, default="32,64,128,256,512,1024,2048,3072,4096",
                   help="comma list of FFN slot counts (the FFN's hidden size), one run per variant and count")
    p.add_argument("--data-bin", help="a binarised en-de directory (default: built from --corpus)")
    p.add_argument("--corpus", default=str(DEFAULT_CORPUS), help="docmt_ende corpus directory")
    p.add_argument("--valid-size", type=positive_int, default=300,
                   help="sentence pairs of the corpus's training side held out for validation")
    p.add_argument("--test-size", type=positive_int, default=500, help="first N sentence pairs of the test side for the test BLEU")
    p.add_argument("--nwords", type=positive_int, default=8000, help="size of the joint fairseq dictionary (words, no BPE)")
    p.add_argument("--max-words", type=positive_int, default=40, help="drop pairs with longer sentences")
    p.add_argument("--arch", default="softmax_tiny", help="reluformer architecture (FFN width is set by --slots)")
    run = sweep_training()  # the fixed budget of every run and its schedule
    add_run_options(p, dict(max_update=run.phases[0].updates, max_tokens=run.max_tokens, lr=run.lr,
                            warmup_updates=run.warmup_updates, seed=run.seed))
    p.add_argument("--beam", type=positive_int, default=4, help="beam size of the test translation")
    p.add_argument("--top-percent", type=percent_list, default="1",
                   help="comma list of p for the top-p%% ratio (the first is tabled)")
    p.add_argument("--stats-batches", type=positive_int, default=10, help="validation batches of the memory diagnostics")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep each run's checkpoints (by default deleted once the run is scored)")
    add_progress_option(p)
    p.add_argument("extra", nargs="*", help="after --: more fairseq-train options for every run")
    return p


def options_from_args(args) -> SweepOptions:
    return SweepOptions(
        out=Path(args.out), variants=args.variants, slots=args.slots,
        data_bin=Path(args.data_bin) if args.data_bin else None, corpus=Path(args.corpus), valid_size=args.valid_size,
        test_size=args.test_size, nwords=args.nwords, max_words=args.max_words,
        training=sweep_training(args.arch, args.max_update, max_tokens=args.max_tokens, lr=args.lr,
                                warmup_updates=args.warmup_updates, seed=args.seed, extra=tuple(args.extra)),
        beam=args.beam, top_percent=args.top_percent, stats_batches=args.stats_batches,
        keep_checkpoints=args.keep_checkpoints, progress=False if args.no_progress else None)


def check_args(args) -> None:
    """Paths and the architecture, before any work (ValueError)."""
    check_output_folder(args.out, "--out")
    if args.data_bin:
        check_input_folder(args.data_bin, "--data-bin")
    else:
        check_input_folder(args.corpus, "--corpus")
    from fairseq.models import ARCH_MODEL_REGISTRY

    from reluformer_mt.plugin import register

    register()  # the entry point registers the plugin (models, criterion, task, fairseq fixes)
    if args.arch not in ARCH_MODEL_REGISTRY:
        ours = sorted(a for a in ARCH_MODEL_REGISTRY if a.split("_")[0] in ("softmax", "relu", "reluformer", "rela"))
        raise ValueError(f"--arch {args.arch}: unknown architecture; expected e.g. {', '.join(ours[:6])}")


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_checked(argv, check_args)
    # MemoryOptionError is a ValueError; a run that fails is not caught here
    return run_command("reluformer-sweep", lambda: run_sweep(options_from_args(args), say=lambda line: print(line, flush=True)),
                       usage=(FileNotFoundError, ValueError), failure=())


if __name__ == "__main__":
    sys.exit(main())
