"""The feed-forward sublayer read as a key-value memory (ReLUFormer section 3, METHODS.md section 2).

An FFN computes H = act(X K^T) V with K = fc1.weight and V = fc2.weight: its width is the
number of memory slots. Three variants (Shen et al. 2023, arXiv:2302.06461):

- ``relu``: the usual FFN, H = ReLU(X K^T) V (fairseq's ``--activation-fn`` is kept);
- ``softmax``: H = softmax(X K^T) V, a normalised read over the slots;
- ``softmax_ln``: H = LN(softmax(X K^T) V), a LayerNorm on the memory output, which the paper
  finds restores the variance lost by the softmax's averaging.

The layer only swaps its activation function and, for ``softmax_ln``, its ``fc2`` for a Linear
followed by a LayerNorm (parameters ``fc2.weight``, ``fc2.bias``, ``fc2.ln.*``), so fairseq's
layer forward, pruning helpers and checkpoint names stay as they are.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

FFN_VARIANTS = ("relu", "softmax", "softmax_ln")


class MemoryOptionError(ValueError):
    """A bad key-value memory option; the message names the option and what was expected."""


def softmax_over_slots(x: torch.Tensor) -> torch.Tensor:
    """softmax over the slot (last) dimension, computed in float32 for fp16 safety."""
    return F.softmax(x.float(), dim=-1).type_as(x)


class LayerNormedLinear(nn.Linear):
    """``LN(x W^T + b)``: the memory readout of the ``softmax_ln`` variant."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features)
        self.ln = nn.LayerNorm(out_features)

    def forward(self, x):
        return self.ln(super().forward(x))


def check_ffn_variant(variant: str) -> None:
    if variant not in FFN_VARIANTS:
        raise MemoryOptionError(f"--ffn-variant: got {variant!r}, expected one of {', '.join(FFN_VARIANTS)}")


def ffn_activation(variant: str, default_fn):
    """The activation applied to ``fc1(x)``: fairseq's own for ``relu``, a softmax otherwise."""
    check_ffn_variant(variant)
    return default_fn if variant == "relu" else softmax_over_slots


def ffn_readout(variant: str, slots: int, embed_dim: int, q_noise: float = 0.0, qn_block_size: int = 8) -> nn.Module:
    """``fc2``: a Linear from the slots back to the model, LayerNormed for ``softmax_ln``."""
    from fairseq.modules.quant_noise import quant_noise

    check_ffn_variant(variant)
    linear = LayerNormedLinear(slots, embed_dim) if variant == "softmax_ln" else nn.Linear(slots, embed_dim)
    return quant_noise(linear, q_noise, qn_block_size)
