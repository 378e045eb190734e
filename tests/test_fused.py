"""The fused C++ ReLU attention kernel (``--attn-impl fused``) equals the reference path.

The extension is compiled on first use (about 30 s here, once per machine; cached under
~/.cache/reluformer_mt or $TORCH_EXTENSIONS_DIR). Skipped with the reason if it cannot be built.
"""
import logging

import pytest
import torch

from reluformer_mt.attention import AttentionConfig, ReluformerAttention
from reluformer_mt.attention import blocked, fused, routes
from reluformer_mt.attention.regularisers import regularisers_from_rows
from reluformer_mt.attention.visibility import Visibility
from reluformer_mt.extension import LazyExtension
from reluformer_mt.attention.blocked import count_visible, tiled_attention
from helpers import route_of
from test_blocked import assert_same, make_module, run

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
    reference = run(make_module(fn, options, "reference", causal), causal, True)
    module, calls, original = fused_module(fn, options, causal)
    try:
        result = run(module, causal, True)
    finally:
        fused.fused_relu_attention = original
    assert calls, "the fused kernel was not used"
    assert_same(result, reference)


@pytest.mark.parametrize("fn,options", [("relu", {"relu_gamma_mode": "head"}), ("pointwise", {})])
def test_fused_stats_and_regularisers_match_reference(fn, options):
    reference = run(make_module(fn, options, "reference", True), True, True, regularise=True)
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
                                       route="fused" if use_fused else "blocked", block_q=64, block_k=64,
                                       want_rows=True)
        loss = (out * out.detach().sign()).sum() + rows[0].sum() + 0.1 * rows[1].sum()
        grads = torch.autograd.grad(loss, (q, k, v))
        results.append((out, rows[0], rows[1], rows[2].double(), *grads))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_fused_option_and_auto_paths():
    config = AttentionConfig(fn="relu", impl="fused")
    module = ReluformerAttention(16, 2, config, self_attention=True)
    assert route_of(module, 9, 9) == "fused"
    assert route_of(module, 9, 9, want_weights=True) == "direct"  # weights wanted: one dense tile
    gelu = ReluformerAttention(16, 2, AttentionConfig(fn="pointwise", pointwise_activation="gelu", impl="fused"),
                               self_attention=True)
    assert route_of(gelu, 9, 9) == "blocked"  # kernel is for h = relu only


def test_failed_build_warns_and_falls_back(monkeypatch, caplog):
    monkeypatch.setattr(routes, "_logged", set())
    missing = LazyExtension("missing", fused.SOURCE.with_name("missing.cpp"), fused.KERNEL.what, fused.KERNEL.fallback)
    monkeypatch.setattr(fused, "KERNEL", missing)
    with pytest.warns(UserWarning, match="fused ReLU attention kernel unavailable"):
        assert fused.load() is None
    module = ReluformerAttention(16, 2, AttentionConfig(fn="relu", impl="fused"), self_attention=True)
    with caplog.at_level(logging.WARNING, logger="reluformer_mt.attention.routes"):
        assert route_of(module, 9, 9) == "blocked"  # decided by the chooser, logged once
        assert route_of(module, 9, 9) == "blocked"
    fallbacks = [r for r in caplog.records if "--attn-impl fused" in r.getMessage()]
    assert len(fallbacks) == 1 and "blocked route instead" in fallbacks[0].getMessage()


def test_a_stale_build_lock_is_removed(tmp_path):
    """torch waits forever for its build lock; one left by a killed build must not hang a run."""
    import os
    import time

    from reluformer_mt.extension import clear_stale_lock

    import threading

    lock = tmp_path / "lock"
    assert not clear_stale_lock(tmp_path)  # no lock: nothing to wait for
    lock.touch()  # a build beside this one: waited for until it ends, not removed
    threading.Timer(0.3, lock.unlink).start()
    started = time.time()
    assert not clear_stale_lock(tmp_path, poll=0.05) and time.time() - started >= 0.25
    lock.touch()  # a lock that turns stale while it is waited for (its build was killed): removed then
    with pytest.warns(UserWarning, match="stale build lock"):
        assert clear_stale_lock(tmp_path, max_age=0.3, poll=0.05)
    assert not lock.exists()
    lock.touch()
    old = time.time() - 3600
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match="stale build lock"):
        assert clear_stale_lock(tmp_path)
    assert not lock.exists()


def test_counts_without_sums_on_the_fused_route():
    """Statistics without regularisers (ReLA) take only the non-zero counts from the kernel
    (issue 22: no log per weight): output and counts as with the sums, the sums None."""
    torch.manual_seed(6)
    q, k, v = (torch.randn(2, 3, 9, 4) for _ in range(3))
    vis = Visibility.from_padding(9, 9, torch.tensor([[True, True] + [False] * 7, [False] * 9]), causal=True)
    full_out, full_rows, _ = tiled_attention(q, k, v, vis, route="fused", scaling=0.5, want_rows=True,
                                             block_q=4, block_k=4)
    out, rows, _ = tiled_attention(q, k, v, vis, route="fused", scaling=0.5, want_rows=True, row_sums=False,
                                   block_q=4, block_k=4)
    assert torch.equal(out, full_out)
    assert rows[0] is None and rows[1] is None
    assert torch.equal(rows[2], full_rows[2]) and torch.equal(rows[3], full_rows[3])
    assert rows[2].sum() > 0 and (rows[2] < rows[3]).any()  # some weights are zero, some are not


def _direct_route_results(monkeypatch, kernel: bool, dtype, loss_terms):
    """Outputs, rows and q/k/v gradients of one direct-route call as a ReLUFormer layer makes it
    (padding and causal mask, row factor, its row losses), with or without the one-node backward."""
    if not kernel:
        monkeypatch.setattr(blocked, "_row_kernel_supports", lambda q: False)
    torch.manual_seed(8)
    B, H, T, D = 4, 2, 24, 8  # enough weights that another order of the sums shows in the last bits
    q, k, v = (torch.randn(B, H, T, D, dtype=dtype, requires_grad=True) for _ in range(3))
    padding = torch.zeros(B, T, dtype=torch.bool)
    padding[1, :3] = True
    vis = Visibility.from_padding(T, T, padding, causal=True)
    n_visible = vis.n_visible()
    out, rows, weights = tiled_attention(q, k, v, vis, route="direct", scaling=0.5,
                                         row_factor=1 / n_visible.clamp(min=1).sqrt(), n_visible=n_visible,
                                         want_rows=True, want_weights=True)
    norm, margin, _ = regularisers_from_rows(rows[0], rows[1], rows[3])
    terms = {"out": out.square().sum(), "norm": 0.3 * norm, "margin": 0.7 * margin}
    sum(terms[name] for name in loss_terms).backward()
    monkeypatch.undo()
    return [out, weights, *rows[:3], q.grad, k.grad, v.grad]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("loss_terms", [("out", "norm", "margin"), ("out", "norm"), ("out",), ("norm", "margin")])
def test_direct_route_backward_kernel_is_autograds_gradient_bit_for_bit(monkeypatch, dtype, loss_terms):
    """The direct route's one-node backward with ReLUFormer's row sums adds autograd's terms in
    autograd's order (issue 22 keeps training bit for bit): outputs and gradients equal plain
    autograd's exactly, whichever results the loss reads."""
    calls = []
    original = fused.direct_relu_backward
    monkeypatch.setattr(fused, "direct_relu_backward", lambda *args: calls.append(1) or original(*args))
    kernel = _direct_route_results(monkeypatch, True, dtype, loss_terms)
    assert calls, "the kernel did not run"
    plain = _direct_route_results(monkeypatch, False, dtype, loss_terms)
    for got, want in zip(kernel, plain):
        if want is None:
            assert got is None
        else:
            assert torch.equal(got, want) and got.dtype == want.dtype
            if got.is_floating_point():  # down to the sign of zeros (hidden keys' weights are -0 or +0)
                assert torch.equal(torch.signbit(got), torch.signbit(want))
    assert all((g != 0).any() for g in kernel[5:] if g is not None)
    assert torch.signbit(kernel[1]).any()  # some weights are -0: the case above can fail


def test_positive_counts_equal_count_nonzero():
    a = torch.randn(3, 5, 300).relu_()
    a[0, 0] = 0.0
    a[1, 1, :7] = 1e-40  # denormals count as non-zero, as in count_nonzero
    assert torch.equal(blocked.positive_counts(a), torch.count_nonzero(a, dim=-1))
    assert torch.equal(blocked.positive_counts(a.bfloat16()), torch.count_nonzero(a.bfloat16(), dim=-1))


def test_build_all_reports_each_kernel_and_never_fails(monkeypatch, tmp_path, capsys):
    """``make setup`` compiles the kernels once (build_all): one line per kernel, a kernel that
    cannot be built is reported with the reason and does not fail the set-up."""
    from reluformer_mt import extension
    from reluformer_mt.attention import sparse_maps
    from reluformer_mt.cli import build_kernels

    assert fused.available()  # built already: only the broken kernel compiles, in tmp_path
    monkeypatch.setattr(extension, "build_directory", lambda: tmp_path / "build")
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(sparse_maps, "KERNEL", LazyExtension("reluformer_broken_test", broken, "broken kernel",
                                                             "PyTorch code"))
    assert build_kernels.build_all() == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("reluformer_mt: fused ReLU attention kernel ready")
    assert out[1].startswith("reluformer_mt: broken kernel not built: reluformer_mt: broken kernel unavailable")
