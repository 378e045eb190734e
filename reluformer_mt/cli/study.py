"""``reluformer-study``: the quality study (quality and alignment per CPU minute) on the bible corpus.

Trains each named configuration of :data:`reluformer_mt.experiments.study.RUNS` for a wall-clock
budget (resumable: a finished run is not trained again), scores greedy s-BLEU / d-BLEU at every
validation and AER of every kept checkpoint, and writes ``OUT/study.{json,md,png}``. With
``--tune FAMILY,...`` it is the family tuner instead (:mod:`reluformer_mt.cli.tune`).
"""
import argparse
import sys
from pathlib import Path

from reluformer_mt.cli.checks import (EXIT_USAGE, DefaultsHelpFormatter, OneLineParser, check_input_folder,
                                     check_output_folder, positive_int, resolve_device, run_command)
from reluformer_mt.cli.run_options import add_bible_root_option, add_progress_option, add_run_options, add_training_device_option


def build_parser() -> argparse.ArgumentParser:
    from reluformer_mt.experiments.study import RUNS

    p = OneLineParser(prog="reluformer-study", description=__doc__.split("\n\n")[0],
                      formatter_class=DefaultsHelpFormatter,
                      epilog="Each mode lists its own options: reluformer-study --tune FAMILY,... --help; "
                             "reluformer-study --lengths LENGTH,... --help (docs/USAGE.md).")
    add_mode_options(p)
    p.add_argument("--out", default="runs/study", help="working and report folder")
    p.add_argument("--runs", default=",".join(RUNS), help="comma-separated configurations: " + ", ".join(RUNS))
    add_run_options(p, dict(budget_minutes=20, update_limit=0, threads=1))
    add_training_device_option(p)
    p.add_argument("--seeds", type=positive_int, default=1,
                   help="train each configuration with seeds 1..N (seed S > 1 as NAME-seedS) and report mean ± "
                        "standard deviation and min–max of every quality column over them")
    add_bible_root_option(p)
    p.add_argument("--skip-alignment", action="store_true", help="no AER of the checkpoints")
    add_progress_option(p)
    p.add_argument("--no-report", action="store_true",
                   help="train and score only (for several processes sharing --out); a later call writes the report")
    return p


def add_mode_options(p) -> None:
    """The other modes, listed so that --help shows them; main() hands a command with --tune or
    --lengths to its own parser before this one parses."""
    from reluformer_mt.cli.lengths import LENGTHS
    from reluformer_mt.cli.tune import FAMILIES, build_parser as tune_parser

    modes = p.add_argument_group("other modes (reluformer-study --tune X --help, --lengths X --help: their options)")
    modes.add_argument("--tune", metavar="FAMILY,...",
                       help="the family tuner: the same search budget for each of " + ", ".join(FAMILIES)
                            + f" on the validation chapters (with --trials N per family, default "
                              f"{tune_parser().get_default('trials')}; --tune-updates, "
                              "--jobs, --write-presets)")
    modes.add_argument("--lengths", metavar="LENGTH,...",
                       help="the length study: each family at its tuned settings, several seeds, trained at each of "
                            + ", ".join(LENGTHS) + " (with --seeds, --tune-families, --jobs)")
    modes.add_argument("--trials", metavar="N", help="trials per family of --tune (only with --tune)")


def check_args(args) -> None:
    """Checks that need more than one option or the machine, before any work (ValueError)."""
    if args.trials is not None:  # --tune is handed to its own parser before this one: here it is missing
        raise ValueError("--trials goes with --tune FAMILY,... (the family tuner)")
    if args.budget_minutes <= 0 and args.max_update <= 0:
        raise ValueError("--budget-minutes or --max-update must be > 0")
    check_output_folder(args.out, "--out")
    check_input_folder(args.bible_root, "--bible-root")
    args.device = resolve_device(args.device)  # the runs below see cpu or cuda


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--tune" or a.startswith("--tune=") for a in argv):  # the family tuner (reluformer_mt.cli.tune)
        from reluformer_mt.cli.tune import main as tune_main

        return tune_main(argv)
    if any(a == "--lengths" or a.startswith("--lengths=") for a in argv):  # the length study (cli.lengths)
        from reluformer_mt.cli.lengths import main as lengths_main

        return lengths_main(argv)
    args = build_parser().parse_checked(argv, check_args)
    from reluformer_mt.plugin import register

    register()  # the models, criteria and task, and the fairseq fixes
    from reluformer_mt.experiments.study import RUNS, run_study

    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNS]
    if unknown or not names:
        print(f"reluformer-study: error: --runs: unknown {', '.join(unknown) or '(none given)'}; "
              f"expected some of {', '.join(RUNS)}", file=sys.stderr)
        return EXIT_USAGE
    return run_command("reluformer-study", lambda: run_study(
        Path(args.out), names, args.budget_minutes, args.threads, args.max_update, args.device, args.bible_root,
        args.skip_alignment, report=not args.no_report, progress=False if args.no_progress else None, seeds=args.seeds))


if __name__ == "__main__":
    sys.exit(main())
