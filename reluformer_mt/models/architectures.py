"""Architectures: one per attention family and size.

Sizes: ``tiny`` (tests and CPU demos), ``iwslt_de_en`` (fairseq's transformer_iwslt_de_en:
512/1024, 4 heads, 6+6 layers) and ``base`` (Vaswani et al. base: 512/2048, 8 heads, 6+6).
Families set the three sublayers' weight functions:

- ``softmax``: the baseline, identical to fairseq's transformer;
- ``reluformer``: ``relu`` in all three (ReLUFormer's "full ReLU" model);
- ``rela``: ``rela`` (gated, ReLA-g) in all three;
- ``pointwise``: ReLU-ViT defaults, h = relu, alpha = 1, qk-layernorm;
- ``sparsemax`` / ``entmax15``: the sparse baselines;
- ``sigmoid``: sigmoid(s + b) with b = -log n_i and the hybrid-norm (LayerNorm on the attention
  output) that Ramapuram et al. 2024 need for stable early training; no qk-layernorm;
- ``softpick``: ReLU(e^s - 1) / (sum |e^s - 1| + eps) (Zuhri et al. 2025);
- ``relu2``: FLASH's squared ReLU (Hua et al. 2022) as pointwise attention n_i^-1 relu(s)^2, with
  qk-layernorm (as ``pointwise``: it bounds the logits, which the square would amplify).

Every value is only a default: command-line options (``--encoder-attn-fn`` ...) override it.
"""
from fairseq.models import register_model_architecture
from fairseq.models.transformer.transformer_legacy import base_architecture, transformer_iwslt_de_en

from reluformer_mt.attention.config import fill_attention_defaults
from reluformer_mt.families import FAMILIES



def _tiny(args):
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 64)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 128)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 4)
    args.encoder_layers = getattr(args, "encoder_layers", 2)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 64)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 128)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 4)
    args.decoder_layers = getattr(args, "decoder_layers", 2)
    base_architecture(args)


SIZES = {
    "tiny": _tiny,
    "iwslt_de_en": transformer_iwslt_de_en,
    "base": base_architecture,
}


def _make_architecture(family_defaults, size_fn):
    def architecture(args):
        fill_attention_defaults(args, **family_defaults)
        size_fn(args)
    return architecture


for _family, _defaults in FAMILIES.items():
    for _size, _size_fn in SIZES.items():
        register_model_architecture("reluformer", f"{_family}_{_size}")(_make_architecture(_defaults, _size_fn))

ARCHITECTURES = [f"{family}_{size}" for family in FAMILIES for size in SIZES]
