"""The segment format shared by preparation, training, generation, evaluation and translation.

A document is cut into segments of whole sentences; inside a segment the sentences are joined by
the separator token, so a translated segment splits back into sentences without guessing.
Beside every binarised split, ``{split}.segments.tsv`` holds one line per example, in the
order of the binarised file (= fairseq's sample id)::

    doc_id <TAB> n_sentences <TAB> first_sentence_index

where ``first_sentence_index`` is the 0-based index of the segment's first sentence inside its
document. A prepared directory also holds ``prepared.json`` (languages, segment length,
separator, SentencePiece model file names), owned by :mod:`reluformer_mt.data.prepared`.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

SEPARATOR = "<sep>"
METADATA_SUFFIX = ".segments.tsv"


@dataclass(frozen=True)
class SegmentInfo:
    doc_id: str
    n_sentences: int
    first_sentence: int


def join_sentences(sentences: List[str], separator: str = SEPARATOR) -> str:
    """Join the (already tokenised) sentences of one segment with the separator token."""
    return f" {separator} ".join(s.strip() for s in sentences)


def split_segment(text: str, separator: str = SEPARATOR, expected: Optional[int] = None) -> List[str]:
    """Split a (translated) segment back into sentences.

    Raises ValueError when ``expected`` is given and the count differs, so callers decide how
    to repair (nothing is padded or merged here).
    """
    parts = [p.strip() for p in text.split(separator)]
    if expected is not None and len(parts) != expected:
        raise ValueError(f"segment splits into {len(parts)} sentences, expected {expected}")
    return parts


MISMATCH_POLICIES = ("error", "keep", "fit")


def fit_count(parts: List[str], n: int) -> List[str]:
    """Exactly ``n`` sentences: extra parts merge into the last one, missing ones are empty (the
    usual convention for s-BLEU of doc-to-doc output)."""
    if len(parts) > n:
        parts = parts[: n - 1] + [" ".join(parts[n - 1:])]
    return parts + [""] * (n - len(parts))


def segments_to_documents(texts: Sequence[str], segments: Sequence[SegmentInfo], separator: str = SEPARATOR,
                          on_mismatch: str = "error") -> Dict[str, List[str]]:
    """Split segments (``texts[k]`` is the text of ``segments[k]``) back into the sentences of
    each document; documents in first-appearance order.

    ``on_mismatch`` says what a segment that splits into another number of sentences than its
    metadata does:

    - ``"error"``: ValueError naming the document, the segment and both counts; the segments of
      a document must also come in order, without gaps;
    - ``"keep"``: its parts are kept as they are (the document's sentence count then differs,
      its text still serves d-BLEU);
    - ``"fit"``: :func:`fit_count` makes it exactly its metadata's count.

    With ``keep`` and ``fit`` a document's segments are put in sentence order.
    """
    if on_mismatch not in MISMATCH_POLICIES:
        raise ValueError(f"on_mismatch must be one of {', '.join(MISMATCH_POLICIES)}, got {on_mismatch!r}")
    if len(texts) != len(segments):
        raise ValueError(f"{len(texts)} segment texts but {len(segments)} segment metadata entries")
    pieces: Dict[str, list] = {}
    for k, (text, seg) in enumerate(zip(texts, segments)):
        parts = split_segment(text, separator)
        done = pieces.setdefault(seg.doc_id, [])
        if on_mismatch == "error":
            _check_in_order(k, seg, sum(len(p) for _, p in done))
            if len(parts) != seg.n_sentences:
                raise ValueError(f"document {seg.doc_id!r}: segment {k} (sentence {seg.first_sentence}) splits into "
                                 f"{len(parts)} sentences, but the segment metadata has {seg.n_sentences}")
        elif on_mismatch == "fit":
            parts = fit_count(parts, seg.n_sentences)
        done.append((seg.first_sentence, parts))
    return {doc: [s for _, parts in sorted(done, key=lambda p: p[0]) for s in parts] for doc, done in pieces.items()}


def _check_in_order(k: int, seg: SegmentInfo, expected_first: int) -> None:
    if seg.first_sentence != expected_first:
        raise ValueError(f"segment {k}: document {seg.doc_id!r} segment starts at sentence {seg.first_sentence}, "
                         f"expected {expected_first} (segments of a document must be in order)")


def metadata_path(data_dir, split: str) -> Path:
    return Path(data_dir) / f"{split}{METADATA_SUFFIX}"


def write_segment_metadata(path, segments: List[SegmentInfo]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for seg in segments:
            if "\t" in seg.doc_id or "\n" in seg.doc_id:
                raise ValueError(f"document id {seg.doc_id!r} contains a tab or newline")
            f.write(f"{seg.doc_id}\t{seg.n_sentences}\t{seg.first_sentence}\n")


def read_segment_metadata(path) -> List[SegmentInfo]:
    segments = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 3:
                raise ValueError(f"{path}:{line_no}: expected 'doc_id<TAB>n_sentences<TAB>first_sentence', got {line.rstrip()!r}")
            try:
                segments.append(SegmentInfo(fields[0], int(fields[1]), int(fields[2])))
            except ValueError:
                raise ValueError(f"{path}:{line_no}: n_sentences and first_sentence must be integers, got {line.rstrip()!r}") from None
    return segments
