"""reluformer-memory: the translation memory of a prepared directory.

    # re-key the memory with a checkpoint's learned keys (EMAT), rewrite every split's neighbours
    # and compare recall and copy-of-top-1 s-BLEU with the TF-IDF keys
    reluformer-memory rekey --checkpoint checkpoints/checkpoint_last.pt --data data-bin/bible.sentence

    # kNN-MT: a datastore of the checkpoint's decoder states over its training split, its
    # description, and the search values tuned on the validation split (docs/KNN_MT.md)
    reluformer-memory datastore build --checkpoint checkpoints/checkpoint_last.pt --out knn/bible
    reluformer-memory datastore info knn/bible
    reluformer-memory tune --checkpoint checkpoints/checkpoint_last.pt --knn knn/bible --json tuned.json
"""
import argparse
import json
import logging
import sys
from pathlib import Path

from reluformer_mt.cli.checks import (DEVICE_HELP, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, DefaultsHelpFormatter,
                                     OneLineParser, add_device_option, add_match_score_option, check_distinct_files,
                                     check_input_folder, check_output_file, folder_files, positive_int, resolve_device, write_error)
from reluformer_mt.data.textfiles import write_text_atomically


def build_parser() -> argparse.ArgumentParser:
    from reluformer_mt.experiments.knn_search_tune import SEARCH_TOLERANCE  # a constant: no torch

    p = OneLineParser(prog="reluformer-memory", description="The translation memory of a prepared directory and kNN-MT datastores.",
                      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    r = sub.add_parser("rekey", formatter_class=DefaultsHelpFormatter,
                       help="rewrite the neighbours with a checkpoint's learned keys (docs/TRANSLATION_MEMORY.md)")
    r.add_argument("--checkpoint", "-c", required=True, help="fairseq checkpoint (.pt) of a reluformer model")
    r.add_argument("--data", required=True, help="directory prepared by reluformer-prepare --memory-k K (rewritten in place)")
    r.add_argument("--rerank", choices=["fuzzy", "none"], default="fuzzy",
                   help="fuzzy: the top --candidates by inner product reranked by fuzzy match; none: pure MIPS (EMAT)")
    r.add_argument("--candidates", type=positive_int, default=128, help="inner-product candidates that the fuzzy rerank sees")
    r.add_argument("--max-tokens", type=positive_int, default=8000, help="tokens per encoding batch")
    add_device_option(r, help="torch device of the encoding: " + DEVICE_HELP)
    r.add_argument("--json", help="also write the comparison to this file")
    r.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    ds = sub.add_parser("datastore", help="kNN-MT datastores (docs/KNN_MT.md)")
    ds_sub = ds.add_subparsers(dest="action", required=True, parser_class=OneLineParser)
    b = ds_sub.add_parser("build", formatter_class=DefaultsHelpFormatter,
                          help="force-decode a prepared split with a checkpoint: (decoder state -> next token) entries")
    b.add_argument("--checkpoint", "-c", required=True, help="fairseq checkpoint (.pt) of any family")
    b.add_argument("--out", "-o", required=True, help="the datastore's directory (created)")
    b.add_argument("--data", help="a directory prepared with the checkpoint's dictionaries (default: the one it was trained on)")
    b.add_argument("--split", default="train", help="the split whose target tokens become entries")
    b.add_argument("--index", choices=("auto", "exact", "hnsw", "ivf"), default="auto",
                   help="faiss index: auto = exact up to 20k entries, IVF above (docs/KNN_MT.md)")
    b.add_argument("--max-tokens", type=int, default=8000, help="tokens per force-decoding batch")
    add_device_option(b, help="torch device of the force-decoding: " + DEVICE_HELP)
    b.add_argument("--force", action="store_true", help="rebuild a datastore that is already there")
    b.add_argument("--drop-nonfinite", action="store_true",
                   help="leave out the entries whose keys hold NaN or inf (counted); without it such keys are refused")
    b.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    i = ds_sub.add_parser("info", help="what a datastore holds")
    i.add_argument("directory")
    t = sub.add_parser("tune", formatter_class=DefaultsHelpFormatter,
                       help="choose kNN-MT and translation-piece values on the validation split (never the test split)")
    t.add_argument("--checkpoint", "-c", required=True, help="fairseq checkpoint (.pt)")
    t.add_argument("--knn", metavar="DATASTORE", help="a datastore of this checkpoint (its tuned values are written back)")
    t.add_argument("--data", help="prepared directory (default: the one the checkpoint was trained on)")
    t.add_argument("--split", default="valid", help="the split tuned on (test is refused)")
    t.add_argument("--beam", type=int, default=4, help="beam of the validation decodes")
    t.add_argument("--knn-memory-k", type=int, default=8, help="matches per sentence of the per-input datastores")
    t.add_argument("--pieces-k", type=int, default=8, help="matches per sentence of translation pieces")
    t.add_argument("--no-decode", action="store_true", help="only the teacher-forced grid (seconds), no validation decodes")
    t.add_argument("--adaptive-k", type=positive_int, default=16,
                   help="with --knn: the largest k of the adaptive kNN-MT network (Zheng et al. 2021), trained on "
                        "the split and written beside the datastore (adaptive.npz); a power of two")
    t.add_argument("--search-tolerance", type=float, default=SEARCH_TOLERANCE, metavar="POINTS",
                   help="the approximate searches of the chosen kNN setting (fewer IVF probes, the index searched "
                        "every few steps, per-input datastores in one batch) are decoded too, and the fastest whose "
                        "validation s-BLEU is at most POINTS below the exact search's is chosen (0: only one that "
                        f"scores as well; default {SEARCH_TOLERANCE:g})")
    add_device_option(t, help="torch device: " + DEVICE_HELP)
    add_match_score_option(t, "how the memory ranks its matches for the pieces, the per-input datastores and TM-first "
                              "(default: the score the data directory was prepared with)", default=False)
    t.add_argument("--json", help="write the whole report (grid, decodes, chosen values) here")
    return p


def check_options(args) -> None:
    """The options and the files and folders a subcommand reads, checked before torch and fairseq
    load (seconds)."""
    if getattr(args, "checkpoint", None) and not Path(args.checkpoint).is_file():
        raise ValueError(f"--checkpoint {args.checkpoint}: not found")
    check_input_folder(getattr(args, "data", None), "--data")
    check_input_folder(getattr(args, "directory", None), "datastore")
    if args.command == "tune":
        check_input_folder(args.knn, "--knn")
        if not 0 <= args.search_tolerance < float("inf"):
            raise ValueError(f"--search-tolerance: expected s-BLEU points >= 0, got {args.search_tolerance}")
        if args.adaptive_k & (args.adaptive_k - 1):
            raise ValueError(f"--adaptive-k: expected a power of two (the network chooses among k = 1, 2, 4, ...), "
                             f"got {args.adaptive_k}")
    if getattr(args, "json", None):
        check_output_file(args.json, "--json")
    if getattr(args, "device", None):
        args.device = resolve_device(args.device)


def run_datastore(args) -> str:
    from reluformer_mt.knn.datastore import Datastore, build_datastore

    if args.action == "info":
        store = Datastore.load(args.directory, check_keys=False)
        tuned = store.meta.get("tuned", {}).get("full")
        bad = store.nonfinite_keys()
        keys = (f"\n  keys: {bad:,} of {store.size:,} hold NaN or inf; refused by --knn (rebuild it with --force "
                "--drop-nonfinite)" if bad else "\n  keys: all finite")
        return store.describe() + keys + (f"\n  tuned: {tuned}" if tuned else "\n  not tuned (reluformer-memory tune)")
    store = build_datastore(args.checkpoint, args.out, data=args.data, split=args.split, max_tokens=args.max_tokens,
                            index=args.index, device=args.device, progress=not args.quiet, force=args.force,
                            drop_nonfinite=args.drop_nonfinite)
    m = store.meta
    return (store.describe() + f"\n  built in {m['build_seconds']} s; {m['bytes'] / 2**20:.1f} MiB on disk"
            + (f"; resumed {m['resumed_shards']} finished shard(s)" if m["resumed_shards"] else "")
            + (f"; left out {m['dropped_nonfinite']:,} entries whose keys held NaN or inf"
               if m["dropped_nonfinite"] else ""))


def data_of(checkpoint, data) -> Path:
    """The data directory a command reads: ``data``, else the one the checkpoint's loader finds
    (the checkpoint is read, its model not built)."""
    from reluformer_mt.checkpoints import open_checkpoint

    return Path(data) if data else open_checkpoint(checkpoint).data.path


def run_tune(args) -> str:
    from reluformer_mt.experiments.knn_tune import TuneSettings, format_report, tune

    if args.knn:  # the tuned values and the adaptive network are written into the datastore's folder
        from reluformer_mt.knn.adaptive import FILE_NAME
        from reluformer_mt.knn.datastore import META_NAME, refuse_links

        refuse_links("--knn", Path(args.knn), [Path(args.knn) / META_NAME, Path(args.knn) / FILE_NAME])
    if args.json:  # never over what the tuning reads (the data folder's path needs the checkpoint's config)
        check_distinct_files([("--json", args.json)], [("--checkpoint", args.checkpoint)] + folder_files("--knn", args.knn))
        check_distinct_files([("--json", args.json)], folder_files("--data", data_of(args.checkpoint, args.data)))
    settings = TuneSettings(data=args.data, datastore=args.knn, split=args.split, device=args.device, beam=args.beam,
                            memory_k=args.knn_memory_k, pieces_k=args.pieces_k, decode=not args.no_decode,
                            adaptive_k=args.adaptive_k, match_score=args.match_score,
                            search_tolerance=args.search_tolerance)
    report = tune(args.checkpoint, settings, progress=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        write_text_atomically(args.json, json.dumps(report, indent=1) + "\n")
    return format_report(report)


def run_rekey(args) -> dict:
    from reluformer_mt.checkpoints import check_data_vocabulary, open_checkpoint
    from reluformer_mt.data.prepared import Prepared
    from reluformer_mt.memory.maintenance.rekey import rekey
    from reluformer_mt.memory.neighbours import MEMORY_DIR

    data = Path(args.data)
    if args.json:  # before the neighbours are rewritten, not after
        check_output_file(args.json, "--json")
        check_distinct_files([("--json", args.json)], [("--checkpoint", args.checkpoint)] + folder_files("--data", data)
                             + folder_files("--data", data / MEMORY_DIR))
    if not Prepared.exists(data):
        raise ValueError(f"--data {data}: no prepared.json (expected a directory prepared by reluformer-prepare)")
    opened = open_checkpoint(args.checkpoint, data)
    # the neighbours are rewritten from --data's pieces read with the model's dictionary: the same
    # vocabulary, checked against what the checkpoint was trained with (refused when that is not found)
    check_data_vocabulary(opened)
    loaded = opened.load(device=args.device)
    return rekey(data, loaded.model, loaded.task.source_dictionary, rerank=args.rerank, candidates=args.candidates,
                 checkpoint=args.checkpoint, max_tokens=args.max_tokens, progress=not args.quiet)


def main(argv=None) -> int:
    logging.basicConfig(format="reluformer-memory: %(levelname)s: %(message)s", level=logging.WARNING,
                        stream=sys.stderr, force=True)
    args = build_parser().parse_args(argv)
    try:
        check_options(args)
        from reluformer_mt.plugin import register

        register()
        if args.command == "datastore":
            print(run_datastore(args))
            return EXIT_OK
        if args.command == "tune":
            print(run_tune(args))
            return EXIT_OK
        report = run_rekey(args)
        if args.json:
            write_text_atomically(args.json, json.dumps(report, indent=1) + "\n")
    except (ValueError, FileNotFoundError) as e:
        print(f"reluformer-memory: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"reluformer-memory: error: {write_error(e, getattr(args, 'json', None) or getattr(args, 'data', None))}",
              file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("reluformer-memory: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    from reluformer_mt.memory.maintenance.rekey import format_report

    print(format_report(report))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
