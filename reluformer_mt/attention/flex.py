"""CUDA path for ReLU attention (h = relu) through PyTorch's FlexAttention (``--attn-impl flex``; ``auto``
where the Triton kernel is not available).

FlexAttention computes softmax attention with a user ``score_mod`` in one fused, block-sparse
kernel and can return the log-sum-exp of every row. With the score ``log relu(s)`` (-inf where
s <= 0) its softmax weights are relu(s_ij) / m_i with m_i = sum_j relu(s_ij) = exp(lse_i), so

    sum_j relu(s_ij) v_j = out_i * exp(lse_i)

is ReLU attention without a T x S tensor, with FlexAttention's own backward (the log-sum-exp has
a gradient). The scale and the positive row factor (ReLUFormer's 1 / (gamma sqrt(n_i / 2)),
Shen et al. 2023, arXiv:2302.06461) are folded into the queries before, as for the CPU kernel.
The visible keys (:class:`~reluformer_mt.attention.visibility.Visibility`) become a block mask,
so blocks that no query sees (the causal upper triangle, padding) are skipped. ReLU needs no
running row maximum, which is where sigmoid attention's FlashSigmoid kernel gets its speed-up
(Ramapuram et al. 2024); here the gain, if any, comes from the block sparsity and FlexAttention's
tiling, so it is measured (benchmarks/run.py), not assumed.

Not covered (the caller takes the blocked path): the regularisers' row sums (sum a log a is not a
weighted sum of the values), returned weights, masks that are not key ranges + causal.
FlexAttention is compiled with ``torch.compile`` on CUDA; on CPU it runs eagerly, forward only
(PyTorch does not differentiate it there), which is how the tests check this file without a GPU.
"""
import math
import os
from typing import Optional

import torch
from torch import Tensor

from reluformer_mt.attention.routes import register_route
from reluformer_mt.attention.visibility import Visibility

_compiled = None


def _flex_attention():
    """FlexAttention (torch >= 2.5); None where missing (``flex_relu_attention`` compiles it on CUDA)."""
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError:
        return None
    return flex_attention


def supports(q: Tensor) -> bool:
    """CUDA queries, FlexAttention present, not disabled by ``RELUFORMER_NO_FLEX=1``."""
    return q.is_cuda and os.environ.get("RELUFORMER_NO_FLEX") != "1" and _flex_attention() is not None


def _cannot_serve(call) -> Optional[str]:
    if not supports(call.q):
        return "FlexAttention needs CUDA queries and torch >= 2.5 (and RELUFORMER_NO_FLEX unset)"
    if call.want_rows:
        return "attention statistics or ReLUFormer's regularisers (per-row sums)"
    if not call.key_ranges:
        return "a mask that is not key ranges and a causal flag"
    return None


# auto: every CUDA call it can serve that the Triton kernel (tried first, measured faster on an H200:
# docs/PERFORMANCE.md#gpu) leaves, saying once why one runs elsewhere; asked for where it cannot:
# what auto would run without it
register_route("flex", _cannot_serve, auto=lambda call: supports(call.q), fallback="auto", announce=True)


def log_relu_score(score: Tensor, batch: Tensor, head: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """FlexAttention score_mod: log relu(s), -inf where s <= 0 (such keys get weight 0)."""
    return torch.where(score > 0, torch.log(score.clamp_min(1e-30)), -math.inf)


def block_mask(visible: Optional[Visibility], batch: int, heads: int, device):
    """FlexAttention's BlockMask for key ranges + causal flag; None when every key is visible."""
    if visible is None or visible.all_visible:
        return None
    visible = visible.resolved()
    if visible.mask is not None:
        raise ValueError("the flex path takes key ranges and a causal flag, not a dense mask")
    from torch.nn.attention.flex_attention import create_block_mask

    T, S = visible.tgt_len, visible.src_len
    starts = (visible.starts if visible.starts is not None else torch.zeros(1, dtype=torch.long)).to(device)
    ends = (visible.ends if visible.ends is not None else torch.full((1,), S, dtype=torch.long)).to(device)
    if starts.numel() == 1:
        starts, ends = starts.expand(batch), ends.expand(batch)
    offset = visible.causal_offset

    def mask_mod(b, h, q_idx, kv_idx):
        keep = (kv_idx >= starts[b]) & (kv_idx < ends[b])
        return keep & (kv_idx <= q_idx + offset) if offset is not None else keep

    return create_block_mask(mask_mod, batch, None, T, S, device=device)


def flex_relu_attention(q: Tensor, k: Tensor, v: Tensor, visible: Optional[Visibility]) -> Tensor:
    """sum_j relu(q_i . k_j) v_j over the visible keys; q (B, H, T, D) already scaled and
    row-factored, k (B, H, S, D), v (B, H, S, Dv)."""
    global _compiled
    flex = _flex_attention()
    if flex is None:
        raise RuntimeError("FlexAttention needs torch >= 2.5")
    if q.is_cuda:
        if _compiled is None:
            _compiled = torch.compile(flex, dynamic=False)
        flex = _compiled
    mask = block_mask(visible, q.size(0), q.size(1), q.device)
    out, lse = flex(q, k, v, score_mod=log_relu_score, block_mask=mask, scale=1.0, return_lse=True)
    mass = torch.exp(lse.float()).unsqueeze(-1)
    # rows without a positive logit: lse = -inf, mass 0 (their output must be exactly 0, never NaN)
    return torch.where(mass > 0, out.float() * mass, torch.zeros((), device=out.device)).to(q.dtype)


__all__ = ["block_mask", "flex_relu_attention", "log_relu_score", "supports"]
