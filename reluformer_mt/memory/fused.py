"""One memory-attention decoding step in two C++ calls (``csrc/memory_step.cpp``): each softmax
reader's sublayer over its cached keys (layer norm, query, scores, softmax, values, output
projection, gate and residual, the head-averaged weights) and the copy distribution's correction
of the step's log-probabilities. At the demo's sizes the two readers and the copy were a few
dozen small tensor operations a step, 0.7x the speed of the same model without matches
(docs/PERFORMANCE.md, guided decoding); here they are loops over the rows.

The PyTorch code in ``tm_attention.py`` stays the reference (the same outputs up to float
rounding, tests/test_memory_fused.py) and the fallback: on CUDA, for other dtypes, where the
kernel cannot be built (one warning), or with ``RELUFORMER_NO_FUSED=1``.
"""
from pathlib import Path
from typing import Optional, Tuple

import torch
from torch import Tensor

from reluformer_mt.extension import LazyExtension

SOURCE = Path(__file__).resolve().parent / "csrc" / "memory_step.cpp"
KERNEL = LazyExtension("reluformer_memory_step", SOURCE, "translation-memory step kernel",
                       "the PyTorch reader and copy step, scipy's sparse product")


def available(*tensors: Tensor) -> bool:
    """Whether the kernel serves these tensors: float32 on the CPU, and it could be built."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors) and KERNEL.load() is not None


def reader_inputs(reader) -> tuple:
    """A :class:`reluformer_mt.memory.tm_attention.MemoryReader`'s parameters in the order
    :func:`read_step` passes them (taken once per decoding, not at every step)."""
    attn, norm, gate = reader.attn, reader.layer_norm, reader.gate
    return (norm.weight, norm.bias, float(norm.eps), attn.q_proj.weight, attn.q_proj.bias, float(attn.scaling),
            attn.out_proj.weight, attn.out_proj.bias, gate.weight, gate.bias, int(attn.num_heads))


def read_step(inputs: tuple, x: Tensor, keys_t: Tensor, values: Tensor, bias: Optional[Tensor],
              keep_weights: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """x + g * Attn(LN(x), memory) of the reader whose :func:`reader_inputs` are ``inputs``, for one
    step's rows ``x`` (rows, C), a sentence's beams adjacent, over its cached ``keys_t``
    (sentences x heads, D, M), ``values`` (.., M, D), both float32 or both float16 (read as float32:
    ``MemoryReader.step_cache_dtype``), and padding ``bias`` (.., 1, M) or None.
    Returns the sublayer's output (rows, C) and the head-averaged weights (rows, M) or None."""
    norm_w, norm_b, eps, q_w, q_b, scaling, out_w, out_b, gate_w, gate_b, heads = inputs
    groups, _, slots = keys_t.shape
    out, weights = KERNEL.load().read_step(
        x, norm_w, norm_b, eps, q_w, q_b, scaling, keys_t, values,
        x.new_zeros(0) if bias is None else bias.reshape(groups, slots), out_w, out_b, gate_w, gate_b, heads,
        keep_weights)
    return out, (weights if keep_weights else None)


def copy_step(lprobs: Tensor, weights: Tensor, columns: Tensor, column_tokens: Tensor, gate_logit: Tensor) -> int:
    """:func:`reluformer_mt.memory.tm_attention._log_copy_step`'s correction of ``lprobs`` (rows, V),
    the step's log_softmax, in place, from the last reader's ``weights`` (rows, M), each sentence's
    copy table (``columns``, ``column_tokens``) and the gate's logit (rows). Returns the number of
    rows that copy."""
    return KERNEL.load().copy_step(lprobs, weights.float(), columns, column_tokens, gate_logit.float())


def sparse_scores(queries, entries):
    """``(queries @ entries).toarray()`` of two float32 scipy CSR matrices (queries, units) and
    (units, entries) as a numpy array, summed in scipy's order; None where the kernel cannot serve
    them (then scipy's product is the fallback)."""
    import numpy as np

    kernel = KERNEL.load()
    if kernel is None or queries.dtype != np.float32 or entries.dtype != np.float32:
        return None
    if entries.indices.dtype not in (np.int32, np.int64):
        return None
    as_tensor = lambda array, dtype: torch.from_numpy(np.ascontiguousarray(array, dtype=dtype))
    return kernel.sparse_scores(as_tensor(queries.indptr, np.int64), as_tensor(queries.indices, entries.indices.dtype),
                                torch.from_numpy(queries.data), as_tensor(entries.indptr, np.int64),
                                torch.from_numpy(entries.indices), torch.from_numpy(entries.data),
                                int(entries.shape[1])).numpy()
