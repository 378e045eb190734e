"""The ``reluformer`` model: fairseq's Transformer whose three attention sublayers use
:class:`~reluformer_mt.attention.ReluformerAttention` with a weight function each.

Only the attention builders of fairseq's layers are overridden; embeddings, positions, layer
norms, FFNs, incremental decoding and alignment outputs are fairseq's own. Options are plain
argparse arguments of the model (``--encoder-attn-fn`` etc.), so ``--arch`` presets, the
command line and hydra configs (``model.encoder_attn_fn``) all set the same knobs.
"""
import argparse
import logging
import math

import torch
import torch.nn as nn

from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.models.transformer.transformer_decoder import TransformerDecoderBase
from fairseq.models.transformer.transformer_encoder import TransformerEncoderBase
from fairseq.modules import transformer_layer
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from omegaconf import OmegaConf

from reluformer_mt.attention import (ATTENTION_FUNCTIONS, FUNCTIONS, POINTWISE_ACTIVATIONS, AttentionConfig,
                                     AttentionOptionError, ReluformerAttention)
from reluformer_mt.attention.config import ATTENTION_IMPLS, GAMMA_MODES, RELA_VARIANTS
from reluformer_mt.attention.functions import SIGMOID_BIAS_MODES
from reluformer_mt.memory.tm_attention import (MemoryEncoder, MemoryReader, add_tm_args, copy_probabilities, fill_tm_defaults,
                                               memory_attention_config, memory_of, reorder_memory)
from reluformer_mt.memory import (add_memory_args, attach_memory_layers, build_ffn_fc2, configure_ffn,
                                  fill_memory_defaults, validate_memory_args)

logger = logging.getLogger(__name__)

SUBLAYERS = ("encoder", "decoder", "cross")

# defaults of the family-wide options (architectures may override them)
ATTENTION_DEFAULTS = {
    "encoder_attn_fn": "softmax",
    "decoder_attn_fn": "softmax",
    "cross_attn_fn": "softmax",
    "relu_gamma": 1.0,
    "relu_gamma_mode": "fixed",
    "relu_no_logit_scale": False,
    "relu_no_length_scale": False,
    "rela_variant": "gated",
    "rela_gain_init": 1.0,
    "pointwise_alpha": 1.0,
    "pointwise_h": "relu",
    "qk_layernorm": False,
    "attn_output_gate": False,
    "attn_output_norm": False,
    "sigmoid_bias": "auto",
    "attn_impl": "auto",
    "attn_blocked_min_len": 2048,
    "attn_block_size": 512,
}


def checked_number(accept, expected, kind=float):
    """argparse type: a finite ``kind`` number for which ``accept`` holds, else argparse's
    one-line error (so inf, nan and out-of-range values stop at option parsing)."""
    def parse(text):
        try:
            value = kind(text)
        except (TypeError, ValueError):
            value = None
        if value is None or not math.isfinite(value) or not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


def sigmoid_bias_value(text):
    """argparse type of --sigmoid-bias: 'auto', 'learned' or a finite number."""
    if text in SIGMOID_BIAS_MODES:
        return text
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = None
    if value is None or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected auto, learned or a finite number, got {text!r}")
    return value


def add_attention_args(parser):
    """The attention options; enumerations and ranges are checked by argparse (one-line errors)."""
    group = parser.add_argument_group("reluformer attention")
    for sub, what in (("encoder", "encoder self-attention"), ("decoder", "decoder (causal) self-attention"),
                      ("cross", "encoder-decoder attention")):
        group.add_argument(f"--{sub}-attn-fn", choices=list(ATTENTION_FUNCTIONS), help=f"weight function of the {what}")
    group.add_argument("--relu-gamma", type=checked_number(lambda g: g > 0, "a finite number > 0"), metavar="G",
                       help="ReLUFormer temperature gamma")
    group.add_argument("--relu-gamma-mode", choices=list(GAMMA_MODES),
                       help="gamma fixed, or learned per layer / per head (initialised at --relu-gamma)")
    group.add_argument("--relu-no-logit-scale", action="store_true", default=None,
                       help="ReLUFormer: drop the 1/sqrt(d_h) inside the ReLU")
    group.add_argument("--relu-no-length-scale", action="store_true", default=None,
                       help="ReLUFormer ablation: drop the 1/sqrt(n_i/2) length factor (weights ReLU(s)/gamma)")
    group.add_argument("--rela-variant", choices=list(RELA_VARIANTS), help="ReLA-g (gated) or ReLA-i (ungated)")
    group.add_argument("--rela-gain-init", type=checked_number(lambda x: True, "a finite number"), metavar="X",
                       help="initial RMSNorm gain of ReLA")
    group.add_argument("--pointwise-alpha", type=checked_number(lambda a: 0 <= a <= 2, "a number in [0, 2]"), metavar="A",
                       help="pointwise length exponent alpha")
    group.add_argument("--pointwise-h", choices=list(POINTWISE_ACTIVATIONS), help="pointwise activation h")
    group.add_argument("--qk-layernorm", action="store_true", default=None, help="LayerNorm on queries and keys")
    group.add_argument("--attn-output-gate", action="store_true", default=None,
                       help="gated attention unit: multiply the attention output by a projection of the input")
    group.add_argument("--attn-output-norm", action="store_true", default=None,
                       help="hybrid-norm: LayerNorm on the attention sublayer's output before the residual "
                            "(sigmoid attention's stabiliser, Ramapuram et al. 2024)")
    group.add_argument("--sigmoid-bias", type=sigmoid_bias_value, metavar="auto|learned|B",
                       help="sigmoid attention's bias b in sigmoid(s + b): auto = -log n_i (default), "
                            "learned = a scalar per head initialised at -log 64, or a fixed number")
    group.add_argument("--attn-impl", choices=list(ATTENTION_IMPLS),
                       help="dense, memory-bounded blocked, fused (C++ CPU kernel built on first use; blocked if it cannot be built), "
                            "flex (FlexAttention, CUDA), triton (Triton kernel, CUDA; docs/PERFORMANCE.md), "
                            "or auto (blocked from --attn-blocked-min-len keys on; on CUDA triton when training records statistics)")
    positive_int = checked_number(lambda n: n >= 1, "an integer >= 1", int)
    group.add_argument("--attn-blocked-min-len", type=positive_int, metavar="L",
                       help="auto: use the blocked path from this key length on")
    group.add_argument("--attn-block-size", type=positive_int, metavar="B", help="block size of the blocked path")


def fill_attention_defaults(args, **overrides):
    """Set each attention option not given on the command line: architecture value, then default."""
    for name, default in ATTENTION_DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, overrides.get(name, default))


def attention_config(cfg, sublayer: str) -> AttentionConfig:
    """The AttentionConfig of one sublayer ('encoder', 'decoder' or 'cross') from model args."""
    return AttentionConfig(
        fn=getattr(cfg, f"{sublayer}_attn_fn"),
        relu_gamma=cfg.relu_gamma,
        relu_gamma_mode=cfg.relu_gamma_mode,
        relu_scale_logits=not cfg.relu_no_logit_scale,
        relu_length_scale=not cfg.relu_no_length_scale,
        rela_variant=cfg.rela_variant,
        rela_gain_init=cfg.rela_gain_init,
        pointwise_alpha=cfg.pointwise_alpha,
        pointwise_activation=cfg.pointwise_h,
        qk_layernorm=bool(cfg.qk_layernorm),
        output_gate=bool(cfg.attn_output_gate),
        output_norm=bool(getattr(cfg, "attn_output_norm", False)),
        sigmoid_bias=_sigmoid_bias(getattr(cfg, "sigmoid_bias", "auto")),
        impl=cfg.attn_impl,
        blocked_min_len=cfg.attn_blocked_min_len,
        block_size=cfg.attn_block_size,
    )


def _sigmoid_bias(value):
    """A hydra config may give the number as a string."""
    if isinstance(value, str) and value not in SIGMOID_BIAS_MODES:
        try:
            return float(value)
        except ValueError:
            return value  # AttentionConfig.validate names the option
    return value


def validate_attention_args(args) -> None:
    """One-line errors naming the option and the accepted values, before any layer is built."""
    for sub in SUBLAYERS:
        fn = getattr(args, f"{sub}_attn_fn")
        if fn not in ATTENTION_FUNCTIONS:
            raise AttentionOptionError(f"--{sub}-attn-fn: got {fn!r}, expected one of {', '.join(ATTENTION_FUNCTIONS)}")
    attention_config(args, "encoder").validate()


def inapplicable_impl_notes(args) -> list:
    """What an explicit ``--attn-impl`` cannot do for the chosen functions: the fused kernel (and
    FlexAttention) run h = relu functions without a row normaliser only, the blocked path any
    function without one; the others keep their own path (softmax: fairseq's; the rest: dense)."""
    impl = args.attn_impl
    if impl not in ("blocked", "fused", "flex"):
        return []
    notes = {}  # (function, path) -> sublayers: one line per function
    for sub in SUBLAYERS:
        config = attention_config(args, sub)
        function = FUNCTIONS[config.fn]
        applies = function.tiled if impl == "blocked" else function.fused_relu(config)
        if applies:
            continue
        if function.tiled:  # a tiled function with another activation (sigmoid, pointwise h != relu)
            path = "the blocked path"
        else:
            path = "fairseq's attention" if config.fn == "softmax" else "the dense path"
        what = config.fn + (f" with --pointwise-h {config.pointwise_activation}" if config.fn == "pointwise" else "")
        notes.setdefault((what, path), []).append(sub)
    return [f"--attn-impl {impl} does not apply to {what} ({', '.join(subs)} attention): it runs {path}"
            for (what, path), subs in notes.items()]


def _wrap_layer(layer, cfg):
    """fairseq's activation checkpointing and FSDP wrapping, as its own layer builders do."""
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0)


class ReluformerEncoderLayer(transformer_layer.TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        configure_ffn(self, cfg)  # FFN as key-value memory: relu / softmax / softmax_ln

    def build_fc2(self, input_dim, output_dim, q_noise, qn_block_size):
        return build_ffn_fc2(self.cfg, input_dim, output_dim, q_noise, qn_block_size)

    def build_self_attention(self, embed_dim, cfg):
        return ReluformerAttention(embed_dim, cfg.encoder.attention_heads, attention_config(cfg, "encoder"),
                                   dropout=cfg.attention_dropout, self_attention=True,
                                   q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size)


class ReluformerDecoderLayer(transformer_layer.TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        self._ffn_cfg = cfg  # fairseq's decoder layer keeps no cfg; build_fc2 needs the variant
        super().__init__(cfg, no_encoder_attn, add_bias_kv, add_zero_attn)
        configure_ffn(self, cfg)

    def build_fc2(self, input_dim, output_dim, q_noise, qn_block_size):
        return build_ffn_fc2(self._ffn_cfg, input_dim, output_dim, q_noise, qn_block_size)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if add_bias_kv or add_zero_attn or cfg.cross_self_attention:
            raise AttentionOptionError("--cross-self-attention / bias_kv / zero_attn are not supported by reluformer models")
        return ReluformerAttention(embed_dim, cfg.decoder.attention_heads, attention_config(cfg, "decoder"),
                                   dropout=cfg.attention_dropout, self_attention=True,
                                   q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size)

    # during one decoder forward, the memory that the layer's ``tm_reader`` (a MemoryReader
    # submodule with --tm-fusion attention) reads; set by ReluformerDecoder.extract_features
    tm_memory = None

    def forward(self, x, *args, self_attn_padding_mask=None, **kwargs):
        # the cross-attention's queries are the decoder positions: lend it their padding mask so
        # that padding rows stay out of its statistics and ReLUFormer's regularisers
        if isinstance(self.encoder_attn, ReluformerAttention):
            with self.encoder_attn.padded_queries(self_attn_padding_mask):
                out = super().forward(x, *args, self_attn_padding_mask=self_attn_padding_mask, **kwargs)
        else:
            out = super().forward(x, *args, self_attn_padding_mask=self_attn_padding_mask, **kwargs)
        reader = self._modules.get("tm_reader")
        if reader is not None and self.tm_memory is not None:
            out = (reader(out[0], *self.tm_memory, query_padding=self_attn_padding_mask),) + tuple(out[1:])
        return out

    def build_encoder_attention(self, embed_dim, cfg):
        return ReluformerAttention(embed_dim, cfg.decoder.attention_heads, attention_config(cfg, "cross"),
                                   kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim,
                                   dropout=cfg.attention_dropout, encoder_decoder_attention=True,
                                   q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size)


class ReluformerEncoder(TransformerEncoderBase):
    def build_encoder_layer(self, cfg):
        return _wrap_layer(ReluformerEncoderLayer(cfg, return_fc=self.return_fc), cfg)

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False, token_embeddings=None,
                memory_tokens=None):
        out = super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)
        tm_encoder = self._modules.get("tm_encoder")  # a MemoryEncoder with --tm-fusion attention
        if tm_encoder is not None and memory_tokens is not None:
            states, padding = tm_encoder(memory_tokens)
            out["tm_out"], out["tm_padding_mask"], out["tm_tokens"] = [states], [padding], [memory_tokens]
        return out

    def reorder_encoder_out(self, encoder_out, new_order):
        reordered = super().reorder_encoder_out(encoder_out, new_order)
        if encoder_out.get("tm_out"):
            for key in ("tm_out", "tm_padding_mask", "tm_tokens"):
                reordered[key] = encoder_out[key]
        return reorder_memory(reordered, new_order)


class ReluformerDecoder(TransformerDecoderBase):
    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_layer(ReluformerDecoderLayer(cfg, no_encoder_attn), cfg)

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None, **kwargs):
        memory = memory_of(encoder_out)
        readers = [layer for layer in self.layers if "tm_reader" in layer._modules]
        for layer in readers:
            layer.tm_memory = memory
        try:
            x, extra = super().extract_features(prev_output_tokens, encoder_out, incremental_state, **kwargs)
        finally:
            for layer in readers:
                layer.tm_memory = None
        copy_gate = self._modules.get("tm_copy_gate")
        if memory is not None and copy_gate is not None:
            reader = readers[-1].tm_reader
            extra["tm_copy"] = {"weights": reader.weights, "tokens": encoder_out["tm_tokens"][0],
                                "gate": torch.sigmoid(copy_gate(x)), "ignore": (self.padding_idx, self.dictionary.bos())}
            reader.weights = None
        return x, extra

    def get_normalized_probs(self, net_output, log_probs, sample=None):
        """With a translation memory, the output distribution can copy its tokens (``--tm-no-copy`` off)."""
        extra = net_output[1] if len(net_output) > 1 else None
        if isinstance(extra, dict) and extra.get("tm_copy") is not None:
            return copy_probabilities(net_output[0], extra["tm_copy"], log_probs)
        return super().get_normalized_probs(net_output, log_probs, sample)


@register_model("reluformer")
class ReluformerModel(TransformerModel):
    """Transformer with ReLU-family attention (ReLUFormer, ReLA, pointwise), sigmoid or softpick
    attention, or softmax/sparse maps.

    Papers: Shen et al. 2023 (arXiv:2302.06461), Zhang et al. EMNLP 2021 (arXiv:2104.07012),
    Wortsman et al. 2023 (arXiv:2309.08586), Ramapuram et al. ICLR 2025 (arXiv:2409.04431),
    Zuhri et al. 2025 (arXiv:2504.20966), Hua et al. 2022 (arXiv:2202.10447).
    """

    @classmethod
    def add_args(cls, parser):
        TransformerModel.add_args(parser)
        add_attention_args(parser)
        add_memory_args(parser)
        add_tm_args(parser)

    @classmethod
    def build_model(cls, args, task):
        if OmegaConf.is_config(args):
            # fairseq-hydra-train passes a DictConfig; fairseq's TransformerConfig.from_namespace
            # keeps extra (plugin) options only from a flat namespace
            args = argparse.Namespace(**OmegaConf.to_container(args, resolve=True))
        fill_attention_defaults(args)
        fill_memory_defaults(args)
        fill_tm_defaults(args, task)
        validate_attention_args(args)
        validate_memory_args(args)
        for note in inapplicable_impl_notes(args):
            logger.warning(note)
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        encoder = ReluformerEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)
        attach_memory_layers(encoder.layers, args, "encoder")  # --memory-layers
        if getattr(args, "tm_attention", False):
            cfg = TransformerConfig.from_namespace(args)
            encoder.tm_encoder = MemoryEncoder(cfg, embed_tokens, ReluformerEncoderLayer, args.tm_encoder_layers)
        return encoder

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        decoder = ReluformerDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)
        attach_memory_layers(decoder.layers, args, "decoder")  # --memory-layers
        if getattr(args, "tm_attention", False):
            tm_config = memory_attention_config(attention_config(args, "cross"), args.tm_attn_fn)
            for layer in decoder.layers:
                layer.tm_reader = MemoryReader(cfg, tm_config, cfg.decoder.attention_heads)
            if not args.tm_no_copy:
                decoder.tm_copy_gate = nn.Linear(cfg.decoder.embed_dim, 1)
                nn.init.constant_(decoder.tm_copy_gate.bias, -2.0)  # copy ~12 % at first: noisy matches stay cheap
                decoder.layers[-1].tm_reader.keep_weights = True
        return decoder

    def forward(self, src_tokens, src_lengths, prev_output_tokens, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer=None, alignment_heads=None, memory_tokens=None):
        """fairseq's forward, with the translation memory's tokens (``--tm-fusion attention``)."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens,
                                   memory_tokens=memory_tokens)
        return self.decoder(prev_output_tokens, encoder_out=encoder_out, features_only=features_only,
                            alignment_layer=alignment_layer, alignment_heads=alignment_heads, src_lengths=src_lengths,
                            return_all_hiddens=return_all_hiddens)

    def attention_modules(self):
        """Every ReluformerAttention of the model, with its name."""
        return [(name, m) for name, m in self.named_modules() if isinstance(m, ReluformerAttention)]

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """Refuse, in one line, a checkpoint whose parameters belong to another architecture.

        The names are compared after fairseq's upgrade step (which the parent runs again, a no-op
        then), so an old layout it renames (e.g. ``gamma`` -> ``log_gamma``) loads."""
        self.upgrade_state_dict(state_dict)
        own = set(self.state_dict().keys())
        given = set(state_dict.keys())
        missing, unexpected = sorted(own - given), sorted(given - own)
        # fairseq fills/upgrades a few buffers itself (e.g. version, positions); ignore those
        ignorable = lambda k: k.endswith((".version", "_float_tensor"))  # noqa: E731
        missing = [k for k in missing if not ignorable(k)]
        unexpected = [k for k in unexpected if not ignorable(k)]
        if strict and (missing or unexpected):
            raise ValueError(
                f"checkpoint does not fit this reluformer architecture "
                f"(encoder/decoder/cross attn = {self.cfg.encoder_attn_fn}/{self.cfg.decoder_attn_fn}/"
                f"{self.cfg.cross_attn_fn}): {len(missing)} missing parameters"
                f"{' e.g. ' + missing[0] if missing else ''}, {len(unexpected)} unexpected"
                f"{' e.g. ' + unexpected[0] if unexpected else ''}; was it trained with another --arch?")
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
