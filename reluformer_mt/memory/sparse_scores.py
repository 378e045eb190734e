"""Sparse bag-of-units match scores, searched exhaustively: TF-IDF cosine (Salton & Buckley 1988)
and Okapi BM25 (Robertson & Zaragoza 2009, "The Probabilistic Relevance Framework: BM25 and
Beyond") over the words, the character 3-5-grams or the SentencePiece pieces of the sources.

A word-level edit distance makes every inflected form (Greek λόγος / λόγου) a whole word apart;
bags of character n-grams or subword pieces share most of an inflected word's units, and their
idf weights let the rare words two verses share outweigh the particles every verse has. The
nearest-verse baseline (:func:`reluformer_mt.evaluation.baselines.nearest_verse_translations`) is
TF-IDF cosine over words: the same weights as ``tfidf-words`` (raw tf, idf = ln(N / df) + 1).

Both scores are in [0, 1], 1 for an identical source, so the fuzzy bands and a TM-first threshold
apply to them: TF-IDF is a cosine of non-negative vectors; BM25 is divided by the query's score
against itself (taken as an entry of its own length), and an entry that repeats the query's units
more often than the query does is clipped to 1.
"""
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

UNITS = ("words", "chars", "pieces")
WEIGHTINGS = ("tfidf", "bm25")
CHAR_NGRAMS = (3, 5)
BM25_K1, BM25_B = 1.2, 0.75  # the usual defaults (Robertson & Zaragoza 2009, section 3.5)
QUERY_CHUNK = 256  # queries per sparse product: (256 x entries) dense scores at a time


def lower_words(text: str):
    return text.lower().split()


def char_ngrams(text: str):
    """Character 3-5-grams of each lower-cased word padded by a space (as sklearn's char_wb)."""
    grams = []
    low, high = CHAR_NGRAMS
    for word in text.lower().split():
        padded = f" {word} "
        for n in range(low, high + 1):
            grams.extend(padded[i:i + n] for i in range(max(1, len(padded) - n + 1)))
    return grams


def analyzer_of(units: str, pieces: Optional[Callable] = None) -> Callable:
    if units == "words":
        return lower_words
    if units == "chars":
        return char_ngrams
    if pieces is None:
        raise ValueError("the pieces units need a SentencePiece model (Retriever(..., sentencepiece=...))")
    return lambda text: pieces(text.lower())


class SparseSpace:
    """The memory's sources as sparse unit vectors; :meth:`top` gives each query's best entries
    by the whole memory's scores (a sparse product per chunk of queries, no candidate cut)."""

    def __init__(self, weighting: str, units: str, pieces: Optional[Callable] = None):
        self.weighting, self.units = weighting, units
        self.analyze = analyzer_of(units, pieces)

    def fit(self, sentences: Sequence[str]) -> "SparseSpace":
        from sklearn.feature_extraction.text import CountVectorizer

        self.vectorizer = CountVectorizer(analyzer=self.analyze, dtype=np.float32)
        counts = self.vectorizer.fit_transform(sentences).tocsr()
        n = counts.shape[0]
        df = np.bincount(counts.indices, minlength=counts.shape[1]).astype(np.float64)
        if self.weighting == "tfidf":
            self.idf = (np.log(n / np.maximum(df, 1)) + 1.0).astype(np.float32)
            matrix = _l2_rows(counts.multiply(self.idf).tocsr())
        else:
            self.idf = np.log1p((n - df + 0.5) / (df + 0.5)).astype(np.float32)
            self.mean_length = max(float(counts.sum(1).mean()), 1e-9)
            matrix = self._bm25_weights(counts)
        self.matrix_t = matrix.T.tocsr()  # (units, entries): a chunk of queries times it scores every entry
        return self

    def queries(self, texts: Sequence[str]):
        counts = self.vectorizer.transform(texts).tocsr()
        if self.weighting == "tfidf":
            return _l2_rows(counts.multiply(self.idf).tocsr())
        # BM25 counts each query unit once; the query against itself is its score's unit
        own = np.asarray(self._bm25_weights(counts).sum(1)).ravel()
        counts.data[:] = 1.0
        return _divide_rows(counts, own)

    def _bm25_weights(self, counts):
        """idf x (k1 + 1) tf / (tf + k1 (1 - b + b length / mean length)) of each row's units."""
        lengths = np.asarray(counts.sum(1)).ravel()
        norm = BM25_K1 * (1 - BM25_B + BM25_B * lengths / self.mean_length)
        tf = counts.copy()
        tf.data = tf.data * (BM25_K1 + 1) / (tf.data + np.repeat(norm, np.diff(tf.indptr)))
        return tf.multiply(self.idf).tocsr().astype(np.float32)

    def top(self, texts: Sequence[str], n: int, exclude: Optional[Sequence[int]] = None
            ) -> Tuple[np.ndarray, np.ndarray]:
        """(ids, scores) of each query's ``n`` best entries, best first (ties: the lower id);
        ``exclude[i]`` is never returned for query i."""
        entries = self.matrix_t.shape[1]
        n = max(0, min(n, entries - (1 if exclude is not None else 0)))
        ids = np.full((len(texts), n), -1, dtype=np.int64)
        scores = np.zeros((len(texts), n), dtype=np.float32)
        if n == 0:
            return ids, scores
        for start in range(0, len(texts), QUERY_CHUNK):
            dense = (self.queries(list(texts[start:start + QUERY_CHUNK])) @ self.matrix_t).toarray()
            if exclude is not None:
                dense[np.arange(len(dense)), np.asarray(exclude[start:start + len(dense)])] = -1.0
            best = np.argpartition(-dense, n - 1, axis=1)[:, :n] if n < entries else np.tile(np.arange(entries),
                                                                                            (len(dense), 1))
            values = np.take_along_axis(dense, best, axis=1)
            order = np.lexsort((best, -values), axis=1)  # best first, ties to the lower id
            ids[start:start + len(dense)] = np.take_along_axis(best, order, axis=1)
            scores[start:start + len(dense)] = np.take_along_axis(values, order, axis=1)
        return ids, np.clip(scores, 0.0, 1.0)


def _l2_rows(matrix):
    norms = np.sqrt(np.asarray(matrix.multiply(matrix).sum(1)).ravel())
    return _divide_rows(matrix, norms)


def _divide_rows(matrix, by: np.ndarray):
    from scipy.sparse import diags

    return (diags(1.0 / np.maximum(by, 1e-12).astype(np.float32)) @ matrix).tocsr().astype(np.float32)
