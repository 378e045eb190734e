"""Numerics at the edges (issue 23, class 5), each against a float64 reference: the entmax
package's fallback on rows below -1e4, the float16 gradient of the normalisation loss, softpick
near s = 0, float64 weights, a learned log gamma far below 0; --regularise-fns softmax and the
FlexAttention note."""
import logging
import math

import pytest
import torch

from reluformer_mt.attention import AttentionConfig, ReluformerAttention, record_attention
from reluformer_mt.attention import functions as F_attn
from reluformer_mt.attention import regularisers, sparse_maps

from helpers import route_of

E, H = 16, 2


def sparsemax_reference(z):
    """Exact sparsemax of one float64 vector (Martins & Astudillo 2016, sort-based)."""
    s, _ = torch.sort(z, descending=True)
    k = torch.arange(1, len(z) + 1, dtype=z.dtype)
    support = 1 + k * s > torch.cumsum(s, 0)
    k_max = int(support.nonzero().max()) + 1
    tau = (s[:k_max].sum() - 1) / k_max
    return torch.clamp(z - tau, min=0)


def entmax15_reference(z):
    """Exact 1.5-entmax of one float64 vector (Peters et al. 2019, sort-based)."""
    from entmax import entmax15

    return entmax15(z.view(1, -1), dim=-1).view(-1)


# ---------------------------------------------------------------- the entmax-package fallback

@pytest.mark.parametrize("name,reference", [("sparsemax", sparsemax_reference), ("entmax15", entmax15_reference)])
def test_package_fallback_rows_below_minus_1e4_sum_to_one(name, reference, monkeypatch):
    monkeypatch.setattr(sparse_maps, "supports", lambda logits: False)  # CUDA, or no compiler
    visible = torch.tensor([-20000.0, -20000.3, -20001.5, -19999.8])
    scores = torch.cat([visible, torch.tensor([5.0, 3.0])]).view(1, 1, 1, 6)  # two hidden keys
    keep = torch.tensor([True, True, True, True, False, False]).view(1, 1, 1, 6)
    weights = getattr(F_attn, f"{name}_weights")(scores, keep).view(-1)
    expected = reference(visible.double())
    torch.testing.assert_close(weights[:4].double(), expected, rtol=0, atol=1e-5)
    assert float(weights.sum()) == pytest.approx(1.0, abs=1e-5) and weights[4:].eq(0).all()


# ---------------------------------------------------------------- float16 normalisation loss

def small_mass_module(path):
    """relu2 with qk-layernorm whose gains make the logits tiny: live rows of mass ~1e-5."""
    torch.manual_seed(0)
    config = AttentionConfig(fn="pointwise", pointwise_activation="relu2", qk_layernorm=True,
                             impl=path, block_size=8, blocked_min_len=10_000)
    module = ReluformerAttention(E, H, config, self_attention=True)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name in ("q_norm.weight", "k_norm.weight"):
                p.fill_(0.02)
    return module


@pytest.mark.parametrize("path", ["reference", "dense", "blocked"])
def test_float16_normalisation_loss_gradients_stay_finite(path):
    def run(module, dtype):
        torch.manual_seed(1)
        x = torch.randn(12, 2, E).to(dtype).requires_grad_()
        with record_attention(module, regularise=True) as record:
            module(x, x, x, need_weights=False)
        totals = record.totals()
        (totals["norm_loss"] + totals["entropy_margin"]).backward()
        return totals["norm_loss"].detach(), {n: p.grad for n, p in module.named_parameters() if p.grad is not None}

    half_loss, half_grads = run(small_mass_module(path).half(), torch.float16)
    assert torch.isfinite(half_loss) and {"q_proj.weight", "k_proj.weight", "q_norm.weight"} <= set(half_grads)
    assert all(torch.isfinite(g).all() for g in half_grads.values()), [n for n, g in half_grads.items()
                                                                       if not torch.isfinite(g).all()]
    # the float64 module: the same (finite) loss and gradients; the values differ from float16's
    # because relu2 of logits ~1e-3 is subnormal in float16, not because of the loss
    full_loss, full_grads = run(small_mass_module(path).double(), torch.float64)
    assert torch.isfinite(full_loss) and all(torch.isfinite(g).all() for g in full_grads.values())


def test_normalisation_loss_is_log_above_the_floor_and_its_tangent_below():
    m = torch.tensor([1.0, 0.5, 2.0 ** -12, 1e-6, 1e-30], dtype=torch.float64, requires_grad=True)
    loss = regularisers.normalisation_loss(m)
    loss.sum().backward()
    floor = regularisers.NORM_LOSS_MIN_MASS
    torch.testing.assert_close(loss[:3], torch.log(m[:3]).abs())
    assert torch.isfinite(loss).all() and float(m.grad.abs().max()) <= 1 / floor
    assert float(loss[4]) == pytest.approx(-math.log(floor) + 1.0)


# ---------------------------------------------------------------- softpick near 0

def softpick_reference(s, keep, eps=F_attn.SOFTPICK_EPS):
    e = torch.expm1(s.double()).masked_fill(~keep, 0.0)
    return torch.relu(e) / (e.abs().sum(-1, keepdim=True) + eps)


def test_softpick_near_zero_logits_match_float64():
    s = torch.tensor([[1e-5, -3e-5, 2e-5, 4e-5]])
    keep = torch.ones_like(s, dtype=torch.bool)
    got = F_attn.softpick_weights(s, keep).double()
    expected = softpick_reference(s, keep)
    assert float(((got - expected).abs() / expected.clamp(min=1e-300)).max()) < 1e-5
    # one visible key: s / (s + eps) rises from 0, no step at s = 0
    one = torch.linspace(-1e-6, 4e-6, 101).view(-1, 1)
    keep1 = torch.ones_like(one, dtype=torch.bool)
    torch.testing.assert_close(F_attn.softpick_weights(one, keep1).double(), softpick_reference(one, keep1),
                               rtol=1e-4, atol=1e-6)
    # large logits still do not overflow
    big = torch.tensor([[100.0, 99.0, -3.0, 0.2]])
    torch.testing.assert_close(F_attn.softpick_weights(big, keep).double(), softpick_reference(big, keep), rtol=1e-5,
                               atol=1e-7)


# ---------------------------------------------------------------- float64 inputs

@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15", "softpick"])
def test_float64_inputs_get_float64_weights(name):
    torch.manual_seed(0)
    scores = (torch.randn(2, 2, 5, 9, dtype=torch.float64) * 3) + 1e-9 * torch.arange(9, dtype=torch.float64)
    keep = torch.rand(1, 1, 5, 9) > 0.2
    keep[..., 0] = True
    weights = getattr(F_attn, f"{name}_weights")(scores, keep)
    if name == "softmax":
        expected = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1)
    elif name == "softpick":
        expected = softpick_reference(scores, keep)
    else:
        reference = sparsemax_reference if name == "sparsemax" else entmax15_reference
        rows = scores.expand(2, 2, 5, 9).reshape(-1, 9)
        masks = keep.expand(2, 2, 5, 9).reshape(-1, 9)
        expected = torch.zeros_like(rows)
        for r, (z, m) in enumerate(zip(rows, masks)):
            expected[r, m] = reference(z[m])
        expected = expected.view(2, 2, 5, 9)
    assert weights.dtype == torch.float64
    torch.testing.assert_close(weights, expected, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- log gamma far below 0

@pytest.mark.parametrize("path", ["reference", "dense", "blocked", "fused"])
def test_log_gamma_far_below_zero_is_bounded(path):
    def output(log_gamma, dtype=torch.float32):
        torch.manual_seed(0)
        config = AttentionConfig(fn="relu", relu_gamma_mode="head", impl=path, block_size=8, blocked_min_len=10_000)
        module = ReluformerAttention(E, H, config, self_attention=True).to(dtype).eval()
        with torch.no_grad():
            module.log_gamma.fill_(log_gamma)
            x = (torch.randn(10, 2, E) * 1e-3).to(dtype)
            return module(x, x, x, need_weights=False)[0]

    out = output(-100.0)  # exp(-100) is 0 in float32
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), output(-F_attn.LOG_GAMMA_BOUND, torch.float64), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- options and notes

def test_regularise_fns_softmax_is_refused():
    from reluformer_mt.criteria.reluformer_criterion import attention_function_names

    with pytest.raises(ValueError, match="softmax runs fairseq's own attention"):
        attention_function_names("relu,softmax")
    assert attention_function_names("relu,sparsemax") == "relu,sparsemax"


def test_flex_calls_that_fall_back_say_so_once(monkeypatch, caplog):
    """auto on CUDA (faked: FlexAttention runs eagerly on the CPU) gives h = relu calls to FlexAttention;
    one that records row statistics runs another route, and the route chooser says so once."""
    from reluformer_mt.attention import flex, routes

    monkeypatch.setattr(flex, "supports", lambda q: True)
    monkeypatch.setattr(routes, "_logged", set())
    caplog.set_level(logging.WARNING)
    module = ReluformerAttention(E, H, AttentionConfig(fn="relu"), self_attention=True)
    assert route_of(module, 6, 6) == "flex"
    for _ in range(2):
        assert route_of(module, 6, 6, want_rows=True) == "direct"
    notes = [r.getMessage() for r in caplog.records if "flex" in r.getMessage()]
    assert notes == ["--attn-impl auto: the flex route cannot serve attention statistics or ReLUFormer's regularisers "
                     "(per-row sums); running another route"]
