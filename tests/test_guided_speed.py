"""The speed options of guided decoding: the batched search of per-input datastores, a corpus
datastore's probes, and the index searched every few steps with the neighbours followed between."""
import numpy as np
import pytest
import torch

from reluformer_mt.guidance import TranslationError
from reluformer_mt.guidance.knn import KnnMtOptions
from reluformer_mt.knn.continued import ContinuedSearch
from reluformer_mt.knn.datastore import Datastore, build_index
from reluformer_mt.knn.search import PerInputDatastores


def units_of(seed=0, sources=5, dim=16):
    """Per-input units of random sizes (a source of 1 to 3 sentences, one without any entry)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in range(sources):
        sentences = []
        for _ in range(1 + s % 3):
            n = 0 if s == 2 else int(torch.randint(3, 40, (1,), generator=g))
            sentences.append((torch.randn(n, dim, generator=g), torch.randint(0, 50, (n,), generator=g),
                              float(torch.rand(1, generator=g))))
        out.append(sentences)
    return out


def test_batched_per_input_search_finds_the_same_neighbours(monkeypatch):
    from reluformer_mt.knn import fused

    monkeypatch.setattr(fused, "available", lambda *tensors: False)  # the PyTorch paths (the kernel: test_knn_fused.py)
    units = units_of()
    exact, batched = PerInputDatastores(units), PerInputDatastores(units, batched=True)
    g = torch.Generator().manual_seed(1)
    sources = torch.arange(5).repeat_interleave(4)  # beam 4, rows sentence-major
    sentences = torch.randint(0, 3, (20,), generator=g)  # beams of a segment on other sentences
    states = torch.randn(20, 16, generator=g)
    (d1, v1, t1), (d2, v2, t2) = (s.neighbours(states, sources, 8, sentences) for s in (exact, batched))
    assert torch.equal(v1, v2) and torch.equal(t1, t2)
    assert torch.allclose(d1, d2, rtol=1e-5, atol=1e-4) and torch.equal(torch.isinf(d1), torch.isinf(d2))
    assert (v1[sources == 2] == -1).all()  # the source without entries has no neighbours


def datastore(tmp_path, kind: str, n=3000, dim=8, seed=0) -> Datastore:
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((n, dim)).astype(np.float32)
    values = rng.integers(0, 30, n).astype(np.int32)
    meta = {"index": build_index(kind, keys, tmp_path / "index.faiss")}
    return Datastore(tmp_path, meta, keys.astype(np.float16), values)


def test_probing_every_list_of_an_ivf_index_is_exact_search(tmp_path):
    (tmp_path / "ivf").mkdir()
    (tmp_path / "exact").mkdir()
    ivf, exact = datastore(tmp_path / "ivf", "ivf"), datastore(tmp_path / "exact", "exact")
    queries = np.random.default_rng(2).standard_normal((50, 8)).astype(np.float32)
    truth = exact.search_ids(queries, 8)[1]
    recall = {}
    for probe in (1, ivf.meta["index"]["nlist"]):
        ids = ivf.set_probe(probe).search_ids(queries, 8)[1]
        recall[probe] = np.mean([len(set(a) & set(b)) / 8 for a, b in zip(ids, truth)])
    assert recall[ivf.meta["index"]["nlist"]] == 1.0 and recall[1] < 1.0


def test_the_index_is_searched_every_n_steps_and_successors_followed_between(tmp_path):
    store = datastore(tmp_path, "exact", n=400)
    from collections import Counter

    stats = Counter()
    search = ContinuedSearch(store, 2, stats)
    # the first step: a sentence's beams have one prefix and one state
    states = torch.from_numpy(np.asarray(store.keys[[0, 0, 1]], dtype=np.float32))
    sources = torch.tensor([0, 0, 1])
    search.follow(torch.tensor([[2, 5]] * 3))  # a step of even length: every row searched
    d, v, _ = search.neighbours(states, sources, 4)
    assert torch.equal(v, torch.from_numpy(store.search(states.numpy(), 4)[1].astype(np.int64)))
    parents = search._last[(0, (2, 5))]
    voted = int(store.values[parents[0]])  # row 0 writes its nearest neighbour's token
    search.follow(torch.tensor([[2, 5, voted], [2, 5, 29 if voted != 29 else 28], [2, 5, voted]]))
    later = torch.from_numpy(np.asarray(store.keys[parents[0] + 1:parents[0] + 4], dtype=np.float32))
    d, v, _ = search.neighbours(later, sources, 4)
    followed = parents[(store.values[parents] == voted)] + 1
    assert set(search._last[(0, (2, 5, voted))][:len(followed)]) == set(followed)
    expected = ((np.asarray(store.keys[followed], dtype=np.float32) - later[0].numpy()) ** 2).sum(1)
    assert np.allclose(sorted(d[0, :len(followed)].tolist()), sorted(expected), rtol=1e-5)
    assert stats["knn: beam steps that followed their neighbours (no index search)"] >= 1
    search.follow(torch.tensor([[2, 5, voted, 1]] * 3))  # an even step: the index again
    d, v, _ = search.neighbours(states, sources, 4)
    assert torch.equal(v, torch.from_numpy(store.search(states.numpy(), 4)[1].astype(np.int64)))


@pytest.mark.parametrize("options, named", [
    (dict(memory=True, search_every=2), "--knn-search-every"), (dict(datastore="x", search_every=0), "--knn-search-every"),
    (dict(datastore="x", batched_search=True), "--knn-batched-search"), (dict(memory=True, probe=4), "--knn-probe"),
    (dict(datastore="x", probe=0), "--knn-probe"), (dict(memory=True, exact_search=True), "--knn-exact-search"),
    (dict(datastore="x", probe=4, exact_search=True), "--knn-exact-search"),
    (dict(datastore="x", search_every=1, exact_search=True), "--knn-exact-search"),
    (dict(memory=True, restrict=4), "--knn-restrict"), (dict(datastore="x", restrict=-1), "--knn-restrict"),
    (dict(datastore="x", restrict=4, probe=2), "--knn-restrict"),
    (dict(datastore="x", restrict=4, search_every=2), "--knn-restrict"),
    (dict(datastore="x", restrict=4, exact_search=True), "--knn-restrict")])
def test_speed_options_out_of_place_are_one_line_errors(options, named):
    with pytest.raises(TranslationError, match=named):
        KnnMtOptions(**options)
