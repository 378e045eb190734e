"""The one multi-head attention module of reluformer-mt, with the weight function an option.

It subclasses fairseq's ``MultiheadAttention`` instead of replacing it, for three reasons:
parameter names (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``) stay fairseq's, so a softmax
model and fairseq's ``transformer`` load each other's weights; the incremental-decoding cache
and ``reorder_incremental_state`` used by beam search stay fairseq's; and the softmax function
calls fairseq's own forward (PyTorch's fused attention), so the baseline keeps fairseq's speed.
Every other function runs :meth:`ReluformerAttention._attend`, which computes the logits,
applies a function from :mod:`reluformer_mt.attention.functions`, and the output transforms
(ReLA's RMSNorm and gate, ReLU-ViT's gated unit). The ReLU family (relu, rela, pointwise) runs
the fused dense or memory-bounded blocked kernel of :mod:`reluformer_mt.attention.blocked`
(same results; chosen by ``--attn-impl``, see docs/PERFORMANCE.md).
"""
import math
from contextlib import contextmanager
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
from fairseq.modules.multihead_attention import MultiheadAttention
from torch import Tensor

from reluformer_mt.attention import functions as F_attn
from reluformer_mt.attention.blocked import RELU_FAMILY, regularisers_from_rows, relu_family_attention
from reluformer_mt.attention import fused as fused_kernel
from reluformer_mt.attention.config import AttentionConfig

# ReLA's RMSNorm epsilon, from the official code (bzhangGo/zero)
RELA_EPS = 1e-8


def rela_gate_init_range(embed_dim: int) -> float:
    """ReLA's gate is initialised uniformly in +-sqrt(3 / d) (the official code's scale:
    0.0765 at d = 512, 0.2165 at d = 64), not with one constant at every width."""
    return math.sqrt(3.0 / embed_dim)
# pointwise activations that can be negative
SIGNED_ACTIVATIONS = ("gelu", "identity")


class ReluformerAttention(MultiheadAttention):
    """Multi-head attention whose weight function is ``config.fn``.

    Input and output shapes are fairseq's (Time x Batch x Channel). Attention weights are
    returned per head (heads x batch x tgt x src) with ``need_head_weights`` and averaged over
    heads with ``need_weights``, as in fairseq.

    Recording (off by default, so training pays nothing for it): set ``record_stats`` to make
    each forward add counts of zero weights, null rows and (with ``regularise``) ReLUFormer's
    row losses into ``self.stats``; the criterion reads and clears them.
    """

    def __init__(self, embed_dim: int, num_heads: int, config: AttentionConfig, kdim=None, vdim=None,
                 dropout: float = 0.0, self_attention: bool = False,
                 encoder_decoder_attention: bool = False, q_noise: float = 0.0, qn_block_size: int = 8):
        super().__init__(embed_dim, num_heads, kdim=kdim, vdim=vdim, dropout=dropout,
                         self_attention=self_attention,
                         encoder_decoder_attention=encoder_decoder_attention,
                         q_noise=q_noise, qn_block_size=qn_block_size)
        self.config = config.validate()
        self.fn = config.fn

        # a learned gamma is kept as log(gamma): the fast paths fold 1/gamma into the queries,
        # which is only valid for gamma > 0. Only ReLUFormer's function uses gamma: other
        # sublayers get no parameter (an unused one breaks DDP without find_unused_parameters).
        self.log_gamma = None
        if self.fn == "relu" and config.relu_gamma_mode != "fixed":
            shape = (num_heads,) if config.relu_gamma_mode == "head" else ()
            self.log_gamma = nn.Parameter(torch.full(shape, math.log(config.relu_gamma)))

        self.rela_gain = self.rela_gate = None
        if self.fn == "rela":
            self.rela_gain = nn.Parameter(torch.full((embed_dim,), float(config.rela_gain_init)))
            if config.rela_variant == "gated":
                bound = rela_gate_init_range(embed_dim)
                self.rela_gate = nn.Parameter(torch.empty(embed_dim).uniform_(-bound, bound))

        self.q_norm = nn.LayerNorm(self.head_dim) if config.qk_layernorm else None
        self.k_norm = nn.LayerNorm(self.head_dim) if config.qk_layernorm else None
        self.gate_proj = nn.Linear(embed_dim, embed_dim) if config.output_gate else None

        self.record_stats = False
        self.regularise = False
        self.entropy_margin_ratio = 0.7
        self.stats: Dict[str, Tensor] = {}
        # cross-attention cannot see which decoder positions are padding; the decoder layer
        # lends it the target padding mask for one call (``padded_queries``)
        self._query_padding: Optional[Tensor] = None
        # evaluation (alignment, attention statistics) asks for every head's weights of every call
        self.capture_weights = False
        self.captured: Optional[Tensor] = None

    # ------------------------------------------------------------------ helpers
    @property
    def uses_fairseq_forward(self) -> bool:
        """Plain softmax attention runs fairseq's own (fused) forward."""
        return self.fn == "softmax" and self.q_norm is None and self.gate_proj is None

    def _split_heads(self, x: Tensor, bsz: int) -> Tensor:
        """(T, B, H*D) -> (B, H, T, D)."""
        return x.contiguous().view(-1, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def _gamma(self, dtype) -> Tensor:
        """ReLUFormer's gamma (> 0 by construction), broadcastable to (heads, 1, 1)."""
        if self.log_gamma is None:
            return torch.tensor(self.config.relu_gamma, dtype=dtype)
        gamma = self.log_gamma.exp().to(dtype)
        return gamma.view(-1, 1, 1) if gamma.dim() == 1 else gamma

    @contextmanager
    def padded_queries(self, query_padding_mask: Optional[Tensor]):
        """For the calls inside the block, (B, T) True marks query positions that are padding,
        so that their rows stay out of the statistics and regularisers."""
        self._query_padding = query_padding_mask
        try:
            yield
        finally:
            self._query_padding = None

    def _live_queries(self, tgt_len: int, key_padding_mask: Optional[Tensor]) -> Optional[Tensor]:
        """(B, 1, T) bool, True for real query positions; None when none is padding.

        In self-attention the queries are the last ``tgt_len`` keys (also while decoding step by
        step), so the key padding mask says which are padding; cross-attention is told.
        """
        padding = self._query_padding
        if padding is None and self.self_attention and key_padding_mask is not None:
            padding = key_padding_mask[:, -tgt_len:]
        if padding is None or padding.size(-1) != tgt_len or not bool(padding.any()):
            return None
        return ~padding.bool().view(padding.size(0), 1, tgt_len)

    def attention_weights(self, scores: Tensor, keep: Tensor, n_visible: Tensor) -> Tensor:
        """Dispatch to the named weight function."""
        fn = self.fn
        if fn == "softmax":
            return F_attn.softmax_weights(scores, keep)
        if fn == "relu":
            return F_attn.relu_weights(scores, keep, n_visible, self._gamma(scores.dtype), self.config.relu_length_scale)
        if fn == "rela":
            return F_attn.rela_weights(scores, keep)
        if fn == "pointwise":
            return F_attn.pointwise_weights(scores, keep, n_visible, self.config.pointwise_alpha,
                                            self.config.pointwise_activation)
        if fn == "sparsemax":
            return F_attn.sparsemax_weights(scores, keep)
        if fn == "entmax15":
            return F_attn.entmax15_weights(scores, keep)
        raise AssertionError(fn)  # validated in AttentionConfig

    def _visible_keys(self, tgt_len: int, src_len: int, attn_mask: Optional[Tensor],
                      key_padding_mask: Optional[Tensor], device) -> Tuple[Tensor, Optional[Tensor]]:
        """Bool mask (B or 1, 1, T, S) of keys each query may see, and an additive float mask.

        fairseq gives the causal mask as a float (T, S) tensor of 0 / -inf (or a bool one);
        finite non-zero entries (e.g. a bias) are returned separately to add to the logits.
        """
        keep = torch.ones(1, 1, tgt_len, src_len, dtype=torch.bool, device=device)
        additive = None
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                blocked = attn_mask
            else:
                blocked = torch.isneginf(attn_mask)
                finite = attn_mask.masked_fill(blocked, 0.0)
                if finite.any():
                    additive = finite.view(1, 1, tgt_len, src_len)
            keep = keep & ~blocked.view(1, 1, tgt_len, src_len)
        if key_padding_mask is not None:
            keep = keep & ~key_padding_mask.bool().view(-1, 1, 1, src_len)
        return keep, additive

    # ------------------------------------------------------------------ attention core
    def _attention_path(self, tgt_len: int, src_len: int, additive: Optional[Tensor],
                        want_weights: bool) -> str:
        """'reference', 'dense', 'blocked' or 'fused' (see ``blocked.py``, ``fused.py``); all give the same results.

        The fast paths cover relu, rela and pointwise; they leave to the reference path additive
        masks and attention dropout in training (its random mask is the reference's). ``auto``
        goes blocked from ``blocked_min_len`` keys on, except for single-query decoding steps and
        calls that return the weights (which are then materialised anyway).
        """
        if self.fn not in RELU_FAMILY or additive is not None:
            return "reference"
        if self.training and self.dropout_module.p > 0:
            return "reference"
        relu_act = self.fn != "pointwise" or self.config.pointwise_activation == "relu"
        if self.regularise and self.fn == "pointwise" and self.config.pointwise_activation in SIGNED_ACTIVATIONS:
            return "reference"  # the entropy of rows with negative weights is defined by the reference only
        impl = self.config.impl
        if impl == "fused" and relu_act and not want_weights:
            return "fused"  # the C++ kernel; blocked if it cannot be built
        blocked = impl in ("blocked", "fused") or (impl == "auto" and src_len >= self.config.blocked_min_len and tgt_len > 1)
        if blocked and not want_weights:
            return "blocked"
        return "dense" if relu_act else "reference"

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor, additive: Optional[Tensor],
                want_weights: bool, live_queries: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
        """q (B,H,T,D) k,v (B,H,S,D) -> output (B,H,T,D) and weights (B,H,T,S) if wanted.

        ``live_queries`` (B, 1, T) marks real query rows: only they enter the recorded statistics
        and ReLUFormer's regularisers (padding rows would otherwise count and get gradients).
        """
        scale_logits = self.fn != "relu" or self.config.relu_scale_logits
        path = self._attention_path(q.size(2), k.size(2), additive, want_weights)
        if path != "reference":
            block = self.config.block_size
            # auto: the fused C++ kernel replaces dense/blocked from AUTO_MIN_LEN keys on where it was
            # built (faster there, docs/PERFORMANCE.md); not for single-query decoding steps
            fused = path == "fused" or (self.config.impl == "auto" and not want_weights and q.size(2) > 1
                                        and k.size(2) >= fused_kernel.AUTO_MIN_LEN and q.device.type == "cpu"
                                        and fused_kernel.available())
            out, rows, weights = relu_family_attention(
                q, k, v, keep, fn=self.fn, scaling=self.scaling if scale_logits else None,
                gamma=self._gamma(q.dtype) if self.fn == "relu" else None, length_scale=self.config.relu_length_scale,
                alpha=self.config.pointwise_alpha, activation=self.config.pointwise_activation,
                blocked=path in ("blocked", "fused"), block_q=block, block_k=block,
                want_rows=self.record_stats, want_weights=want_weights, fused=fused)
            if rows is not None:
                self._record_rows(*rows, live_queries=live_queries)
            return out, weights
        scores = torch.matmul(q * self.scaling if scale_logits else q, k.transpose(-1, -2))
        if additive is not None:
            scores = scores + additive
        n_visible = keep.sum(-1, keepdim=True)
        weights = self.attention_weights(scores, keep, n_visible)
        if self.record_stats:
            self._record(weights, keep, n_visible, live_queries)
        out = torch.matmul(self.dropout_module(weights), v)
        return out, (weights if want_weights else None)

    def _record_rows(self, mass: Tensor, xlogx: Tensor, nonzero: Tensor, n_visible: Tensor,
                     live_queries: Optional[Tensor] = None) -> None:
        """``_record`` from per-row sums of the fast paths (B, H, T each): same keys and values."""
        if live_queries is not None:  # padding rows: as if they saw no key
            n_visible = n_visible * live_queries
            mass = mass * live_queries
        live_rows = n_visible > 0
        add = {
            "zeros": n_visible.sum() - (nonzero * live_rows).sum(),
            "visible": n_visible.sum(),
            "null_rows": (live_rows & (nonzero == 0)).sum(),
            "rows": live_rows.sum(),
        }
        if self.regularise:
            norm_loss, margin, used = regularisers_from_rows(mass, xlogx, n_visible, self.entropy_margin_ratio)
            add.update(norm_loss=norm_loss, entropy_margin=margin, reg_rows=used)
        self._add_stats(add)

    def _record(self, weights: Tensor, keep: Tensor, n_visible: Tensor, live_queries: Optional[Tensor] = None) -> None:
        if live_queries is not None:  # padding rows: as if they saw no key
            keep = keep & live_queries.unsqueeze(-1)
        keep_full = keep.expand_as(weights)
        live_rows = keep_full.any(-1)
        nonzero = weights.detach() != 0
        add = {
            "zeros": (~nonzero & keep_full).sum(),
            "visible": keep_full.sum(),
            "null_rows": (live_rows & ~nonzero.any(-1)).sum(),
            "rows": live_rows.sum(),
        }
        if self.regularise:
            norm_loss, margin, used = F_attn.row_regularisers(weights, keep, n_visible,
                                                              self.entropy_margin_ratio)
            add.update(norm_loss=norm_loss, entropy_margin=margin, reg_rows=used)
        self._add_stats(add)

    def _add_stats(self, add: Dict[str, Tensor]) -> None:
        for key, value in add.items():
            self.stats[key] = self.stats.get(key, 0) + value

    def _output_transform(self, out: Tensor, query: Tensor) -> Tensor:
        """ReLA's RMSNorm (+ gate) over the concatenated heads; ReLU-ViT's gated unit."""
        if self.fn == "rela":
            rms = torch.sqrt(out.float().pow(2).mean(-1, keepdim=True) + RELA_EPS).type_as(out)
            normed = self.rela_gain * out / rms
            out = normed * torch.sigmoid(self.rela_gate * out) if self.rela_gate is not None else normed
        if self.gate_proj is not None:
            out = out * self.gate_proj(query)
        return out

    # ------------------------------------------------------------------ fairseq interface
    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False):
        asked_head_weights, asked_weights = need_head_weights, need_weights
        need_head_weights = need_head_weights or self.capture_weights
        # fairseq's fused path averages the heads, so per-head weights take the generic path
        if self.uses_fairseq_forward and not before_softmax and not need_head_weights:
            out, weights = super().forward(query, key, value, key_padding_mask=key_padding_mask,
                                           incremental_state=incremental_state, need_weights=need_weights,
                                           static_kv=static_kv, attn_mask=attn_mask,
                                           need_head_weights=need_head_weights)
            if self.record_stats:
                self._record_dense_rows(query.size(0), query.size(1), key_padding_mask)
            return out, weights
        if before_softmax:
            raise ValueError("before_softmax is only defined for softmax attention")
        need_weights = need_weights or need_head_weights

        tgt_len, bsz, _ = query.size()
        saved = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        if saved is not None and static_kv and "prev_key" in saved:
            key = value = None  # encoder keys/values are cached from the first step

        q = self._split_heads(self.q_proj(query), bsz)
        k = v = None
        if self.self_attention:
            k, v = self.k_proj(query), self.v_proj(query)
        elif key is not None:
            if self.encoder_decoder_attention and self.beam_size > 1 and key.size(1) == bsz:
                # fairseq's shared-encoder beam search (set_beam_size): keep one copy of the
                # encoder keys per sentence, as fairseq does, so reorder_incremental_state fits
                key = value = key.view(key.size(0), -1, self.beam_size, key.size(2))[:, :, 0]
                if key_padding_mask is not None:
                    key_padding_mask = key_padding_mask.view(-1, self.beam_size, key_padding_mask.size(1))[:, 0]
            k, v = self.k_proj(key), self.v_proj(value)
        if k is not None:
            k, v = self._split_heads(k, k.size(1)), self._split_heads(v, v.size(1))
        if self.q_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k) if k is not None else None

        if saved is not None:
            k, v, key_padding_mask = self._update_cache(saved, k, v, key_padding_mask, static_kv)
            self._set_input_buffer(incremental_state, saved)

        kv_bsz, src_len = k.size(0), k.size(2)
        if kv_bsz != bsz:  # beam search shares one copy of the encoder keys per sentence
            repeat = bsz // kv_bsz
            k, v = k.repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.repeat_interleave(repeat, 0)

        keep, additive = self._visible_keys(tgt_len, src_len, attn_mask, key_padding_mask, query.device)
        live_queries = self._live_queries(tgt_len, key_padding_mask) if self.record_stats else None
        out, weights = self._attend(q, k, v, keep, additive, need_weights, live_queries)

        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, self.embed_dim)
        out = self.out_proj(self._output_transform(out, query))

        if weights is not None:
            weights = weights.float().transpose(0, 1)  # heads x batch x tgt x src
            if self.capture_weights:
                self.captured = weights.detach()
            if not asked_head_weights:
                weights = weights.mean(0) if asked_weights else None
        return out, weights

    def _update_cache(self, saved, k, v, key_padding_mask, static_kv):
        """Append this step's keys/values to fairseq's incremental cache, (B, H, S, D) layout."""
        if "prev_key" in saved:
            if static_kv:
                k, v = saved["prev_key"], saved["prev_value"]
            else:
                k = torch.cat([saved["prev_key"], k], dim=2)
                v = torch.cat([saved["prev_value"], v], dim=2)
        key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
            key_padding_mask=key_padding_mask,
            prev_key_padding_mask=saved.get("prev_key_padding_mask"),
            batch_size=k.size(0), src_len=k.size(2), static_kv=static_kv)
        saved["prev_key"], saved["prev_value"] = k, v
        saved["prev_key_padding_mask"] = key_padding_mask
        return k, v, key_padding_mask

    def _record_dense_rows(self, tgt_len: int, bsz: int, key_padding_mask: Optional[Tensor]) -> None:
        """Softmax rows are never null and never hold exact zeros: count real query rows only."""
        live = self._live_queries(tgt_len, key_padding_mask)
        rows = live.sum() if live is not None else torch.tensor(tgt_len * bsz)
        self._add_stats({"rows": rows * self.num_heads, "zeros": torch.tensor(0), "null_rows": torch.tensor(0)})

    def upgrade_state_dict_named(self, state_dict, name):
        """Checkpoints from before gamma was kept as log(gamma) stored ``gamma`` itself."""
        super().upgrade_state_dict_named(state_dict, name)
        old_key = f"{name}.gamma" if name else "gamma"
        if old_key in state_dict:
            gamma = state_dict.pop(old_key)
            if not bool((gamma > 0).all()):
                raise ValueError(f"{old_key}: a learned ReLUFormer gamma must be > 0, the checkpoint has {gamma.tolist()}")
            if self.log_gamma is not None:
                state_dict[old_key.replace(".gamma", ".log_gamma") if name else "log_gamma"] = gamma.log()

    def pop_stats(self) -> Dict[str, Tensor]:
        stats, self.stats = self.stats, {}
        return stats
