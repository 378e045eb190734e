"""Second derivatives of the attention kernels (issue 34).

The hand-written backward passes of the direct route's row-sum node, the tiles, the C++ kernel and
the Triton kernel compute gradients without building a graph of them, so ``create_graph=True``
(a gradient penalty, double backward) got None or zeros. Under ``create_graph`` (grad mode on
inside backward) each of them calls :func:`grads_with_graph` instead, which recomputes the weights
as plain autograd ops and differentiates those, with a graph.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from reluformer_mt.attention.functions import POINTWISE_ACTIVATIONS, accumulation_dtype


def grads_with_graph(q: Tensor, k: Tensor, v: Tensor, c: Optional[Tensor], b: Optional[Tensor], visible, act: str,
                     heads: int, grads: Tuple[Optional[Tensor], ...], needs: Tuple[bool, ...],
                     scale: Optional[float] = None) -> List[Optional[Tensor]]:
    """The gradients of (out, mass, xlogx) for q, k, v, c, b when autograd wants a graph of them
    (``create_graph=True``: double backward, gradient penalties). The kernels' own backward passes
    (C++, tiles, Triton) are not differentiable, so this recomputes a = c h(s q k^T + b) masked as
    plain autograd ops (one T x S tensor per head) and differentiates that, with a graph.
    ``visible``: a Visibility, a (B|1, 1, T, S) bool mask or None; c, b (N, T[, 1]) or None."""
    N, T, _ = q.shape
    S = k.size(1)
    keep = None if visible is None else (visible if isinstance(visible, Tensor) else visible.dense(q.device))
    inputs = [(i, t) for i, (t, need) in enumerate(zip((q, k, v, c, b), needs)) if need and t is not None]
    result: List[Optional[Tensor]] = [None] * 5
    wanted = [(i, g) for i, g in enumerate(grads) if g is not None and g.numel() > 0]
    if not inputs or not wanted:
        return result
    with torch.enable_grad():
        s = torch.bmm(q if scale is None else q * scale, k.transpose(1, 2))
        if b is not None:
            s = s + b.reshape(N, T, 1).to(s.dtype)
        a = POINTWISE_ACTIVATIONS[act](s)
        if c is not None:
            a = a * c.reshape(N, T, 1).to(a.dtype)
        if keep is not None:
            a = (a.view(-1, heads, T, S) * keep).view(N, T, S)
        out = torch.bmm(a, v)
        a_acc = a.to(accumulation_dtype(a.dtype))
        outputs = (out, a_acc.sum(-1), torch.linalg.vecdot(a_acc, a_acc.clamp_min(1e-30).log()))
    found = torch.autograd.grad([outputs[i] for i, _ in wanted], [t for _, t in inputs],
                                [g.to(outputs[i].dtype).view_as(outputs[i]) for i, g in wanted],
                                create_graph=True, allow_unused=True)
    for (i, t), g in zip(inputs, found):
        result[i] = g.view_as(t) if g is not None else torch.zeros_like(t)
    return result



__all__ = ["grads_with_graph"]
