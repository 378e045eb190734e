"""Neutralise two traps of the Python-3.11 fairseq builds (ve-fairseq / fairseq-fixed), once, at import.

1. torch >= 2.6 loads checkpoints with ``weights_only=True`` and refuses the argparse, omegaconf
   and numpy objects that fairseq stores in them. We *allowlist* exactly those types with
   ``torch.serialization.add_safe_globals`` instead of switching the safety check off, so a
   checkpoint carrying any other pickled object is still refused.
2. ``batch_by_size`` in these builds drops the final batch when the number of remaining
   sentences is not a multiple of ``--required-batch-size-multiple`` (upstream issues #5036,
   #5351): ``fairseq-generate`` translates 96 of 100 sentences. We wrap it so that every index
   it was given comes back in some batch; the missing ones form extra batches.
"""
import argparse
import collections
import logging
import typing

import numpy as np
import torch

logger = logging.getLogger(__name__)

_PATCHED_ATTR = "_reluformer_mt_patched"


def _checkpoint_safe_types():
    """The classes a fairseq checkpoint pickles besides tensors and builtins."""
    import omegaconf
    from omegaconf import base, nodes

    types = [
        argparse.Namespace,
        collections.defaultdict,
        collections.OrderedDict,
        typing.Any,
        # omegaconf pickles its element types by reference
        dict, list, tuple, set, int, float, str, bool, bytes,
        omegaconf.DictConfig,
        omegaconf.ListConfig,
        base.ContainerMetadata,
        base.Metadata,
        nodes.AnyNode,
        nodes.StringNode,
        nodes.IntegerNode,
        nodes.FloatNode,
        nodes.BooleanNode,
        nodes.EnumNode,
        np.dtype,
        np.ndarray,
        # numpy scalars (e.g. the BLEU stored by --eval-bleu as "best" metric) pickle through
        # these reconstructors and their dtype classes
        np.core.multiarray.scalar if hasattr(np, "core") else None,
        np.core.multiarray._reconstruct if hasattr(np, "core") else None,
    ]
    for name in ("Float64DType", "Float32DType", "Int64DType", "Int32DType", "BoolDType"):
        dtype_cls = getattr(getattr(np, "dtypes", None), name, None)
        if dtype_cls is not None:
            types.append(dtype_cls)
    for name in ("float64", "float32", "int64", "int32", "bool_"):
        types.append(getattr(np, name))
    return [t for t in types if t is not None]


def allow_fairseq_checkpoints():
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is None:  # torch < 2.4 loads everything anyway
        return
    add_safe_globals(_checkpoint_safe_types())


def _complete_batches(batch_by_size):
    """Wrap ``data_utils.batch_by_size`` so it never loses an index."""

    def batch_by_size_keeping_all(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None,
                                  max_sentences=None, required_batch_size_multiple=1,
                                  fixed_shapes=None):
        batches = batch_by_size(indices, num_tokens_fn, num_tokens_vec=num_tokens_vec,
                                max_tokens=max_tokens, max_sentences=max_sentences,
                                required_batch_size_multiple=required_batch_size_multiple,
                                fixed_shapes=fixed_shapes)
        if fixed_shapes is not None:
            return batches  # fixed shapes drop by design: TPU-style callers ask for it
        wanted = np.asarray(indices, dtype=np.int64).reshape(-1)
        batched = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]) if len(batches) else np.zeros(0, np.int64)
        if len(batched) == len(wanted):
            return batches
        missing = wanted[~np.isin(wanted, batched)]
        if len(missing) == 0:
            return batches
        # re-batch the leftovers with multiple 1: they are few and all must be seen
        extra = batch_by_size(missing, num_tokens_fn,
                              num_tokens_vec=None if num_tokens_vec is None else
                              np.asarray(num_tokens_vec)[np.isin(wanted, missing)],
                              max_tokens=max_tokens, max_sentences=max_sentences,
                              required_batch_size_multiple=1)
        return list(batches) + list(extra)

    batch_by_size_keeping_all.__wrapped__ = batch_by_size
    return batch_by_size_keeping_all


def keep_every_sentence():
    from fairseq.data import data_utils

    if getattr(data_utils.batch_by_size, _PATCHED_ATTR, False):
        return
    patched = _complete_batches(data_utils.batch_by_size)
    setattr(patched, _PATCHED_ATTR, True)
    data_utils.batch_by_size = patched


def apply():
    allow_fairseq_checkpoints()
    keep_every_sentence()
