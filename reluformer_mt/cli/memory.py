"""reluformer-memory: the translation memory of a prepared directory.

    # re-key the memory with a checkpoint's learned keys (EMAT), rewrite every split's neighbours
    # and compare recall and copy-of-top-1 s-BLEU with the TF-IDF keys
    reluformer-memory rekey --checkpoint checkpoints/checkpoint_last.pt --data data-bin/bible.sentence
"""
import argparse
import json
import logging
import sys
from pathlib import Path

from reluformer_mt.cli.checks import (EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, DefaultsHelpFormatter, OneLineParser,
                                     check_distinct_files, check_output_file, positive_int)
from reluformer_mt.data.textfiles import write_text_atomically


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="reluformer-memory", description="The translation memory of a prepared directory.",
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
    r.add_argument("--device", default="cpu", help="torch device of the encoding")
    r.add_argument("--json", help="also write the comparison to this file")
    r.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    return p


def run_rekey(args) -> dict:
    from reluformer_mt.checkpoints import load_model
    from reluformer_mt.data.prepared import Prepared
    from reluformer_mt.evaluation.rekey import rekey

    data = Path(args.data)
    if args.json:  # before the neighbours are rewritten, not after
        check_output_file(args.json, "--json")
        check_distinct_files([("--json", args.json)], [("--checkpoint", args.checkpoint),
                                                       ("--data", str(Prepared.path(data)))])
    if not Prepared.exists(data):
        raise ValueError(f"--data {data}: no prepared.json (expected a directory prepared by reluformer-prepare)")
    if not Path(args.checkpoint).is_file():
        raise ValueError(f"--checkpoint {args.checkpoint}: not found")
    loaded = load_model(args.checkpoint, data, device=args.device)
    return rekey(data, loaded.model, loaded.task.source_dictionary, rerank=args.rerank, candidates=args.candidates,
                 checkpoint=args.checkpoint, max_tokens=args.max_tokens, progress=not args.quiet)


def main(argv=None) -> int:
    logging.basicConfig(format="reluformer-memory: %(levelname)s: %(message)s", level=logging.WARNING,
                        stream=sys.stderr, force=True)
    args = build_parser().parse_args(argv)
    from reluformer_mt.plugin import register

    register()
    try:
        report = run_rekey(args)
        if args.json:
            write_text_atomically(args.json, json.dumps(report, indent=1) + "\n")
    except (ValueError, FileNotFoundError) as e:
        print(f"reluformer-memory: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"reluformer-memory: error: cannot write {e.filename}: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("reluformer-memory: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    from reluformer_mt.evaluation.rekey import format_report

    print(format_report(report))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
