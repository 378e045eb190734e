"""Cut documents into training segments of whole sentences (doc-to-doc training, as in
G-Transformer, Bao et al. ACL 2021; the Maruf et al. 2019 data).

Sentences are added greedily while the longer side, in tokens and counting the separators
between sentences, stays <= N. A sentence longer than N on its own becomes a segment of its own
(counted, with a warning): it is never cut. N = 0 (or ``None``) gives one sentence per segment,
the sentence-level baseline from the same data. The ``</s>`` fairseq appends is not counted, so
a model needs ``--max-source-positions``/``--max-target-positions`` >= N + 1.
"""
from typing import List, Optional, Sequence, Tuple

from reluformer_mt.data.segments import SEPARATOR, SegmentInfo, join_sentences


WHOLE_DOCUMENT = 1_000_000_000  # a segment bound no document reaches: each document is one segment


def parse_segment_tokens(value) -> int:
    """'sentence' or 0 -> 0 (sentence level); 'document' -> :data:`WHOLE_DOCUMENT`; otherwise a
    positive integer."""
    if value in (None, "sentence", "sent", "0", 0):
        return 0
    if value == "document":
        return WHOLE_DOCUMENT
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"segment length must be a positive integer, 'sentence' or 'document', got {value!r}") from None
    if n < 0:
        raise ValueError(f"segment length must be a positive integer, 'sentence' or 'document', got {value!r}")
    return n


def greedy_segments(src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: Optional[int]) -> List[Tuple[int, int]]:
    """Half-open sentence ranges [start, end) covering the document in order."""
    if len(src_lengths) != len(tgt_lengths):
        raise ValueError(f"{len(src_lengths)} source vs {len(tgt_lengths)} target sentence lengths")
    n = len(src_lengths)
    if not max_tokens:
        return [(i, i + 1) for i in range(n)]
    ranges, start, cur_src, cur_tgt = [], 0, 0, 0
    for i in range(n):
        if i == start:
            cur_src, cur_tgt = src_lengths[i], tgt_lengths[i]
            continue
        new_src, new_tgt = cur_src + 1 + src_lengths[i], cur_tgt + 1 + tgt_lengths[i]  # +1: the separator
        if max(new_src, new_tgt) <= max_tokens:
            cur_src, cur_tgt = new_src, new_tgt
        else:
            ranges.append((start, i))
            start, cur_src, cur_tgt = i, src_lengths[i], tgt_lengths[i]
    if n:
        ranges.append((start, n))
    return ranges


def segment_document(doc_id: str, src_tokens: List[List[str]], tgt_tokens: List[List[str]], max_tokens: Optional[int],
                     separator: str = SEPARATOR):
    """Tokenised sentences of one document -> (source segments, target segments, SegmentInfo list,
    number of over-long sentences). Segments are token strings joined by ``separator``."""
    src_len = [len(s) for s in src_tokens]
    tgt_len = [len(t) for t in tgt_tokens]
    ranges = greedy_segments(src_len, tgt_len, max_tokens)
    src_out, tgt_out, infos = [], [], []
    for start, end in ranges:
        src_out.append(join_sentences([" ".join(s) for s in src_tokens[start:end]], separator))
        tgt_out.append(join_sentences([" ".join(t) for t in tgt_tokens[start:end]], separator))
        infos.append(SegmentInfo(doc_id, end - start, start))
    overlong = sum(1 for a, b in zip(src_len, tgt_len) if max_tokens and max(a, b) > max_tokens)
    return src_out, tgt_out, infos, overlong
