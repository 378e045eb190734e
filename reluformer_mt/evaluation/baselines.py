"""Trivial baselines that every reported number stands beside, so a reader can tell learning from noise.

- ``nearest_verse_translations``: translate each test sentence by copying the target side of the
  most similar training sentence (TF-IDF cosine over source words) — what memorising the
  training data without translating gets;
- ``diagonal_aer``: AER of the diagonal alignment (Och & Ney's AER of links j -> round(j * n/m)),
  which attention must beat before it can be said to align.
"""
import math
from collections import Counter, defaultdict
from typing import Dict, List, Sequence, Tuple

from reluformer_mt.evaluation import aer as aer_lib


def _tfidf_vectors(sentences: Sequence[str], idf: Dict[str, float]) -> List[Dict[str, float]]:
    vectors = []
    for sentence in sentences:
        counts = Counter(sentence.lower().split())
        vector = {w: c * idf.get(w, 0.0) for w, c in counts.items()}
        norm = math.sqrt(sum(v * v for v in vector.values())) or 1.0
        vectors.append({w: v / norm for w, v in vector.items()})
    return vectors


def nearest_verse_translations(train_src: Sequence[str], train_tgt: Sequence[str],
                               test_src: Sequence[str]) -> List[str]:
    """For each test source sentence, the training target whose source is most similar (TF-IDF cosine)."""
    if len(train_src) != len(train_tgt):
        raise ValueError(f"{len(train_src)} training sources but {len(train_tgt)} targets")
    if not train_src:
        raise ValueError("no training sentences to copy from")
    document_frequency = Counter(w for s in train_src for w in set(s.lower().split()))
    idf = {w: math.log(len(train_src) / df) + 1.0 for w, df in document_frequency.items()}
    train_vectors = _tfidf_vectors(train_src, idf)
    postings = defaultdict(list)  # word -> [(training sentence, weight)]
    for i, vector in enumerate(train_vectors):
        for w, v in vector.items():
            postings[w].append((i, v))
    copies = []
    for vector in _tfidf_vectors(test_src, idf):
        scores: Dict[int, float] = defaultdict(float)
        for w, v in vector.items():
            for i, u in postings.get(w, ()):
                scores[i] += v * u
        best = max(scores.items(), key=lambda item: (item[1], -item[0]))[0] if scores else 0
        copies.append(train_tgt[best])
    return copies


def diagonal_aer(lengths: Sequence[Tuple[int, int]], gold) -> aer_lib.AERResult:
    """AER of the diagonal alignment of each (source, target) length pair against ``gold``."""
    return aer_lib.corpus_aer([aer_lib.diagonal_alignment(n, m) for n, m in lengths], gold)


__all__ = ["diagonal_aer", "nearest_verse_translations"]
