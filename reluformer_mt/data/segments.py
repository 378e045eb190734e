"""The segment format shared by preparation, training, generation, evaluation and translation.

A document is cut into segments of whole sentences; inside a segment the sentences are joined by
the separator token, so a translated segment splits back into sentences without guessing.
Beside every binarised split, ``{split}.segments.tsv`` holds one line per example, in the
order of the binarised file (= fairseq's sample id)::

    doc_id <TAB> n_sentences <TAB> first_sentence_index

where ``first_sentence_index`` is the 0-based index of the segment's first sentence inside its
document. A prepared directory also holds ``prepared.json`` (languages, segment length,
separator, SentencePiece model file name).
"""
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

SEPARATOR = "<sep>"
METADATA_SUFFIX = ".segments.tsv"
MANIFEST_NAME = "prepared.json"


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
