"""Visible keys as ranges and a causal flag (``attention/visibility.py``) instead of T x S masks.

The ranges must say exactly what the bool masks they replace said (checked against masks built
here the plain way, independently of the module), the paths that take them must give the
reference path's results with left padding, right padding, causal offsets (T < S) and patterns
ranges cannot express, and a long call must not allocate anything of size T x S.
"""
from dataclasses import replace

import pytest
import torch

from reluformer_mt.attention import AttentionConfig, ReluformerAttention, fused
from reluformer_mt.attention.blocked import tiled_attention
from reluformer_mt.attention.visibility import (_VISIBILITY_CACHE, Visibility, is_causal_mask, live_query_rows,
                                                padding_ranges)
from helpers import load_benchmark_script


def plain_mask(T, S, kpm=None, causal=False, hidden=None):
    """(B|1, 1, T, S) bool, True = visible, built entry by entry from its definition."""
    B = kpm.size(0) if kpm is not None else 1
    keep = torch.ones(B, 1, T, S, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            for j in range(S):
                if kpm is not None and kpm[b, j]:
                    keep[b, 0, i, j] = False
                if causal and j > i + (S - T):
                    keep[b, 0, i, j] = False
                if hidden is not None and hidden[i, j]:
                    keep[b, 0, i, j] = False
    return keep


def mixed_padding(S):
    """Sentence 0 full, 1 right-padded, 2 left-padded, 3 all but one key padded."""
    kpm = torch.zeros(4, S, dtype=torch.bool)
    kpm[1, -3:] = True
    kpm[2, :4] = True
    kpm[3, 1:] = True
    return kpm


@pytest.mark.parametrize("T,S,causal", [(7, 7, True), (3, 9, True), (6, 9, False), (1, 5, True)])
def test_ranges_state_exactly_what_the_mask_said(T, S, causal):
    kpm = mixed_padding(S)
    vis = Visibility.from_padding(T, S, kpm, causal)
    assert vis.mask is None, "left and right padding must stay ranges"
    expected = plain_mask(T, S, kpm, causal)
    assert torch.equal(vis.dense(), expected)
    assert torch.equal(vis.n_visible(), expected.sum(-1, keepdim=True))
    for i0 in range(0, T, 2):
        for j0 in range(0, S, 3):
            i1, j1 = min(T, i0 + 2), min(S, j0 + 3)
            tile = expected[:, :, i0:i1, j0:j1]
            kind = 0 if not tile.any() else (1 if tile.all() else 2)
            assert vis.tile_kind(i0, i1, j0, j1) == kind, (i0, j0)
            assert torch.equal(vis.tile(i0, i1, j0, j1).expand_as(tile), tile)


def test_padding_inside_a_sentence_and_custom_masks_keep_the_mask():
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1, 2] = True  # a hole: no range says this
    assert padding_ranges(kpm) is None
    for causal in (False, True):
        vis = Visibility.from_padding(4, 6, kpm, causal=causal)
        expected = plain_mask(4, 6, kpm, causal)
        # masks and counts come from the padding itself: exact without asking the host
        assert torch.equal(vis.dense(), expected)
        assert torch.equal(vis.n_visible(), expected.sum(-1, keepdim=True))
        # the routes that take ranges get the dense mask instead
        assert not vis.ranges_hold() and torch.equal(vis.resolved().mask, expected)
        assert vis.tile_kind(0, 4, 2, 3) == 2 and not vis.all_visible
    hidden = torch.zeros(5, 5, dtype=torch.bool)
    hidden[3, 0] = True
    vis = Visibility.from_padding(5, 5, mixed_padding(5), causal=True, extra_mask=hidden)
    assert torch.equal(vis.dense(), plain_mask(5, 5, mixed_padding(5), True, hidden))


def test_fairseq_future_mask_is_recognised_once_and_changes_are_seen():
    # fairseq's decoder: one buffer, sliced per call (buffered_future_mask)
    buffer = torch.triu(torch.full((16, 16), float("-inf")), 1)
    assert is_causal_mask(buffer[:9, :9], 9, 9)
    assert is_causal_mask(buffer[:9, :9], 9, 9)  # remembered
    assert is_causal_mask(torch.ones(4, 4, dtype=torch.bool).triu(1), 4, 4)
    assert is_causal_mask(torch.ones(3, 6, dtype=torch.bool).triu(4), 3, 6)  # T < S: offset S - T
    assert not is_causal_mask(torch.ones(4, 4, dtype=torch.bool).triu(2), 4, 4)
    biased = buffer[:9, :9].clone()
    biased[5, 2] = -1.0  # a finite bias is not the plain causal mask
    assert not is_causal_mask(biased, 9, 9)
    changed = buffer[:9, :9]
    changed[4, 1] = float("-inf")  # in place: the version counter changes
    assert not is_causal_mask(changed, 9, 9)


def module_pair(fn, impl):
    torch.manual_seed(0)
    config = AttentionConfig(fn=fn, impl=impl, block_size=4, blocked_min_len=1)
    reference = ReluformerAttention(32, 4, replace(config, impl="reference"), self_attention=True)
    torch.manual_seed(0)
    return reference, ReluformerAttention(32, 4, config, self_attention=True)


@pytest.mark.parametrize("impl", ["blocked", "dense"] + (["fused"] if fused.available() else []))
@pytest.mark.parametrize("fn", ["relu", "rela", "sigmoid"])
def test_left_and_right_padded_causal_calls_match_the_reference(impl, fn):
    """Left padding (fairseq's sources) never appeared in the older tests; here both, with a causal
    mask, forward and backward, and the causal pattern given as a flag instead of a mask."""
    T = 13
    kpm = mixed_padding(T)
    mask = torch.triu(torch.full((T, T), float("-inf")), 1)
    results = []
    for module, kwargs in zip(module_pair(fn, impl), ({"attn_mask": mask}, {"is_causal": True})):
        x = torch.randn(T, 4, 32, generator=torch.Generator().manual_seed(5)).requires_grad_(True)
        out, _ = module(x, x, x, key_padding_mask=kpm, need_weights=False, **kwargs)
        out = out.masked_fill(kpm.t().unsqueeze(-1), 0.0)  # padding rows are not compared
        grad, = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(), x)
        results.append((out.detach(), grad))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(results[1][1], results[0][1], atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not fused.available(), reason="fused kernel not built")
def test_kernel_ranges_equal_kernel_mask_with_causal_offset_and_float64():
    torch.manual_seed(2)
    B, H, T, S, D = 4, 2, 300, 530, 8  # several 256-key tiles, T < S (offset 230)
    q, k, v = (torch.randn(B * H, n, D, dtype=torch.float64, requires_grad=True) for n in (T, S, S))
    kpm = mixed_padding(S)
    vis = Visibility.from_padding(T, S, kpm, causal=True)
    outs = []
    for visible in (vis, Visibility.from_mask(vis.dense())):
        out, mass, xlogx, _ = fused.fused_relu_attention(q, k, v, visible, H, want_rows=True)
        loss = (out * out).sum() + mass.sum() + 0.1 * xlogx.sum()
        outs.append((out, mass, xlogx) + torch.autograd.grad(loss, (q, k, v)))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("impl", ["blocked"] + (["fused"] if fused.available() else []))
def test_long_padded_causal_call_has_linear_peak_memory(impl):
    """Causal and padded, L = 2048 and 4096: the call's whole peak (activations included) grows
    linearly with L and stays below what one T x S bool mask alone would take (16 MB at 4096)."""
    config = AttentionConfig(fn="relu", impl=impl, block_size=256, blocked_min_len=1)
    module = ReluformerAttention(16, 2, config, self_attention=True).eval()
    peak_bytes = load_benchmark_script().peak_memory_bytes  # the benchmark's own measurement
    peaks = {}
    for L in (2048, 4096):
        x = torch.randn(L, 2, 16)
        kpm = torch.zeros(2, L, dtype=torch.bool)
        kpm[1, :100] = True  # left padding, as fairseq pads sources
        with torch.no_grad():
            peaks[L] = peak_bytes(lambda: module(x, x, x, key_padding_mask=kpm, need_weights=False, is_causal=True))
    assert peaks[4096] < 4096 * 4096, f"peak {peaks[4096] / 2**20:.1f} MB"
    assert peaks[4096] < 2.5 * peaks[2048], f"peaks {peaks}: not linear in L"


def test_padding_ranges_are_remembered_per_mask_and_changes_are_seen():
    """Decoding hands cross-attention the same encoder mask at every step: found once."""
    kpm = mixed_padding(9)
    first = padding_ranges(kpm)
    assert padding_ranges(kpm)[0] is first[0]  # the same remembered ranges, not found again
    kpm[0, -2:] = True  # in place: sentence 0 is now right-padded too
    starts, ends = padding_ranges(kpm)
    assert ends[0] == 7 and starts.tolist() == [0, 0, 4, 0]
    kpm[1, 0] = True  # now padded at both ends: no longer a range
    assert padding_ranges(kpm) is None


def test_layers_share_one_visibility_per_mask_and_changes_are_seen():
    """The layers of a forward get the same padding mask: one Visibility, one count, one dense
    mask and one set of live rows for all of them (issue 22); an in-place change of the mask
    gives fresh ones, equal to what the mask now says."""
    kpm = mixed_padding(9)
    first = Visibility.from_padding(6, 9, kpm, causal=True)
    assert Visibility.from_padding(6, 9, kpm, causal=True) is first
    assert Visibility.from_padding(6, 9, kpm) is not first  # another pattern: another object
    assert first.dense() is first.dense() and first.n_visible() is first.n_visible()
    assert torch.equal(first.dense(), plain_mask(6, 9, kpm, causal=True))
    live = live_query_rows(kpm)
    assert live_query_rows(kpm) is live and torch.equal(live, ~kpm.view(4, 1, 9))
    kpm[0, -2:] = True  # in place: sentence 0 is now right-padded too
    changed = Visibility.from_padding(6, 9, kpm, causal=True)
    assert changed is not first
    assert torch.equal(changed.dense(), plain_mask(6, 9, kpm, causal=True))
    assert torch.equal(changed.n_visible(), plain_mask(6, 9, kpm, causal=True).sum(-1, keepdim=True))
    assert torch.equal(live_query_rows(kpm), ~kpm.view(4, 1, 9))
    assert live_query_rows(torch.zeros(4, 9, dtype=torch.bool)) is None  # no padding row at all
    starts = torch.tensor([0, 2])  # ranges given directly and then changed: counts follow
    vis = Visibility(3, 5, starts=starts)
    assert vis.n_visible().reshape(-1).tolist() == [5, 5, 5, 3, 3, 3]
    starts[1] = 4
    assert vis.n_visible().reshape(-1).tolist() == [5, 5, 5, 1, 1, 1]
    assert torch.equal(vis.dense(), Visibility(3, 5, starts=starts.clone()).dense())


def test_counts_without_sums_skip_the_sums_and_keep_everything_else():
    """Statistics without regularisers take only the non-zero counts from the direct route
    (issue 22): output and counts as with the sums, the sums None."""
    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 3, 7, 4) for _ in range(3))
    vis = Visibility.from_padding(7, 7, mixed_padding(7)[:2], causal=True)
    full_out, full_rows, _ = tiled_attention(q, k, v, vis, route="direct", scaling=0.5, want_rows=True)
    out, rows, _ = tiled_attention(q, k, v, vis, route="direct", scaling=0.5, want_rows=True, row_sums=False)
    assert torch.equal(out, full_out)
    assert rows[0] is None and rows[1] is None
    assert torch.equal(rows[2], full_rows[2]) and torch.equal(rows[3], full_rows[3])


@pytest.mark.parametrize("act,factor,bias", [("relu", True, False), ("sigmoid", False, True), ("gelu", True, False)])
def test_small_calls_without_gradients_equal_the_tiled_path(act, factor, bias):
    """Decoding steps take a direct path (no tiling) when nothing needs gradients."""
    torch.manual_seed(3)
    B, H, T, S, D = 4, 2, 3, 11, 8
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    vis = Visibility.from_padding(T, S, mixed_padding(S), causal=True)
    c = torch.rand(B, H, T, 1) + 0.5 if factor else None
    b = torch.randn(B, H, T, 1) if bias else None
    with torch.no_grad():
        direct, _, _ = tiled_attention(q, k, v, vis, route="direct", activation=act, scaling=0.3, row_factor=c,
                                       row_bias=b)
    tiled, _, _ = tiled_attention(q.requires_grad_(), k, v, vis, route="dense", activation=act, scaling=0.3,
                                  row_factor=c, row_bias=b)
    torch.testing.assert_close(direct, tiled.detach(), atol=1e-6, rtol=1e-6)


def test_the_direct_and_dense_routes_ask_the_host_nothing_about_padding(monkeypatch):
    """Training (the direct and dense routes) builds its mask and counts from the padding mask on
    the device: no copy to the host and no scalar read per padding mask (issue 64: each is a
    wait for the queue on a GPU); a hole in the padding is still masked exactly."""
    torch.manual_seed(3)
    kpm = mixed_padding(9)
    kpm[0, 4] = True  # a hole too: ranges cannot say it, the padding itself can
    q = torch.randn(4, 2, 6, 5, requires_grad=True)
    k, v = (torch.randn(4, 2, 9, 5, requires_grad=True) for _ in range(2))
    expected = plain_mask(6, 9, kpm, causal=True)
    s = (q @ k.transpose(-1, -2)).relu() * expected
    reference = s @ v

    def no_host(*_):
        raise AssertionError("a host synchronisation on the direct route")
    for name in ("tolist", "item", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, no_host)
    outs = {}
    for route in ("direct", "dense"):  # dense: the tiles are masked from the padding, none skipped by it
        vis = Visibility.from_padding(6, 9, kpm, causal=True)
        outs[route], _, _ = tiled_attention(q, k, v, vis, route=route, want_rows=True, block_q=4, block_k=4)
        outs[route].sum().backward()
        _VISIBILITY_CACHE.clear()  # a fresh Visibility for the next route
    monkeypatch.undo()
    for out in outs.values():
        torch.testing.assert_close(out, reference)
    assert not vis.ranges_hold() and torch.equal(vis.resolved().mask, expected)
