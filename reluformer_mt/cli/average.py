"""``reluformer-average``: average the weights of the last N checkpoints of a training run
(or of the checkpoints named), as fairseq's ``scripts/average_checkpoints.py`` does.

    reluformer-average --dir checkpoints/ted --last 5 --output checkpoints/ted/checkpoint_avg5.pt
    reluformer-average --inputs a.pt b.pt c.pt --output avg.pt
"""
import sys

from reluformer_mt.cli.checks import (EXIT_OK, EXIT_USAGE, DefaultsHelpFormatter, OneLineParser, check_checkpoint_file,
                                     check_output_file)
from reluformer_mt.data.wording import counted


def build_parser():
    p = OneLineParser(prog="reluformer-average", formatter_class=DefaultsHelpFormatter,
                      description="Average the weights of several checkpoints of one model (the last N of a "
                                  "training run, or those named) into one checkpoint for translation and evaluation.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--dir", help="a fairseq --save-dir; with --last N: its N newest checkpoint_E_U.pt "
                                     "(--save-interval-updates), else its N newest checkpointE.pt")
    which.add_argument("--inputs", nargs="+", metavar="CHECKPOINT", help="the checkpoints to average")
    p.add_argument("--last", type=int, default=5, metavar="N", help="with --dir: how many of the newest checkpoints")
    p.add_argument("--output", "-o", required=True, help="the averaged checkpoint (.pt)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import logging

    # fairseq's speech task logs an install hint at import (as register() quiets it for the other commands)
    logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)
    from reluformer_mt.averaging import average_checkpoints, last_checkpoints

    try:  # the files are chosen and checked before torch loads (seconds)
        check_output_file(args.output, "--output", creates_folders=True)
        paths = last_checkpoints(args.dir, args.last) if args.dir else args.inputs
        for path in paths:
            check_checkpoint_file(path)
        done = average_checkpoints(paths, args.output)
    except (ValueError, FileNotFoundError) as e:  # CheckpointError is a ValueError
        print(f"reluformer-average: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"reluformer-average: error: cannot write {e.filename or args.output}: {e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"reluformer-average: {counted(len(done['inputs']), 'checkpoint')} ({', '.join(done['inputs'])}) averaged into "
          f"{done['output']} ({done['parameters']:,} weights; configuration of the newest, update "
          f"{done['newest_updates']:,}" + ("; its optimizer state dropped: for translation, not for resuming)"
                                           if done["optimizer_state_dropped"] else ")"), file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
