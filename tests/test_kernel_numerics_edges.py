"""The C++ decoding steps at the edges of float32, each against a float64 reference or the PyTorch
code they replace: the copy step where a row's copyable weight total is subnormal, the float16
memory cache beyond +-65504, a NaN key in the per-unit kNN search, a tiny --knn-temperature, and
the vector and portable exp(x) loops on NaN."""
import math
import os
import subprocess
import sys
import types

import pytest
import torch

from reluformer_mt.attention import AttentionConfig
from reluformer_mt.knn import fused as knn_fused
from reluformer_mt.knn.readout import ReadoutError, check_search_values
from reluformer_mt.knn.search import PerInputDatastores
from reluformer_mt.memory import fused as memory_fused
from reluformer_mt.memory.tm_attention import MemoryReader, copy_probabilities, sentence_copy_table

needs_kernels = pytest.mark.skipif(memory_fused.KERNEL.load() is None or knn_fused.KERNEL.load() is None,
                                   reason="C++ kernels not buildable here")


# ---------------------------------------------------------------- the copy step

def copy_reference(logits, weights, tokens, gate_logit, ignore):
    """log((1 - c) softmax(logits) + c * share) in float64, share = each token's copyable weight / total."""
    logits, weights, gate = logits.double(), weights.double(), torch.sigmoid(gate_logit.double())
    keep = torch.ones_like(tokens, dtype=torch.bool)
    for token in ignore:
        keep &= tokens.ne(token)
    w = weights * keep
    total = w.sum(-1, keepdim=True)
    copied = torch.zeros_like(logits).scatter_add_(1, tokens, w / total)
    return torch.log((1 - gate) * torch.softmax(logits, -1) + gate * copied)


@needs_kernels
@pytest.mark.parametrize("total", [1e-39, 1e-42, 1e-45])
def test_copy_step_with_a_subnormal_total_is_finite_and_right(total):
    """A row whose copyable weights sum to a subnormal number (two <s> markers, one slot far below in
    one head): c / total overflowed to inf and the copied token's log-probability was +inf."""
    vocab, slots, pad, bos = 40, 6, 1, 0
    tokens = torch.tensor([[bos, 7, 9, 7, bos, 11]])
    weights = torch.tensor([[0.5, total, 0.0, 0.0, 0.5, 0.0]])  # the markers hold all but a subnormal share
    gate_logit = torch.tensor([0.3])
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(0))
    columns, column_tokens = sentence_copy_table(tokens, (pad, bos))
    copy = {"weights": weights.view(1, 1, slots), "gate_logit": gate_logit.view(1, 1, 1), "ignore": (pad, bos),
            "table": (tokens, columns, column_tokens)}
    with torch.no_grad():
        step = copy_probabilities(logits.view(1, 1, vocab), copy, log_probs=True).view(1, vocab)
    expected = copy_reference(logits, weights, tokens, gate_logit.view(1, 1), (pad, bos))
    assert torch.isfinite(step).all() and step[0, 7] <= 0
    torch.testing.assert_close(step.double(), expected, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- the float16 memory cache

C, HEADS, SLOTS, BEAMS = 16, 2, 12, 2


def reader(cache):
    g = torch.Generator().manual_seed(1)
    dims = types.SimpleNamespace(embed_dim=C)
    cfg = types.SimpleNamespace(decoder=dims, encoder=dims, attention_dropout=0.0, dropout=0.0)
    module = MemoryReader(cfg, AttentionConfig(fn="softmax"), HEADS, step_cache_dtype=cache).eval()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=g) * 0.3)
    module.attn.set_beam_size(BEAMS)
    return module


def decode(module, x, memory):
    state, outputs = {}, []
    with torch.no_grad():
        outputs.append(module(x[:1], memory, None, incremental_state=state))
        for t in range(1, x.size(0)):
            outputs.append(module(x[t:t + 1], None, None, incremental_state=state))
    return torch.cat(outputs).double()


@needs_kernels
def test_float16_cache_beyond_its_range_falls_back_to_float32(caplog):
    """Memory keys and values beyond +-65504 became inf in the float16 cache: NaN outputs or
    finite wrong ones. That memory is kept in float32 (counted, said once): the float32 result."""
    g = torch.Generator().manual_seed(2)
    memory = torch.randn(SLOTS, BEAMS, C, generator=g).mul_(3e5)  # projected keys and values beyond 65504
    x = torch.randn(3, BEAMS, C, generator=g) * 2
    wide = reader(torch.float16)
    with caplog.at_level("WARNING"):
        out = decode(wide, x, memory)
    exact = decode(reader(torch.float32), x, memory)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, exact, rtol=1e-5, atol=1e-5)
    assert wide.cache_fallbacks == 1 and wide._laid_out[1][0].dtype == torch.float32
    assert sum("float16's range" in r.getMessage() for r in caplog.records) <= 1
    within = reader(torch.float16)  # a memory within the range is still cached in float16
    decode(within, x, memory / 1e5)
    assert within.cache_fallbacks == 0 and within._laid_out[1][0].dtype == torch.float16


# ---------------------------------------------------------------- the per-unit kNN search

@needs_kernels
@pytest.mark.parametrize("k", [3, 8])
def test_a_nan_key_is_farthest_in_the_per_unit_search(k, monkeypatch):
    """A NaN key among a unit's first k slots stalled the C++ sorted list (every comparison with
    NaN is false): the first slots came back instead of the nearest. It is now no neighbour at all,
    in the C++ search and the PyTorch one (where topk ranked NaN first)."""
    g = torch.Generator().manual_seed(3)
    keys = torch.randn(20, 8, generator=g)
    keys[1, 2] = float("nan")
    store = PerInputDatastores([[(keys, torch.arange(20), 1.0)]], batched=True)
    state = keys[15:16] + 0.01
    distances64 = ((keys.double() - state.double()) ** 2).sum(-1)
    nearest = [j for j in distances64.argsort().tolist() if j != 1][:k]
    results = [store.neighbours(state, torch.zeros(1, dtype=torch.long), k)]
    monkeypatch.setattr(knn_fused, "available", lambda *tensors: False)
    results.append(store.neighbours(state, torch.zeros(1, dtype=torch.long), k))
    for distances, values, _ in results:
        assert values[0].tolist() == nearest
        torch.testing.assert_close(distances[0].double(), distances64[nearest], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- a tiny temperature

def test_a_temperature_below_float32s_smallest_normal_is_refused():
    with pytest.raises(ReadoutError, match=r"--knn-temperature: expected a positive number of at least 1\.175e-38"):
        check_search_values({"temperature": 2e-39})
    check_search_values({"temperature": 1.2e-38})


@needs_kernels
@pytest.mark.parametrize("temperature", [1e-39, 1e-44, 1.0])
def test_kernel_softmax_readout_at_a_tiny_temperature(temperature):
    """1 / T was inf below ~2.9e-39: (nearest - d) * inf is NaN at the nearest neighbour, which then
    got no mass. At such a T the softmax is all on the nearest neighbour (float64 reference)."""
    vocab, lam = 10, 0.5
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(4))
    lprobs = torch.log_softmax(logits, -1)
    distances = torch.tensor([[2.0, 1.0, 3.0]])
    values = torch.tensor([[4, 6, 8]])
    out = lprobs.clone()
    knn_fused.mix_readout(out, None, distances, values, None, lprobs.max(-1).values, lam, "softmax", temperature,
                          1.0, 0.0)
    d = distances.double()[0]
    weights = torch.softmax((d.min() - d) / temperature, 0) if temperature >= 1e-30 else (d == d.min()).double()
    knn = torch.zeros(vocab, dtype=torch.float64).index_add_(0, values[0], weights)
    expected = torch.log((1 - lam) * lprobs.double().exp()[0] + lam * knn)
    torch.testing.assert_close(out[0].double(), expected, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- exp(x) for x <= 0 on NaN

EXP_SCRIPT = """
import torch
from reluformer_mt.knn import fused
x = torch.tensor([0.0, -1.0, float("nan"), -50.0, float("-inf"), -87.0, -100.0] * 6)
print(fused.KERNEL.load().exp_nonpositive_(x.clone()).tolist())
"""


@needs_kernels
def test_vector_and_portable_exp_agree_with_torch_on_nan():
    """The AVX2 lanes gave 0 for NaN and the portable loop NaN: both NaN now, as torch.exp; below
    float's normal range (-87.3) both give 0 by design."""
    x = torch.tensor([0.0, -1.0, float("nan"), -50.0, float("-inf"), -87.0, -100.0] * 6)
    results = {}
    for loops, switch in (("vector", {}), ("portable", {"RELUFORMER_NO_AVX2": "1"})):
        env = {**os.environ, **switch}
        run = subprocess.run([sys.executable, "-c", EXP_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
        assert run.returncode == 0, run.stderr
        results[loops] = torch.tensor(eval(run.stdout.strip().splitlines()[-1], {"nan": math.nan, "inf": math.inf}))
    expected = torch.where(x < -87.3, torch.zeros_like(x), torch.exp(x))
    for loops, got in results.items():
        assert torch.equal(got.isnan(), x.isnan()), loops
        torch.testing.assert_close(got[~x.isnan()], expected[~x.isnan()], rtol=1e-6, atol=0, msg=loops)
