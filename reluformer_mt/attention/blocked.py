"""Fast and memory-bounded paths for the ReLU attention family (``relu``, ``rela``, ``pointwise``).

ReLU-type weights have no row-wise normaliser, so key blocks can be summed independently:
out_i = sum_j c_i h(s_ij) v_j over any split of j. One custom autograd function does the work
in tiles of ``block_q`` queries x ``block_k`` keys, all heads at once (batched matmul):

- **dense** mode: tiles of whole key rows written into one (T, S) weight tensor that is kept for
  backward (as autograd would, but without the extra copies: in-place activation, scale and
  mask); without gradients and without wanted weights nothing is kept;
- **blocked** mode: many tiles; nothing of size T x S is kept; the backward pass recomputes each
  tile's logits (one more matmul per tile) instead of storing them. Peak extra memory is one tile
  (a few MB) instead of several T x S tensors.

Row factors. ReLUFormer's 1 / (gamma sqrt(n_i / 2)) and pointwise's n_i^-alpha are positive
per-row factors c_i. For h = relu, c_i relu(q_i.k_j) = relu((c_i q_i).k_j), so c is folded into
the queries before the kernel (a T x D multiply instead of a T x S one) and autograd carries its
gradient to gamma. Other pointwise activations pass c to the kernel, which returns its gradient.

Rows for the regularisers (ReLUFormer, Shen et al. 2023, arXiv:2302.06461): instead of the
weights, the kernel can return, per query row, the mass m_i = sum_j a_ij, e_i = sum_j a_ij log a_ij
and the count of non-zero weights. The entropy of p_i = a_i / m_i is log m_i - e_i / m_i, so both
losses and the sparsity statistics come from these three numbers, with exact gradients (the
backward adds g_m + g_e (log a_ij + 1) to each weight's gradient), in dense and blocked mode alike.

Not handled here (the caller uses the reference path of :mod:`reluformer_mt.attention.functions`):
additive float masks, attention dropout in training, and non-ReLU pointwise activations in
dense mode (blocked mode handles them, recomputing the activation's derivative with autograd).
"""
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor

from reluformer_mt.attention.functions import POINTWISE_ACTIVATIONS, entropy_margin_target

RELU_FAMILY = ("relu", "rela", "pointwise")
# dense mode: rows per tile = this / key length (1 MB of float32 per head: the L2 cache here)
DENSE_TILE_ELEMENTS = 2 ** 18


def _activation(name: str) -> Callable[[Tensor], Tensor]:
    return POINTWISE_ACTIVATIONS[name]


def _tile_plan(T: int, S: int, block_q: int, block_k: int, keep: Optional[Tensor]) -> List[tuple]:
    """(i0, i1, j0, j1, keep_tile or None) for every tile that has a visible key.

    Tiles whose keys are all masked (the upper triangle of a causal mask, padding) are skipped;
    tiles with nothing masked get no mask at all.
    """
    plan = []
    for i0 in range(0, T, block_q):
        i1 = min(T, i0 + block_q)
        for j0 in range(0, S, block_k):
            j1 = min(S, j0 + block_k)
            tile = None if keep is None else keep[:, :, i0:i1, j0:j1]
            if tile is not None:
                if not bool(tile.any()):
                    continue
                if bool(tile.all()):
                    tile = None
            plan.append((i0, i1, j0, j1, tile))
    return plan


def _weights_tile(q: Tensor, k: Tensor, c: Optional[Tensor], keep: Optional[Tensor], act: str,
                  heads: int, out: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """a = c * h(q k^T), masked (written into ``out`` if given, relu only); also the logits s
    when act is not relu (its backward needs them)."""
    s = torch.bmm(q, k.transpose(1, 2), out=out) if out is not None else torch.bmm(q, k.transpose(1, 2))
    if act == "relu":
        a, logits = s.relu_(), None
    else:
        a, logits = _activation(act)(s), s
        if a is s:  # identity: keep the logits intact for the backward pass
            a = s.clone()
    if c is not None:
        a.mul_(c)
    if keep is not None:
        _mask_(a, keep, heads)
    return a, logits


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Row statistics are summed in float32 (float64 for float64 inputs): in half precision a
    row sum over thousands of keys loses digits, and 1e-30 (``_safe_log``) rounds to 0."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _safe_log(a: Tensor) -> Tensor:
    """log a for a > 0 and a finite stand-in (log 1e-30) at a = 0, so that a log a = 0 there.

    Two cheap passes instead of xlogy + where (profiled: the entropy loss was a quarter of a
    ReLUFormer training step at L = 1024); for a > 1e-23 the value is log a exactly in float32.
    Half-precision inputs are computed in float32 (their 1e-30 would be 0, and 0 log 0 NaN).
    """
    return a.to(accumulation_dtype(a.dtype)).clamp_min(1e-30).log_()


def _mask_(x: Tensor, keep: Tensor, heads: int) -> Tensor:
    """Zero hidden keys in place. Multiplying by the bool mask is ~25x faster than masked_fill_
    on CPU (profiled); x is finite, so hidden entries become exactly (+/-) 0."""
    n, tq, tk = x.shape
    x.view(-1, heads, tq, tk).mul_(keep)
    return x


class _ReluFamilyAttention(torch.autograd.Function):
    """out = (c * h(q k^T) masked) v in tiles; optional per-row mass, sum a log a, non-zeros.

    q (N, T, D) already scaled, k (N, S, D), v (N, S, Dv), N = batch * heads; c (N, T, 1) or
    None; keep (B or 1, 1, T, S) bool, True where a key is visible, or None (all visible).
    """

    @staticmethod
    def forward(ctx, q, k, v, c, keep, act, heads, block_q, block_k, dense, want_rows, keep_weights):
        N, T, _ = q.shape
        S = k.size(1)
        full = None
        if dense:  # whole key rows, ~1 MB per head per tile (measured 1.6x faster than one bmm at L = 1024)
            block_q, block_k = max(16, DENSE_TILE_ELEMENTS // max(S, 1)), S
            if keep_weights:  # for backward or for the caller; else tiles are temporaries
                full = q.new_zeros(N, T, S) if keep is not None else q.new_empty(N, T, S)
        plan = _tile_plan(T, S, block_q, block_k, keep)
        out = q.new_zeros(N, T, v.size(2))
        acc = accumulation_dtype(q.dtype)
        mass = q.new_zeros((N, T) if want_rows else (0,), dtype=acc)
        xlogx = q.new_zeros((N, T) if want_rows else (0,), dtype=acc)
        nonzero = torch.zeros(N if want_rows else 0, T if want_rows else 0, dtype=torch.long, device=q.device)
        for i0, i1, j0, j1, tile in plan:
            a, _ = _weights_tile(q[:, i0:i1], k[:, j0:j1], None if c is None else c[:, i0:i1], tile, act, heads,
                                 out=None if full is None else full[:, i0:i1, j0:j1])
            out[:, i0:i1].baddbmm_(a, v[:, j0:j1])
            if want_rows:
                a_acc = a.to(acc)  # no copy unless a is half precision
                mass[:, i0:i1] += a_acc.sum(-1)
                xlogx[:, i0:i1] += torch.linalg.vecdot(a_acc, _safe_log(a_acc))
                nonzero[:, i0:i1] += torch.count_nonzero(a, dim=-1)
        ctx.mark_non_differentiable(nonzero)
        ctx.plan, ctx.act, ctx.heads, ctx.want_rows = plan, act, heads, want_rows
        ctx.save_for_backward(q, k, v, c, full)
        # the dense weights double as the module's returned attention weights (no extra copy)
        weights = full.detach() if full is not None else q.new_zeros(0)
        ctx.mark_non_differentiable(weights)
        return out, mass, xlogx, nonzero, weights

    @staticmethod
    def backward(ctx, g_out, g_mass, g_xlogx, _g_nonzero, _g_weights):
        q, k, v, c, saved_weights = ctx.saved_tensors
        act, heads = ctx.act, ctx.heads
        need_q, need_k, need_v, need_c = ctx.needs_input_grad[:4]
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dc = torch.zeros_like(c) if (c is not None and need_c) else None
        rows = ctx.want_rows and (g_mass is not None or g_xlogx is not None)
        g_out = g_out.contiguous()
        for i0, i1, j0, j1, tile in ctx.plan:
            qi, kj, vj, gi = q[:, i0:i1], k[:, j0:j1], v[:, j0:j1], g_out[:, i0:i1]
            ci = None if c is None else c[:, i0:i1]
            if saved_weights is not None:
                a, logits = saved_weights[:, i0:i1, j0:j1], None
            else:
                a, logits = _weights_tile(qi, kj, ci, tile, act, heads)
            dv[:, j0:j1].baddbmm_(a.transpose(1, 2), gi)
            da = torch.bmm(gi, vj.transpose(1, 2))  # dL/da_ij
            if rows:  # d m_i / d a_ij = 1, d e_i / d a_ij = log a_ij + 1 (a_ij > 0; zeros are cut below)
                gm = g_mass if g_mass is not None else torch.zeros_like(g_xlogx)
                if g_xlogx is not None:
                    da.addcmul_(_safe_log(a), g_xlogx[:, i0:i1, None])
                    gm = gm + g_xlogx
                da += gm[:, i0:i1, None]
            if act == "relu":
                # a > 0 exactly where s > 0 and the key is visible: ReLU's own fused backward
                ds = torch.ops.aten.threshold_backward(da, a, 0.0)
                if ci is not None:
                    if dc is not None:
                        dc[:, i0:i1] += (ds * a).sum(-1, keepdim=True) / ci
                    ds.mul_(ci)
            else:
                if dc is not None:
                    dc[:, i0:i1] += (da * a).sum(-1, keepdim=True) / ci
                dh = da * ci if ci is not None else da
                if tile is not None:
                    _mask_(dh, tile, heads)
                with torch.enable_grad():
                    s = logits.detach().requires_grad_(True)
                    ds, = torch.autograd.grad(_activation(act)(s), s, dh)
            dq[:, i0:i1].baddbmm_(ds, kj)
            dk[:, j0:j1].baddbmm_(ds.transpose(1, 2), qi)
        return (dq if need_q else None, dk if need_k else None, dv if need_v else None, dc,
                None, None, None, None, None, None, None, None)


def count_visible(keep: Tensor, rows: int = 256) -> Tensor:
    """keep.sum(-1, keepdim=True) in row chunks: summing a bool tensor first converts it to
    int64 (8 bytes per entry; 2 GB at T = S = 16384), which the memory profile showed."""
    T = keep.size(-2)
    if T <= rows:
        return keep.sum(-1, keepdim=True)
    return torch.cat([keep[..., i:i + rows, :].sum(-1, keepdim=True) for i in range(0, T, rows)], dim=-2)


def row_factor(fn: str, n_visible: Tensor, gamma: Optional[Tensor], alpha: float,
               dtype: torch.dtype = torch.float32, length_scale: bool = True) -> Optional[Tensor]:
    """c_i of each function (None for ReLA): ReLUFormer 1/(gamma sqrt(n_i/2)) (1/gamma without
    the length factor), pointwise n_i^-alpha, computed in ``accumulation_dtype(dtype)``."""
    n = n_visible.clamp(min=1).to(accumulation_dtype(dtype))
    if fn == "relu":
        return 1.0 / (gamma * torch.sqrt(n / 2.0)) if length_scale else (1.0 / gamma) * torch.ones_like(n)
    if fn == "pointwise":
        return n.pow(-alpha)
    return None


def relu_family_attention(q: Tensor, k: Tensor, v: Tensor, keep: Tensor, *, fn: str, scaling: Optional[float],
                          gamma: Optional[Tensor] = None, length_scale: bool = True,
                          alpha: float = 1.0, activation: str = "relu",
                          blocked: bool = False, block_q: int = 512, block_k: int = 512,
                          want_rows: bool = False, want_weights: bool = False, fused: bool = False):
    """ReLU-family attention without the T x S intermediates of the reference path.

    ``fused``: run the C++ kernel of :mod:`reluformer_mt.attention.fused` where it applies
    (h = relu, no weights wanted, float CPU tensors, extension built); else the dense or blocked
    path as ``blocked`` says.

    q (B, H, T, D), k/v (B, H, S, D); keep (B or 1, 1, T, S) bool; gamma broadcastable to
    (H, 1, 1) for ``relu``; ``scaling`` multiplies the logits (1/sqrt(d_h)) or is None.
    Returns (out (B, H, T, D), rows, weights) with rows = (mass, xlogx, nonzero, n_visible) of
    shape (B, H, T) each when ``want_rows`` (else None) and weights (B, H, T, S) when wanted
    (dense mode only).
    """
    B, H, T, D = q.shape
    S = k.size(2)
    act = "relu" if fn in ("relu", "rela") else activation
    if want_weights and blocked:
        raise ValueError("the blocked path never materialises the weights; use dense mode")
    if act != "relu" and not blocked:
        raise ValueError("dense mode handles h = relu only; use blocked mode or the reference path")
    n_visible = count_visible(keep)  # (B|1, 1, T, 1)
    visible = None if bool(keep.all()) else keep
    c = row_factor(fn, n_visible, gamma, alpha, q.dtype, length_scale)
    if c is not None:
        c = c.to(q.dtype).expand(B, H, T, 1)
    if scaling is not None:
        q = q * scaling
    if c is not None and act == "relu":
        q, c = q * c, None  # c_i relu(q_i.k_j) = relu((c_i q_i).k_j) for c_i > 0
    q3 = q.reshape(B * H, T, D)
    k3, v3 = k.reshape(B * H, S, D), v.reshape(B * H, S, v.size(-1))
    c3 = None if c is None else c.reshape(B * H, T, 1)
    if fused and act == "relu" and not want_weights:
        from reluformer_mt.attention import fused as fused_kernel
        if fused_kernel.supports(q3):
            out, mass, xlogx, nonzero = fused_kernel.fused_relu_attention(q3, k3, v3, visible, H, want_rows)
            return _finish(out, mass, xlogx, nonzero, None, n_visible, B, H, T, S, want_rows, False)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q3, k3, v3, c3))
    out, mass, xlogx, nonzero, weights = _ReluFamilyAttention.apply(
        q3, k3, v3, c3, visible, act, H, block_q, block_k, not blocked, want_rows,
        not blocked and (needs_grad or want_weights))
    return _finish(out, mass, xlogx, nonzero, weights, n_visible, B, H, T, S, want_rows, want_weights)


def _finish(out, mass, xlogx, nonzero, weights, n_visible, B, H, T, S, want_rows, want_weights):
    """The kernel's (N, ...) outputs reshaped to (B, H, ...) as relu_family_attention returns them."""
    out = out.view(B, H, T, -1)
    rows = None
    if want_rows:
        rows = (mass.view(B, H, T), xlogx.view(B, H, T), nonzero.view(B, H, T),
                n_visible.view(-1, 1, T).expand(B, H, T))
    return out, rows, (weights.view(B, H, T, S) if want_weights else None)


def regularisers_from_rows(mass: Tensor, xlogx: Tensor, n_visible: Tensor, ratio: float = 0.7):
    """ReLUFormer's two row losses from per-row sums (same values as ``functions.row_regularisers``).

    H(p_i) = log m_i - e_i / m_i with m_i = sum_j a_ij and e_i = sum_j a_ij log a_ij.
    Returns (norm_loss_sum, entropy_margin_sum, n_rows_used).
    """
    acc = accumulation_dtype(mass.dtype)
    mass, xlogx = mass.to(acc), xlogx.to(acc)
    live = mass > 0
    safe = torch.where(live, mass, torch.ones_like(mass))
    log_mass = torch.log(safe)
    norm_loss = log_mass.abs().masked_fill(~live, 0.0)
    entropy = log_mass - xlogx / safe
    target = entropy_margin_target(n_visible, ratio, acc)
    margin = torch.relu(entropy - target).masked_fill(~live, 0.0)
    return norm_loss.sum(), margin.sum(), live.sum()


__all__ = ["RELU_FAMILY", "count_visible", "relu_family_attention", "regularisers_from_rows", "row_factor"]
