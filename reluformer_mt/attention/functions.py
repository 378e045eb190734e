"""Attention weight functions: small functions from logits to weights, one registry.

Every function takes

- ``scores``: logits ``s_ij = q_i . k_j / sqrt(d_h)`` of shape (batch, heads, tgt, src);
- ``keep``: a bool tensor broadcastable to ``scores``, True where query i may see key j;
- ``n_visible``: the number of keys each query may see, shape broadcastable to (..., tgt, 1)

and returns weights of the same shape as ``scores`` in which every masked entry is exactly 0.
ReLU-type weights are masked *after* the activation (``masked_fill(0)``), never with -inf
before it, so no masked entry can leak (METHODS.md, section 1).

References:
- ReLUFormer: Shen et al., "A Study on ReLU and Softmax in Transformer", arXiv:2302.06461.
- ReLA: Zhang, Titov, Sennrich, "Sparse Attention with Linear Units", EMNLP 2021.
- Pointwise: Wortsman et al., "Replacing softmax with ReLU in Vision Transformers", arXiv:2309.08586.
- sparsemax: Martins & Astudillo 2016; 1.5-entmax: Peters et al. 2019 (the ``entmax`` package).
"""
from typing import Callable, Dict

import torch
import torch.nn.functional as F
from torch import Tensor

# Finite stand-in for -inf before sparse maps: they need real numbers to find their threshold.
_NEG_LARGE = -1e4


def softmax_weights(scores: Tensor, keep: Tensor) -> Tensor:
    """softmax_j(s_ij); a row with no visible key gets all zeros instead of NaN."""
    weights = torch.softmax(scores.float().masked_fill(~keep, float("-inf")), dim=-1)
    return torch.nan_to_num(weights, nan=0.0).type_as(scores)


def relu_weights(scores: Tensor, keep: Tensor, n_visible: Tensor, gamma, length_scale: bool = True) -> Tensor:
    """ReLUFormer: ReLU(s_ij) / (gamma * sqrt(n_i / 2)).

    With x, v ~ N(0, 1), sum_j ReLU(x_j) v_j has variance n/2; the factor keeps the output
    variance near 1 at every length (ReLUFormer, section 4). ``length_scale=False`` is the
    paper's ablation without the length factor: ReLU(s_ij) / gamma.
    """
    scale = gamma * torch.sqrt(n_visible.clamp(min=1).to(scores.dtype) / 2.0) if length_scale else gamma
    return torch.relu(scores).masked_fill(~keep, 0.0) / scale


def rela_weights(scores: Tensor, keep: Tensor) -> Tensor:
    """ReLA: plain ReLU(s_ij); the normalisation happens on the attention output (RMSNorm)."""
    return torch.relu(scores).masked_fill(~keep, 0.0)


POINTWISE_ACTIVATIONS: Dict[str, Callable[[Tensor], Tensor]] = {
    "relu": torch.relu,
    "relu2": lambda x: torch.relu(x).square(),
    "gelu": F.gelu,
    "softplus": F.softplus,
    "identity": lambda x: x,
    "relu6": F.relu6,
    "sigmoid": torch.sigmoid,
}


def pointwise_weights(scores: Tensor, keep: Tensor, n_visible: Tensor, alpha: float,
                      activation: str) -> Tensor:
    """ReLU-ViT pointwise attention: n_i^(-alpha) * h(s_ij)."""
    h = POINTWISE_ACTIVATIONS[activation]
    length_factor = n_visible.clamp(min=1).to(scores.dtype).pow(-alpha)
    return h(scores).masked_fill(~keep, 0.0) * length_factor


def sparsemax_weights(scores: Tensor, keep: Tensor) -> Tensor:
    """sparsemax (Martins & Astudillo 2016) from the ``entmax`` package."""
    from entmax import sparsemax

    return sparsemax(scores.float().masked_fill(~keep, _NEG_LARGE), dim=-1).masked_fill(~keep, 0.0).type_as(scores)


def entmax15_weights(scores: Tensor, keep: Tensor) -> Tensor:
    """1.5-entmax (Peters, Niculae, Martins 2019) from the ``entmax`` package."""
    from entmax import entmax15

    return entmax15(scores.float().masked_fill(~keep, _NEG_LARGE), dim=-1).masked_fill(~keep, 0.0).type_as(scores)


# name -> does the function produce a probability distribution per row?
ATTENTION_FUNCTIONS = {
    "softmax": True,
    "relu": False,
    "rela": False,
    "pointwise": False,
    "sparsemax": True,
    "entmax15": True,
}


def entropy_margin_target(n_visible: Tensor, ratio: float = 0.7, dtype: torch.dtype = torch.float32) -> Tensor:
    """C_i = ratio * log(n_i), the entropy a row may reach before the margin loss applies."""
    return ratio * torch.log(n_visible.clamp(min=1).to(dtype))


def row_regularisers(weights: Tensor, keep: Tensor, n_visible: Tensor, ratio: float = 0.7):
    """ReLUFormer's two losses per query row, over the scaled weights a_i.

    - normalisation loss |log(sum_j a_ij)| pulls each row's mass towards 1;
    - entropy-margin loss max(H(p_i) - C_i, 0) with p_i = a_i / sum_j a_ij.

    Rows whose mass is 0 (null attention) or that see no key are excluded: log(0) has no
    useful gradient. Returns (norm_loss_sum, entropy_margin_sum, n_rows_used).
    """
    w = weights.double() if weights.dtype == torch.float64 else weights.float()
    mass = w.sum(-1)
    live = (mass > 0) & keep.any(-1).expand_as(mass)
    safe_mass = torch.where(live, mass, torch.ones_like(mass))
    norm_loss = torch.log(safe_mass).abs().masked_fill(~live, 0.0)
    p = w / safe_mass.unsqueeze(-1)
    entropy = -(p * torch.log(p.clamp(min=1e-12))).sum(-1)
    target = entropy_margin_target(n_visible.squeeze(-1), ratio, w.dtype).expand_as(entropy)
    margin = torch.relu(entropy - target).masked_fill(~live, 0.0)
    return norm_loss.sum(), margin.sum(), live.sum()


__all__ = [
    "ATTENTION_FUNCTIONS",
    "POINTWISE_ACTIVATIONS",
    "softmax_weights",
    "relu_weights",
    "rela_weights",
    "pointwise_weights",
    "sparsemax_weights",
    "entmax15_weights",
    "row_regularisers",
]
