"""The fused C++ ReLU attention kernel (``--attn-impl fused``) equals the reference path.

The extension is compiled on first use (about 30 s here, once per machine; cached under
~/.cache/reluformer_mt or $TORCH_EXTENSIONS_DIR). Skipped with the reason if it cannot be built.
"""
import pytest
import torch

from reluformer_mt.attention import AttentionConfig, ReluformerAttention
from reluformer_mt.attention import fused
from reluformer_mt.attention.extension import LazyExtension
from reluformer_mt.attention.blocked import count_visible, tiled_attention
from test_blocked import assert_same, force_reference, make_module, run

pytestmark = pytest.mark.skipif(not fused.available(),
                                reason="fused ReLU attention extension could not be built (no C++ compiler or ninja?)")

FUSED_CASES = [
    ("relu", {}),
    ("relu", {"relu_gamma_mode": "head", "relu_gamma": 1.3}),
    ("relu", {"relu_scale_logits": False}),
    ("rela", {}),
    ("pointwise", {"pointwise_alpha": 0.5}),
]


def fused_module(fn, options, causal):
    module = make_module(fn, options, "fused", causal)
    calls = []
    original = fused.fused_relu_attention

    def spy(*args, **kwargs):  # proves the kernel ran (no silent fallback)
        calls.append(1)
        return original(*args, **kwargs)

    fused.fused_relu_attention = spy
    return module, calls, original


@pytest.mark.parametrize("fn,options,causal", [(fn, opts, causal) for fn, opts in FUSED_CASES for causal in (False, True)])
def test_fused_matches_reference(fn, options, causal):
    reference = run(force_reference(make_module(fn, options, "dense", causal)), causal, True)
    module, calls, original = fused_module(fn, options, causal)
    try:
        result = run(module, causal, True)
    finally:
        fused.fused_relu_attention = original
    assert calls, "the fused kernel was not used"
    assert_same(result, reference)


@pytest.mark.parametrize("fn,options", [("relu", {"relu_gamma_mode": "head"}), ("pointwise", {})])
def test_fused_stats_and_regularisers_match_reference(fn, options):
    reference = run(force_reference(make_module(fn, options, "dense", True)), True, True, regularise=True)
    result = run(make_module(fn, options, "fused", True), True, True, regularise=True)
    assert_same(result, reference)


def test_fused_kernel_larger_tiles_and_float64():
    """Several tiles per row and column, batch-specific masks, float64 against the blocked path."""
    torch.manual_seed(3)
    B, H, T, S, D = 2, 3, 300, 530, 16
    q, k, v = (torch.randn(B, H, n, D, dtype=torch.float64, requires_grad=True) for n in (T, S, S))
    keep = torch.rand(B, 1, T, S) > 0.2
    keep[1, :, :, 400:] = False
    results = []
    for use_fused in (False, True):
        factor = 1.0 / (1.1 * torch.sqrt(count_visible(keep).clamp(min=1).double() / 2))  # ReLUFormer's c_i
        out, rows, _ = tiled_attention(q, k, v, keep, activation="relu", scaling=0.25, row_factor=factor,
                                       blocked=True, block_q=64, block_k=64, want_rows=True, fused=use_fused)
        loss = (out * out.detach().sign()).sum() + rows[0].sum() + 0.1 * rows[1].sum()
        grads = torch.autograd.grad(loss, (q, k, v))
        results.append((out, rows[0], rows[1], rows[2].double(), *grads))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_fused_option_and_auto_paths():
    config = AttentionConfig(fn="relu", impl="fused")
    module = ReluformerAttention(16, 2, config, self_attention=True)
    assert module._attention_path(9, 9, None, False) == "fused"
    assert module._attention_path(9, 9, None, True) == "dense"  # weights wanted
    gelu = ReluformerAttention(16, 2, AttentionConfig(fn="pointwise", pointwise_activation="gelu", impl="fused"),
                               self_attention=True)
    assert gelu._attention_path(9, 9, None, False) == "blocked"  # kernel is for h = relu only


def test_failed_build_warns_and_falls_back(monkeypatch):
    missing = LazyExtension("missing", fused.SOURCE.with_name("missing.cpp"), fused.KERNEL.what, fused.KERNEL.fallback)
    monkeypatch.setattr(fused, "KERNEL", missing)
    with pytest.warns(UserWarning, match="fused ReLU attention kernel unavailable"):
        assert fused.load() is None
    q, k, v = (torch.randn(1, 2, 7, 4) for _ in range(3))
    keep = torch.ones(1, 1, 7, 7, dtype=torch.bool)
    out, _, _ = tiled_attention(q, k, v, keep, activation="relu", scaling=0.5, blocked=True, fused=True)
    ref, _, _ = tiled_attention(q, k, v, keep, activation="relu", scaling=0.5, blocked=True)
    torch.testing.assert_close(out, ref)
