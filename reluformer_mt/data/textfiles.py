"""UTF-8 text files as lines: the one reader behind corpora, translate input, BLEU, AER and the
contrastive suites.

Lines are split on ``\\n`` only (``str.splitlines`` would also split on form feeds and U+2028
inside sentences); a CRLF line end loses its ``\\r``; invalid UTF-8 is an error naming the file,
line and column. Whether a byte-order mark is dropped is the caller's choice: the corpus and
translate readers drop it, BLEU keeps it as the ``sacrebleu`` command line does.
"""
import json
from dataclasses import dataclass
from pathlib import Path
from typing import List

from reluformer_mt.data.documents import BOM


@dataclass
class DecodedLines:
    lines: List[str]
    bom_removed: bool = False
    crlf: int = 0  # lines whose \r\n end became \n


def decode_utf8(data: bytes, name) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ValueError(f"{name}:{line}: invalid UTF-8 (byte 0x{data[e.start]:02x} at column {column}); "
                         "expected UTF-8 text") from None


def decode_lines(data: bytes, name, strip_bom: bool = True) -> DecodedLines:
    """UTF-8 bytes -> lines without line ends, and what was repaired on the way."""
    text = decode_utf8(data, name)
    bom = strip_bom and text.startswith(BOM)
    lines = (text[1:] if bom else text).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    crlf = 0
    for i, line in enumerate(lines):
        if line.endswith("\r"):
            lines[i] = line[:-1]
            crlf += 1
    return DecodedLines(lines, bom, crlf)


def read_lines(path, strip_bom: bool = True, missing: str = "file not found") -> List[str]:
    """The lines of a UTF-8 file; a missing file is FileNotFoundError('PATH: ``missing``')."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {missing}")
    return decode_lines(path.read_bytes(), path, strip_bom).lines


def read_json_object(path: Path, error=ValueError, expected: str = "a JSON object", fix: str = "") -> dict:
    """The JSON object in ``path``; a file that is not JSON, or holds something else than an
    object, is one ``error`` line naming the file (``expected``: what the object is; ``fix``: what to
    do about it, appended)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise error(f"{path}: not valid JSON ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected {expected}, got {type(data).__name__}{fix}")
    return data


def replace_atomically(path, write) -> Path:
    """Write ``path`` through ``write(binary_file)`` into a temporary file beside it, then rename it
    over ``path``: a reader or a run killed half-way sees the old file or the new one, never half
    of one (issue 34). Special files (/dev/null, a FIFO) are written directly: no rename there. A
    symbolic link is replaced by the new file, never written through: what it points to (a
    checkpoint, another run's file) stays as it was."""
    import os

    path = Path(path)
    try:
        if path.exists() and not path.is_file():
            with open(path, "wb") as f:
                write(f)
            return path
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        try:
            with open(partial, "wb") as f:
                write(f)
            os.replace(partial, path)  # over a link: the link is replaced, its target untouched
        finally:
            if partial.exists():
                partial.unlink()
    except OSError as e:
        # a failed write or flush names no file (and a failed rename the temporary one): name
        # the file the caller asked for, so the error line is 'cannot write PATH', not 'None'
        if e.filename2 is None:
            e.filename = str(path)
            raise
        # a rename names two files; an OSError prints a second name set even to None ('-> None'):
        # the same error (errno's subclass) naming the file asked for alone
        raise OSError(e.errno, e.strerror, str(path)) from e
    return path


def write_text_atomically(path, text: str) -> Path:
    """:func:`replace_atomically` for UTF-8 text."""
    return replace_atomically(path, lambda f: f.write(text.encode("utf-8")))
