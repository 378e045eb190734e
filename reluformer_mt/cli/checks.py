"""Shared checks of the console scripts, so bad input stops with one line, never a traceback:
argparse types for counts and limits, the one ``--spm-model`` and ``--segment-tokens`` syntax,
output paths checked before any work, and write errors
(disk full, an unwritable path) turned into ``cannot write PATH: reason``.

One exit-code convention for every console script (argparse's own, which fairseq's and
sacreBLEU's command lines share): 0 success, 2 a usage or input error (a bad option, a missing
or malformed file, an output that cannot be written), 1 a failure while running (a training run
that crashed), 130 interrupted.
"""
import argparse
import logging
import math
import os
import sys
from contextlib import contextmanager
from pathlib import Path

# the one output-versus-input check of every command (below the CLIs: the library's writers use it too)
from reluformer_mt.data.outputs import check_distinct_files, check_no_repeats, folder_files, same_file  # noqa: F401


EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` shows each option's default, as fairseq's and sacreBLEU's do, but not for
    options whose default is "unset" (None, False, an empty list): those say in their help what happens then,
    nor for flags (``--no-knn``'s default of True is the kNN-MT it turns off, not the flag's)."""

    def _get_help_string(self, action):
        text = action.help or ""
        unset = (action.default is None or action.default is False or action.default == argparse.SUPPRESS
                 or (isinstance(action.default, (list, tuple)) and not action.default))  # nothing appended yet
        flag = action.nargs == 0  # store_true / store_false / store_const
        if not action.option_strings or unset or flag or "%(default)" in text or "(default" in text:
            return text
        return text + " (default: %(default)s)"


class RawDescriptionDefaultsFormatter(argparse.RawDescriptionHelpFormatter, DefaultsHelpFormatter):
    """The defaults in ``--help`` with an epilog of examples kept as written."""


def quiet_logging(level: int = logging.WARNING, fmt: str = "%(name)s: %(levelname)s: %(message)s") -> None:
    """Configure the root logger before fairseq is imported. Importing fairseq runs
    ``logging.basicConfig`` in three of its modules (one at DEBUG, which lets matplotlib print a
    hundred ``DEBUG:matplotlib`` lines, one printing a tensorboardX notice); they do nothing once
    the root logger has a handler. A host that configured logging already (pytest) keeps its own."""
    logging.basicConfig(format=fmt, level=level, stream=sys.stderr)


def import_quietly(name: str):
    """Import a module that imports fairseq (and matplotlib) without their import-time lines
    (a tensorboardX notice, matplotlib's DEBUG lines) on the console, e.g. before ``--help``."""
    import importlib

    quiet_logging()
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)
    try:
        return importlib.import_module(name)
    finally:
        logging.disable(previous)


def _number(text, cast, minimum, what):
    try:
        value = cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not (minimum <= value < math.inf):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text) -> int:
    return _number(text, int, 1, "a positive integer")


def non_negative_int(text) -> int:
    return _number(text, int, 0, "an integer >= 0")


def non_negative_float(text) -> float:
    return _number(text, float, 0.0, "a finite number >= 0")


def positive_float(text) -> float:
    """A finite number > 0 (learning rates: 0 never moves, a negative one climbs the loss)."""
    value = _number(text, float, 0.0, "a finite number > 0")
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def unit_interval(text) -> float:
    """A share or score in [0, 1] (e.g. a fuzzy-match floor: 1 keeps exact matches only)."""
    value = _number(text, float, 0.0, "a number in [0, 1]")
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def probability(text) -> float:
    """A dropout rate in [0, 1): 1 drops every unit (NaN), above 1 aborts inside torch."""
    value = _number(text, float, 0.0, "a number in [0, 1)")
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def positive_int_list(text) -> list:
    """A comma list of positive integers, e.g. ``32,256,1024``."""
    try:
        values = [positive_int(x) for x in text.split(",") if x.strip()]
    except argparse.ArgumentTypeError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma list of positive integers, got {text!r}")
    return values


def percent(text) -> float:
    """A percentage in (0, 100]."""
    value = _number(text, float, 0.0, "a percentage in (0, 100]")
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"expected a percentage in (0, 100], got {text!r}")
    return value


def percent_list(text) -> list:
    """A comma list of percentages in (0, 100], e.g. ``1,5``."""
    try:
        values = [_number(x, float, 0.0, "") for x in text.split(",") if x.strip()]
    except argparse.ArgumentTypeError:
        values = []
    if not values or not all(0 < v <= 100 for v in values):
        raise argparse.ArgumentTypeError(f"expected a comma list of percentages in (0, 100], got {text!r}")
    return values


def shell_words(text) -> list:
    """Further options quoted as one string (``--train-args``), split as a shell would."""
    import shlex

    try:
        return shlex.split(text)
    except ValueError as e:  # "No closing quotation", "No escaped character"
        raise argparse.ArgumentTypeError(f"{str(e).lower()} in {text!r}") from None


def segment_tokens(text) -> int:
    """``--segment-tokens``: a positive integer, or 'sentence' / 0 (sentence level) -> 0."""
    from reluformer_mt.data.segmentation import parse_segment_tokens

    try:
        return parse_segment_tokens(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def segment_lengths(text) -> list:
    """``--train-lengths``: comma-separated segment lengths (each as ``--segment-tokens`` reads it)."""
    parts = [part.strip() for part in str(text).split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated lengths like sentence,128,512,document, got {text!r}")
    return [segment_tokens(part) for part in parts]


def segment_length_names(text) -> list:
    """``--train-lengths`` of the demo and the tuner: checked as reluformer-prepare checks it, kept
    as the names given (they name the prepared folder)."""
    segment_lengths(text)
    return [part.strip() for part in str(text).split(",")]


class _SpmModels(argparse.Action):
    """``--spm-model MODEL`` or ``--spm-model SRC_MODEL,TGT_MODEL`` -> a tuple of one or two
    paths; the old space-separated ``SRC_MODEL TGT_MODEL`` still works, with a note."""

    def __call__(self, parser, namespace, values, option_string=None):
        from reluformer_mt.data.prepared import parse_spm_models

        if len(values) > 1:
            print(f"{parser.prog}: note: '{option_string} {' '.join(values)}' is deprecated; "
                  f"write {option_string} {','.join(values)}", file=sys.stderr)
        try:
            setattr(namespace, self.dest, parse_spm_models(values, option_string))
        except ValueError as e:
            parser.error(str(e))


def match_score_names() -> dict:
    """``MATCH_SCORES`` and ``DEFAULT_MATCH_SCORE`` of reluformer_mt/memory/score_names.py, run from
    its file: importing it as a module would import the memory package, and torch with it, before
    a bad option is answered."""
    import runpy
    from importlib.util import find_spec

    names = runpy.run_path(str(Path(find_spec("reluformer_mt").origin).parent / "memory" / "score_names.py"))
    return {"choices": names["MATCH_SCORES"], "default": names["DEFAULT_MATCH_SCORE"]}


def add_match_score_option(parser, help: str, default=True) -> None:
    """``--match-score SCORE``: how the translation memory ranks its entries (one of the names)."""
    names = match_score_names()
    parser.add_argument("--match-score", default=names["default"] if default else None, choices=names["choices"],
                        metavar="SCORE", help=f"{help} (one of {', '.join(names['choices'])})")


def add_spm_model_option(parser, default: str) -> None:
    """The one ``--spm-model`` option of every console script; ``default`` says what is used without it."""
    parser.add_argument("--spm-model", nargs="+", action=_SpmModels, metavar="MODEL[,TGT_MODEL]",
                        help=f"SentencePiece model: MODEL (joint) or SRC_MODEL,TGT_MODEL (default: {default})")


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``PROG: error: ...``, exit 2), without the
    usage block, so a bad option reads like every other error of the package."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_checked(self, argv, check):
        """Parsed arguments after ``check(args)``, whose ValueError is this parser's one-line error."""
        args = self.parse_args(argv)
        try:
            check(args)
        except ValueError as e:
            self.error(str(e))
        return args


def check_output_folder(path, option: str) -> None:
    """Refuse, before any work, an output folder that is a file, lies under a file, or whose
    nearest existing folder cannot be written (permissions, a read-only mount)."""
    p = Path(path)
    for q in (p, *p.parents):
        if q.exists():
            if not q.is_dir():
                where = "is a file" if q == p else f"lies under the file {q}"
                raise ValueError(f"{option} {path}: {where}, expected a folder")
            if not os.access(q, os.W_OK | os.X_OK):
                raise ValueError(f"{option} {path}: cannot write {q} (read-only or permission denied)")
            return


def check_input_folder(path, option: str) -> None:
    if path is not None and not Path(path).is_dir():
        raise ValueError(f"{option} {path}: no such folder")


DEVICE_HELP = "auto (CUDA when available, else the CPU), cpu, cuda or cuda:N"


def add_device_option(parser, help: str = DEVICE_HELP, choices=None) -> None:
    """The one --device of every command: default auto, as reluformer-translate's (issue 33)."""
    parser.add_argument("--device", default="auto", choices=choices, help=help)


def resolve_device(device: str, option: str = "--device") -> str:
    """``auto`` -> ``cuda`` when a CUDA device is visible, else ``cpu``; others checked as given."""
    if device == "auto":
        if no_gpu_visible():  # answered without importing torch (seconds)
            return "cpu"
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"{option}: expected auto, cpu, cuda or cuda:N, got {device!r}")
    check_device(device, option)
    return device


def check_device(device: str, option: str = "--device") -> None:
    """``cuda`` on a machine without CUDA fails before preparing and training, not after."""
    if device.startswith("cuda"):
        if no_gpu_visible():
            raise ValueError(f"{option} {device}: CUDA is not available (no GPU is visible); use {option} cpu")
        import torch

        if not torch.cuda.is_available():
            why = "torch is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
            raise ValueError(f"{option} {device}: CUDA is not available ({why}); use {option} cpu")


def check_input_file(path, option: str, what: str = "file") -> None:
    """An input file (not standard input, '-') that exists and is not a folder, checked before
    torch and fairseq are imported, so a mistyped path is answered at once."""
    if path is None or str(path) == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{option} {path}: is a directory, expected a {what}")
    if not p.exists():
        raise ValueError(f"{option} {path}: {what} not found")


def check_checkpoint_file(path) -> None:
    """The checkpoint loader's own first check (``reluformer_mt.checkpoints``), without importing
    torch: a missing checkpoint or a folder given for one."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{path}: checkpoint not found")
    if p.is_dir():
        raise ValueError(f"{path}: is a directory; give the checkpoint file (e.g. {path}/checkpoint_best.pt)")


def no_gpu_visible() -> bool:
    """True when this machine certainly has no GPU torch could use (hidden by CUDA_VISIBLE_DEVICES,
    or no NVIDIA or ROCm device file), which answers ``--device auto``'s question without importing
    torch; False: ask torch."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return True
    if not os.path.isdir("/dev"):  # not a Unix: only torch knows
        return False
    return not any(name.startswith("nvidia") or name == "kfd" for name in os.listdir("/dev"))


def check_output_file(path, option: str, creates_folders: bool = False) -> None:
    """Refuse, before any work, an output file that cannot be written: a directory, a path
    under a file, or (unless the writer ``creates_folders``) in a folder that does not exist."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{option} {path}: is a directory, expected a file name")
    folder = p.parent
    while creates_folders and not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.exists():
        raise ValueError(f"{option} {path}: folder {folder} does not exist")
    if not folder.is_dir():
        raise ValueError(f"{option} {path}: {folder} is a file, expected a folder")
    if not os.access(folder, os.W_OK) and not (p.exists() and os.access(p, os.W_OK)):
        raise ValueError(f"{option} {path}: cannot write (permission denied)")


def write_error(e: OSError, path=None) -> str:
    """One line for a failed write: the file the error names, else ``path``."""
    return f"cannot write {e.filename or path or 'an output file'}: {e.strerror or e}"


def run_command(prog: str, call, usage=(ValueError,), failure=(RuntimeError, OSError)) -> int:
    """``call()`` with the exit codes of the convention, each error one line ``PROG: error: ...``:
    bad input (``usage``) 2, a run that failed (``failure``) 1."""
    try:
        call()
    except usage as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except failure as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


@contextmanager
def writing(path):
    """Turn an OSError while writing ``path`` (disk full, I/O error) into a one-line ValueError;
    file objects raise it without a file name."""
    try:
        yield
    except OSError as e:
        raise ValueError(write_error(e, path)) from None
