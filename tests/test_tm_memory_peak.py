"""The sparse match scores' memory matrix: built in two passes, a chunk of sources at a time, with
the values of a vectorizer's fit (the same scores and ranks), and a peak that stays near the
matrix's own size (a subprocess reading a generated 20,000-unit TMX, measured by ru_maxrss)."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import DOCMT, REPO, needs_shared_data
from reluformer_mt.memory.sparse_scores import SparseSpace, _l2_rows

IWSLT = DOCMT / "IWSLT2017"


class VectorizerSpace(SparseSpace):
    """The reference: sklearn's CountVectorizer fitted on every source at once, transposed whole
    (what the space did before its two passes)."""

    def fit(self, sentences):
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
        self.matrix_t = matrix.T.tocsr()
        return self

    def counts(self, texts):
        return self.vectorizer.transform(texts).tocsr()


def real_sentences(split: str, limit: int):
    lines = (IWSLT / f"concatenated_en2de_{split}_en.txt").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and line.strip() != "<d>"][:limit]


@needs_shared_data
@pytest.mark.parametrize("name", ["tfidf-words", "tfidf-chars", "bm25-words", "bm25-chars", "bm25-pieces"])
def test_the_two_pass_matrix_equals_a_vectorizers_fit(name, request, monkeypatch):
    """Bit for bit: another rounding would reorder ties and change which match a sentence gets.
    Chunks of 300 sources (so the passes cross chunks), queries with units the memory lacks."""
    import reluformer_mt.memory.sparse_scores as sparse_scores

    monkeypatch.setattr(sparse_scores, "FIT_CHUNK", 300)
    weighting, units = name.split("-")
    pieces = None
    if units == "pieces":
        import sentencepiece

        model = sentencepiece.SentencePieceProcessor(
            model_file=str(request.getfixturevalue("prepared_doc_data")["doc"] / "spm.model"))
        pieces = lambda text: model.encode(text, out_type=str)  # noqa: E731
    sources = real_sentences("dev", 1500)
    queries = real_sentences("test", 200) + sources[:20] + ["zqxj wvvk", "Ünïcödé ÆØÅ"]
    built = SparseSpace(weighting, units, pieces).fit(sources)
    reference = VectorizerSpace(weighting, units, pieces).fit(sources)
    for part in ("indptr", "indices", "data"):
        assert np.array_equal(getattr(built.matrix_t, part), getattr(reference.matrix_t, part)), part
    assert built.matrix_t.shape == reference.matrix_t.shape and np.array_equal(built.idf, reference.idf)
    assert getattr(built, "mean_length", None) == getattr(reference, "mean_length", None)
    for exclude in (None, list(range(len(queries)))):
        for ours, theirs in zip(built.top(queries, 5, exclude), reference.top(queries, 5, exclude)):
            assert np.array_equal(ours, theirs)


PEAK_SCRIPT = """
import json, sys
import scipy.sparse  # noqa: F401  (what translation has imported anyway; not the memory's cost)
from reluformer_mt.memory.tm import Retriever, read_tmx

def status_bytes(field):
    # VmHWM, not ru_maxrss: the kernel carries the parent's resident size at the fork into ru_maxrss
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))

before = status_bytes("VmRSS")
entries = read_tmx(sys.argv[1], "en", "de")
retriever = Retriever(entries)  # the default match score
retriever.search(entries.sources[:40], 2)
matrix = retriever.space(retriever.score).matrix_t
print(json.dumps({"extra": status_bytes("VmHWM") - before, "entries": len(entries),
                  "matrix": matrix.data.nbytes + matrix.indices.nbytes + matrix.indptr.nbytes}))
"""


@needs_shared_data
def test_a_large_tmx_memory_peaks_near_its_matrix_size(tmp_path):
    """Reading a 7 MB TMX of 20,000 real units and searching it by the default score: the extra
    peak over the imports stays within twice the (units, entries) matrix plus 64 MiB. The
    vectorizer's fit took 282 MB here (the matrix: 33 MB), 96 MB now; for a 30 MB TMX the same
    bound is 360 MiB."""
    from reluformer_mt.memory.score_names import DEFAULT_MATCH_SCORE

    assert DEFAULT_MATCH_SCORE.startswith("bm25-chars")
    spec = importlib.util.spec_from_file_location("tmx_translation", REPO / "benchmarks" / "tmx_translation.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tmx = tmp_path / "memory.tmx"
    bench.write_corpus_tmx(tmx, 20_000, DOCMT)
    run = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(tmx)], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    assert measured["entries"] > 19_000
    bound = 2 * measured["matrix"] + 64 * 2 ** 20
    assert measured["extra"] <= bound, (f"the memory's extra peak {measured['extra'] / 2**20:.0f} MiB is over "
                                        f"{bound / 2**20:.0f} MiB (its matrix: {measured['matrix'] / 2**20:.0f} MiB)")
