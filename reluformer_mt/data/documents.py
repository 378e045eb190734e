"""The ``docmt`` format (a line ``<d>`` starts each document), its one reader and its detection,
and the invisible characters around markers and sentences.

``docmt`` is the format of Maruf, Haffari & Mohammed (NAACL 2019) as used by G-Transformer; data
preparation (``reluformer-prepare --format docmt``), translation input (``reluformer-translate
--format docmt``) and evaluation files (``reluformer-eval bleu --ref-format docmt``) all read it
with :func:`read_documents` and detect it with :func:`starts_with_marker`. The rule: a ``<d>``
line starts a document; blank lines before the first ``<d>`` are dropped (and reported); any other
text before it is an error naming the line. A byte-order mark that is not at offset 0 (two files
joined with ``cat``), a zero-width space or joiner, a word joiner or a no-break space next to a
marker would otherwise hide it, and documents would merge. Such characters at the edges of a
line are removed (and counted by the caller); inside a sentence they are left alone (a zero-width
joiner is meaningful in many scripts).
"""
import re
from dataclasses import dataclass, field
from typing import List, Sequence, Tuple

DOC_MARKER = "<d>"
FORMAT = "docmt"  # the format's one name, in every tool
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


def _blank(line: str) -> bool:
    return not strip_edges(line)[0]


def starts_with_marker(lines: Sequence[str], marker: str = DOC_MARKER) -> bool:
    """The format's detection: the first non-blank line is a marker line."""
    first = next((line for line in lines if not _blank(line)), None)
    return first is not None and is_doc_marker(first, marker)


@dataclass
class MarkedDocuments:
    """What :func:`read_documents` found: per document its lines as (line number, text), marker
    lines left out and texts as given (each caller strips or keeps them as its format needs)."""

    documents: List[List[Tuple[int, str]]] = field(default_factory=list)
    marker_lines: List[int] = field(default_factory=list)   # 1-based
    dropped_blank_lines: List[int] = field(default_factory=list)  # blank lines before the first marker
    # (line number, count) of marker lines with invisible characters around them
    invisible_at_markers: List[Tuple[int, int]] = field(default_factory=list)

    def notes(self) -> List[str]:
        """One line per dropped blank line run (empty when nothing was dropped)."""
        if not self.dropped_blank_lines:
            return []
        lines = self.dropped_blank_lines
        where = f"line {lines[0]}" if len(lines) == 1 else f"lines {lines[0]}-{lines[-1]}"
        return [f"blank {where} before the first {DOC_MARKER} dropped"]


def read_documents(lines: Sequence[str], name: str, marker: str = DOC_MARKER) -> MarkedDocuments:
    """The one reader of the ``docmt`` format (see the module docstring); ``name`` is the file
    named in errors. No lines, or only blank ones, give no documents."""
    found = MarkedDocuments()
    current = None
    for i, line in enumerate(lines, 1):
        text, invisible = strip_edges(line)
        if text == marker:
            found.marker_lines.append(i)
            if invisible:
                found.invisible_at_markers.append((i, invisible))
            current = []
            found.documents.append(current)
        elif current is not None:
            current.append((i, line))
        elif not text:
            found.dropped_blank_lines.append(i)
        else:
            raise ValueError(f"{name}:{i}: expected a {marker} line to start the first document, got {line[:40]!r}")
    return found
