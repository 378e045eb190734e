"""Outputs never equal to inputs: the one check of every command and library function that writes
(translate, eval, average, the memory commands, the report tools), comparing files as files.
A ValueError (one line naming both options) before any work; the CLIs print it and exit 2."""
import os
from pathlib import Path


def same_file(a, b) -> bool:
    """Whether two paths name one file (a symlink, './x' and x included)."""
    pa, pb = Path(a), Path(b)
    try:
        if pa.exists() and pb.exists():
            return os.path.samefile(pa, pb)
    except OSError:
        pass
    return pa.resolve() == pb.resolve()


def _named(files) -> list:
    return [(o, p) for o, p in files if p and str(p) != "-"]


def folder_files(option: str, folder) -> list:
    """(option, file) of every file directly in ``folder`` (none when it is not a folder): the
    inputs of a command that reads a directory (a prepared directory, a datastore)."""
    if not folder or not Path(folder).is_dir():
        return []
    return [(option, str(f)) for f in sorted(Path(folder).iterdir()) if f.is_file()]


def check_distinct_files(outputs, inputs) -> None:
    """The one check of every command that writes: refuse, before any work, an output that is one
    of the command's inputs (writing it would destroy what is being read: a report over its
    checkpoint) or another output (one would replace the other). Compared as files, so './a/../x',
    a symlink or a hard link to x is x. ``outputs`` and ``inputs``: (option, path) pairs; None
    paths and standard streams ('-') are left out."""
    outputs, inputs = _named(outputs), _named(inputs)
    for i, (option, path) in enumerate(outputs):
        for other, other_path in outputs[:i]:
            if same_file(path, other_path):
                raise ValueError(f"{option} {path}: the same file as {other} {other_path}; give each output its own file")
        for other, other_path in inputs:
            if same_file(path, other_path):
                raise ValueError(f"{option} {path}: the same file as the input {other} {other_path}; "
                                 "writing it would overwrite what the command reads")


def check_no_repeats(inputs, why: str) -> None:
    """Refuse an input given twice (as files, as :func:`check_distinct_files` compares them):
    ``why`` says what repeating it would do (count double in an average or an ensemble)."""
    inputs = _named(inputs)
    for i, (option, path) in enumerate(inputs):
        for other, other_path in inputs[:i]:
            if same_file(path, other_path):
                raise ValueError(f"{option} {path}: the same file as {other} {other_path}; {why}")
