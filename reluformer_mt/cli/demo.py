"""``reluformer-demo`` (``make demo``): the toolkit's whole story on a real document-level corpus.

Options left unset take the values of ``--preset`` (``quick``: ``make demo``, its duration in the
README; ``long``: the reference run of docs/REFERENCE_RUN.md); the stages are
:func:`reluformer_mt.experiments.demo.run_demo`. The console gets one line per stage; fairseq's
logs go to ``OUT/logs/``.
"""
import argparse
import json
import logging
import sys
from pathlib import Path

from reluformer_mt.cli.checks import (EXIT_OK, EXIT_USAGE, DefaultsHelpFormatter, OneLineParser,
                                     check_input_folder, check_output_folder, import_quietly, non_negative_float,
                                     non_negative_int, positive_int, resolve_device, segment_tokens, unit_interval)
from reluformer_mt.cli.run_options import (add_bible_root_option, add_progress_option, add_recipe_data_options, add_run_options,
                                          add_training_device_option, check_recipe_data_options)
# the options alone (no torch, no fairseq): a bad option is answered before the stages are imported
from reluformer_mt.experiments.demo_options import (DEFAULT_FAMILIES, PRESET_DATA, PRESETS, TUNED_PRESET_NAMES,
                                                    DemoOptions, split_family)
from reluformer_mt.families import FAMILIES

PRESET_DEFAULT = " (default: the preset's)"



def segment_tokens_text(text) -> str:
    """``--segment-tokens`` checked as reluformer-prepare checks it, kept as the text given."""
    segment_tokens(text)
    return text.strip()


def preset_help(values: dict) -> str:
    """A preset's values, with the training's total: max_update counts the document phase only,
    which read alone hid the sentence phase's updates."""
    def item(key, value):
        if key == "max_update" and values.get("sentence_updates"):
            total = values["sentence_updates"] + value
            return (f"{key}={value} ({total:,} updates in all: {values['sentence_updates']:,} on verses, then "
                    f"{value:,} on document segments)")
        return f"{key}={value}"
    return ", ".join(item(k, v) for k, v in values.items())


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="reluformer-demo", description=__doc__.split("\n\n")[0].replace("``", ""),
                      formatter_class=DefaultsHelpFormatter)
    p.add_argument("--out", default="runs/demo", help="working and report folder")
    p.add_argument("--preset", default="quick", choices=list(PRESETS),
                   help="defaults of every option below left unset: " + "; ".join(
                       f"{name}: {preset_help(values)}" for name, values in PRESETS.items()))
    p.add_argument("--families", default=",".join(DEFAULT_FAMILIES),
                   help="comma-separated model families (see the README's table; every registered family works); "
                        "FAMILY+tm adds a translation memory with --tm-fusion (FAMILY+concat, FAMILY+attention name one)")
    p.add_argument("--pieces-weight", type=non_negative_float, default=None,
                   help="translation pieces' weight for every family (reluformer-translate --pieces-weight; 0 = skip); "
                        "default: weight and fuzzy floor tuned on the validation chapters (reluformer-memory tune)")
    p.add_argument("--pieces-floor", type=unit_interval, default=0.0,
                   help="with --pieces-weight: only matches with a fuzzy score >= this give pieces")
    p.add_argument("--no-knn", dest="knn", action="store_false",
                   help="skip kNN-MT (the datastores, the tuning and the kNN rows; docs/KNN_MT.md)")
    p.add_argument("--knn-memory-k", type=positive_int, default=8,
                   help="memory matches per verse of the per-input kNN-MT datastores")
    add_progress_option(p)
    p.add_argument("--tune-chapters", type=non_negative_int, default=7,
                   help="validation chapters decoded by the tuner (its teacher-forced grid reads all; 0: all 13)")
    p.add_argument("--pieces-k", type=positive_int, default=8, help="memory matches per verse whose n-grams are pieces")
    p.add_argument("--jobs", type=positive_int, default=2,
                   help="families trained at once on a CPU, one thread each (small models gain little from a second "
                        "thread, so two side by side finish about twice as fast); 1 = one after the other")
    p.add_argument("--size", default=None, choices=["tiny", "iwslt_de_en", "base"],
                   help="an architecture size instead of the preset's dimensions (e.g. iwslt_de_en with --device cuda)")
    p.add_argument("--segment-tokens", type=segment_tokens_text,
                   help="document segment length N in subword tokens" + PRESET_DEFAULT)
    p.add_argument("--vocab-size", type=positive_int, help="joint SentencePiece vocabulary size" + PRESET_DEFAULT)
    # the training run's options (reluformer_mt.cli.run_options): None = the preset's
    add_run_options(p, dict(embed_dim=None, ffn_dim=None, layers=None, heads=None, sentence_updates=None,
                            max_update=None, budget_minutes=DemoOptions.budget_minutes, max_tokens=None, lr=None,
                            document_lr=None, warmup_updates=None, dropout=None, validations=None,
                            seed=DemoOptions.seed, tm_fusion=DemoOptions.tm_fusion, tm_k=DemoOptions.tm_k,
                            train_args=""), unset=PRESET_DEFAULT)
    add_recipe_data_options(p)
    p.add_argument("--beam", type=positive_int, help="beam size of the evaluation and the translated chapter" + PRESET_DEFAULT)
    p.add_argument("--eval-chapters", type=non_negative_int, default=0,
                   help="evaluate on the first K held-out chapters only (0 = all 13)")
    p.add_argument("--seeds", type=positive_int, default=1,
                   help="train and evaluate every family with N seeds (--seed, --seed+1, ...: OUT/ and "
                        "OUT/seeds/seed-S/), then report mean ± std and min–max of every quality column and "
                        "whether each family's difference to softmax exceeds the seed spread (report/seeds.md, "
                        "table.md, index.html; docs/REFERENCE_RUN.md); each seed costs a whole demo run")
    add_bible_root_option(p, " (default: the installed package)")
    p.add_argument("--force", action="store_true", help="redo every stage, even those already done")
    p.add_argument("--untuned", action="store_true",
                   help="train every family with the preset's shared settings instead of its own tuned ones "
                        "(reluformer_mt/experiments/tuned_presets.json, from reluformer-study --tune; docs/FAMILIES.md)")
    add_training_device_option(p)
    return p


def tuned_settings(args) -> dict:
    """Each family's tuned settings (reluformer-study --tune --write-presets) for the quick preset
    (``tuned_presets.json``) and the reference run (the recipe search's ``tuned_presets_recipe.json``,
    on its own budget: :func:`scaled_to_preset`), less those
    the command line gives (they win); none with ``--untuned``, another preset or a time budget."""
    from reluformer_mt.experiments.tune import RECIPE_PRESETS, TUNED_PRESETS

    presets = TUNED_PRESETS if args.preset == "quick" else RECIPE_PRESETS  # the search made for each preset
    if args.untuned or args.preset not in TUNED_PRESET_NAMES or args.budget_minutes or not presets.exists():
        return {}
    given = {name for name in ("lr", "warmup_updates", "dropout", "sentence_updates", "max_update", "embed_dim",
                               "ffn_dim", "layers", "heads", "max_tokens") if getattr(args, name, None) is not None}
    try:
        families = json.loads(presets.read_text(encoding="utf-8"))["families"]
        if args.preset != "quick":
            families = {family: scaled_to_preset(settings, PRESETS[args.preset]) for family, settings in families.items()}
        return {family: {k: v for k, v in settings.items() if k not in given} for family, settings in families.items()}
    except (ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError) as e:
        raise ValueError(f"{presets}: expected the tuner's {{\"families\": {{FAMILY: {{setting: value}}}}}} "
                         f"(reluformer-study --tune ... --write-presets): {e}") from None


def scaled_to_preset(settings: dict, preset: dict) -> dict:
    """A family's tuned settings on a preset's budget: its share of sentence updates kept, the
    preset's total of updates (sentence + document phase) instead of the search's."""
    from reluformer_mt.experiments.tune import split_updates

    share = settings["sentence_updates"] / (settings["sentence_updates"] + settings["max_update"])
    sentence, document = split_updates(preset["sentence_updates"] + preset["max_update"], share)
    return dict(settings, sentence_updates=sentence, max_update=document)


def options_from_args(args, families) -> DemoOptions:
    """The command line's values, and the preset's for those left unset (with each family's tuned
    settings over the preset's: :func:`tuned_settings`)."""
    preset, data = PRESETS[args.preset], PRESET_DATA.get(args.preset, {})
    values = {name: getattr(args, name) if getattr(args, name, None) is not None else default
              for name, default in preset.items()}
    return DemoOptions(out=Path(args.out), families=families, preset=args.preset, size=args.size,
                       segment_tokens=str(values.pop("segment_tokens")), budget_minutes=args.budget_minutes,
                       document_lr=args.document_lr, eval_chapters=args.eval_chapters, seed=args.seed,
                       bible_root=args.bible_root, tm_fusion=args.tm_fusion, tm_k=args.tm_k, jobs=args.jobs,
                       pieces_weight=args.pieces_weight, pieces_k=args.pieces_k,
                       pieces_floor=args.pieces_floor, knn=args.knn, knn_memory_k=args.knn_memory_k,
                       tune_chapters=args.tune_chapters, no_progress=args.no_progress,
                       force=args.force, device=args.device, train_args=list(args.train_args),
                       extra_target=args.extra_target or data.get("extra_target"),
                       train_lengths=list(args.train_lengths or data.get("train_lengths", [])),
                       family_settings=tuned_settings(args), **values)


def run_demo(options) -> None:
    """The demo's stages, imported only now: they load torch and fairseq (whose imports would print
    log lines on the console), so every option is checked before."""
    import_quietly("reluformer_mt.experiments.demo").run_demo(options)


def family_list(text: str) -> list:
    """``--families``: known families, each optionally FAMILY+tm|concat|attention (ValueError)."""
    families = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in families if split_family(f)[0] not in FAMILIES]  # a bad suffix raises its own line
    if unknown or not families:
        raise ValueError(f"--families: unknown {', '.join(unknown) or '(none given)'}; "
                         f"expected some of {', '.join(FAMILIES)}")
    repeated = sorted({f for f in families if families.count(f) > 1})
    if repeated:  # one run folder per family: a second would train over the first
        raise ValueError(f"--families: {', '.join(repeated)} given twice; give each family once")
    return families


def check_args(args) -> None:
    """Checks that need more than one option or the machine, before any work (ValueError)."""
    args.families = family_list(args.families)
    check_output_folder(args.out, "--out")
    check_input_folder(args.bible_root, "--bible-root")
    args.device = resolve_device(args.device)  # the runs below see cpu or cuda
    memory = [f for f in args.families if split_family(f)[1]]
    for option, value in (("--extra-target", args.extra_target), ("--train-lengths", args.train_lengths)):
        if value and memory:  # the memory would retrieve a verse's own copy / read a sentence once per length
            raise ValueError(f"{option} does not go with the memory families ({', '.join(memory)}); run them apart")
    check_recipe_data_options(args)
    if args.size is None:  # the preset's dimensions: the width must split into the heads
        preset = PRESETS[args.preset]
        embed_dim = args.embed_dim or preset["embed_dim"]
        heads = args.heads or preset["heads"]
        if embed_dim % heads:
            raise ValueError(f"--embed-dim {embed_dim} is not divisible by --heads {heads}")


def main(argv=None) -> int:
    args = build_parser().parse_checked(argv, check_args)
    # fairseq's INFO lines (training progress) are wanted, in the run folder's log (experiments.progress)
    logging.getLogger().setLevel(logging.INFO)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s"))
    from reluformer_mt.plugin import register

    register()  # the models, criteria and task, and the fairseq fixes
    try:
        options = options_from_args(args, args.families)
    except ValueError as e:  # a tuned_presets.json that is not what the tuner writes
        print(f"reluformer-demo: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.seeds > 1:
        from reluformer_mt.experiments.seeds import run_demo_seeds, render

        print(render(run_demo_seeds(options, args.seeds, run_demo)))
    else:
        run_demo(options)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
