"""Attention weight functions: small registered objects, one per ``--*-attn-fn`` name.

Every function maps

- ``scores``: logits ``s_ij = q_i . k_j / sqrt(d_h)`` of shape (batch, heads, tgt, src);
- ``keep``: a bool tensor broadcastable to ``scores``, True where query i may see key j;
- ``n_visible``: the number of keys each query may see, shape broadcastable to (..., tgt, 1)
  (causal decoder rows count i + 1 keys, also during incremental decoding);
- ``params``: the sublayer's options and learned tensors (:class:`Params`)

to weights of the same shape in which every masked entry is exactly 0. ReLU-type weights are
masked *after* the activation (``masked_fill(0)``), never with -inf before it, so no masked entry
can leak (METHODS.md, section 1).

Besides ``weights`` (the reference path), each :class:`WeightFunction` declares what the module
needs to choose a faster path once, at construction:

- ``normalised``: its rows are probability distributions;
- ``tiled``: it has no row normaliser, a_ij = c_i h(s_ij + b_i), so key blocks sum
  independently and the dense / memory-bounded blocked kernel of :mod:`.blocked` applies, given
  the activation h (``activation``), the positive row factor c_i (``row_factor``) and the row
  bias b_i inside the activation (``row_bias``);
- ``fused_relu``: h = relu with no row bias, so the C++ kernel of :mod:`.fused` applies;
- ``signed``: weights can be negative (ReLUFormer's row entropy is then the reference's);
- ``parameter_names`` / ``make_parameters``: the learned tensors it owns (names are state-dict keys);
- ``transform_output``: what it does to the concatenated heads before the output projection.

References:
- ReLUFormer: Shen et al., "A Study on ReLU and Softmax in Transformer", arXiv:2302.06461.
- ReLA: Zhang, Titov, Sennrich, "Sparse Attention with Linear Units", EMNLP 2021.
- Pointwise: Wortsman et al., "Replacing softmax with ReLU in Vision Transformers", arXiv:2309.08586.
- sparsemax: Martins & Astudillo 2016; 1.5-entmax: Peters et al. 2019 (``sparse_maps`` kernel on CPU,
  the ``entmax`` package elsewhere).
- sigmoid: Ramapuram et al., "Theory, Analysis, and Best Practices for Sigmoid Self-Attention",
  ICLR 2025, arXiv:2409.04431.
- softpick: Zuhri et al., "Softpick: No Attention Sink, No Massive Activations with Rectified
  Softmax", arXiv:2504.20966.
- squared ReLU (``pointwise`` with h = relu2): Hua et al., "Transformer Quality in Linear Time"
  (FLASH), ICML 2022, arXiv:2202.10447.
"""
import math
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, NamedTuple, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from reluformer_mt.attention import sparse_maps

# Finite stand-in for -inf before sparse maps: they need real numbers to find their threshold.
_NEG_LARGE = -1e4
# ReLA's RMSNorm epsilon, from the official code (bzhangGo/zero)
RELA_EPS = 1e-8
# softpick's epsilon in the denominator (keeps a row whose logits are all 0 finite)
SOFTPICK_EPS = 1e-6
# a learned sigmoid bias starts at -log of this length: between sentence pairs (~30 tokens)
# and the 128-token document segments of the demo, so each weight starts near 1/n there
SIGMOID_LEARNED_BIAS_LENGTH = 64
SIGMOID_BIAS_MODES = ("auto", "learned")

POINTWISE_ACTIVATIONS: Dict[str, Callable[[Tensor], Tensor]] = {
    "relu": torch.relu,
    "relu2": lambda x: torch.relu(x).square(),
    "gelu": F.gelu,
    "softplus": F.softplus,
    "identity": lambda x: x,
    "relu6": F.relu6,
    "sigmoid": torch.sigmoid,
}
# pointwise activations that can be negative
SIGNED_ACTIVATIONS = ("gelu", "identity")


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Row statistics and row factors in float32 (float64 for float64 inputs): in half precision
    a row sum over thousands of keys loses digits, and 1e-30 rounds to 0."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class Params(NamedTuple):
    """What a weight function reads besides the logits: the sublayer's ``AttentionConfig`` and the
    module's learned tensors by name (only those the function declared)."""
    config: object
    learned: Mapping[str, Tensor]


# --------------------------------------------------------------------------- plain formulas
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


def pointwise_weights(scores: Tensor, keep: Tensor, n_visible: Tensor, alpha: float,
                      activation: str) -> Tensor:
    """ReLU-ViT pointwise attention: n_i^(-alpha) * h(s_ij)."""
    h = POINTWISE_ACTIVATIONS[activation]
    length_factor = n_visible.clamp(min=1).to(scores.dtype).pow(-alpha)
    return h(scores).masked_fill(~keep, 0.0) * length_factor


# sparsemax / 1.5-entmax on CPU: the sort-free row kernel of ``sparse_maps`` (exact; measured
# 2-4x faster than the ``entmax`` package's top-k search at 512-1024 keys, docs/PERFORMANCE.md).
# Elsewhere the ``entmax`` package, its threshold searched among the k largest logits of a row
# (torch.topk instead of a full sort; it re-solves a row with 2k, 4k, ... keys when the support
# reaches k, so the result is exact for any k; k = 64 was 3-4x faster than the full sort).
PARTIAL_SORT_K = 64


def _sparse_map(scores: Tensor, keep: Tensor, name: str) -> Tensor:
    logits = scores.float()
    if sparse_maps.supports(logits):  # masks inside the kernel: no masked copies of T x S tensors
        return sparse_maps.sparse_map(logits, name, keep).type_as(scores)
    from entmax import entmax15, sparsemax

    logits = logits.masked_fill(~keep, _NEG_LARGE)
    weights = (sparsemax if name == "sparsemax" else entmax15)(logits, dim=-1, k=PARTIAL_SORT_K)
    return weights.masked_fill(~keep, 0.0).type_as(scores)


def sparsemax_weights(scores: Tensor, keep: Tensor) -> Tensor:
    """sparsemax (Martins & Astudillo 2016)."""
    return _sparse_map(scores, keep, "sparsemax")


def entmax15_weights(scores: Tensor, keep: Tensor) -> Tensor:
    """1.5-entmax (Peters, Niculae, Martins 2019)."""
    return _sparse_map(scores, keep, "entmax15")


def sigmoid_weights(scores: Tensor, keep: Tensor, bias: Tensor) -> Tensor:
    """Sigmoid attention (Ramapuram et al. 2024): sigmoid(s_ij + b_i), masked entries exactly 0."""
    return torch.sigmoid(scores + bias.to(scores.dtype)).masked_fill(~keep, 0.0)


def softpick_weights(scores: Tensor, keep: Tensor, eps: float = SOFTPICK_EPS) -> Tensor:
    """Softpick (Zuhri et al. 2025): ReLU(e^s_ij - 1) / (sum_j |e^s_j - 1| + eps) over visible keys.

    Computed after subtracting m = max(0, max_j s_ij) from every logit (numerator
    ReLU(e^(s-m) - e^-m), denominator sum |e^(s_j-m) - e^-m| + eps e^-m: the same ratio), so no
    exponential overflows. Taking max(0, .) keeps e^-m <= 1 when every logit is negative.
    Masked logits are replaced by 0 before the exponential (an overflow there would turn the
    zero gradient of the masked entry into NaN). A row with no visible key is all zeros.
    """
    s = scores.float().masked_fill(~keep, 0.0)
    m = s.masked_fill(~keep, float("-inf")).amax(-1, keepdim=True).clamp(min=0.0).detach()
    shifted = torch.exp(s - m) - torch.exp(-m)
    numerator = torch.relu(shifted).masked_fill(~keep, 0.0)
    denominator = shifted.abs().masked_fill(~keep, 0.0).sum(-1, keepdim=True) + eps * torch.exp(-m)
    return (numerator / denominator).type_as(scores)


def _length(n_visible: Tensor, dtype: torch.dtype) -> Tensor:
    return n_visible.clamp(min=1).to(accumulation_dtype(dtype))


# --------------------------------------------------------------------------- the function objects
@dataclass(frozen=True)
class WeightFunction:
    """One attention weight function and what it supports (see the module docstring)."""

    name: str
    normalised: bool = False
    tiled: bool = False
    parameter_names: Tuple[str, ...] = ()

    def weights(self, scores: Tensor, keep: Tensor, n_visible: Tensor, params: Params) -> Tensor:
        raise NotImplementedError

    def scale_logits(self, config) -> bool:
        """Whether the logits keep the 1/sqrt(d_h) factor."""
        return True

    def activation(self, config) -> str:
        """h of the tiled kernel (a key of ``POINTWISE_ACTIVATIONS``)."""
        return "relu"

    def fused_relu(self, config) -> bool:
        return self.tiled and self.activation(config) == "relu"

    def signed(self, config) -> bool:
        return False

    def row_factor(self, n_visible: Tensor, params: Params, dtype: torch.dtype) -> Optional[Tensor]:
        """c_i > 0 of the tiled paths, in ``accumulation_dtype(dtype)``; None for 1."""
        return None

    def row_bias(self, n_visible: Tensor, params: Params, dtype: torch.dtype) -> Optional[Tensor]:
        """b_i inside the activation of the tiled paths; None for 0."""
        return None

    def make_parameters(self, config, num_heads: int, embed_dim: int) -> Dict[str, nn.Parameter]:
        return {}

    def transform_output(self, out: Tensor, params: Params) -> Tensor:
        """(T, B, E) concatenated heads -> the same, before the output projection."""
        return out


@dataclass(frozen=True)
class Softmax(WeightFunction):
    def weights(self, scores, keep, n_visible, params):
        return softmax_weights(scores, keep)


@dataclass(frozen=True)
class SparseMap(WeightFunction):
    """sparsemax / 1.5-entmax: probability maps with exact zeros, from the ``entmax`` package."""
    formula: Callable[[Tensor, Tensor], Tensor] = None

    def weights(self, scores, keep, n_visible, params):
        return self.formula(scores, keep)


def relu_gamma(params: Params, dtype: torch.dtype) -> Tensor:
    """ReLUFormer's gamma (> 0 by construction: a learned one is kept as log gamma),
    broadcastable to (heads, 1, 1)."""
    log_gamma = params.learned.get("log_gamma")
    if log_gamma is None:
        return torch.tensor(params.config.relu_gamma, dtype=dtype)
    gamma = log_gamma.exp().to(dtype)
    return gamma.view(-1, 1, 1) if gamma.dim() == 1 else gamma


@dataclass(frozen=True)
class ReluFormer(WeightFunction):
    """ReLU(s_ij) / (gamma sqrt(n_i / 2)) (ReLUFormer); gamma fixed or learned per layer / head."""

    def weights(self, scores, keep, n_visible, params):
        return relu_weights(scores, keep, n_visible, relu_gamma(params, scores.dtype), params.config.relu_length_scale)

    def scale_logits(self, config):
        return config.relu_scale_logits

    def row_factor(self, n_visible, params, dtype):
        gamma = relu_gamma(params, dtype)
        n = _length(n_visible, dtype)
        if params.config.relu_length_scale:
            return 1.0 / (gamma * torch.sqrt(n / 2.0))
        return (1.0 / gamma) * torch.ones_like(n)

    def make_parameters(self, config, num_heads, embed_dim):
        # kept as log(gamma): the fast paths fold 1/gamma into the queries, valid for gamma > 0 only
        if config.relu_gamma_mode == "fixed":
            return {}
        shape = (num_heads,) if config.relu_gamma_mode == "head" else ()
        return {"log_gamma": nn.Parameter(torch.full(shape, math.log(config.relu_gamma)))}


def rela_gate_init_range(embed_dim: int) -> float:
    """ReLA's gate is initialised uniformly in +-sqrt(3 / d) (the official code's scale:
    0.0765 at d = 512, 0.2165 at d = 64), not with one constant at every width."""
    return math.sqrt(3.0 / embed_dim)


@dataclass(frozen=True)
class ReLA(WeightFunction):
    """ReLU(s_ij); the concatenated heads get an RMSNorm with gain (+ ReLA-g's sigmoid gate)."""

    def weights(self, scores, keep, n_visible, params):
        return rela_weights(scores, keep)

    def make_parameters(self, config, num_heads, embed_dim):
        made = {"rela_gain": nn.Parameter(torch.full((embed_dim,), float(config.rela_gain_init)))}
        if config.rela_variant == "gated":
            bound = rela_gate_init_range(embed_dim)
            made["rela_gate"] = nn.Parameter(torch.empty(embed_dim).uniform_(-bound, bound))
        return made

    def transform_output(self, out, params):
        gain, gate = params.learned["rela_gain"], params.learned.get("rela_gate")
        rms = torch.sqrt(out.float().pow(2).mean(-1, keepdim=True) + RELA_EPS).type_as(out)
        normed = gain * out / rms
        return normed * torch.sigmoid(gate * out) if gate is not None else normed


@dataclass(frozen=True)
class Pointwise(WeightFunction):
    """n_i^-alpha h(s_ij) (ReLU-ViT); h = relu2 is FLASH's squared ReLU."""

    def weights(self, scores, keep, n_visible, params):
        return pointwise_weights(scores, keep, n_visible, params.config.pointwise_alpha,
                                 params.config.pointwise_activation)

    def activation(self, config):
        return config.pointwise_activation

    def signed(self, config):
        return config.pointwise_activation in SIGNED_ACTIVATIONS

    def row_factor(self, n_visible, params, dtype):
        return _length(n_visible, dtype).pow(-params.config.pointwise_alpha)


@dataclass(frozen=True)
class Sigmoid(WeightFunction):
    """sigmoid(s_ij + b_i) (Ramapuram et al. 2024). b_i = -log n_i by default (``auto``: each
    weight starts near 1/n_i, so the output norm does not grow with the length), a learned
    scalar per head initialised at -log ``SIGMOID_LEARNED_BIAS_LENGTH`` (``learned``), or a
    fixed number. No row normaliser and no row max: the tiled kernel applies, bias inside."""

    def weights(self, scores, keep, n_visible, params):
        return sigmoid_weights(scores, keep, self.row_bias(n_visible, params, scores.dtype))

    def activation(self, config):
        return "sigmoid"

    def row_bias(self, n_visible, params, dtype):
        mode = params.config.sigmoid_bias
        if mode == "learned":
            return params.learned["sigmoid_bias"].view(-1, 1, 1)
        n = _length(n_visible, dtype)
        if mode == "auto":
            return -torch.log(n)
        return torch.full_like(n, float(mode))

    def make_parameters(self, config, num_heads, embed_dim):
        if config.sigmoid_bias != "learned":
            return {}
        return {"sigmoid_bias": nn.Parameter(torch.full((num_heads,), -math.log(SIGMOID_LEARNED_BIAS_LENGTH)))}


@dataclass(frozen=True)
class Softpick(WeightFunction):
    """ReLU(e^s - 1) / (sum |e^s - 1| + eps) (Zuhri et al. 2025): sparse, rows sum to at most 1."""

    def weights(self, scores, keep, n_visible, params):
        return softpick_weights(scores, keep)


FUNCTIONS: Dict[str, WeightFunction] = {f.name: f for f in (
    Softmax("softmax", normalised=True),
    ReluFormer("relu", tiled=True, parameter_names=("log_gamma",)),
    ReLA("rela", tiled=True, parameter_names=("rela_gain", "rela_gate")),
    Pointwise("pointwise", tiled=True),
    SparseMap("sparsemax", normalised=True, formula=sparsemax_weights),
    SparseMap("entmax15", normalised=True, formula=entmax15_weights),
    Sigmoid("sigmoid", tiled=True, parameter_names=("sigmoid_bias",)),
    Softpick("softpick"),
)}
ATTENTION_FUNCTIONS: Tuple[str, ...] = tuple(FUNCTIONS)
# every learned tensor some function may own (a module holds None for the others)
PARAMETER_NAMES: Tuple[str, ...] = tuple(dict.fromkeys(n for f in FUNCTIONS.values() for n in f.parameter_names))


def get_function(name: str) -> WeightFunction:
    return FUNCTIONS[name]


__all__ = [
    "ATTENTION_FUNCTIONS", "FUNCTIONS", "PARAMETER_NAMES", "POINTWISE_ACTIVATIONS", "Params", "WeightFunction",
    "accumulation_dtype", "get_function", "softmax_weights", "relu_weights", "rela_weights", "pointwise_weights",
    "sparsemax_weights", "entmax15_weights", "sigmoid_weights", "softpick_weights",
]
