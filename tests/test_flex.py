"""The FlexAttention path (``attention/flex.py``), checked on the CPU without a GPU.

PyTorch runs FlexAttention eagerly on the CPU (forward only), so the formula (log relu scores,
output times exp(lse)), the block mask from key ranges and the causal flag, zero rows, and the
module's choice of the path are all tested here; on CUDA the same code is compiled.
"""
import pytest
import torch

from reluformer_mt.attention import AttentionConfig, ReluformerAttention
from reluformer_mt.attention import flex as flex_kernel
from reluformer_mt.attention.blocked import tiled_attention
from reluformer_mt.attention.recording import record_attention
from reluformer_mt.attention.visibility import Visibility

from helpers import route_of

pytest.importorskip("torch.nn.attention.flex_attention")


def padding(B, S):
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[1, -40:] = True  # right-padded
    kpm[2, :70] = True  # left-padded
    return kpm


@pytest.mark.parametrize("T,S,causal", [(128, 256, False), (256, 256, True), (128, 256, True)])
def test_flex_equals_the_blocked_path(T, S, causal):
    torch.manual_seed(0)
    B, H, D = 3, 2, 16
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    q[0, 0, :5] = -q[0, 0, :5].abs()  # some rows may see no positive logit: output exactly 0
    vis = Visibility.from_padding(T, S, padding(B, S), causal)
    with torch.no_grad():
        expected, _, _ = tiled_attention(q, k, v, vis, route="blocked", activation="relu", scaling=0.25, block_q=64,
                                         block_k=64)
        got, rows, _ = tiled_attention(q, k, v, vis, route="flex", activation="relu", scaling=0.25)
    assert rows is None and not torch.isnan(got).any()
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-4)


def test_block_mask_skips_hidden_blocks_and_refuses_dense_masks():
    T = S = 512
    vis = Visibility.from_padding(T, S, None, causal=True)
    mask = flex_kernel.block_mask(vis, 1, 1, "cpu")
    # 4 x 4 blocks of 128: the causal pattern keeps 10 of 16 (diagonal ones partially)
    assert mask.sparsity() == pytest.approx(100 * 6 / 16)
    assert flex_kernel.block_mask(Visibility.from_padding(T, S), 1, 1, "cpu") is None
    with pytest.raises(ValueError, match="dense mask"):
        flex_kernel.block_mask(Visibility.from_mask(torch.rand(1, 1, T, S) > 0.5), 1, 1, "cpu")


def test_module_takes_flex_where_supported_and_blocked_when_rows_are_recorded(monkeypatch):
    """The path choice is the module's; ``supports`` is faked (no CUDA here) and the call runs eagerly."""
    monkeypatch.setattr(flex_kernel, "supports", lambda q: True)
    calls = []
    original = flex_kernel.flex_relu_attention
    monkeypatch.setattr(flex_kernel, "flex_relu_attention", lambda *a: calls.append(1) or original(*a))
    torch.manual_seed(1)
    module = ReluformerAttention(32, 4, AttentionConfig(fn="relu"), self_attention=True).eval()
    reference = ReluformerAttention(32, 4, AttentionConfig(fn="relu", impl="dense"), self_attention=True).eval()
    reference.load_state_dict(module.state_dict())
    x = torch.randn(150, 3, 32)
    kpm = padding(3, 150)
    with torch.no_grad():
        out, _ = module(x, x, x, key_padding_mask=kpm, need_weights=False, is_causal=True)
        expected, _ = reference(x, x, x, key_padding_mask=kpm, need_weights=False, is_causal=True)
    assert calls, "the flex path was not taken"
    real = ~kpm.t()
    torch.testing.assert_close(out[real], expected[real], atol=2e-4, rtol=2e-4)
    calls.clear()
    with torch.no_grad(), record_attention(module, regularise=True, statistics=True):
        module(x, x, x, key_padding_mask=kpm, need_weights=False, is_causal=True)
    assert not calls, "row sums cannot come from FlexAttention: the blocked path must serve"


def test_recorded_statistics_fall_back_to_what_auto_runs_without_flex(monkeypatch):
    """Issue 21: with statistics recorded, ``auto`` on CUDA used to report flex and run blocked at
    any length; the chooser now names the route that runs: direct/dense short, blocked long."""
    from reluformer_mt.attention import fused

    monkeypatch.setattr(flex_kernel, "supports", lambda q: True)  # as on CUDA: flex, and no C++ kernel
    monkeypatch.setattr(fused, "supports", lambda q: False)
    module = ReluformerAttention(32, 4, AttentionConfig(fn="relu", blocked_min_len=100), self_attention=True)
    assert route_of(module, 50, 50) == "flex" and route_of(module, 500, 500) == "flex"
    assert route_of(module, 50, 50, want_rows=True) == "direct"
    assert route_of(module, 600, 600, want_rows=True, q=torch.zeros(1, 4, 600, 8, requires_grad=True)) == "blocked"
    assert route_of(module, 50, 50, want_weights=True) == "direct"  # weights: never a kernel


def test_auto_on_cuda_takes_the_triton_kernel_before_flex(monkeypatch):
    """Measured on an H200 (docs/PERFORMANCE.md#gpu), the Triton kernel beats FlexAttention at every
    length, so ``auto`` gives it every CUDA call it serves; FlexAttention only where it cannot run."""
    from reluformer_mt.attention import fused, triton_kernel

    monkeypatch.setattr(flex_kernel, "supports", lambda q: True)  # as on CUDA
    monkeypatch.setattr(fused, "supports", lambda q: False)
    monkeypatch.setattr(triton_kernel, "auto_allowed", lambda q: True)
    monkeypatch.setattr(triton_kernel, "supports", lambda q: True)
    module = ReluformerAttention(32, 4, AttentionConfig(fn="relu"), self_attention=True)
    assert route_of(module, 50, 50) == "triton" and route_of(module, 50, 50, want_rows=True) == "triton"
    monkeypatch.setattr(triton_kernel, "auto_allowed", lambda q: False)  # RELUFORMER_NO_TRITON=1
    assert route_of(module, 50, 50) == "flex"
