"""Memory attention: the decoder reads the retrieved translations of a translation memory
(EMAT-style fusion, Wu et al. 2022, arXiv:2210.16773; for MT cf. Cai et al. ACL 2021).

The retrieved targets (``net_input["memory_tokens"]``, k entries x their length slots, see
:mod:`reluformer_mt.memory.tm_data`) are embedded with the model's shared embeddings and
positions and contextualised by ``--tm-encoder-layers`` encoder layers of their own
(:class:`MemoryEncoder`). Each decoder layer then reads them with one more attention sublayer
(:class:`MemoryReader`) whose weight function is ``--tm-attn-fn`` (default: the family's
cross-attention function, so softmax and ReLU read the same memory), pre-normed, and added to
the residual stream through a gate g = sigmoid(w . [x; o] + b) per position, which lets the
model ignore a useless match (b starts at 0: half open).

By default the output distribution can also copy from the memory (a pointer over its tokens,
See et al. ACL 2017; as in TM-augmented NMT, Gu et al. AAAI 2018, Cai et al. ACL 2021):
p(y) = (1 - c) p_vocab(y) + c * sum_{m: token_m = y} w_m, where w is the last reader's
head-averaged attention renormalised over the memory (a ReLU row that attends to nothing
copies nothing: c = 0 there) and c = sigmoid(Linear(decoder state)), computed in log space over the memory's tokens only
(:func:`copy_probabilities`). Without it a small model
trained for minutes learns to ignore its matches (measured: docs/history/TRANSLATION_MEMORY.md);
``--tm-no-copy`` is that ablation.

The choice of where to read (after every decoder layer's feed-forward block) and the gate's
form are ours; EMAT fuses its values into the encoder, which for MT would make the source
encoder k times longer.
"""
import dataclasses
import logging
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.modules import LayerNorm, PositionalEmbedding

from reluformer_mt.attention import ATTENTION_FUNCTIONS, AttentionOptionError, ReluformerAttention
from reluformer_mt.memory import fused
from reluformer_mt.model_args import fill_unset, task_option

logger = logging.getLogger(__name__)

# no memory encoder layer by default: with the previous-token feature and the copy distribution a
# 1-layer encoder learned no faster (docs/history/TRANSLATION_MEMORY.md) and costs k times a source encoder
TM_DEFAULTS = {"tm_attention": False, "tm_attn_fn": None, "tm_encoder_layers": 0, "tm_no_copy": False}


def add_tm_args(parser) -> None:
    group = parser.add_argument_group("translation memory (memory attention; the task's --tm-fusion attention)")
    group.add_argument("--tm-attn-fn", choices=list(ATTENTION_FUNCTIONS),
                       help="weight function of the memory-attention sublayers (default: --cross-attn-fn)")
    group.add_argument("--tm-encoder-layers", type=int, metavar="N",
                       help="encoder layers of the memory encoder (0, the default: embeddings, positions and the previous token)")
    group.add_argument("--tm-no-copy", action="store_true", default=None,
                       help="ablation: no copy distribution over the memory tokens (the readers only)")
    group.add_argument("--tm-attention", action="store_true", default=None,
                       help="build the memory encoder and readers (set by --task document_translation --tm-fusion attention)")


def fill_tm_defaults(args, task=None) -> None:
    fill_unset(args, TM_DEFAULTS)
    if task_option(task, "tm_fusion", "none") == "attention":
        args.tm_attention = True
    if args.tm_attn_fn is None:
        args.tm_attn_fn = args.cross_attn_fn
    if args.tm_attn_fn not in ATTENTION_FUNCTIONS:
        raise AttentionOptionError(f"--tm-attn-fn: got {args.tm_attn_fn!r}, expected one of {', '.join(ATTENTION_FUNCTIONS)}")
    if args.tm_encoder_layers < 0:
        raise AttentionOptionError(f"--tm-encoder-layers: got {args.tm_encoder_layers}, expected >= 0")


class MemoryEncoder(nn.Module):
    """Shared embeddings + positions + ``layers`` encoder layers over the memory tokens.

    Each slot also carries its previous token (a projection of its embedding): a decoder that
    has just emitted y finds the slots that follow a y in a match with one attention step,
    the 'continue the match' lookup that copying a fuzzy match needs (an induction head,
    Olsson et al. 2022, given to the model instead of learned over two layers)."""

    def __init__(self, cfg, embed_tokens: nn.Embedding, layer_factory, layers: int):
        super().__init__()
        dim = embed_tokens.embedding_dim
        self.padding_idx = embed_tokens.padding_idx
        self.embed_tokens = embed_tokens  # shared with the source encoder (not a second copy)
        self.embed_scale = 1.0 if cfg.no_scale_embedding else math.sqrt(dim)
        self.embed_positions = PositionalEmbedding(cfg.max_source_positions, dim, self.padding_idx,
                                                   learned=cfg.encoder.learned_pos)
        self.previous_token = nn.Linear(dim, dim, bias=False)
        self.layer_norm = LayerNorm(dim)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList([layer_factory(cfg) for _ in range(layers)])

    def forward(self, tokens: torch.Tensor):
        """(B, M) tokens -> ((M, B, C) states, (B, M) padding mask)."""
        padding = tokens.eq(self.padding_idx)
        embedded = self.embed_scale * self.embed_tokens(tokens)
        previous = torch.cat([torch.zeros_like(embedded[:, :1]), embedded[:, :-1]], dim=1)
        x = embedded + self.previous_token(previous) + self.embed_positions(tokens)
        x = self.dropout(self.layer_norm(x)).transpose(0, 1)
        for layer in self.layers:
            x = layer(x, encoder_padding_mask=padding if padding.any() else None)
        return x, padding


class MemoryReader(nn.Module):
    """x + g * Attn(LN(x), memory): one memory-attention sublayer with its gate."""

    kernel_memories = 0  # memories the C++ step read (laid out for it), per reader
    cache_fallbacks = 0  # of those, kept in float32 because float16 could not hold them
    _fallback_said = False

    def __init__(self, cfg, attention_config, heads: int, step_cache_dtype: Optional[torch.dtype] = None):
        """``step_cache_dtype``: the precision of the keys and values that the C++ decoding step reads
        (reluformer-translate's --memory-cache, given to the model's config when the translator
        builds it): float16 halves the bytes each step reads (the step is bound by memory bandwidth
        once the batch's memory outgrows the cache) while the arithmetic stays float32; None keeps
        them as computed. Training and the PyTorch step always use the model's precision."""
        super().__init__()
        self.step_cache_dtype = step_cache_dtype
        dim = cfg.decoder.embed_dim
        self.layer_norm = LayerNorm(dim)
        self.attn = ReluformerAttention(dim, heads, attention_config, kdim=cfg.encoder.embed_dim,
                                        vdim=cfg.encoder.embed_dim, dropout=cfg.attention_dropout,
                                        encoder_decoder_attention=True)
        self.gate = nn.Linear(2 * dim, 1)
        nn.init.zeros_(self.gate.bias)
        self.dropout = nn.Dropout(cfg.dropout)
        self.keep_weights = False  # the copy distribution reads the last reader's weights
        self.weights = None
        self._laid_out = None  # (the cached keys, what _step_keys made of them)

    def forward(self, x, memory, memory_padding, query_padding=None, incremental_state=None):
        if memory is None and incremental_state is not None and self._decodes_directly(x):
            return self._cached_softmax_step(x, incremental_state)
        h = self.layer_norm(x)
        return self._gated(x, h, self._attend(h, memory, memory_padding, query_padding, incremental_state))

    def _gated(self, x, h, out):
        gate = torch.sigmoid(self.gate(torch.cat([h, out], dim=-1)))
        return x + self.dropout(gate * out)

    def _decodes_directly(self, x) -> bool:
        """One decoding step of a softmax reader (no memory given: its keys and values are cached, see
        ReluformerDecoder.extract_features): read them directly."""
        return (not self.training and x.size(0) == 1 and self.attn.fn == "softmax" and self.attn._recorder is None
                and self.attn.uses_fairseq_forward)

    def _cached_softmax_step(self, x, incremental_state):
        """The whole sublayer for one decoding step over the cached keys/values (:meth:`_step_keys`),
        one copy per sentence shared by its beams: the C++ step (:mod:`reluformer_mt.memory.fused`)
        where it serves, else :meth:`_reference_step`."""
        keys, values, bias, kernel_inputs = self._step_keys(incremental_state)  # (kv_bsz x H, D, M), (.., M, D), (.., 1, M)
        if kernel_inputs is not None and x.dtype == torch.float32:
            out, weights = fused.read_step(kernel_inputs, x[0], keys, values, bias, self.keep_weights)
            self.weights = None if weights is None else weights.view(x.size(1), 1, -1)
            return out.view_as(x)
        h = self.layer_norm(x)
        return self._gated(x, h, self._reference_step(h, keys, values, bias))

    def _reference_step(self, h, keys, values, bias):
        """fairseq's attention step as two batched matmuls over each sentence's and head's keys with
        the beams as query rows (fairseq's general forward with its einsum over shared beams: the readers'
        products were 60 % of the decoder's bmm time in a profile of a 2-layer memory model). Same
        formula: softmax in float32, head-averaged weights."""
        attn = self.attn
        groups, head_dim, slots = keys.shape
        bsz, heads = h.size(1), attn.num_heads
        kv_bsz = groups // heads
        beams = bsz // kv_bsz
        q = (attn.q_proj(h[0]) * attn.scaling).view(kv_bsz, beams, heads, head_dim).transpose(1, 2)
        q = q.reshape(groups, beams, head_dim)
        scores = torch.bmm(q, keys) if bias is None else torch.baddbmm(bias, q, keys)  # (kv_bsz x H, beams, M)
        # a sentence without matches (its memory all padding) reads nothing: zero weights, not NaN
        weights = torch.nan_to_num(torch.softmax(scores.float(), dim=-1), nan=0.0).type_as(scores)
        out = torch.bmm(weights, values).view(kv_bsz, heads, beams, head_dim).transpose(1, 2)
        if self.keep_weights:  # head average, rows in the beams' order (sentence-major)
            self.weights = weights.float().view(kv_bsz, heads, beams, slots).mean(1).view(bsz, 1, slots)
        else:
            self.weights = None
        return attn.out_proj(out.reshape(1, bsz, attn.embed_dim))

    def _step_keys(self, incremental_state):
        """The cached keys transposed (kv_bsz x heads, D, M) and values (kv_bsz x heads, M, D), each
        contiguous, and the memory's padding as an additive bias (kv_bsz x heads, 1, M), or None.
        Laid out at the first direct step (and again after fairseq reorders the cache when sentences
        finish) and kept in the attention's cache, which fairseq reorders with its own entries:
        fairseq caches the keys as a transposed view whose rows lie a whole batch apart, which the
        batched matmul copied at every step, and keys stored transposed make the scores' product
        a plain one (about 40 % faster at the demo's sizes); the padding mask was a masked_fill
        per step. With them: the C++ step's parameters (:func:`reluformer_mt.memory.fused.reader_inputs`)
        where it serves, else None. The views are kept for the steps after (``_laid_out``) until
        fairseq replaces the cached keys (a reorder, the next decoding): a step then only looks
        them up. The kernel's copies are in ``step_cache_dtype``."""
        saved = self.attn._get_input_buffer(incremental_state)
        if self._laid_out is not None and self._laid_out[0] is saved["prev_key"]:
            return self._laid_out[1]
        if not saved["prev_key"].transpose(-1, -2).is_contiguous():
            # the same (kv_bsz, H, M, D) tensor for fairseq's own forward, stored as (kv_bsz, H, D, M)
            saved["prev_key"] = saved["prev_key"].transpose(-1, -2).contiguous().transpose(-1, -2)
            saved["prev_value"] = saved["prev_value"].contiguous()
            self.attn._set_input_buffer(incremental_state, saved)
        if "step_bias" not in saved:  # None where no slot is padding (memories cut to the model's positions)
            padding, k = saved.get("prev_key_padding_mask"), saved["prev_key"]
            saved["step_bias"] = None if padding is None or not bool(padding.any()) else (
                k.new_zeros(k.size(0), k.size(1), 1, k.size(2))
                .masked_fill(padding[:, None, None, :].to(torch.bool), float("-inf")))
            self.attn._set_input_buffer(incremental_state, saved)
        k, v, bias = saved["prev_key"], saved["prev_value"], saved["step_bias"]
        groups = k.size(0) * k.size(1)
        keys_t, values = k.transpose(-1, -2).view(groups, k.size(3), k.size(2)), v.view(groups, v.size(2), v.size(3))
        kernel_inputs = fused.reader_inputs(self) if fused.available(keys_t, values) else None
        if kernel_inputs is not None:
            self.kernel_memories += 1
            if self.step_cache_dtype not in (None, keys_t.dtype):
                keys_t, values = self._cache_copies(keys_t, values)
        laid_out = (keys_t, values, None if bias is None else bias.view(groups, 1, k.size(2)), kernel_inputs)
        self._laid_out = (k, laid_out)
        return laid_out

    def _cache_copies(self, keys_t, values):
        """The keys and values in ``step_cache_dtype``; a memory with a value beyond float16's range
        (+-65504: inf there, NaN or wrong weights after) is kept in float32, counted in
        ``cache_fallbacks`` and said once per process."""
        if self.step_cache_dtype == torch.float16 and not (_fits_half(keys_t) and _fits_half(values)):
            self.cache_fallbacks += 1
            if not MemoryReader._fallback_said:
                MemoryReader._fallback_said = True
                logger.warning("memory cache: a memory's keys or values exceed float16's range (+-65504): "
                               "kept in float32 (counted in the summary)")
            return keys_t, values
        return keys_t.to(self.step_cache_dtype), values.to(self.step_cache_dtype)

    def reorder_incremental_state(self, incremental_state, new_order):
        """fairseq's reorder of this reader's cache when sentences finish (each remaining sentence's
        first beam picks its row), done before the attention's own (fairseq visits a module before
        its children, and the attention then finds its cache reordered) so that the keys keep their
        transposed layout (:meth:`_step_keys`): fairseq's index_select wrote them in the standard
        one, which the next step copied back."""
        attn = self.attn
        saved = attn._get_input_buffer(incremental_state)
        keys = saved.get("prev_key")
        if keys is None or attn.beam_size <= 1 or keys.size(0) * attn.beam_size == new_order.size(0):
            return  # fairseq's own reorder (one row per beam) or nothing to reorder
        sentences = new_order.reshape(-1, attn.beam_size)[:, 0] // attn.beam_size
        for name, value in saved.items():
            if value is None:
                continue
            if name == "prev_key" and value.transpose(-1, -2).is_contiguous():
                saved[name] = value.transpose(-1, -2).index_select(0, sentences).transpose(-1, -2)
            else:
                saved[name] = value.index_select(0, sentences)
        attn._set_input_buffer(incremental_state, saved)

    def _attend(self, h, memory, memory_padding, query_padding, incremental_state):
        empty = self._empty_rows(memory_padding, incremental_state, h.size(1))
        padding = memory_padding
        if empty is not None and incremental_state is None:
            # a row without a slot reads all its slots here and gets the output of zero weights below:
            # fairseq's softmax over no key is NaN, in the forward and in every parameter's gradient
            padding = memory_padding & ~empty[:, None]
        with self.attn.padded_queries(query_padding):
            # with an incremental state (beam search) the memory's projected keys and values are
            # computed at the first step and reused (fairseq's static_kv cache), not once per step
            out, weights = self.attn(h, memory, memory, key_padding_mask=padding, static_kv=True,
                                     incremental_state=incremental_state, need_weights=self.keep_weights)
        if empty is not None:  # the formula's zero weights, as the other reader families give
            out = torch.where(empty[None, :, None], self.attn.out_proj(out.new_zeros(out.size(-1))), out)
            weights = None if weights is None else weights.masked_fill(empty[:, None, None], 0.0)
        self.weights = weights  # (B, T, M) head average, or None
        return out

    def _empty_rows(self, memory_padding, incremental_state, bsz: int):
        """(B,) True for the rows whose memory is all padding (a sentence without matches), for a
        reader that runs fairseq's softmax (which gives NaN there); None for the other readers, whose
        formulas give such rows zero weights. In a cached decoding step, from the cached padding."""
        if not self.attn.uses_fairseq_forward:
            return None
        if memory_padding is None and incremental_state is not None:
            memory_padding = self.attn._get_input_buffer(incremental_state).get("prev_key_padding_mask")
        if memory_padding is None:
            return None
        empty = memory_padding.to(torch.bool).all(-1)
        return empty.repeat_interleave(bsz // empty.size(0))  # cached once per sentence for its beams

    def cache_copy_table(self, incremental_state, tokens: torch.Tensor, ignore) -> None:
        """Keep the copy distribution's table of each sentence's memory (:func:`sentence_copy_table`)
        beside this reader's cached keys, one per sentence as they are, so that fairseq reorders it
        with them. ``tokens`` (B, M): the memory tokens of the first step's rows (a sentence's beams
        adjacent)."""
        saved = self.attn._get_input_buffer(incremental_state)
        kv_bsz = saved["prev_key"].size(0)
        per_sentence = tokens.view(kv_bsz, -1, tokens.size(1))[:, 0]
        saved["copy_memory"] = per_sentence
        saved["copy_columns"], saved["copy_tokens"] = sentence_copy_table(per_sentence, ignore)
        self.attn._set_input_buffer(incremental_state, saved)

    def copy_table(self, incremental_state):
        """(memory tokens, columns, column tokens) of each sentence, kept by :meth:`cache_copy_table`,
        or None."""
        saved = self.attn._get_input_buffer(incremental_state)
        if "copy_columns" not in saved:
            return None
        return saved["copy_memory"], saved["copy_columns"], saved["copy_tokens"]

    def cached(self, incremental_state) -> bool:
        """Whether this reader holds the memory's keys and values in ``incremental_state``."""
        return "prev_key" in self.attn._get_input_buffer(incremental_state)


def _fits_half(x: torch.Tensor) -> bool:
    """Whether every element is finite within float16's range (a NaN does not fit either)."""
    return x.numel() == 0 or bool(x.abs().amax() <= torch.finfo(torch.float16).max)


def _copyable(tokens: torch.Tensor, ignore) -> torch.Tensor:
    """(B, M) True where a slot may be copied: padding and entry markers never are."""
    keep = torch.ones_like(tokens, dtype=torch.bool)
    for token in ignore:
        keep &= tokens.ne(token)
    return keep


def _copy_parts(steps: int, copy: dict):
    """(copy weights renormalised over the copyable slots (B, T', M), copyable (B, M), reads (B, T', 1)):
    padding and entry markers are never copied; a row whose weights on the copyable slots sum to 0
    (a ReLU row that reads nothing) does not copy."""
    weights = copy["weights"][:, -steps:].float()
    keep = _copyable(_row_tokens(copy), copy["ignore"])
    weights = weights * keep.unsqueeze(1)
    mass = weights.sum(-1, keepdim=True)
    return weights / _nonzero_or_one(mass), keep, mass.gt(0)


def _nonzero_or_one(x: torch.Tensor) -> torch.Tensor:
    """x where x > 0, else 1: a logarithm or divisor that is exact for any positive mass, however
    small (a clamp to 1e-30 turned masses below it into 1e-30)."""
    return torch.where(x.gt(0), x, 1.0)


def _row_tokens(copy: dict) -> torch.Tensor:
    """(B, M) memory tokens of each row: ``tokens``, or a decoding step's ``table`` of each sentence
    repeated for its beams."""
    if copy.get("tokens") is not None:
        return copy["tokens"]
    sentences = copy["table"][0]
    return sentences.repeat_interleave(copy["weights"].size(0) // sentences.size(0), dim=0)


def sentence_copy_table(tokens: torch.Tensor, ignore):
    """The copy distribution's table of memory tokens (n, M), made once per segment in decoding:
    ``columns`` (n, M), for each copyable slot the first slot holding its token (M where a slot is
    never copied), and ``column_tokens`` (n, M), the token of each such first slot (elsewhere the
    first ignored token, whose score the copy leaves as it is: it gets no copy mass). A decoding
    step then sums its copy weights per distinct token in an (M + 1)-wide buffer instead of a
    vocabulary-wide one (:func:`_log_copy_step`)."""
    slots = torch.arange(tokens.size(1), device=tokens.device).expand_as(tokens)
    keep = _copyable(tokens, ignore)
    first = torch.full((tokens.size(0), int(tokens.max()) + 1), tokens.size(1), dtype=slots.dtype, device=tokens.device)
    first = first.scatter_reduce(1, tokens, slots, "amin").gather(1, tokens)
    columns = torch.where(keep, first, tokens.size(1))
    column_tokens = torch.where(keep & first.eq(slots), tokens, ignore[0])
    return columns, column_tokens


def _log_copy_step(logits: torch.Tensor, copy: dict) -> torch.Tensor:
    """:func:`copy_probabilities`' log-probabilities for one decoding step without gradient, from the
    table of each sentence's memory (``copy["table"]``, :func:`sentence_copy_table`); rows are a
    sentence's beams in turn, as fairseq orders them. The same formula: the share of each distinct
    copyable token in the row's copyable weights, log((1 - c) p_vocab + c * share) for those
    tokens, log(1 - c) + log_softmax elsewhere."""
    _, columns, column_tokens = copy["table"]
    kv_bsz, slots = columns.shape
    bsz = logits.size(0)
    beams = bsz // kv_bsz
    if fused.available(logits):  # the C++ loop over the rows (memory/fused.py)
        lprobs = torch.log_softmax(logits[:, -1:].float(), dim=-1)
        fused.copy_step(lprobs.view(bsz, -1), copy["weights"][:, -1].reshape(bsz, slots), columns, column_tokens,
                        copy["gate_logit"][:, -1].reshape(bsz))
        return lprobs
    weights = copy["weights"][:, -1].float().view(kv_bsz, beams, slots)
    mass = weights.new_zeros(kv_bsz, beams, slots + 1)
    mass = mass.scatter_add_(2, columns.unsqueeze(1).expand(-1, beams, -1), weights)[..., :slots]
    total = mass.sum(-1, keepdim=True).view(bsz, 1, 1)
    gate_logit = copy["gate_logit"][:, -1:].float()
    lprobs = torch.log_softmax(logits[:, -1:].float(), dim=-1) + F.logsigmoid(-gate_logit) * total.gt(0)
    # log(c * mass / total), -inf where a column has no mass (log(0) avoided: it is ~20x slower on the
    # CPU than a logarithm of a normal number, and most columns have no mass); any total > 0 counts
    mass = mass.view(bsz, 1, slots)
    log_share = torch.log(_nonzero_or_one(mass)) + (F.logsigmoid(gate_logit) - torch.log(_nonzero_or_one(total)))
    log_copy = torch.where(mass.gt(0), log_share, torch.full_like(mass, float("-inf")))
    # rows (kv_bsz, beams): the sentence's column tokens serve its beams without a copy
    index = column_tokens.unsqueeze(1).expand(-1, beams, -1)
    by_sentence = lprobs.view(kv_bsz, beams, -1)
    corrected = torch.logaddexp(by_sentence.gather(2, index), log_copy.view(kv_bsz, beams, slots))
    return by_sentence.scatter_(2, index, corrected).view_as(lprobs)


def copy_probabilities(logits: torch.Tensor, copy: dict, log_probs: bool) -> torch.Tensor:
    """p(y) = (1 - c) softmax(logits)(y) + c * sum_{m: token_m = y} w_m, in float32; ``copy`` holds
    ``weights`` (B, T', M), ``tokens`` (B, M), ``gate_logit`` z with c = sigmoid(z) (B, T', 1) and
    ``ignore`` (token ids never copied: padding, the entry marker).

    Log-probabilities are computed in log space and touch the vocabulary once: every token gets
    log(1 - c) + log_softmax(logits); only the (at most M) tokens present in the memory are
    corrected to log((1 - c) p_vocab + c * copy mass). Probabilities (``log_probs=False``) take
    the direct formula. A decoding step may pass ``table`` (each sentence's
    :func:`sentence_copy_table`) instead of ``tokens``."""
    steps = logits.size(1)
    if copy.get("table") is not None and log_probs and steps == 1 and not torch.is_grad_enabled():
        return _log_copy_step(logits, copy)
    weights, keep, reads = _copy_parts(steps, copy)
    tokens = _row_tokens(copy)
    gate_logit = copy["gate_logit"][:, -steps:].float()
    index = tokens.unsqueeze(1).expand(-1, steps, -1)
    if not log_probs:
        gate = torch.sigmoid(gate_logit) * reads
        copied = torch.zeros_like(logits, dtype=torch.float32).scatter_add_(2, index, weights)
        return (1 - gate) * torch.softmax(logits.float(), dim=-1) + gate * copied
    # log(1 - c), log c from the gate's logit (stable where c is near 0 or 1); 0 and -inf where nothing is read
    log_stay = F.logsigmoid(-gate_logit) * reads
    lprobs = torch.log_softmax(logits.float(), dim=-1) + log_stay
    # copy mass of each slot's token (all slots holding it), summed in a vocabulary-sized buffer:
    # cheaper than a slots x slots comparison once a document segment's memory has hundreds of slots
    mass = torch.zeros_like(lprobs).scatter_add_(2, index, weights).gather(2, index)  # (B, T', M)
    has_copy = mass.gt(0) & reads & keep.unsqueeze(1)
    log_copy = torch.where(has_copy, F.logsigmoid(gate_logit) + torch.log(_nonzero_or_one(mass)),
                           torch.full_like(mass, float("-inf")))
    corrected = torch.logaddexp(lprobs.gather(2, index), log_copy)
    if not (torch.is_grad_enabled() and corrected.requires_grad):  # decoding: no gradient to count once
        return lprobs.scatter_(2, index, corrected)
    # a token held by several slots is written once per slot with equal values; only its first
    # slot passes the gradient back, so the vocabulary entry's gradient is counted once
    slots = torch.arange(tokens.size(1), device=tokens.device).expand_as(tokens)
    first_slot = torch.full(lprobs.shape[::2], tokens.size(1), dtype=slots.dtype, device=tokens.device)
    first = first_slot.scatter_reduce(1, tokens, slots, "amin").gather(1, tokens).eq(slots)  # (B, M)
    corrected = torch.where(first.unsqueeze(1), corrected, corrected.detach())
    return lprobs.scatter(2, index, corrected)


def memory_attention_config(base_config, fn: str):
    return dataclasses.replace(base_config, fn=fn)


def reorder_memory(encoder_out: dict, new_order: torch.Tensor) -> dict:
    """Beam search reorders the encoder output at every step; the memory follows its sentences
    without being copied: ``tm_rows`` maps each row (sentence x beam) to its row of the memory as
    encoded, and a reorder composes it with the new order. Copying the states (k x 45 slots a
    sentence, about three times the source) at every step cost more than reading them, and the
    readers need them only once: they cache their keys and values at the first step."""
    if encoder_out.get("tm_out"):
        rows = encoder_out.get("tm_rows")
        encoder_out["tm_rows"] = [rows[0].index_select(0, new_order) if rows else new_order.clone()]
    return encoder_out


def _rows(encoder_out: dict):
    rows = encoder_out.get("tm_rows")
    return rows[0] if rows else None


def memory_of(encoder_out: Optional[dict]):
    """(states (M, B, C), padding (B, M)) of the memory in an encoder output, in the order of its
    rows, or None."""
    if encoder_out is None or not encoder_out.get("tm_out"):
        return None
    states, padding, rows = encoder_out["tm_out"][0], encoder_out["tm_padding_mask"][0], _rows(encoder_out)
    if rows is None:
        return states, padding
    return states.index_select(1, rows), padding.index_select(0, rows)


def memory_tokens_of(encoder_out: dict) -> torch.Tensor:
    """(B, M) memory tokens in the order of the encoder output's rows."""
    tokens, rows = encoder_out["tm_tokens"][0], _rows(encoder_out)
    return tokens if rows is None else tokens.index_select(0, rows)


__all__ = ["MemoryEncoder", "MemoryReader", "copy_probabilities", "sentence_copy_table", "TM_DEFAULTS", "add_tm_args", "fill_tm_defaults", "memory_attention_config",
           "memory_of", "memory_tokens_of", "reorder_memory"]
