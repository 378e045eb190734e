"""Fast and memory-bounded paths for weight functions without a row normaliser.

Weights a_ij = c_i h(s_ij + b_i) (ReLUFormer, ReLA, pointwise, sigmoid: every function whose
``WeightFunction.tiled`` is true) have no row-wise normaliser, so key blocks can be summed
independently: out_i = sum_j c_i h(s_ij + b_i) v_j over any split of j. The caller gives the
activation h, the positive row factor c_i and the row bias b_i; nothing here knows the
functions by name. One custom autograd function does the work in tiles of ``block_q`` queries
x ``block_k`` keys, all heads at once (batched matmul):

Routes (chosen by :mod:`reluformer_mt.attention.routes`, given to :func:`tiled_attention`):

- **direct**: one tile as plain tensor ops (short calls; no tiling bookkeeping);
- **dense** mode: tiles of whole key rows written into one (T, S) weight tensor that is kept for
  backward when h = relu (as autograd would, but without the extra copies: in-place activation,
  scale and mask; other activations recompute their logits in backward, as blocked mode does);
  without gradients and without wanted weights nothing is kept;
- **blocked** mode: many tiles; nothing of size T x S is kept; the backward pass recomputes each
  tile's logits (one more matmul per tile) instead of storing them. Peak extra memory is one tile
  (a few MB) instead of several T x S tensors.

Row factors and biases. ReLUFormer's 1 / (gamma sqrt(n_i / 2)) and pointwise's n_i^-alpha are
positive per-row factors c_i. For h = relu without bias, c_i relu(q_i.k_j) = relu((c_i q_i).k_j),
so c is folded into the queries before the kernel (a T x D multiply instead of a T x S one) and
autograd carries its gradient to gamma. Other activations pass c to the kernel, which returns
its gradient. A row bias b_i (sigmoid attention's -log n_i, Ramapuram et al. 2024, or its learned
per-head bias) is added to the logits inside the activation; its gradient is sum_j dL/ds_ij.

Rows for the regularisers (ReLUFormer, Shen et al. 2023, arXiv:2302.06461): instead of the
weights, the kernel can return, per query row, the mass m_i = sum_j a_ij, e_i = sum_j a_ij log a_ij
and the count of non-zero weights, from which :mod:`reluformer_mt.attention.regularisers` computes
both losses and the sparsity statistics, with exact gradients (the backward adds
g_m + g_e (log a_ij + 1) to each weight's gradient), in dense and blocked mode alike.

Not handled here (the caller uses the reference path of :mod:`reluformer_mt.attention.functions`):
additive float masks and attention dropout in training. Activations other than relu get their
derivative by autograd on the recomputed logits of each tile.
"""
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor

from reluformer_mt.attention.double_backward import grads_with_graph
from reluformer_mt.attention.functions import POINTWISE_ACTIVATIONS, accumulation_dtype
from reluformer_mt.attention.routes import DENSE_TILE_ELEMENTS
from reluformer_mt.attention.visibility import Visibility, as_visibility, count_visible



def _activation(name: str) -> Callable[[Tensor], Tensor]:
    return POINTWISE_ACTIVATIONS[name]


def _tile_plan(T: int, S: int, block_q: int, block_k: int, visible: Optional[Visibility],
               device: torch.device) -> List[tuple]:
    """(i0, i1, j0, j1, keep_tile or None) for every tile that has a visible key.

    Tiles whose keys are all hidden (the upper triangle of a causal mask, padding) are skipped;
    tiles with nothing hidden get no mask at all; only mixed tiles build their (small) mask, on
    ``device`` (a causal pattern without padding has no range tensor to take a device from).
    """
    plan = []
    for i0 in range(0, T, block_q):
        i1 = min(T, i0 + block_q)
        for j0 in range(0, S, block_k):
            j1 = min(S, j0 + block_k)
            kind = 1 if visible is None else visible.tile_kind(i0, i1, j0, j1)
            if kind == 0:
                continue
            plan.append((i0, i1, j0, j1, visible.tile(i0, i1, j0, j1, device) if kind == 2 else None))
    return plan


def _weights_tile(q: Tensor, k: Tensor, c: Optional[Tensor], b: Optional[Tensor], keep: Optional[Tensor], act: str,
                  heads: int, out: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """a = c * h(q k^T + b), masked (written into ``out`` if given); also the logits s + b when
    act is not relu (its backward needs them)."""
    if act == "relu":  # in place: the logits buffer becomes the weights
        if out is None:
            s = torch.bmm(q, k.transpose(1, 2))
        elif out.is_contiguous():
            s = torch.bmm(q, k.transpose(1, 2), out=out)
        else:  # a block of rows of the kept weights: bmm's out= would run per batch entry (see _add_bmm_)
            s = out.copy_(torch.bmm(q, k.transpose(1, 2)))
        if b is not None:
            s.add_(b)
        a, logits = s.relu_(), None
    else:
        s = torch.bmm(q, k.transpose(1, 2))
        if b is not None:
            s.add_(b)
        a, logits = _activation(act)(s), s
        if a is s:  # identity: keep the logits intact for the backward pass
            a = s.clone()
        if out is not None:
            a = out.copy_(a)
    if c is not None:
        a.mul_(c)
    if keep is not None:
        _mask_(a, keep, heads)
    return a, logits


def _safe_log(a: Tensor) -> Tensor:
    """log a for a > 0 and a finite stand-in (log 1e-30) at a = 0, so that a log a = 0 there.

    Two cheap passes instead of xlogy + where (profiled: the entropy loss was a quarter of a
    ReLUFormer training step at L = 1024); for a > 1e-23 the value is log a exactly in float32.
    Half-precision inputs are computed in float32 (their 1e-30 would be 0, and 0 log 0 NaN).
    """
    return a.to(accumulation_dtype(a.dtype)).clamp_min(1e-30).log_()


def _add_bmm_(out: Tensor, a: Tensor, b: Tensor) -> None:
    """out += a @ b (batched). ATen's CPU ``baddbmm_`` into a block of rows of a larger tensor (not
    contiguous) runs one select and addmm_ per batch entry: some 2,000 operators per dense call
    with 1,024 keys at the demo's size (profiled, issue 64); one bmm and one add do it whole."""
    if out.is_contiguous():
        out.baddbmm_(a, b)
    else:
        out.add_(torch.bmm(a, b))


def _mask_(x: Tensor, keep: Tensor, heads: int) -> Tensor:
    """Zero hidden keys in place. Multiplying by the bool mask is ~25x faster than masked_fill_
    on CPU (profiled); x is finite, so hidden entries become exactly (+/-) 0."""
    n, tq, tk = x.shape
    x.view(-1, heads, tq, tk).mul_(keep)
    return x


class _TiledAttention(torch.autograd.Function):
    """out = (c * h(q k^T + b) masked) v in tiles; optional per-row mass, sum a log a, non-zeros.

    q (N, T, D) already scaled, k (N, S, D), v (N, S, Dv), N = batch * heads; c and b (N, T, 1)
    or None; ``visible`` a Visibility, or None (all keys visible).
    """

    @staticmethod
    def forward(ctx, q, k, v, c, b, visible, act, heads, block_q, block_k, dense, want_rows, keep_weights):
        N, T, _ = q.shape
        S = k.size(1)
        full = None
        if dense:  # whole key rows, ~1 MB per head per tile (measured 1.6x faster than one bmm at L = 1024)
            block_q, block_k = max(16, DENSE_TILE_ELEMENTS // max(S, 1)), S
            if keep_weights:  # for backward or for the caller; else tiles are temporaries
                full = q.new_zeros(N, T, S) if visible is not None else q.new_empty(N, T, S)
        plan = _tile_plan(T, S, block_q, block_k, visible, q.device)
        out = q.new_zeros(N, T, v.size(2))
        acc = accumulation_dtype(q.dtype)
        mass = q.new_zeros((N, T) if want_rows else (0,), dtype=acc)
        xlogx = q.new_zeros((N, T) if want_rows else (0,), dtype=acc)
        nonzero = torch.zeros(N if want_rows else 0, T if want_rows else 0, dtype=torch.long, device=q.device)
        for i0, i1, j0, j1, tile in plan:
            a, _ = _weights_tile(q[:, i0:i1], k[:, j0:j1], None if c is None else c[:, i0:i1],
                                 None if b is None else b[:, i0:i1], tile, act, heads,
                                 out=None if full is None else full[:, i0:i1, j0:j1])
            _add_bmm_(out[:, i0:i1], a, v[:, j0:j1])
            if want_rows:
                a_acc = a.to(acc)  # no copy unless a is half precision
                mass[:, i0:i1] += a_acc.sum(-1)
                xlogx[:, i0:i1] += torch.linalg.vecdot(a_acc, _safe_log(a_acc))
                nonzero[:, i0:i1] += torch.count_nonzero(a, dim=-1)
        ctx.mark_non_differentiable(nonzero)
        ctx.plan, ctx.act, ctx.heads, ctx.want_rows = plan, act, heads, want_rows
        ctx.visible = visible
        ctx.save_for_backward(q, k, v, c, b, full)
        # the dense weights double as the module's returned attention weights (no extra copy)
        weights = full.detach() if full is not None else q.new_zeros(0)
        ctx.mark_non_differentiable(weights)
        return out, mass, xlogx, nonzero, weights

    @staticmethod
    def backward(ctx, g_out, g_mass, g_xlogx, _g_nonzero, _g_weights):
        q, k, v, c, b, saved_weights = ctx.saved_tensors
        act, heads = ctx.act, ctx.heads
        need_q, need_k, need_v, need_c, need_b = ctx.needs_input_grad[:5]
        if torch.is_grad_enabled():  # create_graph: the tiles' in-place passes below build no graph
            return (*grads_with_graph(q, k, v, c, b, ctx.visible, act, heads, (g_out, g_mass, g_xlogx),
                                      ctx.needs_input_grad[:5]), None, None, None, None, None, None, None, None)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dc = torch.zeros_like(c) if (c is not None and need_c) else None
        db = torch.zeros_like(b) if (b is not None and need_b) else None
        rows = ctx.want_rows and (g_mass is not None or g_xlogx is not None)
        g_out = g_out.contiguous()
        for i0, i1, j0, j1, tile in ctx.plan:
            qi, kj, vj, gi = q[:, i0:i1], k[:, j0:j1], v[:, j0:j1], g_out[:, i0:i1]
            ci = None if c is None else c[:, i0:i1]
            bi = None if b is None else b[:, i0:i1]
            if saved_weights is not None and act == "relu":
                a, logits = saved_weights[:, i0:i1, j0:j1], None
            else:
                a, logits = _weights_tile(qi, kj, ci, bi, tile, act, heads)
            _add_bmm_(dv[:, j0:j1], a.transpose(1, 2), gi)
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
            if db is not None:  # d(s + b)/db = 1; masked entries have ds = 0
                db[:, i0:i1] += ds.sum(-1, keepdim=True)
            _add_bmm_(dq[:, i0:i1], ds, kj)
            _add_bmm_(dk[:, j0:j1], ds.transpose(1, 2), qi)
        return (dq if need_q else None, dk if need_k else None, dv if need_v else None, dc, db,
                None, None, None, None, None, None, None, None)


TILED_ROUTES = ("direct", "dense", "blocked", "fused", "flex")


def tiled_attention(q: Tensor, k: Tensor, v: Tensor, keep, *, route: str = "dense", activation: str = "relu",
                    scaling: Optional[float] = None, row_factor: Optional[Tensor] = None,
                    row_bias: Optional[Tensor] = None, n_visible: Optional[Tensor] = None,
                    block_q: int = 512, block_k: int = 512, want_rows: bool = False, want_weights: bool = False,
                    row_sums: bool = True):
    """out_i = sum_j c_i h(s_ij + b_i) v_j without the T x S intermediates of the reference path.

    q (B, H, T, D), k/v (B, H, S, D); ``keep`` the visible keys: a
    :class:`~reluformer_mt.attention.visibility.Visibility` (key ranges and a causal flag, O(B + T)
    memory) or a (B or 1, 1, T, S) bool mask; ``activation`` h, a key of
    ``POINTWISE_ACTIVATIONS``; ``scaling`` multiplies the logits (1/sqrt(d_h)) or is None;
    ``row_factor`` c_i > 0 and ``row_bias`` b_i broadcastable to (B, H, T, 1) or None (gradients
    flow to both); ``n_visible`` (B|1, 1, T, 1) if the caller counted it already.
    ``route`` (chosen by :func:`reluformer_mt.attention.routes.choose_route`): ``direct`` (one
    tile of plain tensor ops: h = relu without row factor or bias, or any h without gradients,
    rows or weights), ``dense``, ``blocked``, ``fused`` (the C++ kernel of
    :mod:`reluformer_mt.attention.fused`: h = relu, no bias, no weights, float CPU tensors) or
    ``flex`` (FlexAttention, :mod:`reluformer_mt.attention.flex`: also no rows, key ranges only).
    A route that cannot serve the call raises ValueError: nothing here falls back.
    Returns (out (B, H, T, D), rows, weights) with rows = (mass, xlogx, nonzero, n_visible) of
    shape (B, H, T) each when ``want_rows`` (else None) and weights (B, H, T, S) when wanted
    (direct and dense routes only). ``row_sums=False`` says that only the counts are wanted (the
    statistics of a sublayer without regularisers): the direct and fused routes then skip mass
    and sum a log a (two T x S passes, or a log per weight) and return None for them (the dense
    and blocked routes compute them in the same pass as the counts and return them anyway).
    """
    options = dict(route=route, activation=activation, scaling=scaling, row_bias=row_bias, n_visible=n_visible,
                   block_q=block_q, block_k=block_k, want_rows=want_rows, want_weights=want_weights, row_sums=row_sums)
    if row_factor is not None and q.dtype == torch.float16 and activation == "relu" and row_bias is None:
        folded, rest = _split_half_factor(row_factor)
        return _rescaled(_tiled_attention(q, k, v, keep, row_factor=folded, **options), rest)
    return _tiled_attention(q, k, v, keep, row_factor=row_factor, **options)


def _tiled_attention(q: Tensor, k: Tensor, v: Tensor, keep, *, route: str, activation: str, scaling: Optional[float],
                     row_factor: Optional[Tensor], row_bias: Optional[Tensor], n_visible: Optional[Tensor],
                     block_q: int, block_k: int, want_rows: bool, want_weights: bool, row_sums: bool):
    """:func:`tiled_attention` with its row factor as it is folded (float16: the folded part)."""
    B, H, T, D = q.shape
    S = k.size(2)
    act = activation
    _check_route(route, want_weights)
    keep = as_visibility(keep)
    if n_visible is None:
        n_visible = keep.n_visible(q.device)  # (B|1, 1, T, 1)
    # the direct and dense routes mask with the pattern built on the device from a padding mask,
    # and the C++ kernel reads the ranges' check itself: none asks the host first (issue 64); the
    # blocked route and the GPU kernels take host-checked ranges (they skip padded tiles)
    visible = keep if route in ("direct", "fused", "dense") and keep.padding is not None else _resolved(keep)
    c = None if row_factor is None else row_factor.to(q.dtype).expand(B, H, T, 1)
    b = None if row_bias is None else row_bias.to(q.dtype).expand(B, H, T, 1)
    q, c = _scaled_queries(q, c, b, act, scaling)
    plain_relu = act == "relu" and c is None and b is None
    if route in ("fused", "flex") and not plain_relu:
        raise ValueError(f"the {route} route needs h = relu without row bias")
    if route == "flex":
        return _flex(q, k, v, visible, want_rows)
    q3 = q.reshape(B * H, T, D)
    k3, v3 = k.reshape(B * H, S, D), v.reshape(B * H, S, v.size(-1))
    c3 = None if c is None else c.reshape(B * H, T, 1)
    b3 = None if b is None else b.reshape(B * H, T, 1)
    if route == "fused":
        from reluformer_mt.attention import fused as fused_kernel
        out, mass, xlogx, nonzero = fused_kernel.fused_relu_attention(q3, k3, v3, visible, H, want_rows,
                                                                      row_sums=row_sums)
        if not row_sums:
            mass = xlogx = None
        return _finish(out, mass, xlogx, nonzero, None, n_visible, B, H, T, S, want_rows, False)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q3, k3, v3, c3, b3))
    if route == "direct":
        dense_keep = None if visible is None else visible.dense(q.device)
        if plain_relu:
            # one tile (sentences, L <= 512): plain autograd ops beat the tiling's bookkeeping, which
            # costs as much as the math at these sizes (measured: docs/PERFORMANCE.md)
            out, mass, xlogx, nonzero, weights = _direct_relu(q3, k3, v3, dense_keep, H, want_rows, row_sums)
            return _finish(out, mass, xlogx, nonzero, weights, n_visible, B, H, T, S, want_rows, want_weights)
        if needs_grad or want_rows or want_weights:
            raise ValueError("the direct route runs other activations than relu only without gradients, rows or weights")
        # small calls without gradients (every incremental decoding step): a few tensor ops,
        # without the tiling's bookkeeping, which profiling showed costs as much as the math there
        a, _ = _weights_tile(q3, k3, c3, b3, dense_keep, act, H)
        return _finish(torch.bmm(a, v3), None, None, None, None, n_visible, B, H, T, S, False, False)
    dense = route == "dense"
    # dense mode keeps the weights for backward only for relu (others recompute their logits)
    keep_weights = dense and (want_weights or (needs_grad and act == "relu"))
    out, mass, xlogx, nonzero, weights = _TiledAttention.apply(
        q3, k3, v3, c3, b3, visible, act, H, block_q, block_k, dense, want_rows, keep_weights)
    return _finish(out, mass, xlogx, nonzero, weights, n_visible, B, H, T, S, want_rows, want_weights)


def _resolved(keep: Visibility) -> Optional[Visibility]:
    """None when every key is visible, else the pattern as ranges that hold or a dense mask."""
    return None if keep.all_visible else keep.resolved()


def _check_route(route: str, want_weights: bool) -> None:
    if route not in TILED_ROUTES:
        raise ValueError(f"route {route!r}: expected one of {', '.join(TILED_ROUTES)}")
    if want_weights and route not in ("direct", "dense"):
        raise ValueError(f"the {route} route never materialises the weights; use dense")


def _scaled_queries(q: Tensor, c: Optional[Tensor], b: Optional[Tensor], act: str, scaling: Optional[float]):
    """(queries times the logit scale, the row factor left to apply): a relu row factor without
    bias goes into the queries too, c_i relu(q_i.k_j) = relu((c_i q_i).k_j) for c_i > 0, so one
    pass over q does both."""
    if c is not None and act == "relu" and b is None:
        return q * (c if scaling is None else c * scaling), None
    if scaling is not None:
        q = q * scaling
    return q, c


def _flex(q: Tensor, k: Tensor, v: Tensor, visible, want_rows: bool):
    """relu attention by torch's flex attention: no row sums, key ranges only."""
    if want_rows or (visible is not None and visible.mask is not None):
        raise ValueError("the flex route returns no row sums and takes key ranges, not a dense mask")
    from reluformer_mt.attention import flex as flex_kernel
    return flex_kernel.flex_relu_attention(q, k, v, visible), None, None


def _direct_relu(q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], heads: int, want_rows: bool,
                 row_sums: bool = True):
    """out = relu(q k^T) masked, times v, the rows (mass, sum a log a, non-zeros) when wanted
    (only the non-zeros without ``row_sums``), and the weights (detached, as the tiled path
    returns them), as plain differentiable tensor ops on one (N, T, S) tile (autograd does the
    backward; with the row sums and gradients, :class:`_DirectReluRows` does it in one pass)."""
    if (want_rows and row_sums and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
            and _row_kernel_supports(q)):
        return _DirectReluRows.apply(q, k, v, keep, heads)
    a, out = _relu_weights_and_output(q, k, v, keep, heads)
    if not want_rows:
        return out, None, None, None, a.detach()
    if not row_sums:  # counts only: no T x S pass for sums nobody reads
        return out, None, None, positive_counts(a.detach()), a.detach()
    mass, xlogx = mass_and_xlogx(a.to(accumulation_dtype(a.dtype)))
    return out, mass, xlogx, positive_counts(a.detach()), a.detach()


def _relu_weights_and_output(q: Tensor, k: Tensor, v: Tensor, keep: Optional[Tensor], heads: int):
    """(a, out) with a = relu(q k^T) masked (N, T, S) and out = a v, as differentiable tensor ops."""
    s = torch.bmm(q, k.transpose(1, 2))
    # in place (the GEMM's backward does not need its output): a fresh T x S buffer per op costs
    # as much as the ReLU itself at these sizes (page faults of a new allocation; profiled)
    if keep is not None:
        n, tq, tk = s.shape
        # before the ReLU, whose backward needs its output intact; outside autograd, since its
        # backward would be a pass that changes nothing: ReLU's backward is already 0 where a = 0
        with torch.no_grad():
            s.view(-1, heads, tq, tk).mul_(keep)
    a = s.relu_()
    return a, torch.bmm(a, v)


def positive_counts(a: Tensor) -> Tensor:
    """The non-zeros per row of weights a >= 0 (N, T, S), as int64 (N, T): the sum of sign(a)
    in float32 (exact for up to 2^24 keys), measured 5x faster than count_nonzero on CPU."""
    return a.sign().sum(-1, dtype=torch.float32).long()


def mass_and_xlogx(a: Tensor) -> Tuple[Tensor, Tensor]:
    """(m, e) per row of weights a (N, T, S): m_i = sum_j a_ij, e_i = sum_j a_ij log max(a_ij, 1e-30)
    (a log a = 0 at a = 0, and the gradient there is cut by the ReLU)."""
    # vecdot before sum: the order autograd's backward sums their terms in, which
    # csrc/relu_attention.cpp's direct_relu_backward reproduces (it runs the later op's first)
    xlogx = torch.linalg.vecdot(a, a.clamp_min(1e-30).log())
    return a.sum(-1), xlogx


def _row_kernel_supports(q: Tensor) -> bool:
    from reluformer_mt.attention import fused as fused_kernel
    return fused_kernel.supports(q)


class _DirectReluRows(torch.autograd.Function):
    """:func:`_direct_relu` with the row sums as one autograd node: the same forward ops, and a
    backward that does the GEMMs as autograd's bmm backward does them and everything between them
    (the row sums' terms, the output's term, ReLU's cut) in one C++ pass instead of ten, with the
    same bits (``fused.direct_relu_backward``). ReLUFormer's regularisers were the largest part of
    its extra time per call at the demo's sizes (docs/PERFORMANCE.md)."""

    @staticmethod
    def forward(ctx, q, k, v, keep, heads):
        from reluformer_mt.attention import fused as fused_kernel
        ctx.set_materialize_grads(False)  # a result no loss reads gets no term, as in autograd's graph
        a = torch.bmm(q, k.transpose(1, 2))
        nonzero = fused_kernel.relu_count_(a, keep, heads)  # mask, ReLU and counts in one pass
        out = torch.bmm(a, v)
        log_c = a.clamp_min(1e-30).log_()
        xlogx = torch.linalg.vecdot(a, log_c)
        mass = a.sum(-1)
        ctx.save_for_backward(q, k, v, a, log_c)
        ctx.keep, ctx.heads = keep, heads
        ctx.mark_non_differentiable(nonzero, a)
        return out, mass, xlogx, nonzero, a

    @staticmethod
    def backward(ctx, g_out, g_mass, g_xlogx, _g_nonzero, _g_weights):
        from reluformer_mt.attention import fused as fused_kernel
        q, k, v, a, log_c = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        if torch.is_grad_enabled():  # create_graph: the C++ pass below builds no graph (issue 34)
            dq, dk, dv, _, _ = grads_with_graph(q, k, v, None, None, ctx.keep, "relu", ctx.heads,
                                                (g_out, g_mass, g_xlogx), (need_q, need_k, need_v, False, False))
            return dq, dk, dv, None, None
        d_out = dv = None
        if g_out is not None:  # out = bmm(a, v): autograd's two GEMMs, as it calls them
            d_out = g_out.bmm(v.transpose(1, 2))
            dv = a.transpose(1, 2).bmm(g_out) if need_v else None
        if d_out is None and g_mass is None and g_xlogx is None:  # no loss reads any result
            return None, None, None, None, None
        ds = fused_kernel.direct_relu_backward(a, log_c, g_mass, g_xlogx, d_out)
        k_t = k.transpose(1, 2)  # s = bmm(q, k^T): the same two GEMMs, and the transpose's backward
        dq = ds.bmm(k_t.transpose(1, 2)) if need_q else None
        dk = q.transpose(1, 2).bmm(ds).transpose(1, 2) if need_k else None
        return dq, dk, dv, None, None


# the part of a row factor folded into float16 queries, at most 2^9 (ReLUFormer's largest factor
# with log gamma within +-5.5 is 363) and at least float16's smallest normal number (below it the
# folded queries lose digits); the rest multiplies the output, in float32
HALF_FOLD_RANGE = (2.0 ** -14, 2.0 ** 9)


def _split_half_factor(row_factor: Tensor):
    """c = c_q * r for float16 queries: c_q in ``HALF_FOLD_RANGE`` (c itself where it lies there, so
    those rows compute as they did), r = c / c_q in float32 (exactly 1 where c itself lies there)."""
    c = row_factor.to(torch.float32)
    folded = c.clamp(*HALF_FOLD_RANGE)
    return folded, c / folded


def _rescaled(result, rest: Tensor):
    """(out, rows, weights) of the folded factor c_q times the rest r: out and weights scale by r,
    the mass by r, sum a log a by r (e + log r * m)."""
    out, rows, weights = result
    B, H, T = out.shape[:3]
    r = rest.expand(B, H, T, 1)
    out = (out.float() * r).to(out.dtype)
    if weights is not None:
        weights = (weights.float() * r).to(weights.dtype)
    if rows is not None:
        mass, xlogx, nonzero, n_visible = rows
        r3 = r[..., 0]
        if xlogx is not None:
            xlogx = (r3 * (xlogx.float() + r3.log() * mass.float())).to(xlogx.dtype)
        if mass is not None:
            mass = (mass.float() * r3).to(mass.dtype)
        rows = (mass, xlogx, nonzero, n_visible)
    return out, rows, weights


def _finish(out, mass, xlogx, nonzero, weights, n_visible, B, H, T, S, want_rows, want_weights):
    """The kernel's (N, ...) outputs reshaped to (B, H, ...) as tiled_attention returns them."""
    out = out.view(B, H, T, -1)
    rows = None
    if want_rows:
        rows = (None if mass is None else mass.view(B, H, T), None if xlogx is None else xlogx.view(B, H, T),
                nonzero.view(B, H, T),
                n_visible.view(-1, 1, T).expand(B, H, T))
    return out, rows, (weights.view(B, H, T, S) if want_weights else None)


__all__ = ["TILED_ROUTES", "accumulation_dtype", "count_visible", "tiled_attention"]
