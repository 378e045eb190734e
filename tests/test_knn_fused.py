"""The C++ kNN-MT step (reluformer_mt/knn/csrc/knn_step.cpp) equals the PyTorch search and mixture
it replaces: the same neighbours, the same mixed scores up to float rounding, the same counts."""
import copy

import pytest
import torch

from reluformer_mt.knn import fused, search
from reluformer_mt.knn.readout import MODEL_SHARE
from reluformer_mt.knn.search import KnnMixer, KnnOptions, PerInputDatastores

from test_guided_speed import units_of

pytestmark = pytest.mark.skipif(fused.KERNEL.load() is None, reason="C++ kernel not buildable here")


@pytest.fixture
def torch_only(monkeypatch):
    """Runs the PyTorch reference instead of the kernel inside the ``with`` block it returns."""
    class Switch:
        def __enter__(self):
            monkeypatch.setattr(fused, "available", lambda *tensors: False)

        def __exit__(self, *exc):
            monkeypatch.undo()
    return Switch()


def rows_of(seed=1, rows=20, dim=16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, dim, generator=g), torch.arange(5).repeat_interleave(4),
            torch.randint(0, 3, (rows,), generator=g))


def large_units(seed=3, sources=5, dim=16):
    """Units of 60 to 200 entries: the histogram selection (k > 32, fewer than the unit's entries)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(sources):
        sentences = []
        for _ in range(3):
            n = int(torch.randint(60, 200, (1,), generator=g))
            sentences.append((torch.randn(n, dim, generator=g), torch.randint(0, 50, (n,), generator=g), float(torch.rand(1, generator=g))))
        out.append(sentences)
    return out


@pytest.mark.parametrize("k,units", [(1, units_of()), (8, units_of()), (40, units_of()), (64, units_of()),
                                     (100, large_units())])
def test_kernel_search_finds_the_same_neighbours_in_order(k, units, torch_only):
    states, sources, sentences = rows_of()
    store = PerInputDatastores(units, batched=True)
    d1, v1, t1 = store.neighbours(states, sources, k, sentences)
    with torch_only:
        d2, v2, t2 = store.neighbours(states, sources, k, sentences)
    assert d1.shape == d2.shape == (20, min(k, store.keys.size(1)))
    assert torch.equal(v1, v2) and torch.equal(t1, t2)
    torch.testing.assert_close(d1, d2, rtol=1e-5, atol=1e-4)
    unit = store.first_unit[sources] + torch.minimum(sentences, store.n_units[sources] - 1)
    empty = store.counts[unit] == 0  # a source without entries: no neighbour at all
    assert (v1[empty] == -1).all() and torch.isinf(d1[empty]).all() and empty.any() == (k < 100)


@pytest.mark.parametrize("k,units", [(8, units_of(3)), (40, units_of(3)), (50, large_units()), (150, large_units())])
def test_unordered_search_returns_the_same_set(k, units, torch_only):
    states, sources, sentences = rows_of(2)
    store = PerInputDatastores(units, batched=True)
    store.ordered = False
    d1, v1, t1 = store.neighbours(states, sources, k, sentences)
    store.ordered = True
    with torch_only:
        d2, v2, t2 = store.neighbours(states, sources, k, sentences)
    torch.testing.assert_close(d1.sort(dim=1).values, d2, rtol=1e-5, atol=1e-4)
    assert torch.equal(v1.sort(dim=1).values, v2.sort(dim=1).values)
    assert torch.equal(t1.sort(dim=1).values, t2.sort(dim=1).values)


class Untrusted(PerInputDatastores):
    """Entries without a trust (a restricted corpus search): the mass is the read-out's alone."""

    def neighbours(self, *args, **kwargs):
        distances, values, _ = super().neighbours(*args, **kwargs)
        return distances, values, None


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("k", [5, 40])
def test_ties_go_to_the_earlier_entry(k, ordered):
    """Equal distances (a repeated key) are taken in entry order, whichever selection runs."""
    base = torch.randn(1, 8, generator=torch.Generator().manual_seed(8))
    keys = base.repeat(90, 1)
    keys[::7] += 3.0  # some farther entries
    store = PerInputDatastores([[(keys, torch.arange(90), 1.0)]], batched=True)
    store.ordered = ordered
    d, v, _ = store.neighbours(base + 0.01, torch.zeros(1, dtype=torch.long), k)
    near = [j for j in range(90) if j % 7]
    assert sorted(v[0].tolist()) == near[:k]


def step_of(seed=0, rows=20, vocab=60):
    """A beam step's log-probabilities with ruled-out tokens (padding, a forbidden EOS)."""
    g = torch.Generator().manual_seed(seed)
    lprobs = torch.log_softmax(torch.randn(rows, vocab, generator=g) * 3, dim=1)
    lprobs[:, 1] = float("-inf")
    lprobs[::3, 2] = float("-inf")
    return lprobs


def mixed_both_ways(make_mixer, lprobs, sources, eos_as, sentences, torch_only, kernel_part, monkeypatch):
    """(lprobs, stats) mixed by the kernel, then by the PyTorch reference, each by a fresh mixer from
    ``make_mixer``; asserts that the kernel's ``kernel_part`` ran once and the reference never did."""
    calls = []
    kernel = getattr(fused, kernel_part)
    monkeypatch.setattr(fused, kernel_part, lambda *a: calls.append(1) or kernel(*a))
    outputs = []
    for reference in (False, True):
        mixer, scores = make_mixer(), lprobs.clone()
        if reference:
            with torch_only:
                mixer.mix(scores, sources, 2, eos_as, sentences)
        else:
            mixer.mix(scores, sources, 2, eos_as, sentences)
        outputs.append((scores, copy.copy(mixer.stats)))
    assert calls == [1]
    (fast, fast_stats), (slow, slow_stats) = outputs
    assert torch.equal(torch.isneginf(fast), torch.isneginf(slow))
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    assert fast_stats == slow_stats and fast_stats["knn: beam steps whose best token the neighbours changed"] > 0


class Recorder:
    def __init__(self, states):
        self.states = states

    def last_states(self, rows):
        return self.states


@pytest.mark.parametrize("readout,skip,trusted", [("softmax", 1.0, True), ("relu", 1.0, True), ("softmax", 0.3, False),
                                                  ("relu", 0.5, False), ("sparsemax", 1.0, True)])
def test_kernel_mixer_equals_the_pytorch_mixer(readout, skip, trusted, torch_only, monkeypatch):
    units = units_of()
    states, sources, sentences = rows_of()
    options = KnnOptions(k=16, lam=1.0, temperature=3.0, radius=200.0, readout=readout)

    def make_mixer():
        mixer = KnnMixer(Recorder(states), options)
        mixer.skip_confident = skip
        mixer.store = PerInputDatastores(units, batched=True) if trusted else Untrusted(units, batched=True)
        return mixer

    eos_as = torch.where(sentences < 2, torch.full_like(sentences, 3), torch.full_like(sentences, 2))
    kernel_part = "mix_votes" if readout == "sparsemax" else "mix_readout"
    mixed_both_ways(make_mixer, step_of(), sources, eos_as, sentences, torch_only, kernel_part, monkeypatch)


def test_mix_votes_equals_mix_neighbours():
    from reluformer_mt.knn.readout import mix_neighbours

    g = torch.Generator().manual_seed(4)
    lprobs = step_of(4)
    values = torch.randint(-1, 60, (20, 12), generator=g)
    weights = torch.rand(20, 12, generator=g) * 0.05 * (values >= 0)
    share = 1 - weights.sum(1)
    expected = mix_neighbours(lprobs.clone(), weights, values, share)
    got = lprobs.clone()
    fused.mix_votes(got, None, weights, values, share, lprobs.amax(dim=1))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(torch.isneginf(got), torch.isneginf(expected))


def test_kernel_refuses_rows_outside_the_step():
    lprobs = step_of()
    with pytest.raises(RuntimeError, match="row index outside"):
        fused.mix_votes(lprobs, torch.tensor([0, 25]), torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.long),
                        torch.ones(2), torch.zeros(2))
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        fused.mix_votes(lprobs, None, torch.ones(20, 1), torch.full((20, 1), 99), torch.ones(20), torch.zeros(20))
    store = PerInputDatastores(units_of(), batched=True)
    with pytest.raises(RuntimeError, match="units for"):
        fused.unit_neighbours(torch.randn(3, 16), torch.zeros(2, dtype=torch.long), store.keys_t, store.norms,
                              store.counts, store.values, store.trust, 4)


def test_model_floor_is_kept():
    """lambda 1 with an exact match: the model keeps MODEL_SHARE of every row, no token becomes -inf."""
    lprobs = step_of()
    distances = torch.zeros(20, 4)
    values = torch.tensor([5, 5, 6, 7]).repeat(20, 1)
    fused.mix_readout(lprobs, None, distances, values, None, lprobs.amax(dim=1), 1.0, "softmax", 1.0, 1.0, MODEL_SHARE)
    assert torch.isfinite(lprobs[:, 3:]).all()
    torch.testing.assert_close(lprobs.exp().sum(dim=1), torch.ones(20), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("readout", ["softmax", "relu"])
def test_kernel_adaptive_mixture_equals_the_pytorch_one(readout, torch_only, monkeypatch):
    from reluformer_mt.knn.adaptive import MetaK, MetaKConfig

    torch.manual_seed(5)
    net = MetaK(MetaKConfig(k_max=8, hidden=12, readout=readout, temperature=4.0, radius=60.0, scale=20.0)).eval()
    with torch.no_grad():
        net.net[2].bias.copy_(torch.tensor([-2.0, 0.5, 0.5, 1.0, 1.0]))  # lean on the neighbours
    states, sources, sentences = rows_of(6)

    def make_mixer():
        mixer = KnnMixer(Recorder(states), KnnOptions(k=8, readout=readout))
        mixer.adaptive, mixer.store = net, Untrusted(units_of(7), batched=True)
        return mixer

    mixed_both_ways(make_mixer, step_of(6), sources, None, sentences, torch_only, "mix_adaptive", monkeypatch)
