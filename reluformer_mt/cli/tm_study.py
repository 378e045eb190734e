"""``python -m reluformer_mt.cli.tm_study``: the memory read-out study's command line
(:mod:`reluformer_mt.experiments.tm_study`)."""
import sys
from pathlib import Path

from reluformer_mt.cli.checks import OneLineParser, import_quietly, positive_int, positive_int_list


def build_parser() -> OneLineParser:
    # fairseq and matplotlib, imported by the study, log at import (DEBUG lines): not on the console
    tm_study = import_quietly("reluformer_mt.experiments.tm_study")

    p = OneLineParser(prog="tm_study", description=tm_study.__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/tm_study")
    p.add_argument("--families", default="softmax,reluformer,rela")
    p.add_argument("--ks", type=positive_int_list, default=[1, 4, 16], help="retrieved entries per sentence")
    # >= 1: fairseq reads --max-update 0 as "no limit" (a run that never ends), and -5 trained nothing
    p.add_argument("--updates", type=positive_int, default=1000, help="sentence-level updates per run")
    p.add_argument("--bible-root", default=None)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from reluformer_mt.experiments.tm_study import run_tm_study

    run_tm_study(Path(args.out), [f for f in args.families.split(",") if f], args.ks, args.updates, args.bible_root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
