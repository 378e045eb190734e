"""``reluformer-study --tune FAMILY,...``: the same tuning budget for every attention family on the
validation chapters of the demo's corpus (:mod:`reluformer_mt.experiments.tune`, docs/FAMILIES.md).

Resumable: rerun the same command after a kill and it keeps the finished trials and resumes the
interrupted ones from their checkpoints. ``--write-presets`` makes each family's best settings the
demo's preset for that family once every family's trials are finished.
"""
import argparse
import sys
from pathlib import Path

from reluformer_mt.cli.checks import (DefaultsHelpFormatter, OneLineParser, check_input_folder, check_output_folder,
                                     non_negative_int, positive_int, run_command)
from reluformer_mt.cli.run_options import add_bible_root_option, add_recipe_data_options, check_recipe_data_options

FAMILIES = ("reluformer", "rela", "softmax")  # the families with knobs of their own (experiments/tune.py)


def comma_list(choices) -> callable:
    """An argparse type: comma-separated names, each one of ``choices``."""
    def parse(text: str) -> list:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown) or '(none given)'}; expected some of "
                                             f"{', '.join(choices)}")
        return names
    return parse


family_list = comma_list(FAMILIES)


def trial_list(text: str) -> list:
    """An argparse type: comma-separated FAMILY:NUMBER pairs (``softmax:1,rela:4``)."""
    pairs = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        family, _, number = item.partition(":")
        if family not in FAMILIES or not number.isdigit():
            raise argparse.ArgumentTypeError(f"got {item!r}; expected FAMILY:TRIAL_NUMBER with FAMILY one of "
                                             f"{', '.join(FAMILIES)}")
        pairs.append((family, int(number)))
    return pairs


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="reluformer-study --tune", description=__doc__.split("\n\n")[0],
                      formatter_class=DefaultsHelpFormatter)
    p.add_argument("--tune", type=family_list, required=True, metavar="FAMILY,...",
                   help="families to tune, each with the same budget: " + ", ".join(FAMILIES))
    p.add_argument("--out", default="runs/tune", help="working folder: the corpus, every trial, the journals, tuning.md")
    p.add_argument("--trials", type=positive_int, default=8, help="trials per family")
    p.add_argument("--tune-updates", type=positive_int, default=2500,
                   help="training updates of every trial (sentence + document phase; the quick preset's 1,500 + 1,000)")
    p.add_argument("--space", choices=("shared", "recipe"), default="shared",
                   help="what is searched: the shared settings (lr, warm-up, dropout, sentence share) and each family's "
                        "own; 'recipe' adds the low-resource recipe's (model size, tokens per batch, attention and "
                        "activation dropout, label smoothing, word dropout, decoder layer-drop; docs/FAMILIES.md)")
    add_recipe_data_options(p)  # every trial trains on the recipe's data
    p.add_argument("--first-rung", type=non_negative_int, default=0, metavar="UPDATES",
                   help="successive halving: report each trial's validation (--rung-metric) after UPDATES sentence updates, "
                        "then UPDATES x --rung-factor, ...; trials outside the best 1/factor at a rung stop there "
                        "(0: every trial trains its full budget)")
    p.add_argument("--rung-factor", type=positive_int, default=3, help="successive halving's reduction factor (>= 2)")
    p.add_argument("--rung-metric", choices=("nll", "bleu"), default="nll",
                   help="what ranks the trials at a rung: fairseq's validation loss without label smoothing "
                        "(nll, the default: informative from the first rungs) or its greedy s-BLEU (bleu)")
    p.add_argument("--jobs", type=positive_int, default=2, help="trials at once, one thread each")
    p.add_argument("--retry-trials", type=trial_list, default=[], metavar="FAMILY:N,...",
                   help="run these failed trials again (a failure of the machine, not of their settings): their "
                        "folders are moved aside to trial-KEY.failed-N and the failures stop counting")
    p.add_argument("--startup-trials", type=positive_int, default=4,
                   help="random proposals per family before TPE models the finished trials")
    p.add_argument("--sampler-seed", type=positive_int, default=1, help="seed of the proposals")
    p.add_argument("--valid-chapters", type=non_negative_int, default=0,
                   help="validation chapters each trial translates (0: all 13)")
    add_bible_root_option(p)
    p.add_argument("--write-presets", action="store_true",
                   help="write each family's best settings to reluformer_mt/experiments/tuned_presets.json "
                        "(the quick demo's per-family presets), or with --space recipe to tuned_presets_recipe.json "
                        "(the reference run's, reluformer-demo --preset reference); refused until every family's "
                        "trials are finished")
    p.add_argument("--report-only", action="store_true", help="write tuning.md / tuning.json from the journals, train nothing")
    return p


def check_args(args) -> None:
    """--out and --bible-root before any work (the length study's too)."""
    check_output_folder(args.out, "--out")
    check_input_folder(args.bible_root, "--bible-root")
    check_recipe_data_options(args)
    stray = [f"{f}:{n}" for f, n in getattr(args, "retry_trials", []) if f not in getattr(args, "tune", [f])]
    if stray:
        raise ValueError(f"--retry-trials: {', '.join(stray)} names a family that --tune does not search")
    if getattr(args, "rung_factor", 3) < 2:
        raise ValueError(f"--rung-factor: got {args.rung_factor}, expected an integer >= 2")


def main(argv=None) -> int:
    args = build_parser().parse_checked(argv, check_args)
    from reluformer_mt.cli.checks import quiet_logging

    quiet_logging()  # before fairseq's import-time logging set-up (matplotlib's DEBUG lines)
    from reluformer_mt.experiments import tune

    options = tune.TuneOptions(out=Path(args.out), families=args.tune, trials=args.trials,
                               total_updates=args.tune_updates, jobs=args.jobs, startup_trials=args.startup_trials,
                               sampler_seed=args.sampler_seed, bible_root=args.bible_root,
                               valid_chapters=args.valid_chapters, space=args.space, first_rung=args.first_rung,
                               rung_factor=args.rung_factor, rung_metric=args.rung_metric,
                               extra_target=args.extra_target,
                               train_lengths=args.train_lengths, retry_trials=args.retry_trials)
    def search():
        if args.report_only:
            summary = tune.report_from_journals(options)
        else:
            from reluformer_mt.plugin import register

            register()
            summary = tune.run_search(options)
        if args.write_presets:  # the quick demo's presets, or the reference run's for --space recipe
            path = tune.presets_file(args.space)
            tune.write_presets(summary, path, configs=tune.DEMO_CONFIGS if path == tune.TUNED_PRESETS else None)
            print(f"reluformer-study: wrote {path}", file=sys.stderr)

    return run_command("reluformer-study", search)

if __name__ == "__main__":
    sys.exit(main())
