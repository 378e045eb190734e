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
from array import array
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

UNITS = ("words", "chars", "pieces")
WEIGHTINGS = ("tfidf", "bm25")
CHAR_NGRAMS = (3, 5)
BM25_K1, BM25_B = 1.2, 0.75  # the usual defaults (Robertson & Zaragoza 2009, section 3.5)
QUERY_CHUNK = 256  # queries per sparse product: (256 x entries) dense scores at a time ...
SCORE_CELLS = 2 ** 22  # ... or fewer, so a large memory's chunk is <= 4M scores (16 MB, its ranks 32 MB)
FIT_CHUNK = 1024  # sources analysed at a time while the matrix is built (their unit ids, a few MB)


def lower_words(text: str):
    return text.lower().split()


def word_ngrams(word: str):
    """Character 3-5-grams of one lower-cased word padded by a space (as sklearn's char_wb: a word
    shorter than n gives itself padded)."""
    padded = f" {word} "
    grams = []
    for n in range(CHAR_NGRAMS[0], CHAR_NGRAMS[1] + 1):
        grams.extend(padded[i:i + n] for i in range(max(1, len(padded) - n + 1)))
    return grams


def char_ngrams(text: str):
    """Character 3-5-grams of each lower-cased word (:func:`word_ngrams`)."""
    return [gram for word in text.lower().split() for gram in word_ngrams(word)]


# the units of one lower-cased word, for the units that a text's words give one by one
WORD_UNITS = {"words": lambda word: (word,), "chars": word_ngrams}


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
    by the whole memory's scores (a sparse product per chunk of queries, no candidate cut).

    The (units, entries) matrix is built in two passes over the sources, ``FIT_CHUNK`` at a time:
    the first numbers the units and counts their document frequencies and each source's length,
    the second weights each chunk's counts and writes them straight into the matrix. Holding the
    whole count matrix, its weighted copy and the transpose at once (as a vectorizer's fit does)
    took 616 MiB at peak for the 59,825 sources of a 30 MB TMX, whose matrix is 148 MB; the values
    are the same. Word-wise units (words, character n-grams) are found once per distinct word."""

    def __init__(self, weighting: str, units: str, pieces: Optional[Callable] = None):
        self.weighting, self.units = weighting, units
        self.analyze = analyzer_of(units, pieces)

    def fit(self, sentences: Sequence[str]) -> "SparseSpace":
        self.vocabulary = {}
        words = {} if self.units in WORD_UNITS else None  # a word -> its units' first-seen ids
        df, lengths, renumber = self._count_units(sentences, words)
        n = len(sentences)
        if self.weighting == "tfidf":
            self.idf = (np.log(n / np.maximum(df, 1)) + 1.0).astype(np.float32)
        else:
            self.idf = np.log1p((n - df + 0.5) / (df + 0.5)).astype(np.float32)
            # the mean of the float32 lengths as a (sources, 1) column, as a count matrix's row sums give them
            self.mean_length = max(float(np.asmatrix(lengths.astype(np.float32)[:, None]).mean()), 1e-9)
        # (units, entries): a chunk of queries times it scores every entry
        self.matrix_t = self._weighted_transpose(sentences, df, words, renumber)
        return self

    def _first_seen_ids(self, texts: Sequence[str], words: Optional[dict]):
        """(the ids of every text's units, one text after another; each text's number of units),
        units numbered in order of first sight, new ones added to the vocabulary."""
        vocabulary, ids = self.vocabulary, array("i")
        lengths = np.zeros(len(texts), dtype=np.int64)
        for i, text in enumerate(texts):
            before = len(ids)
            if words is None:
                ids.extend([vocabulary.setdefault(unit, len(vocabulary)) for unit in self.analyze(text)])
            else:
                for word in text.lower().split():
                    found = words.get(word)
                    if found is None:
                        found = words[word] = array("i", [vocabulary.setdefault(unit, len(vocabulary))
                                                          for unit in WORD_UNITS[self.units](word)])
                    ids.extend(found)
            lengths[i] = len(ids) - before
        return np.frombuffer(ids, dtype=np.int32) if len(ids) else np.zeros(0, np.int32), lengths

    def _known_ids(self, texts: Sequence[str]):
        """(the ids of the texts' units in the vocabulary, one text after another; their number per text)."""
        ids, lengths = array("i"), np.zeros(len(texts), dtype=np.int64)
        vocabulary, units_of = self.vocabulary, WORD_UNITS.get(self.units)
        words = {}  # word and character units: each distinct word analysed once per call (words recur)
        for i, text in enumerate(texts):
            before = len(ids)
            if units_of is None:
                ids.extend([vocabulary[unit] for unit in self.analyze(text) if unit in vocabulary])
            else:
                for word in text.lower().split():
                    found = words.get(word)
                    if found is None:
                        found = words[word] = array("i", [vocabulary[unit] for unit in units_of(word) if unit in vocabulary])
                    ids.extend(found)
            lengths[i] = len(ids) - before
        return np.frombuffer(ids, dtype=np.int32) if len(ids) else np.zeros(0, np.int32), lengths

    def _count_units(self, sentences: Sequence[str], words: Optional[dict]):
        """First pass: (each unit's document frequency, each sentence's number of units, the
        first-seen id -> final id map), the vocabulary renumbered to the sorted units, as a
        vectorizer numbers them (a sparse product sums a row's units in this order)."""
        df, lengths = np.zeros(0, dtype=np.int64), np.zeros(len(sentences), dtype=np.int64)
        for start in range(0, len(sentences), FIT_CHUNK):
            ids, lengths[start:start + FIT_CHUNK] = self._first_seen_ids(sentences[start:start + FIT_CHUNK], words)
            counts = count_matrix(ids, lengths[start:start + FIT_CHUNK], len(self.vocabulary))
            df = np.pad(df, (0, len(self.vocabulary) - len(df))) + np.bincount(counts.indices,
                                                                                 minlength=len(self.vocabulary))
        if not self.vocabulary:
            raise ValueError(f"the memory's sources have no {self.units} to score")
        renumber = np.empty(len(self.vocabulary), dtype=np.int32)
        for new, unit in enumerate(sorted(self.vocabulary)):
            renumber[self.vocabulary[unit]] = new
            self.vocabulary[unit] = new
        return np.bincount(renumber, weights=df, minlength=len(df)), lengths, renumber

    def _weighted_transpose(self, sentences: Sequence[str], df: np.ndarray, words: Optional[dict],
                            renumber: np.ndarray):
        """Second pass: each chunk's weighted rows written into the (units, entries) CSR matrix,
        whose row lengths are the document frequencies (each unit's entries ascending)."""
        from scipy.sparse import csr_matrix

        nnz = int(df.sum())
        index = np.int32 if max(nnz, len(sentences)) < 2 ** 31 else np.int64
        indptr = np.zeros(len(df) + 1, dtype=index)
        np.cumsum(df.astype(index), out=indptr[1:])
        indices, data = np.empty(nnz, dtype=index), np.empty(nnz, dtype=np.float32)
        cursor = indptr[:-1].astype(np.int64)  # where each unit's next entry goes
        for start in range(0, len(sentences), FIT_CHUNK):
            chunk = sentences[start:start + FIT_CHUNK]
            if words is None:  # the vocabulary holds the final ids now
                ids, lengths = self._known_ids(chunk)
            else:  # the words' cached ids are first-seen ones
                ids, lengths = self._first_seen_ids(chunk, words)
                ids = renumber[ids]
            weights = self.weigh(count_matrix(ids, lengths, len(df)))
            rows = np.repeat(np.arange(start, start + len(lengths), dtype=index), np.diff(weights.indptr))
            order = np.argsort(weights.indices, kind="stable")  # by unit, then entry
            units = weights.indices[order]
            at = cursor[units] + np.arange(len(units)) - np.searchsorted(units, units)
            indices[at], data[at] = rows[order], weights.data[order]
            cursor += np.bincount(units, minlength=len(df))
        return csr_matrix((data, indices, indptr), shape=(len(df), len(sentences)))

    def counts(self, texts: Sequence[str]):
        """The unit counts of ``texts`` (units outside the vocabulary left out): (texts, units) float32 CSR."""
        return count_matrix(*self._known_ids(texts), len(self.vocabulary))

    def weigh(self, counts):
        """The entries' unit weights of a count matrix's rows."""
        if self.weighting == "tfidf":
            return _l2_rows(counts.multiply(self.idf).tocsr())
        return self._bm25_weights(counts)

    def queries(self, texts: Sequence[str]):
        counts = self.counts(texts)
        if self.weighting == "tfidf":
            return self.weigh(counts)
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

    def scores(self, queries) -> np.ndarray:
        """(queries, entries) dense scores of a query matrix: the C++ loop (memory/fused.py), which
        sums as scipy does without building scipy's sparse result, else scipy's product."""
        from reluformer_mt.memory import fused

        dense = fused.sparse_scores(queries, self.matrix_t)
        return (queries @ self.matrix_t).toarray() if dense is None else dense

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
        chunk = max(1, min(QUERY_CHUNK, SCORE_CELLS // entries))
        for start in range(0, len(texts), chunk):
            dense = self.scores(self.queries(list(texts[start:start + chunk])))
            if exclude is not None:
                dense[np.arange(len(dense)), np.asarray(exclude[start:start + len(dense)])] = -1.0
            best = np.argpartition(-dense, n - 1, axis=1)[:, :n] if n < entries else np.tile(np.arange(entries),
                                                                                            (len(dense), 1))
            values = np.take_along_axis(dense, best, axis=1)
            order = np.lexsort((best, -values), axis=1)  # best first, ties to the lower id
            ids[start:start + len(dense)] = np.take_along_axis(best, order, axis=1)
            scores[start:start + len(dense)] = np.take_along_axis(values, order, axis=1)
        return ids, np.clip(scores, 0.0, 1.0)


def count_matrix(ids: np.ndarray, lengths: np.ndarray, width: int):
    """The (texts, width) float32 CSR counts of unit ids given one text after another (``lengths``
    per text), each row's columns ascending."""
    from scipy.sparse import csr_matrix

    width = max(width, 1)
    rows = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    keys, counts = np.unique(rows * width + ids, return_counts=True)
    indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys // width, minlength=len(lengths)), out=indptr[1:])
    return csr_matrix((counts.astype(np.float32), (keys % width).astype(np.int32), indptr), shape=(len(lengths), width))


def _l2_rows(matrix):
    norms = np.sqrt(np.asarray(matrix.multiply(matrix).sum(1)).ravel())
    return _divide_rows(matrix, norms)


def _divide_rows(matrix, by: np.ndarray):
    from scipy.sparse import diags

    return (diags(1.0 / np.maximum(by, 1e-12).astype(np.float32)) @ matrix).tocsr().astype(np.float32)
