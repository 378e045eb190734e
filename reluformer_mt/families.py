"""The attention families: each family's attention options, from which
:mod:`reluformer_mt.models.architectures` makes its ``{family}_{size}`` architectures.

Plain data, importing neither torch nor fairseq, so that a command line can check a family name
before it loads anything heavy."""

FAMILIES = {
    "softmax": dict(encoder_attn_fn="softmax", decoder_attn_fn="softmax", cross_attn_fn="softmax"),
    "reluformer": dict(encoder_attn_fn="relu", decoder_attn_fn="relu", cross_attn_fn="relu"),
    "rela": dict(encoder_attn_fn="rela", decoder_attn_fn="rela", cross_attn_fn="rela", rela_variant="gated"),
    "pointwise": dict(encoder_attn_fn="pointwise", decoder_attn_fn="pointwise", cross_attn_fn="pointwise",
                      pointwise_h="relu", pointwise_alpha=1.0, qk_layernorm=True),
    "sparsemax": dict(encoder_attn_fn="sparsemax", decoder_attn_fn="sparsemax", cross_attn_fn="sparsemax"),
    "entmax15": dict(encoder_attn_fn="entmax15", decoder_attn_fn="entmax15", cross_attn_fn="entmax15"),
    "sigmoid": dict(encoder_attn_fn="sigmoid", decoder_attn_fn="sigmoid", cross_attn_fn="sigmoid",
                    sigmoid_bias="auto", attn_output_norm=True),
    "softpick": dict(encoder_attn_fn="softpick", decoder_attn_fn="softpick", cross_attn_fn="softpick"),
    "relu2": dict(encoder_attn_fn="pointwise", decoder_attn_fn="pointwise", cross_attn_fn="pointwise",
                  pointwise_h="relu2", pointwise_alpha=1.0, qk_layernorm=True),
}
