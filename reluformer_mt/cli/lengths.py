"""``reluformer-study --lengths LENGTH,...``: each family at its tuned settings, several seeds, trained
on verses and then on document segments of each length (:mod:`reluformer_mt.experiments.lengths`,
docs/FAMILIES.md). Resumable: rerun the same command after a kill.
"""
import argparse
import sys
from pathlib import Path

from reluformer_mt.cli.checks import DefaultsHelpFormatter, OneLineParser, non_negative_int, positive_int, run_command
from reluformer_mt.cli.run_options import add_bible_root_option
from reluformer_mt.cli.tune import check_args, comma_list, family_list

LENGTHS = ("sentence", "128", "512", "chapter")  # reluformer_mt.experiments.lengths.LENGTHS, without its imports


length_list = comma_list(LENGTHS)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="reluformer-study --lengths", description=__doc__.split("\n\n")[0],
                      formatter_class=DefaultsHelpFormatter)
    p.add_argument("--lengths", type=length_list, required=True, metavar="LENGTH,...",
                   help="training lengths: sentence (verses only), 128, 512 (segment tokens), chapter (whole chapters)")
    p.add_argument("--tune-families", dest="families", type=family_list, default=["reluformer", "rela", "softmax"],
                   metavar="FAMILY,...", help="families (softmax is the one the gaps are taken against)")
    p.add_argument("--seeds", type=positive_int, default=3, help="training seeds 1..N of every family")
    p.add_argument("--out", default="runs/lengths", help="working folder: the corpora, every run, lengths.json")
    p.add_argument("--jobs", type=positive_int, default=2, help="runs at once, one thread each")
    p.add_argument("--untuned", action="store_true", help="the quick preset's shared settings instead of the tuned ones")
    p.add_argument("--eval-chapters", type=non_negative_int, default=0, help="the first K test chapters only (0: all 13)")
    p.add_argument("--report-only", action="store_true",
                   help="write OUT/lengths.json from the cells finished so far (a study under way); train nothing")
    add_bible_root_option(p)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_checked(argv, check_args)
    from reluformer_mt.cli.checks import quiet_logging

    quiet_logging()
    from reluformer_mt.experiments import lengths
    from reluformer_mt.plugin import register

    register()
    options = lengths.LengthOptions(out=Path(args.out), families=args.families, seeds=args.seeds, lengths=args.lengths,
                                    jobs=args.jobs, untuned=args.untuned, bible_root=args.bible_root,
                                    eval_chapters=args.eval_chapters, report_only=args.report_only)
    return run_command("reluformer-study", lambda: lengths.run_lengths(options))

if __name__ == "__main__":
    sys.exit(main())
