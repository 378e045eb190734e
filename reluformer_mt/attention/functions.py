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
    """softmax_j(s_ij); a row with no visible key gets all zeros instead of NaN. Computed in
    float32 (float64 for float64 scores)."""
    weights = torch.softmax(scores.to(accumulation_dtype(scores.dtype)).masked_fill(~keep, float("-inf")), dim=-1)
    return torch.nan_to_num(weights, nan=0.0).type_as(scores)


# sparsemax / 1.5-entmax: with ``kernel`` (the ``sparse`` route, CPU: routes.choose_route decides)
# the sort-free row kernel of ``sparse_maps`` (exact; measured 2-4x faster than the ``entmax``
# package's top-k search at 512-1024 keys, docs/PERFORMANCE.md); else the ``entmax`` package, its
# threshold searched among the k largest logits of a row (torch.topk instead of a full sort; it
# re-solves a row with 2k, 4k, ... keys when the support reaches k, so the result is exact for
# any k; k = 64 was 3-4x faster than the full sort).
PARTIAL_SORT_K = 64


def _sparse_map(scores: Tensor, keep: Tensor, name: str, kernel: bool) -> Tensor:
    logits = scores.to(accumulation_dtype(scores.dtype))
    if kernel:  # masks inside the kernel: no masked copies of T x S tensors
        return sparse_maps.sparse_map(logits, name, keep).type_as(scores)
    from entmax import entmax15, sparsemax

    # both maps are shift-invariant: with each row's largest visible logit at 0, the hidden
    # keys' -1e4 lies below every logit that can get weight, also in rows whose visible logits
    # are all below -1e4 (which would otherwise come out all zeros)
    top = logits.masked_fill(~keep, float("-inf")).amax(-1, keepdim=True)
    logits = (logits - torch.where(torch.isfinite(top), top, torch.zeros_like(top)).detach()).masked_fill(~keep, _NEG_LARGE)
    weights = (sparsemax if name == "sparsemax" else entmax15)(logits, dim=-1, k=PARTIAL_SORT_K)
    return weights.masked_fill(~keep, 0.0).type_as(scores)


def sparsemax_weights(scores: Tensor, keep: Tensor, kernel: bool = False) -> Tensor:
    """sparsemax (Martins & Astudillo 2016)."""
    return _sparse_map(scores, keep, "sparsemax", kernel)


def entmax15_weights(scores: Tensor, keep: Tensor, kernel: bool = False) -> Tensor:
    """1.5-entmax (Peters, Niculae, Martins 2019)."""
    return _sparse_map(scores, keep, "entmax15", kernel)


def softpick_weights(scores: Tensor, keep: Tensor, eps: float = SOFTPICK_EPS) -> Tensor:
    """Softpick (Zuhri et al. 2025): ReLU(e^s_ij - 1) / (sum_j |e^s_j - 1| + eps) over visible keys.

    Computed after subtracting m = max(0, max_j s_ij) from every logit (numerator
    ReLU(e^(s-m) - e^-m), denominator sum |e^(s_j-m) - e^-m| + eps e^-m: the same ratio), so no
    exponential overflows. Taking max(0, .) keeps e^-m <= 1 when every logit is negative.
    Masked logits are replaced by 0 before the exponential (an overflow there would turn the
    zero gradient of the masked entry into NaN). A row with no visible key is all zeros.
    For |s| < 1 the difference is e^-m expm1(s): e^(s-m) - e^-m there cancels digits (relative
    error 1.5e-3 at s ~ 1e-5 in float32), and with one visible key the weight s / (s + eps) would
    jump from 0 instead of rising. Computed in float32 (float64 for float64 scores).
    """
    s = scores.to(accumulation_dtype(scores.dtype)).masked_fill(~keep, 0.0)
    m = s.masked_fill(~keep, float("-inf")).amax(-1, keepdim=True).clamp(min=0.0).detach()
    near_zero = s.abs() < 1.0
    shifted = torch.where(near_zero, torch.exp(-m) * torch.expm1(s.clamp(-1.0, 1.0)), torch.exp(s - m) - torch.exp(-m))
    numerator = torch.relu(shifted).masked_fill(~keep, 0.0)
    denominator = shifted.abs().masked_fill(~keep, 0.0).sum(-1, keepdim=True) + eps * torch.exp(-m)
    return (numerator / denominator).type_as(scores)


def _length(n_visible: Tensor, dtype: torch.dtype) -> Tensor:
    return n_visible.clamp(min=1).to(dtype)


@dataclass(frozen=True)
class Learned:
    """A learned tensor a function owns: its state-dict name, when the options create it, and
    its initial value (config, heads, embed_dim) -> Tensor."""

    name: str
    wanted: Callable[[object], bool]
    initial: Callable[[object, int, int], Tensor]


def _always(config) -> bool:
    return True


# --------------------------------------------------------------------------- the function objects
@dataclass(frozen=True)
class WeightFunction:
    """One attention weight function and what it supports (see the module docstring).

    A ``tiled`` function states its math once, as parts: a_ij = c_i h(s_ij + b_i) with h
    (``activation``), the row bias b_i (``row_bias``) and the row factor c_i, given either as a
    factor (``row_factor``) or as a divisor d_i = 1 / c_i (``row_divisor``); :meth:`weights` (the
    reference) and the kernels of :mod:`.blocked` are both derived from the parts. Parts are
    computed in the dtype they are asked for (the kernels: ``accumulation_dtype``).
    """

    name: str
    normalised: bool = False
    tiled: bool = False
    learned: Tuple[Learned, ...] = ()
    # the registered route that computes ``weights`` faster (``kernel_weights``), if any
    weights_kernel: Optional[str] = None

    @property
    def parameter_names(self) -> Tuple[str, ...]:
        return tuple(p.name for p in self.learned)

    def weights(self, scores: Tensor, keep: Tensor, n_visible: Tensor, params: Params) -> Tensor:
        """The reference weights: c_i h(s_ij + b_i), masked entries exactly 0 (tiled functions)."""
        if not self.tiled:
            raise NotImplementedError(f"{self.name} must define its weights")
        acc = accumulation_dtype(scores.dtype)
        bias = self.row_bias(n_visible, params, acc)
        logits = scores if bias is None else scores + bias.to(scores.dtype)
        a = POINTWISE_ACTIVATIONS[self.activation(params.config)](logits).masked_fill(~keep, 0.0)
        # the row factor applied in float32 (float64) and the product rounded once: a half-precision
        # divisor overflows (gamma sqrt(n / 2) with gamma near e^11) and its gradient a / d^2 does too
        divisor = self.row_divisor(n_visible, params, acc)
        if divisor is not None:
            return (a.to(acc) / divisor).to(scores.dtype)
        factor = self.row_factor(n_visible, params, acc)
        return a if factor is None else (a.to(acc) * factor).to(scores.dtype)

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

    def row_divisor(self, n_visible: Tensor, params: Params, dtype: torch.dtype) -> Optional[Tensor]:
        """d_i > 0 with c_i = 1 / d_i, in ``dtype``; None when the function states a factor instead."""
        return None

    def row_factor(self, n_visible: Tensor, params: Params, dtype: torch.dtype) -> Optional[Tensor]:
        """c_i > 0 of the tiled paths, in ``dtype``; None for 1. Derived from ``row_divisor`` where
        the function states one (times ones of the rows' shape: one factor per row)."""
        divisor = self.row_divisor(n_visible, params, dtype)
        return None if divisor is None else (1.0 / divisor) * torch.ones_like(_length(n_visible, dtype))

    def row_bias(self, n_visible: Tensor, params: Params, dtype: torch.dtype) -> Optional[Tensor]:
        """b_i inside the activation of the tiled paths, in ``dtype``; None for 0."""
        return None

    def make_parameters(self, config, num_heads: int, embed_dim: int) -> Dict[str, nn.Parameter]:
        """The declared learned tensors these options create, in declaration order."""
        return {p.name: nn.Parameter(p.initial(config, num_heads, embed_dim)) for p in self.learned if p.wanted(config)}

    def transform_output(self, out: Tensor, params: Params) -> Tensor:
        """(T, B, E) concatenated heads -> the same, before the output projection."""
        return out


@dataclass(frozen=True)
class Softmax(WeightFunction):
    def weights(self, scores, keep, n_visible, params):
        return softmax_weights(scores, keep)


@dataclass(frozen=True)
class SparseMap(WeightFunction):
    """sparsemax / 1.5-entmax: probability maps with exact zeros; ``weights`` from the ``entmax``
    package, ``kernel_weights`` (the ``sparse`` route) from the C++ row kernel, same values."""
    formula: Callable[..., Tensor] = None
    weights_kernel: Optional[str] = "sparse"

    def weights(self, scores, keep, n_visible, params):
        return self.formula(scores, keep)

    def kernel_weights(self, scores, keep, n_visible, params):
        return self.formula(scores, keep, kernel=True)


# a learned log gamma is bounded to +-this: exp(-90) underflows gamma to 0 in float32 (every path
# then divides by 0); within +-30, gamma and 1/gamma stay finite with 1e25 to spare. In float16
# the bound is the log of its largest number (+-11.09), where gamma and 1/gamma are float16
# numbers; the row factors are applied in float32 (the reference's product, the kernels' split
# factor: blocked.tiled_attention), so gamma * sqrt(n / 2) need not be one. The bound is taken
# from the narrower of the module's dtype (the parameter's) and the one asked for, since the
# kernels ask for float32 (their accumulation dtype) while the model runs in float16
LOG_GAMMA_BOUND = 30.0


def log_gamma_bound(*dtypes: torch.dtype) -> float:
    """+-this bounds a learned log gamma used in the narrowest of ``dtypes``."""
    return min(LOG_GAMMA_BOUND, math.log(min(torch.finfo(d).max for d in dtypes)))


class _ClampInward(torch.autograd.Function):
    """x.clamp(-bound, bound) whose gradient also passes beyond the bound when a descent step
    moves x back towards it (plain clamp's gradient is 0 there: a log gamma pushed past the
    bound would never come back). Inside the bound it is clamp, value and gradient alike."""

    @staticmethod
    def forward(ctx, x, bound):
        ctx.save_for_backward(x)
        ctx.bound = bound
        return x.clamp(-bound, bound)

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        # x -= lr * grad moves x inwards when grad > 0 above the bound and grad < 0 below it
        outward = ((x > ctx.bound) & (grad < 0)) | ((x < -ctx.bound) & (grad > 0))
        return grad.masked_fill(outward, 0.0), None


def relu_gamma(params: Params, dtype: torch.dtype) -> Tensor:
    """ReLUFormer's gamma (> 0 by construction: a learned one is kept as log gamma, bounded to
    +-``LOG_GAMMA_BOUND``), broadcastable to (heads, 1, 1)."""
    log_gamma = params.learned.get("log_gamma")
    if log_gamma is None:
        return torch.tensor(params.config.relu_gamma, dtype=dtype)
    bound = log_gamma_bound(dtype, log_gamma.dtype)
    wide = log_gamma.to(torch.promote_types(log_gamma.dtype, torch.float32))  # exp of a float16 30 overflows
    gamma = _ClampInward.apply(wide, bound).exp().to(dtype)
    return gamma.view(-1, 1, 1) if gamma.dim() == 1 else gamma


def _log_gamma(config, num_heads, embed_dim) -> Tensor:
    # kept as log(gamma): the fast paths fold 1/gamma into the queries, valid for gamma > 0 only
    shape = (num_heads,) if config.relu_gamma_mode == "head" else ()
    return torch.full(shape, math.log(config.relu_gamma))


@dataclass(frozen=True)
class ReluFormer(WeightFunction):
    """ReLU(s_ij) / (gamma sqrt(n_i / 2)) (ReLUFormer); gamma fixed or learned per layer / head.

    With x, v ~ N(0, 1), sum_j ReLU(x_j) v_j has variance n/2; the factor keeps the output
    variance near 1 at every length (ReLUFormer, section 4). ``relu_length_scale=False`` is the
    paper's ablation without the length factor: ReLU(s_ij) / gamma.
    """

    def scale_logits(self, config):
        return config.relu_scale_logits

    def row_divisor(self, n_visible, params, dtype):
        gamma = relu_gamma(params, dtype)
        if params.config.relu_length_scale:
            return gamma * torch.sqrt(_length(n_visible, dtype) / 2.0)
        return gamma


def rela_gate_init_range(embed_dim: int) -> float:
    """ReLA's gate is initialised uniformly in +-sqrt(3 / d) (the official code's scale:
    0.0765 at d = 512, 0.2165 at d = 64), not with one constant at every width."""
    return math.sqrt(3.0 / embed_dim)


def _rela_gate(config, num_heads, embed_dim) -> Tensor:
    bound = rela_gate_init_range(embed_dim)
    return torch.empty(embed_dim).uniform_(-bound, bound)


@dataclass(frozen=True)
class ReLA(WeightFunction):
    """ReLU(s_ij); the concatenated heads get an RMSNorm with gain (+ ReLA-g's sigmoid gate)."""

    def transform_output(self, out, params):
        gain, gate = params.learned["rela_gain"], params.learned.get("rela_gate")
        rms = torch.sqrt(out.float().pow(2).mean(-1, keepdim=True) + RELA_EPS).type_as(out)
        normed = gain * out / rms
        return normed * torch.sigmoid(gate * out) if gate is not None else normed


@dataclass(frozen=True)
class Pointwise(WeightFunction):
    """n_i^-alpha h(s_ij) (ReLU-ViT); h = relu2 is FLASH's squared ReLU."""

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


@dataclass(frozen=True)
class Softpick(WeightFunction):
    """ReLU(e^s - 1) / (sum |e^s - 1| + eps) (Zuhri et al. 2025): sparse, rows sum to at most 1."""

    def weights(self, scores, keep, n_visible, params):
        return softpick_weights(scores, keep)


FUNCTIONS: Dict[str, WeightFunction] = {f.name: f for f in (
    Softmax("softmax", normalised=True),
    ReluFormer("relu", tiled=True, learned=(
        Learned("log_gamma", lambda c: c.relu_gamma_mode != "fixed", _log_gamma),)),
    ReLA("rela", tiled=True, learned=(
        Learned("rela_gain", _always, lambda c, heads, dim: torch.full((dim,), float(c.rela_gain_init))),
        Learned("rela_gate", lambda c: c.rela_variant == "gated", _rela_gate))),
    Pointwise("pointwise", tiled=True),
    SparseMap("sparsemax", normalised=True, formula=sparsemax_weights),
    SparseMap("entmax15", normalised=True, formula=entmax15_weights),
    Sigmoid("sigmoid", tiled=True, learned=(
        Learned("sigmoid_bias", lambda c: c.sigmoid_bias == "learned",
                lambda c, heads, dim: torch.full((heads,), -math.log(SIGMOID_LEARNED_BIAS_LENGTH))),)),
    Softpick("softpick"),
)}
ATTENTION_FUNCTIONS: Tuple[str, ...] = tuple(FUNCTIONS)
# every learned tensor some function may own (a module holds None for the others)
PARAMETER_NAMES: Tuple[str, ...] = tuple(dict.fromkeys(n for f in FUNCTIONS.values() for n in f.parameter_names))


def get_function(name: str) -> WeightFunction:
    return FUNCTIONS[name]


__all__ = [
    "ATTENTION_FUNCTIONS", "FUNCTIONS", "PARAMETER_NAMES", "POINTWISE_ACTIVATIONS", "Params", "WeightFunction",
    "Learned", "accumulation_dtype", "get_function", "log_gamma_bound", "softmax_weights", "sparsemax_weights", "entmax15_weights",
    "softpick_weights",
]
