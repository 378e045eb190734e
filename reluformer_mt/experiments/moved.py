"""The old command lines of the studies (``python -m reluformer_mt.experiments.NAME``): their
commands moved to :mod:`reluformer_mt.cli` (a library module cannot import its command line,
which sits above it), so the old one says where the command is instead of exiting 0 unread."""
import shlex
import sys

EXIT_USAGE = 2  # reluformer_mt.cli.checks' code of a usage error


def say_moved(module: str, command: str) -> int:
    """One line on standard error naming the command to run with the same options; exit code 2."""
    options = shlex.join(sys.argv[1:])
    print(f"python -m {module}: error: this module is a library; its command line is "
          f"'{command}{' ' + options if options else ''}'", file=sys.stderr)
    return EXIT_USAGE
