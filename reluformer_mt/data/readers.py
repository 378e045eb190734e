"""Corpus readers: every supported format becomes a list of :class:`Document` (aligned sentence pairs
with a document id), and every repair or skip is counted in a :class:`Report`.

Formats:
  - ``docmt``: line-aligned files where a line ``<d>`` starts each document (Maruf, Haffari &
    Mohammed, NAACL 2019: TED / News Commentary / Europarl as used by G-Transformer);
  - ``xml``: IWSLT / WIT3 mteval XML pairs, joined by (docid, seg id);
  - ``docids``: line-aligned sentence files plus a file with one document id per line;
  - ``doclines``: one document per line, sentences separated by a separator string;
  - ``plain``: sentence-level parallel files (each line its own document, or one document);
  - ``lines``: line-aligned files, one sentence a line, a blank line between documents: the
    layout reluformer-translate reads and writes with ``--format lines`` and reluformer-eval reads.

Policy for bad input: structural disagreement between the two sides (line counts, document
markers, sentence counts) is an error naming both files; local damage (BOM, CRLF, an empty
sentence, a talk on one side only) is repaired or skipped and counted. Invisible characters
(a BOM not at offset 0, zero-width spaces and joiners, no-break spaces) at the edges of a sentence
or around a ``<d>`` line are removed and counted (:mod:`reluformer_mt.data.documents`).
"""
import re
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from reluformer_mt.data.documents import DOC_MARKER, FORMAT as DOCMT, MarkedDocuments, read_documents, strip_edges
from reluformer_mt.data.segments import SEPARATOR
from reluformer_mt.data.textfiles import decode_lines

INVISIBLE_AT_EDGES = "invisible characters at sentence edges removed (BOM, zero-width, no-break space)"
INVISIBLE_AT_MARKERS = f"invisible characters around {DOC_MARKER} lines removed (BOM, zero-width, no-break space)"


@dataclass
class Document:
    doc_id: str
    src: List[str]
    tgt: List[str]
    # optional per-sentence extras (the bible corpus): sentence ids and gold word links
    sentence_ids: Optional[List[str]] = None
    links: Optional[List[List[Tuple[int, int]]]] = None

    def __post_init__(self):
        if len(self.src) != len(self.tgt):
            raise ValueError(f"document {self.doc_id}: {len(self.src)} source vs {len(self.tgt)} target sentences")


@dataclass
class Report:
    """Counts of what went in, what came out, and what was repaired or skipped (with reasons)."""
    counts: Counter = field(default_factory=Counter)
    repaired: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    warnings: Counter = field(default_factory=Counter)
    examples: Dict[str, List[str]] = field(default_factory=dict)
    max_examples: int = 3

    def _note(self, reason, where):
        if where is not None:
            seen = self.examples.setdefault(reason, [])
            if len(seen) < self.max_examples and str(where) not in seen:
                seen.append(str(where))

    def repair(self, reason, where=None, n=1):
        self.repaired[reason] += n
        self._note(reason, where)

    def skip(self, reason, where=None, n=1):
        self.skipped[reason] += n
        self._note(reason, where)

    def warn(self, reason, where=None, n=1):
        self.warnings[reason] += n
        self._note(reason, where)

    def _lines(self, title, counter):
        if not counter:
            return [f"{title}: none"]
        out = [f"{title}:"]
        for reason, n in sorted(counter.items()):
            where = self.examples.get(reason)
            out.append(f"  {reason}: {n:,}" + (f"  (e.g. {'; '.join(where)})" if where else ""))
        return out

    def summary(self) -> str:
        c = self.counts
        lines = ["== prepare summary =="]
        for key in c:
            lines.append(f"{key}: {c[key]:,}")
        lines += self._lines("repaired", self.repaired)
        lines += self._lines("skipped", self.skipped)
        lines += self._lines("warnings", self.warnings)
        return "\n".join(lines)


# ---------------------------------------------------------------- text files

def read_lines(path, report: Report) -> List[str]:
    """The lines of a UTF-8 text file (:mod:`reluformer_mt.data.textfiles`); a removed BOM and
    CRLF line ends are counted as repairs."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    decoded = decode_lines(path.read_bytes(), path)
    if decoded.bom_removed:
        report.repair("byte-order mark removed", path)
    if decoded.crlf:
        report.repair("CRLF line end normalised to LF", path, decoded.crlf)
    return decoded.lines


def _check_sentence(text, where):
    if SEPARATOR in text:
        raise ValueError(f"{where}: sentence contains the separator token {SEPARATOR!r}, which the segment format reserves")


def _pairs_to_document(doc_id, pairs, report) -> Optional[Document]:
    """pairs: (src, tgt, src_where, tgt_where). Drops pairs with an empty side (counted)."""
    src, tgt = [], []
    for s, t, ws, wt in pairs:
        (s, ns), (t, nt) = strip_edges(s), strip_edges(t)
        if ns or nt:
            report.repair(INVISIBLE_AT_EDGES, ws if ns else wt, ns + nt)
        _check_sentence(s, ws)
        _check_sentence(t, wt)
        if not s and not t:
            report.skip("sentence pair empty on both sides", ws)
            continue
        if not s or not t:
            report.skip("sentence empty on one side (pair dropped)", ws if not s else wt)
            continue
        src.append(s)
        tgt.append(t)
    if not src:
        report.skip("document without sentences", doc_id)
        return None
    return Document(doc_id, src, tgt)


def _check_same_count(src_path, src_n, tgt_path, tgt_n, what="lines"):
    if src_n != tgt_n:
        raise ValueError(f"{src_path} has {src_n:,} {what} but {tgt_path} has {tgt_n:,}; the two sides must be aligned")


def corpus_name(src_path, tgt_path) -> str:
    """A short name for document ids: the common prefix of the two file names."""
    a, b = Path(src_path).name, Path(tgt_path).name
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    name = a[:n].rstrip("._-")
    return name or Path(src_path).stem


# ---------------------------------------------------------------- formats

def _read_marked(lines, path, report: Report) -> MarkedDocuments:
    """One side through the one ``docmt`` reader; its repairs counted in ``report``."""
    found = read_documents(lines, str(path))
    for i, n in found.invisible_at_markers:
        report.repair(INVISIBLE_AT_MARKERS, f"{path}:{i}", n)
    if found.dropped_blank_lines:
        report.skip(f"blank line before the first {DOC_MARKER}", f"{path}:{found.dropped_blank_lines[0]}",
                    len(found.dropped_blank_lines))
    return found


def read_docmt(src_path, tgt_path, report: Report, name: Optional[str] = None) -> List[Document]:
    """Line-aligned files in the ``docmt`` format (:func:`reluformer_mt.data.documents.read_documents`:
    a line ``<d>`` starts each document, on the same lines on both sides)."""
    src_lines, tgt_lines = read_lines(src_path, report), read_lines(tgt_path, report)
    _check_same_count(src_path, len(src_lines), tgt_path, len(tgt_lines))
    name = name or corpus_name(src_path, tgt_path)
    src_docs, tgt_docs = _read_marked(src_lines, src_path, report), _read_marked(tgt_lines, tgt_path, report)
    src_marks, tgt_marks = set(src_docs.marker_lines), set(tgt_docs.marker_lines)
    if src_marks != tgt_marks:
        i = min(src_marks ^ tgt_marks)
        marked, other = (src_path, tgt_path) if i in src_marks else (tgt_path, src_path)
        raise ValueError(f"document marker {DOC_MARKER} on line {i} of {marked} but not of {other}; documents must start on the same lines")
    docs = []
    for lines in src_docs.documents:  # the same line numbers on both sides
        pairs = [(s, tgt_lines[i - 1], f"{src_path}:{i}", f"{tgt_path}:{i}") for i, s in lines]
        docs.append(_pairs_to_document(f"{name}.{len(docs)}", pairs, report))
    return [d for d in docs if d is not None]


def _read_mteval(paths, report) -> Tuple[Dict[str, Dict[str, str]], Dict[str, str]]:
    """docid -> {seg id -> text} over one side's XML files, and docid -> file."""
    docs, where = {}, {}
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: file not found")
        raw = path.read_bytes()
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw[: e.start].count(b"\n") + 1
            raise ValueError(f"{path}:{line}: invalid UTF-8; expected UTF-8 XML") from None
        try:
            root = ET.fromstring(raw)
        except ET.ParseError as e:
            raise ValueError(f"{path}: not well-formed XML ({e})") from None
        for doc in root.iter("doc"):
            docid = doc.get("docid")
            if docid is None:
                raise ValueError(f"{path}: <doc> without a docid attribute")
            if docid in docs:
                raise ValueError(f"{path}: document {docid} already read from {where[docid]}")
            segs = {}
            for seg in doc.iter("seg"):
                sid = seg.get("id")
                if sid is None or sid in segs:
                    raise ValueError(f"{path}: document {docid}: <seg> with a missing or repeated id {sid!r}")
                segs[sid] = "".join(seg.itertext())
            docs[docid], where[docid] = segs, str(path)
    return docs, where


def _skip_one_sided(report: Report, reason: str, keys, other, where) -> list:
    """The keys (talks or segments) of one side that the other side has too, in order; each one
    missing there is skipped and counted under ``reason`` (``where(key)``: the place it names)."""
    both = []
    for key in keys:
        if key in other:
            both.append(key)
        else:
            report.skip(reason, where(key))
    return both


def read_mteval_xml(src_paths: Sequence, tgt_paths: Sequence, report: Report) -> List[Document]:
    """IWSLT / WIT3 mteval XML, joined by (docid, seg id); the source side's document order.

    A talk present on one side only, or a segment id on one side only, is skipped and counted.
    """
    src_docs, src_where = _read_mteval(src_paths, report)
    tgt_docs, tgt_where = _read_mteval(tgt_paths, report)
    _skip_one_sided(report, "talk present on the target side only", tgt_docs, src_docs,
                    lambda docid: f"docid {docid} in {tgt_where[docid]}")
    docs = []
    for docid, segs in src_docs.items():
        if docid not in tgt_docs:
            report.skip("talk present on the source side only", f"docid {docid} in {src_where[docid]}")
            continue
        tsegs = tgt_docs[docid]
        _skip_one_sided(report, "segment present on the target side only", tsegs, segs,
                        lambda sid: f"docid {docid} seg {sid}")
        pairs = [(segs[sid], tsegs[sid], f"{src_where[docid]} docid {docid} seg {sid}",
                  f"{tgt_where[docid]} docid {docid} seg {sid}")
                 for sid in _skip_one_sided(report, "segment present on the source side only", segs, tsegs,
                                            lambda sid: f"docid {docid} seg {sid}")]
        doc = _pairs_to_document(docid, pairs, report)
        if doc is not None:
            docs.append(doc)
    return docs


def read_docids(src_path, tgt_path, ids_path, report: Report) -> List[Document]:
    """Line-aligned sentence files plus one document id per line; a document's lines are contiguous."""
    src_lines, tgt_lines = read_lines(src_path, report), read_lines(tgt_path, report)
    ids = [i.strip() for i in read_lines(ids_path, report)]
    _check_same_count(src_path, len(src_lines), tgt_path, len(tgt_lines))
    _check_same_count(src_path, len(src_lines), ids_path, len(ids))
    docs, order, finished = {}, [], set()
    for i, (s, t, d) in enumerate(zip(src_lines, tgt_lines, ids), 1):
        if not d:
            raise ValueError(f"{ids_path}:{i}: empty document id")
        if d in finished:
            raise ValueError(f"{ids_path}:{i}: document {d!r} continues after another document started; a document's lines must be contiguous")
        if order and order[-1] != d:
            finished.add(order[-1])
        if d not in docs:
            docs[d] = []
            order.append(d)
        docs[d].append((s, t, f"{src_path}:{i}", f"{tgt_path}:{i}"))
    return [doc for d in order if (doc := _pairs_to_document(d, docs[d], report)) is not None]


def read_doclines(src_path, tgt_path, report: Report, separator: str = SEPARATOR, name: Optional[str] = None) -> List[Document]:
    """One document per line on both sides, sentences separated by ``separator``."""
    src_lines, tgt_lines = read_lines(src_path, report), read_lines(tgt_path, report)
    _check_same_count(src_path, len(src_lines), tgt_path, len(tgt_lines))
    name = name or corpus_name(src_path, tgt_path)
    docs = []
    for i, (s, t) in enumerate(zip(src_lines, tgt_lines), 1):
        ss, ts = s.split(separator), t.split(separator)
        if len(ss) != len(ts):
            raise ValueError(f"line {i}: {src_path} has {len(ss)} sentences but {tgt_path} has {len(ts)}; documents must have the same number of sentences")
        doc = _pairs_to_document(f"{name}.{i - 1}", [(a, b, f"{src_path}:{i}", f"{tgt_path}:{i}") for a, b in zip(ss, ts)], report)
        if doc is not None:
            docs.append(doc)
    return docs


def read_plain(src_path, tgt_path, report: Report, one_document: bool = False, name: Optional[str] = None) -> List[Document]:
    """Sentence-level parallel files: each line its own document, or the whole file one document."""
    src_lines, tgt_lines = read_lines(src_path, report), read_lines(tgt_path, report)
    _check_same_count(src_path, len(src_lines), tgt_path, len(tgt_lines))
    name = name or corpus_name(src_path, tgt_path)
    pairs = [(s, t, f"{src_path}:{i}", f"{tgt_path}:{i}") for i, (s, t) in enumerate(zip(src_lines, tgt_lines), 1)]
    if one_document:
        doc = _pairs_to_document(name, pairs, report)
        return [doc] if doc is not None else []
    return [doc for i, p in enumerate(pairs) if (doc := _pairs_to_document(f"{name}.{i}", [p], report)) is not None]


def read_blank_separated(src_path, tgt_path, report: Report, name: Optional[str] = None) -> List[Document]:
    """Line-aligned files with a blank line between documents, on the same lines on both sides
    (reluformer-translate's ``lines`` layout: each further blank line is an empty document, which
    is skipped and counted)."""
    src_lines, tgt_lines = read_lines(src_path, report), read_lines(tgt_path, report)
    _check_same_count(src_path, len(src_lines), tgt_path, len(tgt_lines))
    name = name or corpus_name(src_path, tgt_path)
    documents, pairs = [], []
    for i, (s, t) in enumerate(zip(src_lines, tgt_lines), 1):
        src_blank, tgt_blank = not strip_edges(s)[0], not strip_edges(t)[0]
        if src_blank != tgt_blank:
            blank, other = (src_path, tgt_path) if src_blank else (tgt_path, src_path)
            raise ValueError(f"line {i} is blank in {blank} but not in {other}; documents must end on the same lines")
        if src_blank:
            documents.append(pairs)
            pairs = []
        else:
            pairs.append((s, t, f"{src_path}:{i}", f"{tgt_path}:{i}"))
    if src_lines:  # the text after the last blank line (as reluformer-translate reads it)
        documents.append(pairs)
    docs = [_pairs_to_document(f"{name}.{k}", p, report) for k, p in enumerate(documents)]
    return [d for d in docs if d is not None]


LINES = "lines"
FORMATS = (DOCMT, "xml", "docids", "doclines", "plain", "plain-onedoc", LINES)


def read_corpus(fmt: str, files: Sequence[str], report: Report, separator: str = SEPARATOR) -> List[Document]:
    """Dispatch on the format name. ``files``: source, target (and doc ids for ``docids``);
    for ``xml`` each of source and target may be a comma-separated list of files."""
    need = 3 if fmt == "docids" else 2
    if len(files) != need:
        raise ValueError(f"format {fmt!r} takes {need} files (source, target{', doc ids' if need == 3 else ''}), got {len(files)}: {list(files)}")
    if fmt == DOCMT:
        docs = read_docmt(files[0], files[1], report)
    elif fmt == "xml":
        docs = read_mteval_xml(files[0].split(","), files[1].split(","), report)
    elif fmt == "docids":
        docs = read_docids(files[0], files[1], files[2], report)
    elif fmt == "doclines":
        docs = read_doclines(files[0], files[1], report, separator=separator)
    elif fmt == LINES:
        docs = read_blank_separated(files[0], files[1], report)
    elif fmt in ("plain", "plain-onedoc"):
        docs = read_plain(files[0], files[1], report, one_document=fmt == "plain-onedoc")
    else:
        raise ValueError(f"unknown input format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return docs


def normalise_space(text: str) -> str:
    """Collapse runs of whitespace (for comparing texts from different sources)."""
    return re.sub(r"\s+", " ", text).strip()
