"""The document marker and the invisible characters around markers and sentences.

One definition for every reader that recognises a ``<d>`` line (data preparation, the
translate input formats, the BLEU reader). A byte-order mark that is not at offset 0 (two files
joined with ``cat``), a zero-width space or joiner, a word joiner or a no-break space next to a
marker would otherwise hide it, and documents would merge. Such characters at the edges of a
line are removed (and counted by the caller); inside a sentence they are left alone (a zero-width
joiner is meaningful in many scripts).
"""
import re
from typing import Tuple

DOC_MARKER = "<d>"
BOM = "\ufeff"
# invisible characters that str.strip() keeps (except NBSP, which it strips silently): removed at line edges
INVISIBLE = BOM + "\u200b\u200c\u200d\u2060\u00a0"
_EDGES = re.compile(rf"^[\s{INVISIBLE}]+|[\s{INVISIBLE}]+$")


def strip_edges(text: str) -> Tuple[str, int]:
    """``text`` without whitespace and invisible characters at both ends, and how many invisible
    characters (BOM, zero-width space/joiners, word joiner, no-break space) were removed."""
    removed = 0

    def cut(m):
        nonlocal removed
        removed += sum(1 for c in m.group(0) if c in INVISIBLE)
        return ""

    return _EDGES.sub(cut, text), removed


def is_doc_marker(line: str, marker: str = DOC_MARKER) -> bool:
    """Whether ``line`` is a document marker line, invisible characters around it ignored."""
    return strip_edges(line)[0] == marker
