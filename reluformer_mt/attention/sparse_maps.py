"""sparsemax and 1.5-entmax rows by a sort-free C++ kernel (``csrc/sparse_maps.cpp``).

The ``entmax`` package finds each row's threshold with ``torch.topk`` / ``torch.sort`` and
several full passes over the (N, T, S) logits; this kernel does one row per task: the maximum,
the candidates above max - 1, Newton steps with an exact closed-form finish (the file's comment
says why that is exact). Results equal the ``entmax`` package's (tests/test_sparse_maps.py), which
stays the reference, and the fallback on CUDA, for other dtypes, or when the kernel cannot be
built (one warning). ``RELUFORMER_NO_FUSED=1`` disables it.

Papers: Martins & Astudillo 2016 (sparsemax, arXiv:1602.02068); Peters, Niculae & Martins 2019
(1.5-entmax, arXiv:1905.05702); the threshold search is Michelot's (1986) projection step for
sparsemax, generalised as Newton's method on the convex threshold equation for 1.5-entmax.
"""
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from reluformer_mt.extension import LazyExtension
from reluformer_mt.attention.routes import register_route

SOURCE = Path(__file__).resolve().parent / "csrc" / "sparse_maps.cpp"
ALPHA = {"sparsemax": 2.0, "entmax15": 1.5}

KERNEL = LazyExtension("reluformer_sparse_maps", SOURCE, "sparsemax/entmax15 kernel", "the entmax package")


def load(verbose: bool = False):
    """The compiled extension, building it on first use; None (after one warning) if that fails."""
    return KERNEL.load(verbose)


def supports(logits: Tensor) -> bool:
    return logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64) and load() is not None


def _cannot_serve(call) -> Optional[str]:
    # the logits reach the kernel as float32 (functions._sparse_map), whatever q's dtype
    if call.q.device.type == "cpu" and load() is not None:
        return None
    return "the C++ sparse-map kernel runs CPU tensors, where it could be built"


# the weights of sparsemax / 1.5-entmax (WeightFunction.weights_kernel); elsewhere the entmax package
register_route("sparse", _cannot_serve, auto=lambda call: True, fallback="reference",
               weights_of=lambda function, config: function.weights_kernel == "sparse")


class SparseMap(torch.autograd.Function):
    """p = sparsemax(z) (alpha 2) or entmax15(z) (alpha 1.5) over the last dimension of z
    (B, H, T, S), hidden keys (``keep`` False, (B|1, H|1, T, S) or an empty tensor) 0."""

    @staticmethod
    def forward(ctx, logits: Tensor, keep: Tensor, alpha: float) -> Tensor:
        probs = load().forward(logits, keep, alpha)
        ctx.save_for_backward(probs)
        ctx.alpha = alpha
        return probs

    @staticmethod
    def backward(ctx, grad: Tensor):
        probs, = ctx.saved_tensors
        # p = 0 at hidden keys, so their gradient is 0 too: no mask needed here
        return load().backward(probs, grad, ctx.alpha), None, None


def sparse_map(logits: Tensor, name: str, keep: Optional[Tensor] = None) -> Tensor:
    """``name`` ("sparsemax" or "entmax15") of ``logits`` over the last dimension, by the kernel
    (callers check :func:`supports` first). ``keep``: a bool mask broadcastable to ``logits``;
    hidden keys get 0 and a row without a visible key is all 0 (no masked copy of the logits)."""
    alpha = ALPHA[name]
    if keep is None:
        return SparseMap.apply(logits, logits.new_zeros(0, dtype=torch.bool), alpha)
    if (logits.dim() == 4 and keep.dim() == 4 and keep.shape[2:] == logits.shape[2:]
            and keep.size(0) in (1, logits.size(0)) and keep.size(1) in (1, logits.size(1))):
        return SparseMap.apply(logits, keep, alpha)  # attention's (B|1, 1, T, S) mask, as it is
    S = logits.size(-1)  # any other shape: one row per leading index
    flat = SparseMap.apply(logits.reshape(1, 1, -1, S), keep.expand(logits.shape).reshape(1, 1, -1, S), alpha)
    return flat.view(logits.shape)


__all__ = ["ALPHA", "load", "sparse_map", "supports"]
