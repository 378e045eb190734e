"""ReLUFormer's two row losses (Shen et al. 2023, arXiv:2302.06461), in one place.

Over the scaled weights a_i of a query row:

- normalisation loss |log m_i| with m_i = sum_j a_ij pulls each row's mass towards 1 (continued
  along its tangent below ``NORM_LOSS_MIN_MASS``: finite gradients in every dtype);
- entropy-margin loss max(H(p_i) - C_i, 0) with p_i = a_i / m_i and C_i = ratio * log n_i.

Rows whose mass is 0 (null attention) or that see no key are excluded: log(0) has no useful
gradient. Two inputs, same values: the weights themselves (the reference route), or the per-row
sums m_i and e_i = sum_j a_ij log a_ij that the tiled kernels return (H(p_i) = log m_i - e_i / m_i).
"""
import math

import torch
from torch import Tensor

from reluformer_mt.attention.functions import accumulation_dtype


def entropy_margin_target(n_visible: Tensor, ratio: float = 0.7, dtype: torch.dtype = torch.float32) -> Tensor:
    """C_i = ratio * log(n_i), the entropy a row may reach before the margin loss applies."""
    return ratio * torch.log(n_visible.clamp(min=1).to(dtype))


# Below this row mass the normalisation loss |log m| continues linearly (slope -1/m_min): its
# gradient 1/m would pass float16's largest number (65504) for m < 1.5e-5 and, multiplied
# along the backward pass, already overflows q and k gradients a few binades above that.
# 2^-12 keeps it <= 4096 in every dtype; such a row is all but null attention.
NORM_LOSS_MIN_MASS = 2.0 ** -12


def normalisation_loss(mass: Tensor) -> Tensor:
    """|log m| per row for m >= ``NORM_LOSS_MIN_MASS``, its tangent below: finite value and
    gradient for every m > 0 (the loss is defined on live rows only)."""
    floor = NORM_LOSS_MIN_MASS
    linear = -math.log(floor) + (floor - mass) / floor
    return torch.where(mass >= floor, torch.log(mass.clamp(min=floor)).abs(), linear)


def row_regularisers(weights: Tensor, keep: Tensor, n_visible: Tensor, ratio: float = 0.7):
    """Both losses from weights (B, H, T, S); returns (norm_loss_sum, entropy_margin_sum, n_rows_used)."""
    w = weights.double() if weights.dtype == torch.float64 else weights.float()
    mass = w.sum(-1)
    live = (mass > 0) & keep.any(-1).expand_as(mass)
    safe_mass = torch.where(live, mass, torch.ones_like(mass))
    norm_loss = normalisation_loss(safe_mass).masked_fill(~live, 0.0)
    p = w / safe_mass.unsqueeze(-1)
    entropy = -(p * torch.log(p.clamp(min=1e-12))).sum(-1)
    target = entropy_margin_target(n_visible.squeeze(-1), ratio, w.dtype).expand_as(entropy)
    margin = torch.relu(entropy - target).masked_fill(~live, 0.0)
    return norm_loss.sum(), margin.sum(), live.sum()


def regularisers_from_rows(mass: Tensor, xlogx: Tensor, n_visible: Tensor, ratio: float = 0.7):
    """Both losses from per-row sums m_i and e_i (same values as :func:`row_regularisers`);
    returns (norm_loss_sum, entropy_margin_sum, n_rows_used)."""
    acc = accumulation_dtype(mass.dtype)
    mass, xlogx = mass.to(acc), xlogx.to(acc)
    live = mass > 0
    safe = torch.where(live, mass, torch.ones_like(mass))
    log_mass = torch.log(safe)
    norm_loss = normalisation_loss(safe).masked_fill(~live, 0.0)
    entropy = log_mass - xlogx / safe
    target = entropy_margin_target(n_visible, ratio, acc)
    margin = torch.relu(entropy - target).masked_fill(~live, 0.0)
    return norm_loss.sum(), margin.sum(), live.sum()


__all__ = ["NORM_LOSS_MIN_MASS", "entropy_margin_target", "normalisation_loss", "regularisers_from_rows",
           "row_regularisers"]
