"""Fused C++/OpenMP CPU kernel for ReLU attention (``--attn-impl fused``).

Same computation as the blocked path of :mod:`reluformer_mt.attention.blocked` for h = relu
(ReLUFormer, ReLA, pointwise with relu; the row factor already folded into the queries), but each
tile is one head's ``block_q`` x ``block_k`` block, small enough to stay in cache, and ReLU, mask
and the regularisers' row sums are applied in one pass between ATen's GEMMs (forward: 2 per tile;
backward: 5, recomputing the logits). Sources: ``csrc/relu_attention.cpp``.

The extension is compiled on first use (:mod:`reluformer_mt.extension`: needs a C++
compiler and ninja) and reused afterwards. If it cannot be built, :func:`load` warns once and
returns None; callers then use the blocked PyTorch path. ``RELUFORMER_NO_FUSED=1`` disables it.
"""
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from reluformer_mt.extension import LazyExtension
from reluformer_mt.attention.routes import register_route
from reluformer_mt.attention.visibility import Visibility

SOURCE = Path(__file__).resolve().parent / "csrc" / "relu_attention.cpp"
# one head's tile: 256 x 256 float32 = 256 KB; the logits and their gradient tiles fit a 1 MB L2 cache
# (measured: 256 x 256 about 3 % faster than 128 x 512 on a Zen core; tile shape hardly matters)
BLOCK_Q, BLOCK_K = 256, 256
# --attn-impl auto uses the kernel from this key length on: measured as fast as or faster than the
# dense and blocked paths from 512 on, but ~8 % slower forward+backward at 128 (call overheads)
AUTO_MIN_LEN = 512

KERNEL = LazyExtension("reluformer_relu_attention", SOURCE, "fused ReLU attention kernel", "the blocked PyTorch path")


def load(verbose: bool = False):
    """The compiled extension, building it on first use; None (after one warning) if that fails."""
    return KERNEL.load(verbose)


def available() -> bool:
    return load() is not None


def supports(q: Tensor) -> bool:
    """The kernel runs float32/float64 CPU tensors only."""
    return q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64) and available()


def _cannot_serve(call) -> Optional[str]:
    return None if supports(call.q) else "the C++ kernel runs float32/float64 CPU tensors, where it could be built"


# auto: long calls that are not single-query decoding steps; asked for where it cannot run: blocked
register_route("fused", _cannot_serve, auto=lambda call: call.tgt_len > 1 and call.src_len >= AUTO_MIN_LEN,
               fallback="blocked")


def _kernel_visibility(visible: Optional[Visibility], like: Tensor):
    """The kernel's visibility arguments: (mask, starts, ends, causal, offset, hold, padding); empty
    tensors for 'none given'. Ranges are passed as they are (O(B)); only a pattern ranges cannot
    express passes its bool mask; ranges from a padding mask not yet checked on the host come with
    their check and the mask, which the kernel reads itself (no wait before the call)."""
    empty_bool, empty_long = like.new_zeros(0, dtype=torch.bool), like.new_zeros(0, dtype=torch.long)
    if visible is None:
        return empty_bool, empty_long, empty_long, False, 0, empty_bool, empty_bool
    check = visible.kernel_range_check()
    if check is None:
        visible = visible.resolved()
    if visible.mask is not None:
        return visible.mask, empty_long, empty_long, False, 0, empty_bool, empty_bool
    hold, padding = check if check is not None else (empty_bool, empty_bool)
    starts = visible.starts if visible.starts is not None else like.new_zeros(1, dtype=torch.long)
    ends = visible.ends if visible.ends is not None else torch.full((1,), visible.src_len, dtype=torch.long)
    causal = visible.causal_offset is not None
    return (empty_bool, starts.contiguous(), ends.contiguous(), causal, visible.causal_offset if causal else 0,
            hold, padding.contiguous())


class FusedReluAttention(torch.autograd.Function):
    """out = (relu(q k^T) masked) v and the per-row (mass, sum a log a, non-zeros) when wanted.

    q (N, T, D) scaled and row-factored, k (N, S, D), v (N, S, Dv), ``visible`` a
    :class:`~reluformer_mt.attention.visibility.Visibility` or None (all keys visible). The
    outputs match ``blocked._TiledAttention`` (act = relu, c = None).
    """

    @staticmethod
    def forward(ctx, q, k, v, visible, heads, want_rows, row_sums, block_q, block_k):
        ext = load()
        mask, starts, ends, causal, offset, hold, padding = _kernel_visibility(visible, q)
        out, mass, xlogx, nonzero = ext.forward(q, k, v, mask, starts, ends, causal, offset, hold, padding, heads,
                                                block_q, block_k, want_rows, row_sums)
        ctx.mark_non_differentiable(nonzero)
        ctx.save_for_backward(q, k, v, mask, starts, ends, hold, padding)
        ctx.causal, ctx.offset = causal, offset
        ctx.visible = visible
        ctx.heads, ctx.blocks = heads, (block_q, block_k)
        return out, mass, xlogx, nonzero

    @staticmethod
    def backward(ctx, g_out, g_mass, g_xlogx, _g_nonzero):
        q, k, v, mask, starts, ends, hold, padding = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: the C++ backward builds no graph (issue 34)
            from reluformer_mt.attention.double_backward import grads_with_graph
            dq, dk, dv, _, _ = grads_with_graph(q, k, v, None, None, ctx.visible, "relu", ctx.heads,
                                                (g_out, g_mass, g_xlogx), (*ctx.needs_input_grad[:3], False, False))
            return dq, dk, dv, None, None, None, None, None, None
        empty = q.new_zeros(0)
        if g_out is None:
            g_out = torch.zeros(q.size(0), q.size(1), v.size(2), dtype=q.dtype)
        dq, dk, dv = load().backward(g_out, q, k, v, mask, starts, ends, ctx.causal, ctx.offset, hold, padding,
                                     empty if g_mass is None or g_mass.numel() == 0 else g_mass,
                                     empty if g_xlogx is None or g_xlogx.numel() == 0 else g_xlogx,
                                     ctx.heads, *ctx.blocks)
        return dq, dk, dv, None, None, None, None, None, None


def fused_relu_attention(q: Tensor, k: Tensor, v: Tensor, visible, heads: int, want_rows: bool = False,
                         block_q: int = BLOCK_Q, block_k: int = BLOCK_K, row_sums: bool = True):
    """(out, mass, xlogx, nonzero) as ``blocked._TiledAttention`` returns them for h = relu.

    ``visible``: a Visibility, a (B or 1, 1, T, S) bool mask, or None (every key visible).
    ``row_sums=False`` with ``want_rows``: only the non-zero counts (mass and xlogx come back
    empty), without the log per non-zero weight that sum a log a costs."""
    if visible is not None and not isinstance(visible, Visibility):
        visible = Visibility.from_mask(visible)
    return FusedReluAttention.apply(q, k, v, visible, heads, want_rows, row_sums, block_q, block_k)


def relu_count_(s: Tensor, keep: Optional[Tensor], heads: int) -> Tensor:
    """s (N, T, S) logits of N = batch x heads rows made a = relu(s) with hidden keys zeroed, in
    place (the same bits as ``s.view(-1, heads, T, S).mul_(keep).relu_()``); returns the non-zero
    count of each row (N, T), int64. ``keep`` (B or 1, 1, T, S) bool or None."""
    return load().relu_count_(s, s.new_zeros(0, dtype=torch.bool) if keep is None else keep, heads)


def direct_relu_backward(a: Tensor, log_c: Tensor, g_mass: Optional[Tensor], g_xlogx: Optional[Tensor],
                         d_out: Optional[Tensor]) -> Tensor:
    """The logits' gradient of a = relu(s) with the row sums m = a.sum(-1) and e = vecdot(a, log_c),
    log_c = log(max(a, 1e-30)), given d_out (the output GEMM's gradient of a, or None): the same
    bits as autograd's backward of those plain ops, in one pass (``csrc/relu_attention.cpp``).
    Gradients of half-precision models' statistics are widened to a's dtype first, as autograd's
    own terms promote them (exactly)."""
    empty = a.new_zeros(0)
    return load().direct_relu_backward(a, log_c, empty if g_mass is None else g_mass,
                                       empty if g_xlogx is None else g_xlogx, empty if d_out is None else d_out)


__all__ = ["KERNEL", "available", "direct_relu_backward", "fused_relu_attention", "load", "relu_count_", "supports"]
