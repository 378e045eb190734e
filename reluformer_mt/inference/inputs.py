"""Input formats of ``reluformer-translate`` and writers that keep the input's layout.

Formats (``--format``):

- ``lines``: one sentence per line, a blank line between documents. Every further blank line
  is an empty document, so the output has exactly the input's lines: one translation per
  sentence line, a blank line per blank line.
- ``docmt``: a line ``<d>`` starts each document, then one sentence per line (the format of
  Maruf et al. 2019 / G-Transformer data); an empty line inside a document is an empty sentence
  (written back empty), ``<d><d>`` an empty document.
- ``docids``: one sentence per line plus a second file (``--doc-ids``) with one document id per
  line; a document's lines are contiguous. The output has one line per input line.
- ``raw``: running text; paragraphs (blocks of non-blank lines) are split into sentences with
  pysbd (Sadvilkar & Neumann, NLP-OSS 2020). The whole input is one document unless ``<d>``
  lines start documents. The output writes each translated paragraph on one line, paragraphs
  separated by a blank line.
- ``auto`` (default): ``docmt`` when the first non-blank line is ``<d>``; ``raw`` only when the
  lines clearly are paragraphs: at least three of the first 100 non-blank lines, and more than
  half of them, hold three or more sentences (pysbd) and 40 or more words; ``lines`` otherwise
  (reading paragraphs as lines keeps the layout; reading sentence lines as raw would merge them).
  Hard-wrapped running text is not detected: give ``--format raw``.

``-`` reads standard input / writes standard output. Text must be UTF-8 (a BOM is removed, CRLF
becomes LF); invalid UTF-8 is an error naming the line. Invisible characters at the edges of a
line (a BOM not at offset 0, zero-width spaces and joiners, no-break spaces) are removed, so they
cannot hide a ``<d>`` marker, and counted in :attr:`ParsedInput.notes`.
"""
import sys
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, TextIO, Tuple

from reluformer_mt.data import textfiles
from reluformer_mt.data.documents import (DOC_MARKER, FORMAT as DOCMT, is_doc_marker, read_documents,
                                          starts_with_marker, strip_edges)

FORMATS = ("auto", "lines", DOCMT, "docids", "raw")
STDIN = "-"


@dataclass
class InputDocument:
    doc_id: str
    sentences: List[str]
    paragraphs: List[int] = field(default_factory=list)  # raw only: number of sentences of each paragraph


@dataclass
class ParsedInput:
    fmt: str
    documents: List[InputDocument]
    markers: bool = False      # raw: documents were started by <d> lines
    notes: List[str] = field(default_factory=list)
    detected: Optional[str] = None  # --format auto: why this format was chosen

    @property
    def n_sentences(self) -> int:
        return sum(len(d.sentences) for d in self.documents)


# ---------------------------------------------------------------- bytes -> lines

def read_bytes(path) -> bytes:
    if str(path) == STDIN:
        return sys.stdin.buffer.read()
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: input file not found") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, expected a text file") from None


def decode_lines(data: bytes, name: str) -> List[str]:
    """UTF-8 bytes -> lines without line ends (a BOM dropped); invalid UTF-8 is an error naming the line."""
    return textfiles.decode_lines(data, name).lines


def _blank(line: str) -> bool:
    return not strip_edges(line)[0]


def invisible_note(lines: Sequence[str]) -> List[str]:
    """The note counting invisible characters removed at line edges (none: no note)."""
    n = sum(strip_edges(line)[1] for line in lines)
    return [f"{n:,} invisible characters (BOM, zero-width, no-break space) removed at line edges"] if n else []


# ---------------------------------------------------------------- parsers

def parse_lines(lines: Sequence[str], name: str) -> ParsedInput:
    docs, current = [], []
    for line in lines:
        if _blank(line):
            docs.append(current)
            current = []
        else:
            current.append(strip_edges(line)[0])
    if lines:
        docs.append(current)
    return ParsedInput("lines", [InputDocument(f"{name}.{i}", s) for i, s in enumerate(docs)])


def parse_docmt(lines: Sequence[str], name: str) -> ParsedInput:
    """The one ``docmt`` reader (:mod:`reluformer_mt.data.documents`); sentences edge-stripped."""
    found = read_documents(lines, name)
    docs = [[strip_edges(line)[0] for _, line in doc] for doc in found.documents]
    return ParsedInput(DOCMT, [InputDocument(f"{name}.{i}", s) for i, s in enumerate(docs)], notes=found.notes())


def parse_docids(lines: Sequence[str], ids: Sequence[str], name: str, ids_name: str) -> ParsedInput:
    if len(lines) != len(ids):
        raise ValueError(f"{name} has {len(lines):,} lines but {ids_name} has {len(ids):,}; "
                         "expected one document id per sentence line")
    docs: List[InputDocument] = []
    seen = set()
    for i, (line, doc_id) in enumerate(zip(lines, ids), 1):
        doc_id = strip_edges(doc_id)[0]
        if not doc_id:
            raise ValueError(f"{ids_name}:{i}: empty document id")
        if not docs or docs[-1].doc_id != doc_id:
            if doc_id in seen:
                raise ValueError(f"{ids_name}:{i}: document {doc_id!r} continues after another document started; "
                                 "a document's lines must be contiguous")
            seen.add(doc_id)
            docs.append(InputDocument(doc_id, []))
        docs[-1].sentences.append(strip_edges(line)[0])
    return ParsedInput("docids", docs)


def splitter_languages() -> List[str]:
    """The languages pysbd splits into sentences (ISO 639-1 codes)."""
    from pysbd.languages import LANGUAGE_CODES

    return sorted(LANGUAGE_CODES)


def check_language(language: str, option: str = "--language") -> str:
    """``language`` if pysbd knows it, else a one-line error listing the ones it knows."""
    if language not in splitter_languages():
        raise ValueError(f"{option} {language}: no sentence splitter for this language; "
                         f"known: {', '.join(splitter_languages())}")
    return language


def sentence_splitter(language: str):
    """A pysbd segmenter for ``language`` (English, with a warning, when pysbd does not know it:
    a user's --language is checked before, so this is a checkpoint's own language). Made on the
    first text it splits, so a run that splits nothing (format detection on short lines) neither
    waits for pysbd nor warns."""
    segmenter = None

    def split(text: str) -> List[str]:
        nonlocal segmenter
        if segmenter is None:
            segmenter = _segmenter(language)
        return [s.strip() for s in segmenter.segment(text) if s.strip()]

    return split


def _segmenter(language: str):
    import logging

    import pysbd

    if language not in splitter_languages():
        logging.getLogger(__name__).warning("pysbd has no sentence splitter for %r: splitting with English rules "
                                            "(--language chooses one of %s)", language, ", ".join(splitter_languages()))
        language = "en"
    return pysbd.Segmenter(language=language, clean=False)


def parse_raw(lines: Sequence[str], name: str, language: str = "en") -> ParsedInput:
    split = sentence_splitter(language)
    markers = any(is_doc_marker(line) for line in lines)
    docs: List[InputDocument] = []
    current = None if markers else InputDocument(f"{name}.0", [])
    paragraph: List[str] = []

    def end_paragraph():
        if paragraph:
            sentences = split(" ".join(strip_edges(p)[0] for p in paragraph))
            current.sentences.extend(sentences)
            current.paragraphs.append(len(sentences))
            paragraph.clear()

    for i, line in enumerate(lines, 1):
        if is_doc_marker(line):
            if current is not None:
                end_paragraph()
                docs.append(current)
            current = InputDocument(f"{name}.{len(docs)}", [])
        elif _blank(line):
            if current is not None:
                end_paragraph()
        elif current is None:
            raise ValueError(f"{name}:{i}: text before the first {DOC_MARKER} line; start every document with {DOC_MARKER} or use none")
        else:
            paragraph.append(line)
    if current is not None:
        end_paragraph()
        if markers or current.sentences:
            docs.append(current)
    return ParsedInput("raw", docs, markers=markers)


# a line is a paragraph when it holds this many sentences and words (sentence-per-line corpora have a
# few multi-sentence lines, e.g. TED's 'Sie sagte: »Ehrenwort?« Ich sagte: »Ja.«', but short ones)
PARAGRAPH_SENTENCES, PARAGRAPH_WORDS, PARAGRAPH_LINES = 3, 40, 3


def detect_format_reason(lines: Sequence[str], language: str = "en", sample: int = 100) -> Tuple[str, str]:
    """(format, why) for ``--format auto``; see the module docstring for the rule."""
    text_lines = [line for line in lines if not _blank(line)]
    if not text_lines:
        return "lines", "no text"
    if starts_with_marker(text_lines):
        return DOCMT, f"the first line is {DOC_MARKER}"
    # raw only on strong evidence: reading running text as lines keeps the layout (each line is
    # translated as one long sentence, split to fit if need be), reading lines as raw would merge them
    split = sentence_splitter(language)
    probe = text_lines[:sample]
    paragraphs = sum(1 for line in probe if len(line.split()) >= PARAGRAPH_WORDS
                     and sum(1 for s in split(line) if any(c.isalnum() for c in s)) >= PARAGRAPH_SENTENCES)
    fmt = "raw" if paragraphs >= PARAGRAPH_LINES and paragraphs * 2 > len(probe) else "lines"
    return fmt, (f"{paragraphs} of {len(probe)} lines look like paragraphs "
                 f"({PARAGRAPH_SENTENCES}+ sentences, {PARAGRAPH_WORDS}+ words)")


def detect_format(lines: Sequence[str], language: str = "en", sample: int = 100) -> str:
    return detect_format_reason(lines, language, sample)[0]


def input_name(path) -> str:
    return "<stdin>" if str(path) == STDIN else str(path)


def read_text(path) -> List[str]:
    """Lines of a UTF-8 file or of stdin (``-``)."""
    return decode_lines(read_bytes(path), input_name(path))


def parse_input(lines: Sequence[str], name: str, fmt: str = "auto", doc_ids=None, language: str = "en") -> ParsedInput:
    """Parse decoded lines in format ``fmt``; ``doc_ids`` is the path of the id file (docids)."""
    if fmt not in FORMATS:
        raise ValueError(f"--format: unknown input format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if doc_ids is not None and fmt == "auto":
        fmt = "docids"
    if fmt == "docids":
        if doc_ids is None:
            raise ValueError("--format docids needs --doc-ids FILE (one document id per input line)")
        if str(doc_ids) == STDIN:
            raise ValueError("--doc-ids: give the document ids as a file, not standard input")
        parsed = parse_docids(lines, read_text(doc_ids), name, input_name(doc_ids))
        parsed.notes += invisible_note(lines)
        return parsed
    if doc_ids is not None:
        raise ValueError(f"--doc-ids goes with --format docids, not {fmt}")
    detected = None
    if fmt == "auto":
        fmt, detected = detect_format_reason(lines, language)
    if fmt == "lines":
        parsed = parse_lines(lines, name)
    elif fmt == DOCMT:
        parsed = parse_docmt(lines, name)
    else:
        parsed = parse_raw(lines, name, language)
    parsed.detected = detected
    parsed.notes += invisible_note(lines)
    return parsed


def read_input(path=STDIN, fmt: str = "auto", doc_ids=None, language: str = "en") -> ParsedInput:
    """Read and parse one input (``-`` = stdin) in format ``fmt``."""
    return parse_input(read_text(path), input_name(path), fmt, doc_ids, language)


# ---------------------------------------------------------------- writers

def render(parsed: ParsedInput, per_sentence: Sequence[Sequence[str]], one_per_line: bool = False) -> List[str]:
    """Output lines in the input's layout; ``per_sentence[d][k]`` is the text for sentence k of
    document d. ``one_per_line`` writes raw input one sentence per line (for side outputs such
    as scores), keeping the paragraph breaks."""
    if len(per_sentence) != len(parsed.documents):
        raise ValueError(f"{len(per_sentence)} translated documents for {len(parsed.documents)} input documents")
    out: List[str] = []
    for d, (doc, texts) in enumerate(zip(parsed.documents, per_sentence)):
        if len(texts) != len(doc.sentences):
            raise ValueError(f"document {doc.doc_id}: {len(texts)} outputs for {len(doc.sentences)} sentences")
        texts = [t.replace("\n", " ") for t in texts]
        if parsed.fmt == "lines":
            if d:
                out.append("")
            out.extend(texts)
        elif parsed.fmt == DOCMT:
            out.append(DOC_MARKER)
            out.extend(texts)
        elif parsed.fmt == "docids":
            out.extend(texts)
        else:  # raw
            if parsed.markers:
                out.append(DOC_MARKER)
            start = 0
            for p, n in enumerate(doc.paragraphs):
                if p:
                    out.append("")
                part = texts[start: start + n]
                if one_per_line:
                    out.extend(part)
                else:
                    out.append(" ".join(t for t in part if t))
                start += n
    return out


def write_output(parsed: ParsedInput, per_sentence: Sequence[Sequence[str]], out: TextIO, one_per_line: bool = False) -> int:
    """Write :func:`render`'s lines to ``out``; returns the number of lines."""
    lines = render(parsed, per_sentence, one_per_line)
    for line in lines:
        out.write(line + "\n")
    out.flush()
    return len(lines)


def open_output(path) -> TextIO:
    """A UTF-8 text stream for a file or standard output (``-``)."""
    if path is None or str(path) == STDIN:
        if hasattr(sys.stdout, "reconfigure"):
            sys.stdout.reconfigure(encoding="utf-8")  # a C/POSIX locale would refuse non-ASCII output
        return sys.stdout
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{path}: cannot write the output ({e.strerror})") from None
