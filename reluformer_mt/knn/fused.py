"""One kNN-MT beam step in two C++ calls (``csrc/knn_step.cpp``): the search of each row's own
unit of keys (:class:`reluformer_mt.knn.search.PerInputDatastores`, the restricted corpus search)
and the mixture of the neighbours' shares into the log-probabilities. On the demo's model a step's
few dozen small tensor operations cost as much as the decoder's step itself (docs/PERFORMANCE.md,
guided decoding); here they are two loops over the rows.

The PyTorch code in ``search.py`` and ``readout.mix_neighbours`` stays the reference (the same
neighbours and mixed scores up to float rounding, tests/test_knn_fused.py) and the fallback: on
CUDA, for other dtypes, where the kernel cannot be built (one warning), or with
``RELUFORMER_NO_FUSED=1``.
"""
from pathlib import Path
from typing import Optional, Tuple

import torch
from torch import Tensor

from reluformer_mt.extension import LazyExtension

SOURCE = Path(__file__).resolve().parent / "csrc" / "knn_step.cpp"
READOUTS = ("softmax", "relu")  # the read-outs mix_readout computes (sparsemax and entmax15: readout.py)
KERNEL = LazyExtension("reluformer_knn_step", SOURCE, "kNN-MT step kernel", "the PyTorch search and mixture")


def available(*tensors: Tensor) -> bool:
    """Whether the kernel serves these tensors: float32 on the CPU, and it could be built."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors) and KERNEL.load() is not None


def unit_neighbours(states: Tensor, units: Tensor, keys_t: Tensor, norms: Tensor, counts: Tensor, values: Tensor,
                    trust: Tensor, k: int, ordered: bool = True) -> Tuple[Tensor, Tensor, Tensor]:
    """(distances, values, trust) (rows, min(k, n)) of each row's nearest entries among the first
    ``counts[unit]`` of its unit ``units[row]`` in ``keys_t`` (units, dim, n: each unit's keys
    transposed), nearest first (``ordered``) or in any order (a read-out that only sums over them)."""
    return tuple(KERNEL.load().unit_neighbours(states.contiguous(), units.contiguous(), keys_t, norms, counts, values,
                                               trust, int(k), bool(ordered)))


def mix_votes(lprobs: Tensor, rows: Optional[Tensor], weights: Tensor, values: Tensor, model_share: Tensor,
              top: Tensor) -> int:
    """``lprobs`` mixed in place at ``rows`` (None: all) as :func:`reluformer_mt.knn.readout.mix_neighbours`
    does; returns the number of those rows whose best token the neighbours changed."""
    if rows is None:
        rows = torch.arange(lprobs.size(0))
    return KERNEL.load().mix_votes(lprobs, rows.long(), weights.float(), values.long(), model_share.float().contiguous(),
                                   top.float().reshape(-1).contiguous())


def mix_readout(lprobs: Tensor, rows: Optional[Tensor], distances: Tensor, values: Tensor, trust: Optional[Tensor],
                top: Tensor, lam: float, readout: str, temperature: float, radius: float, model_floor: float) -> Tuple[int, int]:
    """The softmax or ReLU read-out of ``distances`` (:func:`reluformer_mt.knn.readout.neighbour_weights`),
    the mass scaled by the voting entries' ``trust`` (None: not), the share lam * mass capped so
    that the model keeps ``model_floor``, mixed into ``lprobs`` in place at ``rows`` (None: all):
    :class:`reluformer_mt.knn.search.KnnMixer`'s steps in one loop. Returns (rows whose best token
    the neighbours changed, rows where the neighbours had mass)."""
    if readout not in READOUTS:
        raise ValueError(f"the C++ mixture reads out {' or '.join(READOUTS)}, not {readout!r}")
    if rows is None:
        rows = torch.arange(lprobs.size(0))
    empty = distances.new_zeros(0)
    changed, with_mass = KERNEL.load().mix_readout(
        lprobs, rows.long(), distances.float(), values.long(), empty if trust is None else trust.float(),
        top.float().reshape(-1).contiguous(), float(lam), readout == "relu", float(temperature), float(radius),
        float(model_floor))
    return changed, with_mass


def mix_adaptive(lprobs: Tensor, rows: Optional[Tensor], distances: Tensor, values: Tensor, top: Tensor, net,
                 model_floor: float) -> Tuple[int, int]:
    """Adaptive kNN-MT's step (:func:`reluformer_mt.knn.adaptive.adaptive_weights` with its prefix
    sums, then the mixture) for ``distances`` (rows, k_max) nearest first and a Meta-k network
    ``net`` whose read-out is softmax or relu, in place at ``rows`` (None: all). Returns (rows whose
    best token the neighbours changed, rows where the neighbours had mass)."""
    config = net.config
    if config.readout not in READOUTS or distances.size(1) != config.k_max:
        raise ValueError(f"the C++ adaptive mixture needs a {' or '.join(READOUTS)} read-out of k_max neighbours")
    if rows is None:
        rows = torch.arange(lprobs.size(0))
    first, second = net.net[0], net.net[2]
    last = torch.tensor([min(size, config.k_max) - 1 for size in config.choices[1:]], dtype=torch.long)
    changed, with_mass = KERNEL.load().mix_adaptive(
        lprobs, rows.long(), distances.float(), values.long(), top.float().reshape(-1).contiguous(),
        first.weight.detach().float(), first.bias.detach().float(), second.weight.detach().float(),
        second.bias.detach().float(), last, float(config.scale), config.readout == "relu", float(config.temperature),
        float(config.radius), float(model_floor))
    return changed, with_mass
