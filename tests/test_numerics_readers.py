"""Numerics of the memory readers, the copy distribution, a float16 learned gamma and the kNN
read-outs at their edges, each against a float64 formula written here: a sentence without
matches (its memory row all padding), a copy mass below 1e-9, log gamma across [-11, 11] in
float16, and neighbour distances whose logits -d / T leave float32's range."""
import math
import types

import numpy as np
import pytest
import torch

from reluformer_mt.attention import AttentionConfig, ReluformerAttention
from reluformer_mt.attention.functions import ATTENTION_FUNCTIONS
from reluformer_mt.knn.readout import knn_probabilities, mix_log_probs, neighbour_weights
from reluformer_mt.memory.tm_attention import MemoryReader, copy_probabilities, sentence_copy_table

C, HEADS = 8, 2


# ---------------------------------------------------------------- memory readers, a row without matches

def reader(fn="softmax"):
    torch.manual_seed(0)
    dims = types.SimpleNamespace(embed_dim=C)
    cfg = types.SimpleNamespace(decoder=dims, encoder=dims, attention_dropout=0.0, dropout=0.0)
    module = MemoryReader(cfg, AttentionConfig(fn=fn), HEADS).eval()
    with torch.no_grad():  # a gate that lets the reader's output through, and an output bias to see
        module.gate.bias.fill_(2.0)
        module.attn.out_proj.bias.uniform_(-1, 1)
    return module


def softmax_reader_by_formula(module, x, memory, padding):
    """y = x + g * Attn(LN(x), memory), softmax per head over the visible slots, zero weights for a
    row without any, in float64 from the module's parameters."""
    p = {name: t.double() for name, t in module.named_parameters()}
    x, memory = x.double(), memory.double()
    h = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    h = h * p["layer_norm.weight"] + p["layer_norm.bias"]
    d = C // HEADS

    def project(t, name):  # (L, B, C) -> (B, H, L, d)
        y = t @ p[f"attn.{name}.weight"].T + p[f"attn.{name}.bias"]
        return y.view(t.size(0), t.size(1), HEADS, d).permute(1, 2, 0, 3)

    q, k, v = project(h, "q_proj") * d ** -0.5, project(memory, "k_proj"), project(memory, "v_proj")
    scores = q @ k.transpose(-1, -2)
    keep = ~padding[:, None, None, :]
    top = scores.masked_fill(~keep, -math.inf).amax(-1, keepdim=True)
    e = torch.exp(torch.where(keep, scores - torch.where(torch.isfinite(top), top, 0.0), -math.inf))
    total = e.sum(-1, keepdim=True)
    weights = torch.where(total > 0, e / torch.where(total > 0, total, 1.0), 0.0)
    ctx = (weights @ v).permute(2, 0, 1, 3).reshape(x.size(0), x.size(1), C)
    out = ctx @ p["attn.out_proj.weight"].T + p["attn.out_proj.bias"]
    gate = torch.sigmoid(torch.cat([h, out], -1) @ p["gate.weight"].T + p["gate.bias"])
    return x + gate * out, weights.mean(1)


def memory_batch():
    torch.manual_seed(1)
    x, memory = torch.randn(3, 2, C), torch.randn(5, 2, C)
    padding = torch.tensor([[False, False, False, True, True], [True] * 5])  # sentence 2: no match
    return x, memory, padding


def test_softmax_reader_reads_nothing_from_a_memory_of_padding_alone():
    """The general path (fairseq's softmax): the formula's zero weights for the sentence without
    matches (on main: NaN), the other sentence unchanged; the copy reads its zero weights."""
    module = reader()
    module.keep_weights = True
    x, memory, padding = memory_batch()
    with torch.no_grad():
        out = module(x, memory, padding)
    expected, weights = softmax_reader_by_formula(module, x, memory, padding)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(module.weights.double(), weights, rtol=1e-5, atol=1e-6)
    assert module.weights[1].abs().sum() == 0


def test_softmax_reader_trains_on_a_sentence_without_matches():
    """In training the loss and every parameter's gradient stay finite and equal float64 autograd
    of the formula (on main: NaN in both)."""
    module = reader().train()
    x, memory, padding = memory_batch()
    x.requires_grad_(True)
    out = module(x, memory, padding)
    out.square().sum().backward()
    expected, _ = softmax_reader_by_formula(module, x, memory, padding)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    assert all(torch.isfinite(t.grad).all() for _, t in module.named_parameters()) and torch.isfinite(x.grad).all()

    double = reader().double()
    with torch.no_grad():
        for a, b in zip(double.parameters(), module.parameters()):
            a.copy_(b)
    xd = x.detach().double().requires_grad_(True)
    by_formula, _ = softmax_reader_by_formula(double, xd, memory, padding)
    reference = torch.autograd.grad(by_formula.square().sum(), [*double.parameters(), xd])
    for (name, t), g in zip([*module.named_parameters(), ("x", x)], reference):
        torch.testing.assert_close(t.grad.double(), g, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("beams", [1, 2])
def test_softmax_reader_cached_step_reads_nothing_from_a_memory_of_padding_alone(beams):
    """Beam search: the first step (fairseq's forward, keys cached once per sentence) and the
    direct cached step after it give the formula (on main: NaN at both)."""
    module = reader()
    assert module.step_cache_dtype is None  # the formula to 1e-5: the cache as computed, not float16's rounding
    module.attn.set_beam_size(beams)
    x, memory, padding = memory_batch()
    x, memory, padding = (x.repeat_interleave(beams, 1), memory.repeat_interleave(beams, 1),
                          padding.repeat_interleave(beams, 0))
    expected, _ = softmax_reader_by_formula(module, x, memory, padding)
    state, steps = {}, []
    with torch.no_grad():
        steps.append(module(x[:1], memory, padding, incremental_state=state))
        assert module._decodes_directly(x[1:2])  # the direct step over the cached keys runs next
        for t in (1, 2):
            steps.append(module(x[t:t + 1], None, None, incremental_state=state))
    torch.testing.assert_close(torch.cat(steps).double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", ATTENTION_FUNCTIONS)
def test_every_reader_family_gives_a_memory_of_padding_alone_zero_weights(fn):
    """A row without slots reads zero weights in every family: its output is the gate times the
    output projection of a zero context, plus the input."""
    module = reader(fn)
    x, memory, padding = memory_batch()
    with torch.no_grad():
        out = module(x, memory, padding)[:, 1]
        h = module.layer_norm(x[:, 1])
        context = module.attn.out_proj(torch.zeros(C))
        gate = torch.sigmoid(module.gate(torch.cat([h, context.expand_as(h)], -1)))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, x[:, 1] + gate * context, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- the copy distribution, tiny mass

def copy_by_formula(logits, weights, tokens, gate_logit, ignore):
    """p(y) = (1 - c) softmax(logits) + c * (the copyable weights renormalised, summed per token), in
    float64; c = 0 where the copyable weights sum to 0."""
    w = weights.double() * torch.from_numpy(~np.isin(tokens.numpy(), ignore)).unsqueeze(1)
    mass = w.sum(-1, keepdim=True)
    c = torch.sigmoid(gate_logit.double()) * (mass > 0)
    shares = torch.zeros(logits.shape, dtype=torch.float64).scatter_add_(
        2, tokens.unsqueeze(1).expand(-1, logits.size(1), -1), w / torch.where(mass > 0, mass, 1.0))
    return (1 - c) * torch.softmax(logits.double(), -1) + c * shares


@pytest.mark.parametrize("scale", [1.0, 1e-8, 1e-10, 1e-20, 1e-30, 1e-36])
def test_copy_distribution_sums_to_one_at_any_copy_mass(scale):
    """A copy mass of 1e-10 on main: the distribution summed to 0.55 (a 1e-9 floor under the mass);
    the general path, its log-probabilities and the cached step's table all equal the formula."""
    torch.manual_seed(0)
    pad, bos, V = 1, 0, 11
    tokens = torch.tensor([[0, 4, 5, 4, 1], [0, 6, 7, 8, 9]])
    weights = torch.rand(2, 1, 5) * scale
    logits, gate_logit = torch.randn(2, 1, V), torch.zeros(2, 1, 1)
    copy = {"weights": weights, "tokens": tokens, "gate_logit": gate_logit, "ignore": (pad, bos)}
    table = (tokens,) + sentence_copy_table(tokens, (pad, bos))
    expected = copy_by_formula(logits, weights, tokens, gate_logit, (pad, bos))
    with torch.no_grad():
        results = {"probabilities": copy_probabilities(logits, copy, log_probs=False),
                   "log": copy_probabilities(logits, copy, log_probs=True).exp(),
                   "step": copy_probabilities(logits, dict(copy, tokens=None, table=table), log_probs=True).exp()}
    for name, p in results.items():
        assert p.double().sum(-1).sub(1).abs().max() < 1e-5, (name, p.sum(-1))
        torch.testing.assert_close(p.double(), expected, rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------- float16 learned gamma

def relu_former_output(path, log_gamma, dtype):
    torch.manual_seed(0)
    config = AttentionConfig(fn="relu", relu_gamma_mode="head", impl=path, block_size=8, blocked_min_len=10_000)
    module = ReluformerAttention(16, HEADS, config, self_attention=True).to(dtype).eval()
    with torch.no_grad():
        module.log_gamma.fill_(log_gamma)
    x = (torch.randn(10, 2, 16) * 0.1).to(dtype)
    out = module(x, x, x, need_weights=False)[0]
    out.float().sum().backward()
    return out.detach(), module.log_gamma.grad


HALF_TINY = 2.0 ** -24  # float16's smallest subnormal: outputs near it hold that much at best


@pytest.mark.parametrize("path", ["reference", "dense", "blocked"])
def test_float16_log_gamma_across_its_range_equals_float64(path):
    """log gamma in [-11, 11], where gamma and 1 / gamma are float16 numbers: outputs and the gradient
    of log gamma in float16 equal float64's to float16's precision (on main the log gamma was bounded
    to +-5.55: relative errors 0.37 at -6, 0.91 at -8, wrong gradients beyond)."""
    for log_gamma in (-11.0, -10.0, -9.0, -8.0, -7.0, -6.0, -5.5, -5.0, 0.0, 5.0, 5.5, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0):
        out, grad = relu_former_output(path, float(log_gamma), torch.float16)
        out64, grad64 = relu_former_output(path, float(log_gamma), torch.float64)
        assert torch.isfinite(out).all() and torch.isfinite(grad).all(), log_gamma
        # float16's precision at the output's scale (its sums round there), or its subnormals' spacing
        scale = 4e-3 * float(out64.abs().max()) + 2 * HALF_TINY
        torch.testing.assert_close(out.double(), out64, rtol=4e-3, atol=scale, msg=f"log gamma {log_gamma}")
        # the gradient sums the outputs, which near log gamma 11 lie among float16's subnormals
        scale = 4e-3 * float(grad64.abs().max()) + 16 * HALF_TINY
        torch.testing.assert_close(grad.double(), grad64, rtol=4e-3, atol=scale, msg=f"log gamma {log_gamma}")


def test_float16_rows_within_the_old_bound_compute_as_before():
    """Where the row factor lies within float16's fold range (every ReLUFormer row with log gamma
    within +-5.5), the split leaves the output bit for bit as the factor folded whole gives it; a
    factor beyond the range is split and gives float32's output to float16's precision."""
    from reluformer_mt.attention import blocked

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, HEADS, 6, 4).half() for _ in range(3))
    keep = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    options = dict(route="dense", activation="relu", scaling=0.5, row_bias=None, n_visible=None, block_q=512,
                   block_k=512, want_rows=True, want_weights=True, row_sums=True)
    factor = torch.tensor([0.7, 300.0]).view(1, HEADS, 1, 1).expand(1, HEADS, 6, 1)
    split = blocked.tiled_attention(q, k, v, keep, row_factor=factor, **{k_: v_ for k_, v_ in options.items() if k_ != "activation"})
    whole = blocked._tiled_attention(q, k, v, keep, row_factor=factor, **options)
    assert torch.equal(split[0], whole[0]) and torch.equal(split[2], whole[2])
    assert all(torch.equal(a, b) for a, b in zip(split[1], whole[1]))
    big = factor * 5  # head 2 beyond 2^9: split
    split = blocked.tiled_attention(q, k, v, keep, row_factor=big, **{k_: v_ for k_, v_ in options.items() if k_ != "activation"})
    wide = blocked._tiled_attention(q.float(), k.float(), v.float(), keep, row_factor=big, **options)
    torch.testing.assert_close(split[0].float(), wide[0], rtol=4e-3, atol=4e-3 * float(wide[0].abs().max()))
    for got, expected in zip(split[1][:2], wide[1][:2]):  # the mass and sum a log a of the regularisers
        torch.testing.assert_close(got.float(), expected, rtol=4e-3, atol=4e-3 * float(expected.abs().max()))


# ---------------------------------------------------------------- kNN read-outs near float32's limit

def sparsemax_by_formula(z):
    """Martins & Astudillo (2016): the projection onto the simplex, by sorting, in float64."""
    z = z - z.max()  # the map is shift-invariant; 1 + z would round to z for |z| > 1e16
    s, _ = torch.sort(z, descending=True)
    ks = torch.arange(1, z.numel() + 1, dtype=z.dtype)
    cumulative = s.cumsum(0)
    support = ks[1 + ks * s > cumulative].max()
    tau = (cumulative[int(support) - 1] - 1) / support
    return torch.clamp(z - tau, min=0)


def entmax15_by_formula(z):
    """Peters et al. (2019), 1.5-entmax's exact sort-based threshold, in float64: p = [z/2 - tau]_+^2."""
    x = z / 2 - (z / 2).max()
    s, _ = torch.sort(x, descending=True)
    ks = torch.arange(1, x.numel() + 1, dtype=x.dtype)
    mean = s.cumsum(0) / ks
    mean_sq = (s ** 2).cumsum(0) / ks
    delta = (1 - ks * (mean_sq - mean ** 2)) / ks
    tau = mean - torch.sqrt(torch.clamp(delta, min=0))
    support = (tau <= s).sum()
    return torch.clamp(x - tau[support - 1], min=0) ** 2


def readout_by_formula(distances, readout, temperature):
    logits = -distances.double() / temperature  # float64 holds -d / T for any float32 distance
    rows = []
    for z in logits:
        real = torch.isfinite(z)
        w = torch.zeros_like(z)
        if real.any():
            w[real] = {"softmax": lambda t: torch.softmax(t, 0), "sparsemax": sparsemax_by_formula,
                       "entmax15": entmax15_by_formula}[readout](z[real])
        rows.append(w)
    return torch.stack(rows)


FAR = torch.finfo(torch.float32).max


@pytest.mark.parametrize("readout", ["softmax", "sparsemax", "entmax15"])
def test_readouts_where_minus_d_over_t_leaves_float32(readout):
    """Distances near float32's largest number, T below 1: -d / T overflows (on main the softmax's
    weights were all 0 with mass 1 and the mixture summed to 1 - lambda; sparsemax and 1.5-entmax
    raised 'index -1 is out of bounds'). Ties share the weight, a row with ordinary distances is
    unchanged, a missing neighbour gets none, and the mixture sums to 1."""
    d = torch.tensor([[0.9 * FAR, 0.9 * FAR, FAR, float("inf")],
                      [1e37, 2e37, 4e37, 8e37],
                      [1.0, 1.3, 2.0, 9.0]])
    for temperature in (0.5, 1e-3):
        weights, mass = neighbour_weights(d, readout, temperature=temperature)
        torch.testing.assert_close(weights.double(), readout_by_formula(d, readout, temperature), rtol=1e-5, atol=1e-6)
        assert mass.tolist() == [1.0, 1.0, 1.0]
        lprobs = torch.log_softmax(torch.randn(3, 9), dim=1)
        mixed = mix_log_probs(lprobs, knn_probabilities(weights, torch.tensor([[1, 1, 2, 3]] * 3), 9), mass, lam=0.6)
        torch.testing.assert_close(mixed.exp().sum(1), torch.ones(3), rtol=0, atol=1e-5)
    assert weights[0, :2].tolist() == pytest.approx([0.5, 0.5], abs=1e-6)


@pytest.mark.parametrize("readout", ["softmax", "sparsemax", "entmax15"])
def test_readouts_of_ordinary_distances_are_unchanged_bit_for_bit(readout):
    """Rows whose logits stay in range are computed as they always were: -d / T straight."""
    import entmax

    torch.manual_seed(0)
    d = torch.rand(6, 8) * 50
    d[2, 5:] = float("inf")
    weights, _ = neighbour_weights(d, readout, temperature=3.0)
    logits = (-d / 3.0).masked_fill(~torch.isfinite(d), float("-inf"))
    if readout == "softmax":
        plain = torch.softmax(logits, dim=1)
    else:
        low = logits.masked_fill(~torch.isfinite(d), 0).min(dim=1, keepdim=True).values - 1e4
        plain = (entmax.sparsemax if readout == "sparsemax" else entmax.entmax15)(
            torch.where(torch.isfinite(d), logits, low), dim=1)
    assert torch.equal(weights, plain)
