"""The one multi-head attention module of reluformer-mt, with the weight function an option.

It subclasses fairseq's ``MultiheadAttention`` instead of replacing it, for three reasons:
parameter names (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``) stay fairseq's, so a softmax
model and fairseq's ``transformer`` load each other's weights; the incremental-decoding cache
and ``reorder_incremental_state`` used by beam search stay fairseq's; and the softmax function
calls fairseq's own forward (PyTorch's fused attention), so the baseline keeps fairseq's speed.
Every other function runs :meth:`ReluformerAttention._attend`, which computes the logits,
applies the weight function object of :mod:`reluformer_mt.attention.functions` (resolved once,
at construction), and the output transforms (ReLA's RMSNorm and gate, ReLU-ViT's gated unit,
the hybrid-norm of sigmoid attention). How a call runs (its route: fairseq's forward, the
reference formula, or a kernel of :mod:`reluformer_mt.attention.blocked`, ``fused`` or ``flex``)
is chosen by :mod:`reluformer_mt.attention.routes` alone, from what the function declares and
what the call asks (same results; ``--attn-impl``, see docs/PERFORMANCE.md).
What a forward records (counts, regularisers, per-head weights) goes to the recording of
:mod:`reluformer_mt.attention.recording` active around it, and to nothing when there is none.
"""
import dataclasses
from contextlib import contextmanager
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
from fairseq.modules.multihead_attention import MultiheadAttention
from torch import Tensor

from reluformer_mt.attention import functions as F_attn
from reluformer_mt.attention import routes
from reluformer_mt.attention.blocked import tiled_attention
# the accelerated kernels register their routes on import (routes.register_route)
from reluformer_mt.attention import flex, fused  # noqa: F401
from reluformer_mt.attention import triton_kernel
from reluformer_mt.attention.config import AttentionConfig
from reluformer_mt.attention.visibility import Visibility, is_causal_mask, live_query_rows


def causal_float_mask(tgt_len: int, src_len: int, like: Tensor) -> Tensor:
    """fairseq's (T, S) 0 / -inf causal mask, for its own softmax forward (which needs one)."""
    return torch.full((tgt_len, src_len), float("-inf"), dtype=like.dtype, device=like.device).triu_(src_len - tgt_len + 1)


class ReluformerAttention(MultiheadAttention):
    """Multi-head attention whose weight function is ``config.fn``.

    Input and output shapes are fairseq's (Time x Batch x Channel). Attention weights are
    returned per head (heads x batch x tgt x src) with ``need_head_weights`` and averaged over
    heads with ``need_weights``, as in fairseq.

    Recording (off by default, so training pays nothing for it) is the business of
    :mod:`reluformer_mt.attention.recording`: its with-blocks install a recorder as
    ``_recorder`` and remove it on exit; the forward hands it counts, ReLUFormer's row losses or
    per-head weights. Nothing else sets attributes on the module.
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
        self.function = F_attn.get_function(config.fn)

        # the function's own parameters (log_gamma, rela_gain, rela_gate, sigmoid_bias), only
        # where it uses them: an unused one breaks DDP without find_unused_parameters
        made = self.function.make_parameters(config, num_heads, embed_dim)
        for name in F_attn.PARAMETER_NAMES:
            setattr(self, name, made.get(name))
        self._function_params = tuple(made)  # names only: the tensors live on the module
        self._config_key = dataclasses.astuple(self.config)  # what a row factor kept per mask depends on

        self.q_norm = nn.LayerNorm(self.head_dim) if config.qk_layernorm else None
        self.k_norm = nn.LayerNorm(self.head_dim) if config.qk_layernorm else None
        self.gate_proj = nn.Linear(embed_dim, embed_dim) if config.output_gate else None
        # hybrid-norm (Ramapuram et al. 2024): LayerNorm on the sublayer output, before the residual
        self.output_norm = nn.LayerNorm(embed_dim) if config.output_norm else None

        # the active recording of attention.recording, None when nothing records; only its
        # with-blocks set and clear it
        self._recorder = None
        # cross-attention cannot see which decoder positions are padding; the decoder layer
        # lends it the target padding mask for one call (``padded_queries``)
        self._query_padding: Optional[Tensor] = None

    # ------------------------------------------------------------------ helpers
    @property
    def uses_fairseq_forward(self) -> bool:
        """Plain softmax attention runs fairseq's own (fused) forward."""
        return routes.uses_fairseq_forward(self.function, self.config)

    def _split_heads(self, x: Tensor, bsz: int) -> Tensor:
        """(T, B, H*D) -> (B, H, T, D)."""
        return x.contiguous().view(-1, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def _params(self) -> F_attn.Params:
        """The options and learned tensors the weight function reads."""
        return F_attn.Params(self.config, {name: getattr(self, name) for name in self._function_params})

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
            # the mask itself where it is the queries' (training): the layers then share one entry
            padding = key_padding_mask if key_padding_mask.size(-1) == tgt_len else key_padding_mask[:, -tgt_len:]
        if padding is None or padding.size(-1) != tgt_len:
            return None
        # remembered per mask: the layers of a forward share it; all True rows count as None would
        # (the statistics multiply by it), without asking the host whether any row is padding
        return live_query_rows(padding, always=True)

    def _visible_keys(self, tgt_len: int, src_len: int, attn_mask: Optional[Tensor],
                      key_padding_mask: Optional[Tensor], is_causal: bool = False) -> Tuple[Visibility, Optional[Tensor]]:
        """The keys each query may see, and an additive float mask (or None).

        fairseq gives the causal mask as a float (T, S) tensor of 0 / -inf (or a bool one);
        recognised as the causal pattern (checked once per mask buffer), it becomes a flag, so
        nothing of size T x S is built here (``visibility.py``). Other masks are kept as masks;
        their finite non-zero entries (e.g. a bias) are returned separately to add to the logits.
        """
        additive, hidden = None, None
        causal = is_causal
        if attn_mask is not None and not is_causal_mask(attn_mask, tgt_len, src_len):
            if attn_mask.dtype == torch.bool:
                hidden = attn_mask
            else:
                hidden = torch.isneginf(attn_mask)
                finite = attn_mask.masked_fill(hidden, 0.0)
                if finite.any():
                    additive = finite.view(1, 1, tgt_len, src_len)
            if not bool(hidden.any()):
                hidden = None
        elif attn_mask is not None:
            causal = True
        return Visibility.from_padding(tgt_len, src_len, key_padding_mask, causal, hidden), additive

    # ------------------------------------------------------------------ attention core
    def route(self, q: Tensor, src_len: int, visible: Visibility, additive: Optional[Tensor], want_weights: bool,
              want_rows: bool, k: Optional[Tensor] = None, v: Optional[Tensor] = None,
              head_weights: bool = False) -> str:
        """The route of this projected call, chosen by :func:`routes.choose_route` from what the
        weight function declares and what the call asks (all routes give the same results)."""
        learned = [getattr(self, name) for name in self._function_params]
        needs_grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (q, k, v, *learned))
        call = routes.Call(
            head_weights=head_weights, tgt_len=q.size(2), src_len=src_len, q=q, want_weights=want_weights, want_rows=want_rows,
            additive=additive is not None, dropout=self.training and self.dropout_module.p > 0,
            regularised=self._recorder is not None and self._recorder.regularises(self),
            visible=visible, needs_grad=needs_grad)
        return routes.choose_route(self.function, self.config, call)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, visible: Visibility, additive: Optional[Tensor],
                want_weights: bool, live_queries: Optional[Tensor] = None,
                head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """q (B,H,T,D) k,v (B,H,S,D) -> output (B,H,T,D) and weights (B,H,T,S) if wanted.

        ``live_queries`` (B, 1, T) marks real query rows: only they enter the recorded statistics
        and ReLUFormer's regularisers (padding rows would otherwise count and get gradients).
        """
        function, params = self.function, self._params()
        recorder = self._recorder
        counting = recorder is not None and recorder.records_statistics(self)
        # the regularisers need the rows' sums; the statistics alone only their non-zero counts
        regularised = counting and recorder.regularises(self)
        scale_logits = function.scale_logits(self.config)
        route = self.route(q, k.size(2), visible, additive, want_weights, counting, k, v, head_weights)
        n_visible = visible.n_visible(q.device)
        if not routes.computes_weights(route):
            acc = F_attn.accumulation_dtype(q.dtype)  # row factors and biases in float32 at least
            # the triton route takes tiled_attention's arguments; where the kernel cannot run a call,
            # it runs tiled_attention with the remaining ones (the blocked route)
            attend, route_arg = ((triton_kernel.triton_tiled_attention, "blocked") if route == "triton"
                                 else (tiled_attention, route))
            out, rows, weights = attend(
                q, k, v, visible, route=route_arg, activation=function.activation(self.config),
                scaling=self.scaling if scale_logits else None,
                row_factor=self._row_part("row_factor", visible, n_visible, params, acc),
                row_bias=self._row_part("row_bias", visible, n_visible, params, acc), n_visible=n_visible,
                block_q=self.config.block_size, block_k=self.config.block_size,
                want_rows=counting, want_weights=want_weights, row_sums=regularised)
            if rows is not None:
                recorder.add_rows(self, *rows, live_queries=live_queries)
            return out, weights
        scores = torch.matmul(q * self.scaling if scale_logits else q, k.transpose(-1, -2))
        if additive is not None:
            scores = scores + additive
        keep = visible.dense(q.device)
        if route == "reference":
            weights = function.weights(scores, keep, n_visible, params)
        else:  # a registered kernel of the function's weights (routes.computes_weights)
            weights = function.kernel_weights(scores, keep, n_visible, params)
        if counting:
            recorder.add_weights(self, weights, keep, n_visible, live_queries)
        out = torch.matmul(self.dropout_module(weights), v)
        return out, (weights if want_weights else None)

    def _row_part(self, what: str, visible: Visibility, n_visible: Tensor, params: F_attn.Params, dtype):
        """The function's row factor or row bias (``what``). Where it depends on nothing learned
        (ReLUFormer's fixed gamma), it is computed once per mask and kept on the Visibility, as
        the counts are: the layers of a forward share it (about ten small operators a call)."""
        part = getattr(self.function, what)
        if self._function_params:
            return part(n_visible, params, dtype)
        key = (what, self.fn, self._config_key, dtype)
        return visible._memo(key, n_visible.device, lambda: part(n_visible, params, dtype))

    def _output_transform(self, out: Tensor, query: Tensor) -> Tensor:
        """The function's own transform (ReLA's RMSNorm + gate), ReLU-ViT's gated unit, the output
        projection and the hybrid-norm."""
        out = self.function.transform_output(out, self._params())
        if self.gate_proj is not None:
            out = out * self.gate_proj(query)
        out = self.out_proj(out)
        return self.output_norm(out) if self.output_norm is not None else out

    # ------------------------------------------------------------------ fairseq interface
    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False, is_causal: bool = False):
        """fairseq's MultiheadAttention.forward; ``is_causal`` (our addition, for callers other than
        fairseq's decoder) asks for the causal pattern without passing a (T, S) mask."""
        if is_causal and attn_mask is None and self.uses_fairseq_forward:
            attn_mask = causal_float_mask(query.size(0), (key if key is not None else query).size(0), query)
        asked_head_weights, asked_weights = need_head_weights, need_weights
        recorder = self._recorder
        capture = recorder is not None and recorder.captures(self)
        counting = recorder is not None and recorder.records_statistics(self)
        need_head_weights = need_head_weights or capture
        # fairseq's fused path averages the heads, so per-head weights take our own routes
        before = routes.Call(head_weights=need_head_weights, before_softmax=before_softmax)
        if routes.choose_route(self.function, self.config, before) == "fairseq":
            return self._fairseq_forward(query, key, value, key_padding_mask, incremental_state, need_weights,
                                         static_kv, attn_mask, need_head_weights, counting)
        if before_softmax:
            raise ValueError("before_softmax is only defined for softmax attention")
        need_weights = need_weights or need_head_weights

        tgt_len, bsz, _ = query.size()
        q, k, v, key_padding_mask = self._project(query, key, value, key_padding_mask, incremental_state, static_kv)
        if k.size(0) != bsz and tgt_len == 1 and attn_mask is None and not counting:
            out, weights = self._attend_shared_keys(q, k, v, key_padding_mask, need_weights, need_head_weights)
        else:
            out, weights = self._attend_every_query(q, k, v, key_padding_mask, attn_mask, is_causal, need_weights,
                                                    need_head_weights, counting)

        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, self.embed_dim)
        out = self._output_transform(out, query)

        if weights is not None:
            weights = weights.float().transpose(0, 1)  # heads x batch x tgt x src
            if capture:
                recorder.add_head_weights(self, weights)
            if not asked_head_weights:
                weights = weights.mean(0) if asked_weights else None
        return out, weights

    def _fairseq_forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                         key_padding_mask: Optional[Tensor], incremental_state, need_weights: bool, static_kv: bool,
                         attn_mask: Optional[Tensor], need_head_weights: bool, counting: bool):
        """Softmax attention by fairseq's own (fused) forward; the recorder counts its live rows."""
        out, weights = super().forward(query, key, value, key_padding_mask=key_padding_mask,
                                       incremental_state=incremental_state, need_weights=need_weights,
                                       static_kv=static_kv, attn_mask=attn_mask,
                                       need_head_weights=need_head_weights)
        if counting:  # softmax rows are never null and never hold exact zeros: count real rows
            live = self._live_queries(query.size(0), key_padding_mask)
            rows = live.sum() if live is not None else torch.tensor(query.size(0) * query.size(1))
            self._recorder.add_softmax_rows(self, rows)
        return out, weights

    def _project(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                 key_padding_mask: Optional[Tensor], incremental_state, static_kv: bool):
        """Queries, keys and values split into heads (B, H, T, D), normalised when the family does,
        with the decoding cache read and updated; the key padding mask that goes with the keys."""
        bsz = query.size(1)
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
        return q, k, v, key_padding_mask

    def _attend_every_query(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                            attn_mask: Optional[Tensor], is_causal: bool, need_weights: bool,
                            need_head_weights: bool, counting: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """Attention with the visible keys of every query, the keys repeated for each beam when beam
        search keeps them once per sentence."""
        bsz, tgt_len = q.size(0), q.size(2)
        kv_bsz, src_len = k.size(0), k.size(2)
        # from the encoder's own padding mask: the same tensor at every decoding step, so its key
        # ranges are found once (visibility.padding_ranges remembers them)
        visible, additive = self._visible_keys(tgt_len, src_len, attn_mask, key_padding_mask, is_causal)
        if kv_bsz != bsz:  # beam search shares one copy of the encoder keys per sentence
            repeat = bsz // kv_bsz
            k, v = k.repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0)
            visible = visible.repeat_interleave(repeat)
            if key_padding_mask is not None and counting:
                key_padding_mask = key_padding_mask.repeat_interleave(repeat, 0)
        live_queries = self._live_queries(tgt_len, key_padding_mask) if counting else None
        return self._attend(q, k, v, visible, additive, need_weights, live_queries, need_head_weights)

    def _attend_shared_keys(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                            want_weights: bool, head_weights: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """One decoding step over keys that beam search keeps once per sentence (fairseq's
        set_beam_size): q (B, H, 1, D), k and v (kv_bsz, H, S, D) with a sentence's beams adjacent
        in B. The beams become the query rows of their sentence's keys, which are read in place
        instead of repeated per beam at every step; -> (B, H, 1, D) and (B, H, 1, S) weights."""
        bsz, heads, kv_bsz = q.size(0), q.size(1), k.size(0)
        beams = bsz // kv_bsz
        rows = q.reshape(kv_bsz, beams, heads, q.size(-1)).transpose(1, 2)  # (kv_bsz, H, beams, D)
        visible, additive = self._visible_keys(beams, k.size(2), None, key_padding_mask)
        out, weights = self._attend(rows, k, v, visible, additive, want_weights, None, head_weights)

        def per_row(t: Tensor) -> Tensor:  # (kv_bsz, H, beams, X) -> (B, H, 1, X)
            return t.transpose(1, 2).reshape(bsz, heads, 1, t.size(-1))
        return per_row(out), (None if weights is None else per_row(weights))

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

    def upgrade_state_dict_named(self, state_dict, name):
        """Checkpoints from before gamma was kept as log(gamma) stored ``gamma`` itself."""
        super().upgrade_state_dict_named(state_dict, name)
        old_key = f"{name}.gamma" if name else "gamma"
        if old_key in state_dict:
            gamma = state_dict.pop(old_key)
            if not bool((gamma > 0).all()):
                raise ValueError(f"{old_key}: a learned ReLUFormer gamma must be > 0, the checkpoint has {gamma.tolist()}")
            if self.log_gamma is None:  # dropping it would score with another gamma, silently
                raise ValueError(f"{old_key}: the checkpoint holds a learned ReLUFormer gamma {gamma.tolist()} but its "
                                 f"header says --relu-gamma-mode fixed (gamma {self.config.relu_gamma:g}); "
                                 "the header and the weights disagree")
            state_dict[old_key.replace(".gamma", ".log_gamma") if name else "log_gamma"] = gamma.log()
