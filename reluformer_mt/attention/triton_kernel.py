"""Triton kernel for the tiled ReLU-family attention functions (``--attn-impl triton``, CUDA).

Weights a_ij = c_i h(s_ij + b_i) over the visible keys (ReLUFormer, ReLA before its norm,
pointwise with any of its activations h, sigmoid: every function whose ``WeightFunction.tiled``
is true) have no row normaliser, so a FlashAttention-style kernel needs no running
row maximum and no rescaling of its accumulator: each (query block, key block) tile adds
a_tile v_tile to the output. This is why FlashSigmoid, a kernel for the same family, is faster than
FlashAttention-2 (Ramapuram et al. 2024, arXiv:2409.04431); ReLU needs not even the exponential.

What one forward program (one block of ``BLOCK_M`` queries of one head) does:

- the mask is the :class:`~reluformer_mt.attention.visibility.Visibility` key ranges and causal
  flag, computed from indices inside the tile (start_b <= j < min(end_b, i + offset + 1)); only the
  key blocks a row of the block can see are visited, so the causal upper triangle and padding
  blocks cost nothing, and no T x S tensor of any dtype exists;
- logits and weights in float32 (``tl.dot`` accumulates in float32 for bf16/fp16 inputs; float32
  inputs use ``input_precision="ieee"``, not TF32, so results match the reference to 1e-5);
- in the same pass, when asked, the per-row statistics ReLUFormer's regularisers and the sparsity
  statistics need (Shen et al. 2023, arXiv:2302.06461): mass m_i = sum_j a_ij,
  e_i = sum_j a_ij log a_ij (log a taken as log 1e-30 at a = 0, as ``blocked._safe_log``, so
  0 log 0 = 0) and the number of non-zero weights, as ``blocked._TiledAttention`` and
  ``fused.FusedReluAttention`` return them (the recorder drops padding query rows afterwards).

Backward recomputes each tile's logits (nothing of size T x S was kept) in two kernels without
atomics: one program per key block accumulates dk, dv; one per query block accumulates dq and the
row gradients of c_i (sum_j dL/da_ij h_ij) and b_i (sum_j dL/dz_ij). The row statistics' gradients
enter as dL/da_ij += g_m + g_e (log a_ij + 1), as in the blocked path.

Triton also runs on the CPU in interpreter mode (``TRITON_INTERPRET=1``, set before triton is
imported): ``tests/test_triton_kernel.py`` checks values and gradients against the reference
path that way. Measured on a GPU: not yet (``benchmarks/gpu_check.sh``, docs/PERFORMANCE.md).
"""
import os
from typing import Optional, Tuple

import torch
from torch import Tensor

from reluformer_mt.attention.routes import register_route
from reluformer_mt.attention.visibility import Visibility, as_visibility

try:  # installed on Linux (requirements.txt, setup.py); elsewhere the blocked path runs
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = tl = None

# activation h -> the kernel's ACT code: every h of functions.POINTWISE_ACTIVATIONS
ACTIVATIONS = {"relu": 0, "relu2": 1, "sigmoid": 2, "relu6": 3, "softplus": 4, "gelu": 5, "identity": 6}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# tile sizes on a GPU (64 x 64 is FlashAttention-2's choice for head dims up to 128 in bf16)
BLOCK_M, BLOCK_N = 64, 64


def available() -> bool:
    """Whether triton can be imported."""
    return triton is not None


def interpreting() -> bool:
    """Triton's CPU interpreter is on (kernels then take CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def supports(q: Tensor) -> bool:
    """CUDA (or interpreted CPU) tensors of float32/float16/bfloat16 with triton importable."""
    return available() and q.dtype in DTYPES and (q.is_cuda or (interpreting() and q.device.type == "cpu"))


def auto_allowed(q: Tensor) -> bool:
    """``--attn-impl auto`` may take the kernel: CUDA tensors it supports, not turned off with
    ``RELUFORMER_NO_TRITON=1``."""
    return q.is_cuda and supports(q) and os.environ.get("RELUFORMER_NO_TRITON") != "1"


def applies(activation: str, visible: Optional[Visibility], want_weights: bool) -> bool:
    """The kernel covers these activations, key ranges + causal flag (not a dense mask), and never
    returns the T x S weights."""
    return activation in ACTIVATIONS and not want_weights and (visible is None or visible.resolved().mask is None)


if triton is not None:

    @triton.jit
    def _act(z, ACT: tl.constexpr):
        """h(z) as in functions.POINTWISE_ACTIVATIONS (gelu: the exact, erf form of F.gelu)."""
        if ACT == 0:
            h = tl.maximum(z, 0.0)
        elif ACT == 1:
            r = tl.maximum(z, 0.0)
            h = r * r
        elif ACT == 2:
            h = tl.sigmoid(z)
        elif ACT == 3:
            h = tl.minimum(tl.maximum(z, 0.0), 6.0)
        elif ACT == 4:  # log(1 + e^z) without overflow
            h = tl.maximum(z, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(z)))
        elif ACT == 5:
            h = 0.5 * z * (1.0 + tl.math.erf(z * 0.7071067811865476))
        else:
            h = z
        return h

    @triton.jit
    def _act_grad(z, h, ACT: tl.constexpr):
        """dh/dz from the logit and the activation's value."""
        if ACT == 0:
            g = tl.where(z > 0, 1.0, 0.0)
        elif ACT == 1:
            g = 2.0 * tl.maximum(z, 0.0)
        elif ACT == 2:
            g = h * (1.0 - h)
        elif ACT == 3:  # as torch's hardtanh backward: 1 strictly inside (0, 6)
            g = tl.where((z > 0) & (z < 6.0), 1.0, 0.0)
        elif ACT == 4:
            g = tl.sigmoid(z)
        elif ACT == 5:  # Phi(z) + z phi(z)
            g = 0.5 * (1.0 + tl.math.erf(z * 0.7071067811865476)) + z * tl.exp(-0.5 * z * z) * 0.3989422804014327
        else:
            g = z * 0.0 + 1.0
        return g

    @triton.jit
    def _dot(x, y, PREC: tl.constexpr, UPCAST: tl.constexpr):
        """x @ y accumulated in float32. UPCAST (interpreter with half inputs only): the product of
        float32 copies of the (already rounded) operands, because triton 3.9's interpreter returns
        garbage for bf16 tl.dot (measured: errors of 1e10 on a 16 x 16 product)."""
        if UPCAST:
            out = tl.dot(x.to(tl.float32), y.to(tl.float32), input_precision="ieee")
        else:
            out = tl.dot(x, y, input_precision=PREC)
        return out

    @triton.jit
    def _visible(offs_m, offs_n, T, start, end, offset, CAUSAL: tl.constexpr):
        """(BLOCK_M, BLOCK_N) bool: query i is a real row and sees key j (Visibility's rule)."""
        vis = (offs_m[:, None] < T) & (offs_n[None, :] >= start) & (offs_n[None, :] < end)
        if CAUSAL:
            vis = vis & (offs_n[None, :] <= offs_m[:, None] + offset)
        return vis

    @triton.jit
    def _weights(q, k, scale, c, b, vis, HAS_C: tl.constexpr, HAS_B: tl.constexpr, ACT: tl.constexpr,
                 PREC: tl.constexpr, UPCAST: tl.constexpr):
        """Logits z = scale q k^T + b, h(z) and the masked weights a = c h(z), all float32 (the
        scale applied here, not to bf16 queries: their rounding would move logits near 0)."""
        z = _dot(q, tl.trans(k), PREC, UPCAST) * scale
        if HAS_B:
            z = z + b[:, None]
        h = _act(z, ACT)
        a = h * c[:, None] if HAS_C else h
        a = tl.where(vis, a, 0.0)
        return z, h, a

    @triton.jit
    def _fwd_kernel(Q, K, V, C, Bb, Starts, Ends, Out, Mass, Xlogx, Nnz,
                    T, S, D, DV, heads, n_ranges, offset, scale,
                    s_qn, s_qt, s_kn, s_ks, s_vn, s_vs, s_on, s_ot,
                    HAS_C: tl.constexpr, HAS_B: tl.constexpr, CAUSAL: tl.constexpr, ACT: tl.constexpr,
                    ROWS: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
        pid_m = tl.program_id(0)
        n = tl.program_id(1)
        r = (n // heads) % n_ranges  # one range per sentence, or one for all
        start = tl.load(Starts + r)
        end = tl.minimum(tl.load(Ends + r), S)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        row_ok = offs_m < T
        q = tl.load(Q + n * s_qn + offs_m[:, None] * s_qt + offs_d[None, :],
                    mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
        c = tl.load(C + n * T + offs_m, mask=row_ok, other=0.0) if HAS_C else None
        b = tl.load(Bb + n * T + offs_m, mask=row_ok, other=0.0) if HAS_B else None
        hi = end
        if CAUSAL:  # the block's last row sees keys up to its index + offset
            hi = tl.minimum(hi, pid_m * BLOCK_M + BLOCK_M + offset)
        lo = (start // BLOCK_N) * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
        mass = tl.zeros((BLOCK_M,), dtype=tl.float32)
        xlogx = tl.zeros((BLOCK_M,), dtype=tl.float32)
        nnz = tl.zeros((BLOCK_M,), dtype=tl.int32)
        for j0 in range(lo, hi, BLOCK_N):
            offs_n = j0 + tl.arange(0, BLOCK_N)
            col_ok = offs_n < S
            k = tl.load(K + n * s_kn + offs_n[:, None] * s_ks + offs_d[None, :],
                        mask=col_ok[:, None] & (offs_d[None, :] < D), other=0.0)
            v = tl.load(V + n * s_vn + offs_n[:, None] * s_vs + offs_dv[None, :],
                        mask=col_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
            vis = _visible(offs_m, offs_n, T, start, end, offset, CAUSAL)
            z, h, a = _weights(q, k, scale, c, b, vis, HAS_C, HAS_B, ACT, PREC, UPCAST)
            acc += _dot(a.to(v.dtype), v, PREC, UPCAST)
            if ROWS:
                mass += tl.sum(a, 1)
                xlogx += tl.sum(a * tl.log(tl.maximum(a, 1e-30)), 1)
                nnz += tl.sum((a != 0.0).to(tl.int32), 1)
        tl.store(Out + n * s_on + offs_m[:, None] * s_ot + offs_dv[None, :], acc.to(Out.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_dv[None, :] < DV))
        if ROWS:
            tl.store(Mass + n * T + offs_m, mass, mask=row_ok)
            tl.store(Xlogx + n * T + offs_m, xlogx, mask=row_ok)
            tl.store(Nnz + n * T + offs_m, nnz.to(tl.int64), mask=row_ok)

    @triton.jit
    def _tile_grad(q, k, v, do, scale, c, b, gm, ge, vis, HAS_C: tl.constexpr, HAS_B: tl.constexpr,
                   ACT: tl.constexpr, ROWS: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
        """The tile's weights a, dL/da (with the row statistics' terms), and dL/dz (masked)."""
        z, h, a = _weights(q, k, scale, c, b, vis, HAS_C, HAS_B, ACT, PREC, UPCAST)
        da = _dot(do, tl.trans(v), PREC, UPCAST)
        if ROWS:  # d m_i/d a_ij = 1, d e_i/d a_ij = log a_ij + 1 (cut below where h' = 0)
            da = da + gm[:, None] + ge[:, None] * (tl.log(tl.maximum(a, 1e-30)) + 1.0)
        dh = da * c[:, None] if HAS_C else da
        dz = tl.where(vis, dh * _act_grad(z, h, ACT), 0.0)
        return h, a, da, dz

    @triton.jit
    def _bwd_kv_kernel(Q, K, V, C, Bb, Gm, Ge, DO, DK, DVv, Starts, Ends,
                       T, S, D, DV, heads, n_ranges, offset, scale,
                       s_qn, s_qt, s_kn, s_ks, s_vn, s_vs, s_on, s_ot,
                       HAS_C: tl.constexpr, HAS_B: tl.constexpr, CAUSAL: tl.constexpr, ACT: tl.constexpr,
                       ROWS: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
        pid_n = tl.program_id(0)
        n = tl.program_id(1)
        r = (n // heads) % n_ranges
        start = tl.load(Starts + r)
        end = tl.minimum(tl.load(Ends + r), S)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        col_ok = offs_n < S
        k = tl.load(K + n * s_kn + offs_n[:, None] * s_ks + offs_d[None, :],
                    mask=col_ok[:, None] & (offs_d[None, :] < D), other=0.0)
        v = tl.load(V + n * s_vn + offs_n[:, None] * s_vs + offs_dv[None, :],
                    mask=col_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
        dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        dv = tl.zeros((BLOCK_N, BLOCK_DV), dtype=tl.float32)
        lo = 0
        # no row sees a key block outside [start, end): zero gradients, no loop
        hi = tl.where((pid_n * BLOCK_N >= end) | (pid_n * BLOCK_N + BLOCK_N <= start), 0, T)
        if CAUSAL:  # rows before (first key - offset) see none of the block
            lo = tl.maximum(pid_n * BLOCK_N - offset, 0)
            lo = (lo // BLOCK_M) * BLOCK_M
        for i0 in range(lo, hi, BLOCK_M):
            offs_m = i0 + tl.arange(0, BLOCK_M)
            row_ok = offs_m < T
            q = tl.load(Q + n * s_qn + offs_m[:, None] * s_qt + offs_d[None, :],
                        mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
            do = tl.load(DO + n * s_on + offs_m[:, None] * s_ot + offs_dv[None, :],
                         mask=row_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
            c = tl.load(C + n * T + offs_m, mask=row_ok, other=0.0) if HAS_C else None
            b = tl.load(Bb + n * T + offs_m, mask=row_ok, other=0.0) if HAS_B else None
            gm = tl.load(Gm + n * T + offs_m, mask=row_ok, other=0.0) if ROWS else None
            ge = tl.load(Ge + n * T + offs_m, mask=row_ok, other=0.0) if ROWS else None
            vis = _visible(offs_m, offs_n, T, start, end, offset, CAUSAL)
            h, a, da, dz = _tile_grad(q, k, v, do, scale, c, b, gm, ge, vis, HAS_C, HAS_B, ACT, ROWS, PREC, UPCAST)
            dv += _dot(tl.trans(a.to(do.dtype)), do, PREC, UPCAST)
            dk += _dot(tl.trans(dz.to(q.dtype)), q, PREC, UPCAST)
        dk = dk * scale  # d z_ij / d k_j = scale q_i
        tl.store(DK + n * s_kn + offs_n[:, None] * s_ks + offs_d[None, :], dk.to(DK.dtype.element_ty),
                 mask=col_ok[:, None] & (offs_d[None, :] < D))
        tl.store(DVv + n * s_vn + offs_n[:, None] * s_vs + offs_dv[None, :], dv.to(DVv.dtype.element_ty),
                 mask=col_ok[:, None] & (offs_dv[None, :] < DV))

    @triton.jit
    def _bwd_q_kernel(Q, K, V, C, Bb, Gm, Ge, DO, DQ, DC, DB, Starts, Ends,
                      T, S, D, DV, heads, n_ranges, offset, scale,
                      s_qn, s_qt, s_kn, s_ks, s_vn, s_vs, s_on, s_ot,
                      HAS_C: tl.constexpr, HAS_B: tl.constexpr, CAUSAL: tl.constexpr, ACT: tl.constexpr,
                      ROWS: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
        pid_m = tl.program_id(0)
        n = tl.program_id(1)
        r = (n // heads) % n_ranges
        start = tl.load(Starts + r)
        end = tl.minimum(tl.load(Ends + r), S)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        row_ok = offs_m < T
        q = tl.load(Q + n * s_qn + offs_m[:, None] * s_qt + offs_d[None, :],
                    mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
        do = tl.load(DO + n * s_on + offs_m[:, None] * s_ot + offs_dv[None, :],
                     mask=row_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
        c = tl.load(C + n * T + offs_m, mask=row_ok, other=0.0) if HAS_C else None
        b = tl.load(Bb + n * T + offs_m, mask=row_ok, other=0.0) if HAS_B else None
        gm = tl.load(Gm + n * T + offs_m, mask=row_ok, other=0.0) if ROWS else None
        ge = tl.load(Ge + n * T + offs_m, mask=row_ok, other=0.0) if ROWS else None
        hi = end
        if CAUSAL:
            hi = tl.minimum(hi, pid_m * BLOCK_M + BLOCK_M + offset)
        lo = (start // BLOCK_N) * BLOCK_N
        dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        dc = tl.zeros((BLOCK_M,), dtype=tl.float32)
        db = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for j0 in range(lo, hi, BLOCK_N):
            offs_n = j0 + tl.arange(0, BLOCK_N)
            col_ok = offs_n < S
            k = tl.load(K + n * s_kn + offs_n[:, None] * s_ks + offs_d[None, :],
                        mask=col_ok[:, None] & (offs_d[None, :] < D), other=0.0)
            v = tl.load(V + n * s_vn + offs_n[:, None] * s_vs + offs_dv[None, :],
                        mask=col_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
            vis = _visible(offs_m, offs_n, T, start, end, offset, CAUSAL)
            h, a, da, dz = _tile_grad(q, k, v, do, scale, c, b, gm, ge, vis, HAS_C, HAS_B, ACT, ROWS, PREC, UPCAST)
            dq += _dot(dz.to(k.dtype), k, PREC, UPCAST)
            if HAS_C:  # d a_ij / d c_i = h_ij on visible keys
                dc += tl.sum(tl.where(vis, da * h, 0.0), 1)
            if HAS_B:  # d z_ij / d b_i = 1
                db += tl.sum(dz, 1)
        dq = dq * scale
        tl.store(DQ + n * s_qn + offs_m[:, None] * s_qt + offs_d[None, :], dq.to(DQ.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_d[None, :] < D))
        if HAS_C:
            tl.store(DC + n * T + offs_m, dc, mask=row_ok)
        if HAS_B:
            tl.store(DB + n * T + offs_m, db, mask=row_ok)


def _pow2(x: int) -> int:
    """tl.arange needs powers of two, tl.dot at least 16."""
    return max(16, 1 << (max(x, 1) - 1).bit_length())


def _ranges(visible: Optional[Visibility], S: int, device):
    """(starts, ends, causal, offset) of the kernel: int64 tensors of one entry per sentence or one."""
    if visible is None:
        zero = torch.zeros(1, dtype=torch.long, device=device)
        return zero, torch.full((1,), S, dtype=torch.long, device=device), False, 0
    starts = visible.starts if visible.starts is not None else torch.zeros(1, dtype=torch.long)
    ends = visible.ends if visible.ends is not None else torch.full((1,), S, dtype=torch.long)
    if starts.numel() != ends.numel():
        starts, ends = torch.broadcast_tensors(starts.to(device), ends.to(device))
    causal = visible.causal_offset is not None
    as_kernel = (lambda t: t.to(device=device, dtype=torch.long).contiguous())
    return as_kernel(starts), as_kernel(ends), causal, visible.causal_offset if causal else 0


def _common_args(q, k, v, out, heads, n_ranges, offset, scale):
    N, T, D = q.shape
    S, DV = k.size(1), v.size(2)
    return (T, S, D, DV, heads, n_ranges, offset, float(scale),
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1))


class TritonReluFamilyAttention(torch.autograd.Function):
    """out = (c * h(q k^T + b) over visible keys) v, and per-row (mass, sum a log a, non-zeros).

    q (N, T, D), k (N, S, D), v (N, S, Dv), N = batch * heads, contiguous; ``scale`` multiplies
    the logits (in float32, inside the kernel); c, b (N, T) float32 or None; ``visible`` a
    Visibility of key ranges (no dense mask) or None (every key visible). Outputs as
    ``blocked._TiledAttention``: out (N, T, Dv) in q's dtype; mass, xlogx (N, T) float32
    and nonzero (N, T) int64 when ``want_rows`` (else empty).
    """

    @staticmethod
    def forward(ctx, q, k, v, c, b, scale, visible, act, heads, want_rows, blocks):
        N, T, D = q.shape
        S, DV = k.size(1), v.size(2)
        block_m, block_n, *launch = blocks
        starts, ends, causal, offset = _ranges(visible, S, q.device)
        out = q.new_empty(N, T, DV)
        f32 = torch.float32
        mass = q.new_zeros((N, T) if want_rows else (1,), dtype=f32)
        xlogx = q.new_zeros((N, T) if want_rows else (1,), dtype=f32)
        nonzero = torch.zeros((N, T) if want_rows else (1,), dtype=torch.long, device=q.device)
        dummy = q.new_zeros(1, dtype=f32)
        consts = _constants(q, c, b, causal, act, want_rows, block_m, block_n, D, DV, *launch)
        grid = (triton.cdiv(T, block_m), N)
        _fwd_kernel[grid](q, k, v, c if c is not None else dummy, b if b is not None else dummy, starts, ends,
                          out, mass, xlogx, nonzero, *_common_args(q, k, v, out, heads, starts.numel(), offset, scale),
                          **consts)
        ctx.mark_non_differentiable(nonzero)
        ctx.save_for_backward(q, k, v, c, b, starts, ends)
        ctx.setup = (scale, causal, offset, act, heads, want_rows, blocks)
        ctx.visible = visible
        if not want_rows:
            mass, xlogx, nonzero = mass[:0], xlogx[:0], nonzero[:0]
        return out, mass, xlogx, nonzero

    @staticmethod
    def backward(ctx, g_out, g_mass, g_xlogx, _g_nonzero):
        q, k, v, c, b, starts, ends = ctx.saved_tensors
        scale, causal, offset, act, heads, want_rows, (block_m, block_n, *launch) = ctx.setup
        if torch.is_grad_enabled():  # create_graph: the kernels build no graph (issue 34)
            from reluformer_mt.attention.double_backward import grads_with_graph
            return (*grads_with_graph(q, k, v, c, b, ctx.visible, act, heads, (g_out, g_mass, g_xlogx),
                                      ctx.needs_input_grad[:5], scale=scale),
                    None, None, None, None, None, None)
        N, T, D = q.shape
        S, DV = k.size(1), v.size(2)
        g_out = torch.zeros(N, T, DV, dtype=q.dtype, device=q.device) if g_out is None else g_out.contiguous()
        rows = want_rows and (g_mass is not None or g_xlogx is not None)
        dummy = q.new_zeros(1, dtype=torch.float32)
        gm = _row_grad(g_mass, N, T, q.device) if rows else dummy
        ge = _row_grad(g_xlogx, N, T, q.device) if rows else dummy
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dc = torch.empty(N, T, dtype=torch.float32, device=q.device) if c is not None else dummy
        db = torch.empty(N, T, dtype=torch.float32, device=q.device) if b is not None else dummy
        consts = _constants(q, c, b, causal, act, rows, block_m, block_n, D, DV, *launch)
        common = _common_args(q, k, v, g_out, heads, starts.numel(), offset, scale)
        c_arg, b_arg = (c if c is not None else dummy), (b if b is not None else dummy)
        _bwd_kv_kernel[(triton.cdiv(S, block_n), N)](q, k, v, c_arg, b_arg, gm, ge, g_out, dk, dv, starts, ends,
                                                     *common, **consts)
        _bwd_q_kernel[(triton.cdiv(T, block_m), N)](q, k, v, c_arg, b_arg, gm, ge, g_out, dq, dc, db, starts, ends,
                                                    *common, **consts)
        return (dq, dk, dv, dc if c is not None else None, db if b is not None else None,
                None, None, None, None, None, None)


def _row_grad(g: Optional[Tensor], N: int, T: int, device) -> Tensor:
    if g is None or g.numel() == 0:
        return torch.zeros(N, T, dtype=torch.float32, device=device)
    return g.to(torch.float32).contiguous()


def _constants(q, c, b, causal, act, rows, block_m, block_n, D, DV, warps: int = 4,
               stages: Optional[int] = None) -> dict:
    """The kernels' compile-time arguments and launch options. Rows of more than 256 bytes (fp32
    with head size > 64) get 2 pipeline stages instead of 3 unless ``stages`` says otherwise:
    compiled for sm_90 with 3, the dq kernel in fp32 at head size 128 needs 208 KB of shared
    memory, near the H100/H200 limit of 227 KB (144 KB with 2); bf16 at 128 needs 64 KB with 3
    (triton.compile, tests/test_triton_kernel.py)."""
    if stages is None:
        stages = 2 if q.element_size() * _pow2(max(D, DV)) > 256 else 3
    half = q.dtype != torch.float32
    return dict(num_warps=warps, num_stages=stages,
                HAS_C=c is not None, HAS_B=b is not None, CAUSAL=causal, ACT=ACTIVATIONS[act], ROWS=bool(rows),
                PREC="tf32" if half else "ieee", UPCAST=interpreting() and half,
                BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=_pow2(D), BLOCK_DV=_pow2(DV))


def _rows_of(t: Optional[Tensor], B: int, H: int, T: int) -> Optional[Tensor]:
    """A row factor or bias broadcastable to (B, H, T, 1) as a contiguous float32 (B * H, T)."""
    if t is None:
        return None
    return t.to(torch.float32).expand(B, H, T, 1).reshape(B * H, T).contiguous()


def triton_tiled_attention(q: Tensor, k: Tensor, v: Tensor, keep, *, activation: str = "relu",
                           scaling: Optional[float] = None, row_factor: Optional[Tensor] = None,
                           row_bias: Optional[Tensor] = None, n_visible: Optional[Tensor] = None,
                           want_rows: bool = False, want_weights: bool = False,
                           tiles: Tuple[int, ...] = (BLOCK_M, BLOCK_N), **blocked_options):
    """``blocked.tiled_attention`` with the Triton kernel: same arguments, same returns
    (out (B, H, T, Dv), rows (mass, xlogx, nonzero, n_visible) each (B, H, T) or None, None).

    Calls the kernel does not cover (a dense mask, another activation, returned weights, other
    dtypes or devices) run ``tiled_attention`` with ``blocked_options`` instead, so every call
    stays correct (``block_q`` / ``block_k`` there are the blocked path's tiles); ``tiles`` are the
    kernel's (queries, keys) per program, powers of two >= 16, optionally followed by the warps
    per program and the pipeline stages (``benchmarks/triton_tiles.py`` measures choices).
    """
    from reluformer_mt.attention import blocked

    keep = as_visibility(keep)
    visible = None if keep.all_visible else keep.resolved()
    if not (supports(q) and applies(activation, visible, want_weights)):
        return blocked.tiled_attention(q, k, v, keep, activation=activation, scaling=scaling, row_factor=row_factor,
                                       row_bias=row_bias, n_visible=n_visible, want_rows=want_rows,
                                       want_weights=want_weights, **blocked_options)
    B, H, T, D = q.shape
    S = k.size(2)
    if n_visible is None:
        n_visible = keep.n_visible(q.device)
    q3 = q.reshape(B * H, T, D).contiguous()
    k3 = k.reshape(B * H, S, D).to(q.dtype).contiguous()  # tl.dot needs one dtype (autocast may mix)
    v3 = v.reshape(B * H, S, v.size(-1)).to(q.dtype).contiguous()
    out, mass, xlogx, nonzero = TritonReluFamilyAttention.apply(
        q3, k3, v3, _rows_of(row_factor, B, H, T), _rows_of(row_bias, B, H, T), 1.0 if scaling is None else scaling,
        visible, activation, H,
        want_rows, tuple(tiles))
    return blocked._finish(out, mass, xlogx, nonzero, None, n_visible, B, H, T, S, want_rows, False)


def require_device(q: Tensor) -> None:
    """``--attn-impl triton`` on tensors the kernel cannot run: one clear error."""
    if not available():
        raise RuntimeError("--attn-impl triton: the triton package is not installed (pip install triton)")
    if not (q.is_cuda or interpreting()):
        raise RuntimeError(f"--attn-impl triton: runs on CUDA tensors only, got {q.device.type}; "
                           "use --attn-impl auto, fused or blocked on the CPU")


def _cannot_serve(call) -> Optional[str]:
    if not supports(call.q):
        return "the Triton kernel runs float32/float16/bfloat16 CUDA tensors (triton installed)"
    if not call.key_ranges:
        return "the visible keys are a dense mask, not key ranges + causal"
    return None


def _auto(call) -> bool:
    """Every CUDA call it serves, unless ``RELUFORMER_NO_TRITON=1``: measured on an H200
    (docs/PERFORMANCE.md#gpu) it beats FlexAttention (forward + backward at L = 4096: 2.1x SDPA's
    time against 4.0x, causal 2.2x against 15.6x) and the blocked route (a Python loop over tiles),
    and it is the only CUDA route that returns the regularisers' row sums."""
    return auto_allowed(call.q)


# every h of the tiled functions (row factors and biases included); asked for without CUDA: one
# error (require_device); where it cannot serve (dense masks, float64): the blocked route
register_route("triton", _cannot_serve, auto=_auto, fallback="blocked",
               serves=lambda function, config: function.activation(config) in ACTIVATIONS,
               require=lambda call: require_device(call.q), priority=1)


__all__ = ["ACTIVATIONS", "TritonReluFamilyAttention", "applies", "auto_allowed", "available", "interpreting",
           "require_device", "supports", "triton_tiled_attention"]
