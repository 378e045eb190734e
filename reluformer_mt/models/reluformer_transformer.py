"""The ``reluformer`` model: fairseq's Transformer whose three attention sublayers use
:class:`~reluformer_mt.attention.ReluformerAttention` with a weight function each.

Only the attention builders of fairseq's layers are overridden; embeddings, positions, layer
norms, FFNs, incremental decoding and alignment outputs are fairseq's own. Options are plain
argparse arguments of the model (``--encoder-attn-fn`` etc.), derived from their one declaration
on :class:`~reluformer_mt.attention.config.AttentionConfig`, so ``--arch`` presets, the command
line and hydra configs (``model.encoder_attn_fn``) all set the same knobs.
"""
import argparse
import logging

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

from reluformer_mt.attention import FUNCTIONS, AttentionOptionError, ReluformerAttention, routes
from reluformer_mt.attention.multihead import causal_float_mask
from reluformer_mt.attention.visibility import in_one_batch, known_causal, one_batch
from reluformer_mt.cpu_memory import keep_freed_memory
from reluformer_mt.attention.config import (SUBLAYERS, add_attention_args, config_from_args as attention_config,
                                            fill_attention_defaults, validate_attention_args)
from reluformer_mt.memory.tm_attention import (MemoryEncoder, MemoryReader, add_tm_args, copy_probabilities, fill_tm_defaults,
                                               memory_attention_config, memory_of, memory_tokens_of,
                                               reorder_memory)
from reluformer_mt.memory.learned_keys import add_key_args, attach_key_head, fill_key_defaults
from reluformer_mt.memory import (add_memory_args, attach_memory_layers, build_ffn_fc2, configure_ffn,
                                  fill_memory_defaults, validate_memory_args)

logger = logging.getLogger(__name__)

def inapplicable_impl_notes(args) -> list:
    """What an explicit ``--attn-impl`` cannot do for the chosen functions: the accelerated routes
    compute their own functions only (fused, flex: h = relu; triton: the tiled functions' h), the
    blocked route any function without a row normaliser; the others keep their own route (softmax:
    fairseq's; the rest: the reference formula). Said once when the model is built."""
    impl = args.attn_impl
    accelerated = routes.ACCELERATED.get(impl)
    if impl != "blocked" and (accelerated is None or accelerated.weights_of is not None):
        return []
    notes = {}  # (function, route) -> sublayers: one line per function
    for sub in SUBLAYERS:
        config = attention_config(args, sub)
        function = FUNCTIONS[config.fn]
        applies = function.tiled and (impl == "blocked" or accelerated.computes(function, config))
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
            # fairseq passes (encoder_out, encoder_padding_mask, incremental_state, ...) positionally;
            # the reader caches the memory's keys and values there while decoding step by step
            incremental_state = args[2] if len(args) > 2 else kwargs.get("incremental_state")
            out = (reader(out[0], *self.tm_memory, query_padding=self_attn_padding_mask,
                          incremental_state=incremental_state),) + tuple(out[1:])
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
        """fairseq's reorder, without the copies that change nothing.

        Beam search reorders the encoder output at every decoding step, but after its first
        reorder (each sentence repeated for its beams) the rows come in groups of identical copies,
        and a step only moves rows inside their sentence's group until a sentence finishes. Such a
        reorder leaves every value where it was, so the tensors are kept as they are instead of
        copying the (source, rows, dim) states twice a step (about 14 % of a step of the demo's
        model, 1.2 of 8.6 ms). The result is identical to fairseq's in every value."""
        group = _row_group(encoder_out)
        if group > 1 and new_order.numel() == _rows_of(encoder_out) and torch.equal(
                new_order // group, torch.arange(new_order.numel(), device=new_order.device) // group):
            reordered = dict(encoder_out)
        else:
            reordered = super().reorder_encoder_out(encoder_out, new_order)
            reordered["row_group"] = [_group_after(encoder_out, group, new_order)]
        if encoder_out.get("tm_out"):
            for key in ("tm_out", "tm_padding_mask", "tm_tokens", "tm_rows"):
                if key in encoder_out:
                    reordered[key] = encoder_out[key]
        return reorder_memory(reordered, new_order)


def _rows_of(encoder_out) -> int:
    return encoder_out["encoder_out"][0].size(1) if encoder_out["encoder_out"] else -1


def _row_group(encoder_out) -> int:
    """How many adjacent rows of the encoder output are copies of one sentence (1: unknown)."""
    group = encoder_out.get("row_group")
    return group[0] if group else 1


def _group_after(encoder_out, group: int, new_order: torch.Tensor) -> int:
    """The copies per sentence after reordering by ``new_order``: the beam size after beam search's
    first reorder (``arange(sentences).repeat_interleave(beam)``), the same group where whole
    groups are kept (sentences leaving the batch), else 1."""
    rows, new = _rows_of(encoder_out), new_order.numel()
    if group == 1 and rows > 0 and new > rows and new % rows == 0:
        repeat = new // rows
        expanded = torch.arange(rows, device=new_order.device).repeat_interleave(repeat)
        return repeat if torch.equal(new_order, expanded) else 1
    if group > 1 and new % group == 0:
        sentences = (new_order // group).view(-1, group)
        return group if bool((sentences == sentences[:, :1]).all()) else 1
    return 1


class ReluformerDecoder(TransformerDecoderBase):
    # fairseq's beam search keeps the alignment layer's cross-attention of every hypothesis, a
    # (rows, source, steps) buffer that it gathers and copies back at every step, though only
    # alignments read it; fairseq's make_generation_fast_(need_attn=False) (fairseq-generate and
    # -interactive without --print-alignment) does not turn that layer off, this flag does: False
    # there and in reluformer-translate without --alignments
    search_alignment = True
    # beam search: every cross-attention (and memory reader) keeps its keys and values once per
    # sentence, read by all the sentence's beams. fairseq does this after set_beam_size, which its
    # generator calls only on models that define it (BART), and fairseq's attention then shares keys
    # in every forward, teacher-forced ones included; so the decoder sets it itself, at the first
    # step of each incremental decoding, from the encoder output's rows (:func:`_row_group`), and
    # turns it off for a full forward. False: one copy per beam (what it did before; the same
    # translations, the states equal but for their last bits, which kNN-MT's lookups can see)
    share_keys_across_beams = True

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_layer(ReluformerDecoderLayer(cfg, no_encoder_attn), cfg)

    def buffered_future_mask(self, tensor):
        """Inside a model forward, a causal mask built for it (the values of fairseq's buffer) and
        known causal to the attention, which otherwise compares fairseq's buffer, kept across
        forwards, with its copy once per forward (a host synchronisation, issue 64)."""
        if not in_one_batch():
            return super().buffered_future_mask(tensor)
        dim = tensor.size(0)
        return known_causal(causal_float_mask(dim, dim, tensor))

    def make_generation_fast_(self, need_attn: bool = False, **kwargs):
        self.search_alignment = bool(need_attn)

    def _share_keys(self, encoder_out, incremental_state) -> None:
        """Set the attention modules' beam size (fairseq's set_beam_size) for this forward: the beams
        of the encoder output's row groups at the first step of an incremental decoding, kept until
        its end (fairseq reorders the caches by it), and 1 for a full forward."""
        if incremental_state is None:
            beams = 1
        elif not incremental_state:  # the first step: no module has cached anything yet
            beams = _row_group(encoder_out) if self.share_keys_across_beams and encoder_out is not None else 1
        else:
            return
        self.set_beam_size(beams)  # a no-op when unchanged

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None, **kwargs):
        self._share_keys(encoder_out, incremental_state)
        if incremental_state is not None and not self.search_alignment and kwargs.get("alignment_layer") is None:
            kwargs["alignment_layer"] = -1  # no layer's index: none returns its attention
        readers = [layer for layer in self.layers if "tm_reader" in layer._modules]
        memory, cached = None, False
        if readers and encoder_out is not None and encoder_out.get("tm_out"):
            # decoding step by step, the readers hold the memory's keys and values from the first
            # step on: the states are not gathered again ((None, None): read from the cache)
            cached = incremental_state is not None and all(layer.tm_reader.cached(incremental_state) for layer in readers)
            memory = (None, None) if cached else memory_of(encoder_out)
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
            extra["tm_copy"] = self._copy_inputs(reader, encoder_out, incremental_state, cached, copy_gate(x))
            reader.weights = None
        return x, extra

    def _copy_inputs(self, reader, encoder_out, incremental_state, cached: bool, gate_logit) -> dict:
        """What the copy distribution reads. Decoding step by step, the first step keeps a table of
        each sentence's memory tokens beside the last reader's cached keys, and the later steps read
        it (``table``) instead of gathering the tokens in the beams' order."""
        copy = {"weights": reader.weights, "gate_logit": gate_logit, "ignore": (self.padding_idx, self.dictionary.bos())}
        table = reader.copy_table(incremental_state) if cached else None
        if table is not None:
            copy["table"] = table
            return copy
        copy["tokens"] = memory_tokens_of(encoder_out)
        if incremental_state is not None and reader.cached(incremental_state):
            reader.cache_copy_table(incremental_state, copy["tokens"], copy["ignore"])
        return copy

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
        add_key_args(parser)

    @classmethod
    def build_model(cls, args, task):
        if OmegaConf.is_config(args):
            # fairseq-hydra-train passes a DictConfig; fairseq's TransformerConfig.from_namespace
            # keeps extra (plugin) options only from a flat namespace
            args = argparse.Namespace(**OmegaConf.to_container(args, resolve=True))
        fill_attention_defaults(args)
        fill_memory_defaults(args)
        fill_tm_defaults(args, task)
        fill_key_defaults(args, task)
        validate_attention_args(args)
        validate_memory_args(args)
        for note in inapplicable_impl_notes(args):
            logger.warning(note)
        if getattr(args, "cpu", False) or not torch.cuda.is_available():
            keep_freed_memory()  # training on the CPU: reuse freed blocks instead of page-faulting new ones
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        encoder = ReluformerEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)
        attach_memory_layers(encoder.layers, args, "encoder")  # --memory-layers
        if getattr(args, "tm_attention", False):
            cfg = TransformerConfig.from_namespace(args)
            encoder.tm_encoder = MemoryEncoder(cfg, embed_tokens, ReluformerEncoderLayer, args.tm_encoder_layers)
        attach_key_head(encoder, args)  # learned memory keys (--tm-key-layers; the projection with --tm-key-loss)
        return encoder

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(args)
        decoder = ReluformerDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)
        attach_memory_layers(decoder.layers, args, "decoder")  # --memory-layers
        if getattr(args, "tm_attention", False):
            tm_config = memory_attention_config(attention_config(args, "cross"), args.tm_attn_fn)
            # the translator's --memory-cache, put into the model's config when it builds it for decoding
            cache = getattr(args, "memory_cache", None)
            cache_dtype = None if cache is None else getattr(torch, cache)
            for layer in decoder.layers:
                layer.tm_reader = MemoryReader(cfg, tm_config, cfg.decoder.attention_heads, step_cache_dtype=cache_dtype)
            if not args.tm_no_copy:
                decoder.tm_copy_gate = nn.Linear(cfg.decoder.embed_dim, 1)
                nn.init.constant_(decoder.tm_copy_gate.bias, -2.0)  # copy ~12 % at first: noisy matches stay cheap
                decoder.layers[-1].tm_reader.keep_weights = True
        return decoder

    def forward(self, src_tokens, src_lengths, prev_output_tokens, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer=None, alignment_heads=None, memory_tokens=None):
        """fairseq's forward, with the translation memory's tokens (``--tm-fusion attention``). Its
        padding masks are checked once for the whole forward, not once per layer (``one_batch``)."""
        with one_batch():
            encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens,
                                       memory_tokens=memory_tokens)
            return self.decoder(prev_output_tokens, encoder_out=encoder_out, features_only=features_only,
                                alignment_layer=alignment_layer, alignment_heads=alignment_heads,
                                src_lengths=src_lengths, return_all_hiddens=return_all_hiddens)

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
