"""The options of one attention sublayer, validated in one place."""
import math
from dataclasses import dataclass

from typing import Union

from reluformer_mt.attention.functions import ATTENTION_FUNCTIONS, POINTWISE_ACTIVATIONS, SIGMOID_BIAS_MODES

GAMMA_MODES = ("fixed", "layer", "head")
RELA_VARIANTS = ("gated", "ungated")
# "triton": the Triton kernel of triton_kernel.py (CUDA; issue 24)
ATTENTION_IMPLS = ("auto", "dense", "blocked", "fused", "flex", "triton")


def valid_sigmoid_bias(value) -> bool:
    if isinstance(value, str):
        return value in SIGMOID_BIAS_MODES
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class AttentionOptionError(ValueError):
    """A bad attention option; the message names the option and the accepted values."""


@dataclass
class AttentionConfig:
    """Options of one attention sublayer.

    fn: the weight function (see ``functions.ATTENTION_FUNCTIONS``).
    relu_gamma / relu_gamma_mode: ReLUFormer's temperature; ``fixed`` keeps it constant,
        ``layer``/``head`` learn one scalar per layer / per head, initialised at relu_gamma.
        (Secondary sources disagree whether gamma is learned; both are offered, fixed by default.)
    relu_scale_logits: keep the 1/sqrt(d_h) inside the ReLU (the paper does not say; default True).
    relu_length_scale: ReLUFormer's 1/sqrt(n_i/2) length factor; False is the paper's ablation
        without it (weights ReLU(s)/gamma), which it reports to train worse or diverge.
    rela_variant: ``gated`` (ReLA-g, the released variant) or ``ungated`` (ReLA-i: RMSNorm only).
    rela_gain_init: initial RMSNorm gain of ReLA (ReLA-i's specialised value is unpublished).
    pointwise_alpha / pointwise_activation: ReLU-ViT's n^-alpha * h(s).
    qk_layernorm: LayerNorm on queries and keys (per head) before the dot product (ReLU-ViT).
    output_gate: the gated attention unit of ReLU-ViT: the attention output is multiplied
        element-wise by a linear projection of the query input before the output projection.
    output_norm: LayerNorm on the sublayer's output (after the output projection, before the
        residual): the "hybrid-norm" that sigmoid attention needs to tame its large initial
        attention norms (Ramapuram et al. 2024).
    sigmoid_bias: b of sigmoid attention: ``auto`` (-log n_i), ``learned`` (a scalar per head,
        initialised at -log 64) or a fixed number.
    impl / blocked_min_len / block_size: the memory-bounded path for long sequences.
    """

    fn: str = "softmax"
    relu_gamma: float = 1.0
    relu_gamma_mode: str = "fixed"
    relu_scale_logits: bool = True
    relu_length_scale: bool = True
    rela_variant: str = "gated"
    rela_gain_init: float = 1.0
    pointwise_alpha: float = 1.0
    pointwise_activation: str = "relu"
    qk_layernorm: bool = False
    output_gate: bool = False
    output_norm: bool = False
    sigmoid_bias: Union[str, float] = "auto"
    impl: str = "auto"
    blocked_min_len: int = 2048
    block_size: int = 512

    def validate(self, option_prefix: str = "") -> "AttentionConfig":
        def fail(option, value, expected):
            raise AttentionOptionError(f"--{option_prefix}{option}: got {value!r}, expected {expected}")

        if self.fn not in ATTENTION_FUNCTIONS:
            fail("attn-fn", self.fn, "one of " + ", ".join(ATTENTION_FUNCTIONS))
        if not (0 < self.relu_gamma < math.inf):
            fail("relu-gamma", self.relu_gamma, "a finite number > 0")
        if self.relu_gamma_mode not in GAMMA_MODES:
            fail("relu-gamma-mode", self.relu_gamma_mode, "one of " + ", ".join(GAMMA_MODES))
        if self.rela_variant not in RELA_VARIANTS:
            fail("rela-variant", self.rela_variant, "one of " + ", ".join(RELA_VARIANTS))
        if not math.isfinite(self.rela_gain_init):
            fail("rela-gain-init", self.rela_gain_init, "a finite number")
        if not (0.0 <= self.pointwise_alpha <= 2.0):
            fail("pointwise-alpha", self.pointwise_alpha, "a number in [0, 2]")
        if self.pointwise_activation not in POINTWISE_ACTIVATIONS:
            fail("pointwise-h", self.pointwise_activation, "one of " + ", ".join(POINTWISE_ACTIVATIONS))
        if not valid_sigmoid_bias(self.sigmoid_bias):
            fail("sigmoid-bias", self.sigmoid_bias, "auto, learned or a finite number")
        if self.impl not in ATTENTION_IMPLS:
            fail("attn-impl", self.impl, "one of " + ", ".join(ATTENTION_IMPLS))
        if self.block_size < 1:
            fail("attn-block-size", self.block_size, "a positive integer")
        if self.blocked_min_len < 1:
            fail("attn-blocked-min-len", self.blocked_min_len, "a positive integer")
        return self
