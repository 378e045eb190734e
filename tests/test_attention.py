"""The attention functions and the multi-head module against direct, naive computations."""
import math

import pytest
import torch

from reluformer_mt.attention import (AttentionConfig, AttentionOptionError, ReluformerAttention, capture_attention,
                                    record_attention)
from reluformer_mt.attention.functions import POINTWISE_ACTIVATIONS

E, H = 16, 4
D = E // H
FNS = ["softmax", "relu", "rela", "pointwise", "sparsemax", "entmax15", "sigmoid", "softpick"]


def make(fn, seed=0, **options):
    torch.manual_seed(seed)
    module = ReluformerAttention(E, H, AttentionConfig(fn=fn, **options), self_attention=True).eval()
    if module.rela_gain is not None:  # make the gain non-trivial so the test can see it
        module.rela_gain.data.uniform_(0.5, 1.5)
    if module.sigmoid_bias is not None:  # one learned bias per head, different ones
        module.sigmoid_bias.data = torch.linspace(-3.0, -0.5, H)
    return module


# --------------------------------------------------------------------------- naive references
def naive_sparsemax(z):
    """Sparsemax by its definition: Euclidean projection onto the simplex (sort-based)."""
    zs, _ = torch.sort(z, descending=True)
    k = torch.arange(1, len(z) + 1, dtype=z.dtype)
    support = 1 + k * zs > torch.cumsum(zs, 0)
    k_max = support.nonzero().max() + 1
    tau = (zs[:k_max].sum() - 1) / k_max
    return torch.clamp(z - tau, min=0)


def naive_entmax15(z, iters=80):
    """1.5-entmax by bisection on tau: p_j = max((z_j/2 - tau), 0)^2 summing to 1."""
    x = z / 2
    lo, hi = x.max() - 1, x.max()
    for _ in range(iters):
        tau = (lo + hi) / 2
        mass = torch.clamp(x - tau, min=0).pow(2).sum()
        lo, hi = (tau, hi) if mass > 1 else (lo, tau)
    p = torch.clamp(x - (lo + hi) / 2, min=0).pow(2)
    return p / p.sum()


def naive_weights(fn, s, visible, cfg, head_bias=None):
    """One query row: logits s (S,), visible (S,) bool -> weights (S,), loop-free but direct."""
    n = int(visible.sum())
    out = torch.zeros_like(s)
    sv = s[visible]
    if n == 0:
        return out
    if fn == "softmax":
        w = torch.exp(sv - sv.max()) / torch.exp(sv - sv.max()).sum()
    elif fn == "relu":
        w = torch.clamp(sv, min=0) / (cfg.relu_gamma * math.sqrt(n / 2))
    elif fn == "rela":
        w = torch.clamp(sv, min=0)
    elif fn == "pointwise":
        w = n ** (-cfg.pointwise_alpha) * POINTWISE_ACTIVATIONS[cfg.pointwise_activation](sv)
    elif fn == "sparsemax":
        w = naive_sparsemax(sv)
    elif fn == "entmax15":
        w = naive_entmax15(sv)
    elif fn == "sigmoid":
        b = {"auto": -math.log(n), "learned": head_bias}.get(cfg.sigmoid_bias, cfg.sigmoid_bias)
        w = 1 / (1 + torch.exp(-(sv + b)))
    elif fn == "softpick":
        w = torch.clamp(torch.exp(sv) - 1, min=0) / ((torch.exp(sv) - 1).abs().sum() + 1e-6)
    out[visible] = w
    return out


def naive_forward(module, x, key_padding_mask=None, causal=False):
    """The whole module by loops over batch, head and query, from its own parameters."""
    T, B, _ = x.shape
    cfg = module.config
    q = module.q_proj(x).view(T, B, H, D)
    k = module.k_proj(x).view(T, B, H, D)
    v = module.v_proj(x).view(T, B, H, D)
    if module.q_norm is not None:
        q, k = module.q_norm(q), module.k_norm(k)
    out = torch.zeros(T, B, H, D)
    weights = torch.zeros(H, B, T, T)
    scale = 1 / math.sqrt(D) if (cfg.fn != "relu" or cfg.relu_scale_logits) else 1.0
    for b in range(B):
        for h in range(H):
            for i in range(T):
                visible = torch.ones(T, dtype=torch.bool)
                if key_padding_mask is not None:
                    visible &= ~key_padding_mask[b]
                if causal:
                    visible[i + 1:] = False
                s = (q[i, b, h] @ k[:, b, h].T) * scale
                head_bias = None if module.sigmoid_bias is None else float(module.sigmoid_bias[h])
                w = naive_weights(cfg.fn, s, visible, cfg, head_bias)
                weights[h, b, i] = w
                out[i, b, h] = w @ v[:, b, h]
    out = out.reshape(T, B, E)
    if cfg.fn == "rela":
        rms = torch.sqrt((out ** 2).mean(-1, keepdim=True) + 1e-8)
        normed = module.rela_gain * out / rms
        out = normed * torch.sigmoid(module.rela_gate * out) if module.rela_gate is not None else normed
    if module.gate_proj is not None:
        out = out * module.gate_proj(x)
    out = module.out_proj(out)
    return (module.output_norm(out) if module.output_norm is not None else out), weights


def causal_mask(T):
    return torch.triu(torch.full((T, T), float("-inf")), 1)


# --------------------------------------------------------------------------- tests
@pytest.mark.parametrize("fn,options", [(fn, {}) for fn in FNS] + [
    ("relu", {"relu_gamma": 2.0}), ("relu", {"relu_scale_logits": False}),
    ("rela", {"rela_variant": "ungated"}),
    ("pointwise", {"pointwise_alpha": 0.5, "pointwise_activation": "gelu", "qk_layernorm": True}),
    ("pointwise", {"pointwise_activation": "sigmoid", "output_gate": True}),
    ("pointwise", {"pointwise_activation": "identity"}),
    ("pointwise", {"pointwise_activation": "relu2", "qk_layernorm": True}),
    ("softmax", {"qk_layernorm": True}),
    ("sigmoid", {"sigmoid_bias": "learned", "output_norm": True}), ("sigmoid", {"sigmoid_bias": -1.0}),
    ("softpick", {"output_norm": True}), ("softmax", {"output_norm": True}),
])
@pytest.mark.parametrize("causal", [False, True])
def test_module_matches_naive_reference(fn, options, causal):
    module = make(fn, **options)
    x = torch.randn(6, 3, E)
    kpm = torch.zeros(3, 6, dtype=torch.bool)
    kpm[1, :2] = True  # left padding, as fairseq pads sources
    kpm[2, 4:] = True  # right padding
    out, w = module(x, x, x, key_padding_mask=kpm, attn_mask=causal_mask(6) if causal else None,
                    need_head_weights=True)
    ref_out, ref_w = naive_forward(module, x, kpm, causal)
    tol = 2e-4 if fn == "entmax15" else 1e-5
    torch.testing.assert_close(w, ref_w, atol=tol, rtol=1e-4)
    real = ~kpm.T  # compare outputs of real (unpadded) query positions
    torch.testing.assert_close(out[real], ref_out[real], atol=tol * 10, rtol=1e-4)


@pytest.mark.parametrize("fn", FNS)
def test_masked_positions_get_exactly_zero_weight(fn):
    module = make(fn)
    x = torch.randn(7, 2, E) * 3
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[0, :3] = True
    _, w = module(x, x, x, key_padding_mask=kpm, attn_mask=causal_mask(7), need_head_weights=True)
    assert torch.all(w[:, 0, :, :3] == 0)
    assert torch.all(torch.triu(w, 1) == 0)


@pytest.mark.parametrize("fn", FNS)
def test_padding_does_not_change_real_outputs(fn):
    module = make(fn)
    x = torch.randn(5, 1, E)
    padded = torch.cat([torch.randn(3, 1, E), x], 0)  # left-padded by 3 junk positions
    kpm = torch.tensor([[True] * 3 + [False] * 5])
    out, _ = module(x, x, x)
    out_padded, _ = module(padded, padded, padded, key_padding_mask=kpm)
    torch.testing.assert_close(out_padded[3:], out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fn", FNS)
def test_incremental_decoding_equals_full_pass(fn):
    module = make(fn)
    T = 6
    x = torch.randn(T, 2, E)
    full, _ = module(x, x, x, attn_mask=causal_mask(T))
    state = {}
    steps = [module(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state)[0] for t in range(T)]
    torch.testing.assert_close(torch.cat(steps, 0), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fn", FNS)
def test_cross_attention_incremental_with_static_keys(fn):
    torch.manual_seed(0)
    module = ReluformerAttention(E, H, AttentionConfig(fn=fn), encoder_decoder_attention=True).eval()
    enc = torch.randn(5, 2, E)
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[0, :2] = True
    y = torch.randn(4, 2, E)
    full, _ = module(y, enc, enc, key_padding_mask=kpm, static_kv=True)
    state = {}
    steps = [module(y[t:t + 1], enc, enc, key_padding_mask=kpm, incremental_state=state, static_kv=True)[0]
             for t in range(4)]
    torch.testing.assert_close(torch.cat(steps, 0), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fn", FNS)
def test_cross_attention_reads_keys_shared_by_beams_in_place(fn):
    """Beam search keeps one copy of the encoder keys per sentence (set_beam_size); a decoding
    step reads it with the sentence's beams as query rows: the same outputs and head weights as
    attending a copy of the keys per beam (padding on one sentence; issue 32)."""
    torch.manual_seed(0)
    beams, sentences = 3, 2
    module = ReluformerAttention(E, H, AttentionConfig(fn=fn), encoder_decoder_attention=True).eval()
    enc = torch.randn(5, sentences, E).repeat_interleave(beams, 1)  # each sentence's copies, beams adjacent
    kpm = torch.zeros(sentences, 5, dtype=torch.bool)
    kpm[0, :2] = True
    kpm = kpm.repeat_interleave(beams, 0)
    y = torch.randn(3, sentences * beams, E)
    per_beam, shared = {}, {}
    module.set_beam_size(1)
    expected = [module(y[t:t + 1], enc, enc, key_padding_mask=kpm, incremental_state=per_beam, static_kv=True,
                       need_head_weights=True) for t in range(3)]
    module.set_beam_size(beams)
    found = [module(y[t:t + 1], enc, enc, key_padding_mask=kpm, incremental_state=shared, static_kv=True,
                    need_head_weights=True) for t in range(3)]
    assert module._get_input_buffer(shared)["prev_key"].size(0) == sentences  # one copy per sentence
    for (out, w), (ref_out, ref_w) in zip(found, expected):
        torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(w, ref_w, atol=1e-5, rtol=1e-5)


def test_relu_counts_visible_tokens_per_position_in_causal_attention():
    """Row i of causal ReLUFormer attention is scaled by sqrt((i+1)/2): check on constant logits."""
    module = make("relu")
    for p in (module.q_proj, module.k_proj):
        torch.nn.init.zeros_(p.weight)
        torch.nn.init.constant_(p.bias, 1.0)
    x = torch.randn(5, 1, E)
    _, w = module(x, x, x, attn_mask=causal_mask(5), need_head_weights=True)
    s = D * 1.0 / math.sqrt(D)  # q.k / sqrt(d) with all-ones q, k
    for i in range(5):
        expected = torch.tensor([s / math.sqrt((i + 1) / 2)] * (i + 1) + [0.0] * (4 - i))
        torch.testing.assert_close(w[0, 0, i], expected)


def test_relu_variance_property():
    """sum_j ReLU(x_j) v_j has variance ~ n/2; ReLUFormer's factor keeps it ~1 for n in 16..1024."""
    from reluformer_mt.attention import AttentionConfig
    from reluformer_mt.attention.functions import FUNCTIONS, Params

    relu, params = FUNCTIONS["relu"], Params(AttentionConfig(fn="relu"), {})

    torch.manual_seed(0)
    trials = 4000
    for n in (16, 64, 256, 1024):
        s = torch.randn(trials, 1, 1, n)
        v = torch.randn(trials, 1, n, 1)
        keep = torch.ones(1, 1, 1, n, dtype=torch.bool)
        unscaled = (torch.relu(s) @ v).var().item()
        scaled = (relu.weights(s, keep, torch.full((1, 1, 1, 1), n), params) @ v).var().item()
        assert abs(unscaled / (n / 2) - 1) < 0.1, (n, unscaled)
        assert abs(scaled - 1) < 0.1, (n, scaled)


@pytest.mark.parametrize("mode", ["layer", "head"])
def test_gradients_reach_gamma_and_gates(mode):
    module = make("relu", relu_gamma_mode=mode).train()
    x = torch.randn(5, 2, E)
    module(x, x, x)[0].pow(2).sum().backward()
    assert module.log_gamma.grad is not None and torch.all(module.log_gamma.grad != 0)

    rela = make("rela").train()
    rela(x, x, x)[0].pow(2).sum().backward()
    assert rela.rela_gate.grad.abs().sum() > 0 and rela.rela_gain.grad.abs().sum() > 0

    gated = make("pointwise", output_gate=True).train()
    gated(x, x, x)[0].pow(2).sum().backward()
    assert gated.gate_proj.weight.grad.abs().sum() > 0


def test_rela_null_attention_gives_zero_not_nan():
    module = make("rela")
    torch.nn.init.zeros_(module.q_proj.weight)
    torch.nn.init.constant_(module.q_proj.bias, -1.0)
    torch.nn.init.zeros_(module.k_proj.weight)
    torch.nn.init.constant_(module.k_proj.bias, 1.0)  # every logit negative: all rows null
    x = torch.randn(4, 2, E)
    out, w = module(x, x, x, need_head_weights=True)
    assert torch.all(w == 0)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, module.out_proj.bias.expand_as(out))


def test_stats_recording_counts_zeros_and_null_rows():
    module = make("relu")
    x = torch.randn(6, 2, E)
    with record_attention(module, regularise=True) as record:
        _, w = module(x, x, x, need_head_weights=True)
    stats = record.totals()
    assert int(stats["visible"]) == w.numel()
    assert int(stats["zeros"]) == int((w == 0).sum())
    assert int(stats["null_rows"]) == int((w.sum(-1) == 0).sum())
    mass = w.sum(-1)
    live = mass > 0
    torch.testing.assert_close(stats["norm_loss"], torch.log(mass[live]).abs().sum())
    assert record.statistics(module) == stats
    assert module._recorder is None


# --------------------------------------------------------------------------- recording API
def test_recording_is_cleared_after_an_exception():
    relu, softmax = make("relu"), make("softmax")
    x = torch.randn(5, 2, E)
    with pytest.raises(KeyError):
        with record_attention([relu, softmax], regularise=True), capture_attention(relu):
            relu(x, x, x)
            raise KeyError("inside the block")
    assert relu._recorder is None and softmax._recorder is None
    # nothing records any more, and softmax runs fairseq's forward again (no per-head weights)
    assert relu(x, x, x, need_weights=False)[1] is None
    assert softmax(x, x, x)[1].dim() == 3


def test_a_model_s_attention_modules_are_found_once_each_in_model_order():
    """A model is walked once (the criterion does it every update): every attention module, nested
    at any depth and shared ones once, in the order of ``model.modules()``, as for the same modules
    given as a list."""
    from reluformer_mt.attention.recording import attention_modules_in

    a, b, c, shared = make("relu"), make("softmax"), make("rela"), make("relu", seed=1)
    inner = torch.nn.Sequential(torch.nn.Linear(E, E), torch.nn.Sequential(b, shared))
    model = torch.nn.ModuleDict({"first": a, "block": inner, "again": shared, "deep": torch.nn.Sequential(inner, c)})
    found = attention_modules_in(model)
    assert found == [a, b, shared, c]
    assert found == attention_modules_in(list(model.children()))
    assert attention_modules_in(a) == [a]


def test_repeated_and_nested_recordings():
    module = make("relu")
    x, y = torch.randn(5, 2, E), torch.randn(7, 2, E)
    with record_attention(module) as first:
        module(x, x, x)
    with record_attention(module) as again:
        module(x, x, x)
    assert first.totals().keys() == {"zeros", "visible", "null_rows", "rows"}
    assert {k: int(v) for k, v in first.totals().items()} == {k: int(v) for k, v in again.totals().items()}
    with pytest.raises(RuntimeError, match="one with-block"):
        with first:
            pass

    with record_attention(module, statistics=False, regularise=True) as outer:
        module(x, x, x)
        with capture_attention(module) as captured, record_attention(module, statistics=True) as inner:
            _, w = module(y, y, y, need_head_weights=True)
            assert module._recorder is inner
        assert module._recorder is outer
        module(x, x, x)
    assert module._recorder is None
    # every recording saw the calls of its own block: the outer one all three, with regularisers
    torch.testing.assert_close(captured.weights(module), w)
    assert int(inner.totals()["rows"]) == H * 2 * 7 and "norm_loss" not in inner.totals()
    assert int(outer.totals()["rows"]) == H * 2 * (5 + 7 + 5) and int(outer.totals()["reg_rows"]) > 0
    with pytest.raises(RuntimeError, match="not captured"):
        capture_attention(make("relu")).weights(module)


def test_regularise_selects_modules_by_function_and_captures_by_kind():
    relu, rela = make("relu"), make("rela")
    x = torch.randn(4, 1, E)
    with record_attention({"a": [relu], "b": [rela]}, regularise={"relu"}) as record, \
            capture_attention({"layers": [relu, rela]}) as captured:
        relu(x, x, x)
        rela(x, x, x)
    assert "norm_loss" in record.statistics(relu) and "norm_loss" not in record.statistics(rela)
    assert captured.weights("layers").shape == (2, H, 1, 4, 4)


@pytest.mark.parametrize("options,message", [
    ({"fn": "tanh"}, "--attn-fn: got 'tanh', expected one of softmax, relu"),
    ({"fn": "relu", "relu_gamma": 0.0}, "--relu-gamma: got 0.0, expected a finite number > 0"),
    ({"fn": "pointwise", "pointwise_alpha": 3.0}, "--pointwise-alpha: got 3.0, expected a number in [0, 2]"),
    ({"fn": "pointwise", "pointwise_activation": "tanh"}, "--pointwise-h: got 'tanh', expected one of relu, relu2"),
    ({"fn": "relu", "relu_gamma_mode": "token"}, "--relu-gamma-mode"),
])
def test_bad_options_name_the_option(options, message):
    with pytest.raises(AttentionOptionError) as err:
        AttentionConfig(**options).validate()
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("fn", ["sparsemax", "entmax15"])
def test_partial_sort_is_exact_when_the_support_exceeds_k(fn):
    """The threshold is searched among the PARTIAL_SORT_K largest logits, re-solved with 2k, 4k...
    where the support reaches k: rows with flat logits (support > k) and peaked ones (support < k)
    must both equal the definition."""
    from reluformer_mt.attention.functions import PARTIAL_SORT_K, entmax15_weights, sparsemax_weights

    S = 4 * PARTIAL_SORT_K
    torch.manual_seed(4)
    scores = torch.cat([torch.randn(1, 3, S) * 0.01, torch.randn(1, 3, S) * 5.0], dim=1)  # flat, peaked
    keep = torch.ones(1, 6, S, dtype=torch.bool)
    keep[0, 2, -10:] = False
    weights = (sparsemax_weights if fn == "sparsemax" else entmax15_weights)(scores, keep)
    naive = naive_sparsemax if fn == "sparsemax" else naive_entmax15
    support = []
    for r in range(6):
        expected = torch.zeros(S)
        expected[keep[0, r]] = naive(scores[0, r][keep[0, r]])
        torch.testing.assert_close(weights[0, r], expected, atol=2e-5, rtol=1e-4)
        support.append(int((weights[0, r] > 0).sum()))
    assert max(support) > PARTIAL_SORT_K and min(support) < PARTIAL_SORT_K, support


@pytest.mark.parametrize("fn", ["sparsemax", "entmax15", "softpick", "sigmoid", "relu", "pointwise"])
def test_stats_of_padded_calls_count_only_visible_keys(fn):
    """The counts come from non-zeros per row and the visible counts: hidden keys must hold exact
    zeros and must not count as zeros; checked against the weights and the mask directly."""
    module = make(fn)
    x = torch.randn(7, 3, E)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, :2] = True  # left padding
    pad[2, 5:] = True  # right padding
    with record_attention(module) as record:
        _, w = module(x, x, x, key_padding_mask=pad, need_head_weights=True)  # w (H, B, T, S)
    keep = (~pad)[None, :, None, :].expand_as(w)
    assert torch.all(w[~keep] == 0), "hidden keys hold exact zeros"
    live = keep & (~pad)[None, :, :, None]  # padding positions are not queries either
    stats = record.totals()
    assert int(stats["visible"]) == int(live.sum())
    assert int(stats["zeros"]) == int(((w == 0) & live).sum())
    assert int(stats["rows"]) == int(live.any(-1).sum())
    assert int(stats["null_rows"]) == int((live.any(-1) & ~((w != 0) & live).any(-1)).sum())


def test_every_option_is_declared_once_on_the_config():
    """Issue 21: argparse arguments, defaults, the sublayer config and validation all come from
    the fields of AttentionConfig: a default namespace gives the default config in every sublayer,
    and every bad value names its command-line option, at parsing and in validate()."""
    import argparse
    from dataclasses import fields

    from reluformer_mt.attention.config import (OPTIONS, SUBLAYERS, add_attention_args, config_from_args,
                                                fill_attention_defaults)

    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    add_attention_args(parser)
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    assert dests == {d for spec in OPTIONS for d in spec.dests()}
    assert [spec.name for spec in OPTIONS] == [f.name for f in fields(AttentionConfig)]
    args = parser.parse_args([])
    fill_attention_defaults(args)
    for sub in SUBLAYERS:
        assert config_from_args(args, sub) == AttentionConfig()
    flipped = parser.parse_args(["--relu-no-length-scale", "--cross-attn-fn", "relu", "--attn-impl", "reference"])
    fill_attention_defaults(flipped)
    cross = config_from_args(flipped, "cross")
    assert not cross.relu_length_scale and cross.fn == "relu" and cross.impl == "reference"
    assert config_from_args(flipped, "encoder").fn == "softmax"
    with pytest.raises(AttentionOptionError, match="^--cross-attn-fn: got 'tanh'"):
        AttentionConfig(fn="tanh").validate("cross")
    with pytest.raises(AttentionOptionError, match=r"^--attn-block-size: got 0, expected an integer >= 1$"):
        AttentionConfig(block_size=0).validate()
