"""The fast dense and memory-bounded blocked paths equal the reference path (forward and gradients)."""
import pytest
import torch

from reluformer_mt.attention import AttentionConfig, ReluformerAttention, record_attention
from reluformer_mt.attention.blocked import tiled_attention
from helpers import route_of

E, H = 16, 2
T, S = 23, 19  # not multiples of the block size, on purpose
BLOCK = 8

CASES = [
    ("relu", {}),
    ("relu", {"relu_gamma": 1.7}),
    ("relu", {"relu_gamma_mode": "layer", "relu_gamma": 0.8}),
    ("relu", {"relu_gamma_mode": "head", "relu_gamma": 1.3}),
    ("relu", {"relu_scale_logits": False}),
    ("rela", {}),
    ("pointwise", {}),
    ("pointwise", {"pointwise_alpha": 0.5}),
    ("pointwise", {"pointwise_activation": "gelu"}),
    ("pointwise", {"pointwise_activation": "softplus"}),
    ("pointwise", {"pointwise_activation": "relu2"}),
    ("sigmoid", {}),
    ("sigmoid", {"sigmoid_bias": "learned"}),
    ("sigmoid", {"sigmoid_bias": 0.5, "output_norm": True}),
]


def make_module(fn, options, impl, self_attention=False, seed=0):
    torch.manual_seed(seed)
    config = AttentionConfig(fn=fn, impl=impl, block_size=BLOCK, blocked_min_len=10_000, **options)
    module = ReluformerAttention(E, H, config, self_attention=self_attention,
                                 encoder_decoder_attention=not self_attention)
    if module.log_gamma is not None:  # make the per-head values differ
        with torch.no_grad():
            module.log_gamma.add_(torch.linspace(0.8, 1.2, module.log_gamma.numel()).log().view_as(module.log_gamma))
    if module.sigmoid_bias is not None:
        with torch.no_grad():
            module.sigmoid_bias.copy_(torch.linspace(-3.0, -1.0, H))
    return module


def run(module, causal, padding, regularise=False, seed=1):
    """Forward + backward of a loss touching every output; returns outputs, grads, stats."""
    torch.manual_seed(seed)
    tgt, src = (T, T) if causal else (T, S)
    query = torch.randn(tgt, 3, E, requires_grad=True)
    key = query if causal else torch.randn(src, 3, E, requires_grad=True)
    mask = torch.triu(torch.full((tgt, src), float("-inf")), 1) if causal else None
    kpm = None
    if padding:
        kpm = torch.zeros(3, src, dtype=torch.bool)
        kpm[1, -5:] = True
        kpm[2, 3:] = True
    with record_attention(module, regularise=regularise, statistics=regularise) as record:
        out, _ = module(query, key, key, key_padding_mask=kpm, attn_mask=mask, need_weights=False)
    loss = (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum()
    stats = record.totals()
    if regularise:
        loss = loss + stats["norm_loss"] + stats["entropy_margin"]
    inputs = [query] if causal else [query, key]
    params = [p for _, p in sorted(module.named_parameters())]
    grads = torch.autograd.grad(loss, inputs + params)
    return out.detach(), grads, stats


def assert_same(a, b):
    out_a, grads_a, stats_a = a
    out_b, grads_b, stats_b = b
    torch.testing.assert_close(out_a, out_b, atol=1e-5, rtol=1e-5)
    for ga, gb in zip(grads_a, grads_b):
        torch.testing.assert_close(ga, gb, atol=1e-5, rtol=1e-5)
    assert stats_a.keys() == stats_b.keys()
    for key in stats_a:
        torch.testing.assert_close(torch.as_tensor(stats_a[key]).double(), torch.as_tensor(stats_b[key]).double(),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fn,options,causal,padding",
                         [(fn, opts, causal, True) for fn, opts in CASES for causal in (False, True)]
                         + [("relu", {}, False, False), ("rela", {}, True, False)])
def test_fast_paths_match_reference(fn, options, causal, padding):
    reference = run(make_module(fn, options, "reference", causal), causal, padding)
    blocked = run(make_module(fn, options, "blocked", causal), causal, padding)
    assert_same(blocked, reference)
    dense = run(make_module(fn, options, "dense", causal), causal, padding)
    assert_same(dense, reference)


@pytest.mark.parametrize("impl", ["dense", "blocked"])
@pytest.mark.parametrize("fn,options", [("relu", {"relu_gamma_mode": "head"}), ("pointwise", {"pointwise_activation": "softplus"}),
                                        ("sigmoid", {"sigmoid_bias": "learned"})])
def test_stats_and_regularisers_match_reference(impl, fn, options):
    """Zeros, null rows and ReLUFormer's two losses (values and gradients) from per-block row sums."""
    reference = run(make_module(fn, options, "reference", True), True, True, regularise=True)
    fast = run(make_module(fn, options, impl, True), True, True, regularise=True)
    assert set(fast[2]) == {"zeros", "visible", "null_rows", "rows", "norm_loss", "entropy_margin", "reg_rows"}
    assert_same(fast, reference)


def test_null_rows_counted_and_not_nan():
    """All-negative logits: every row is null; the blocked output is exactly 0 and finite."""
    q = -torch.rand(1, 2, 12, 4) - 0.1
    k = torch.rand(1, 2, 12, 4) + 0.1
    v = torch.randn(1, 2, 12, 4)
    keep = torch.ones(1, 1, 12, 12, dtype=torch.bool)
    out, rows, _ = tiled_attention(q, k, v, keep, activation="relu", scaling=0.5, row_factor=torch.full((1, 1, 12, 1), 0.4),
                                   route="blocked", block_q=5, block_k=5, want_rows=True)
    assert torch.equal(out, torch.zeros_like(out))
    mass, xlogx, nonzero, n = rows
    assert int(nonzero.sum()) == 0 and bool((mass == 0).all()) and bool((n == 12).all())


def test_blocked_backward_keeps_no_full_size_tensor():
    """Memory bound: nothing of size T x S is saved for backward by the blocked path."""
    L = 256
    q, k, v = (torch.randn(1, 2, L, 8, requires_grad=True) for _ in range(3))
    keep = torch.ones(1, 1, L, L, dtype=torch.bool).tril()
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    for blocked in (False, True):
        sizes.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out, _, _ = tiled_attention(q, k, v, keep, activation="relu", scaling=0.35,
                                        route="blocked" if blocked else "dense",
                                        block_q=32, block_k=32)
        out.sum().backward()
        if blocked:
            assert max(sizes) < L * L, sizes
        else:
            assert max(sizes) >= 2 * L * L, sizes  # the dense path keeps the weights


def test_auto_threshold_and_option_override():
    def path(impl, tgt, src, want_weights=False, min_len=64, training=False, dropout=0.0, fn="relu"):
        config = AttentionConfig(fn=fn, impl=impl, blocked_min_len=min_len)
        module = ReluformerAttention(E, H, config, self_attention=True, dropout=dropout)
        module.train(training)
        return route_of(module, tgt, src, want_weights)

    assert path("auto", 63, 63) == "direct"          # one tile of plain tensor ops
    assert path("auto", 64, 64) == "blocked"
    assert path("auto", 8, 64) == "blocked"          # cross-attention to a long source
    assert path("auto", 1, 5000) == "direct"         # one incremental decoding step
    assert path("auto", 100, 100, want_weights=True) == "direct"
    assert path("auto", 600, 600, want_weights=True, min_len=10_000) == "dense"  # more than one tile
    assert path("dense", 5000, 5000) == "dense"
    assert path("reference", 5000, 5000) == "reference"
    assert path("blocked", 3, 3) == "blocked"
    assert path("blocked", 100, 100, training=True, dropout=0.1) == "reference"
    assert path("blocked", 100, 100, training=False, dropout=0.1) == "blocked"
    assert path("auto", 5000, 5000, fn="softmax") == "fairseq"  # fairseq's own forward, heads averaged
    gelu = ReluformerAttention(E, H, AttentionConfig(fn="pointwise", pointwise_activation="gelu", impl="blocked"),
                               self_attention=True)
    assert route_of(gelu, 9, 9) == "blocked"
    with record_attention(gelu, regularise=True):  # negative weights: the row entropy is the reference's definition
        assert route_of(gelu, 9, 9) == "reference"
    assert route_of(gelu, 9, 9) == "blocked"
    assert path("auto", 5000, 5000, fn="entmax15") == "sparse"  # the reference with the C++ weights kernel
    assert path("auto", 5000, 5000, fn="softpick") == "reference"
    assert path("auto", 63, 63, fn="sigmoid") == "dense"  # gradients: the tiled kernel
    sigmoid = ReluformerAttention(E, H, AttentionConfig(fn="sigmoid", blocked_min_len=64), self_attention=True)
    assert route_of(sigmoid, 1, 63, q=torch.zeros(1, H, 1, E // H)) == "direct"  # a decoding step
    assert path("auto", 64, 64, fn="sigmoid") == "blocked"


def test_model_option_reaches_attention(tmp_path):
    """--attn-impl / --attn-blocked-min-len / --attn-block-size reach every attention module."""
    from argparse import Namespace

    from reluformer_mt.attention.config import config_from_args as attention_config, fill_attention_defaults

    args = Namespace(encoder_attn_fn="relu", decoder_attn_fn="rela", cross_attn_fn="pointwise",
                     attn_impl="blocked", attn_blocked_min_len=100, attn_block_size=64)
    fill_attention_defaults(args)
    for sub in ("encoder", "decoder", "cross"):
        config = attention_config(args, sub)
        assert (config.impl, config.blocked_min_len, config.block_size) == ("blocked", 100, 64)


def test_mixed_tiles_are_built_on_the_queries_device():
    """A causal pattern without padding has no range tensor to take a device from: the blocked and
    dense routes failed on CUDA with 'cuda:0 and cpu' (the first GPU check). The tile masks must
    follow the device they are asked for."""
    from reluformer_mt.attention.blocked import _tile_plan
    from reluformer_mt.attention.visibility import Visibility
    causal = Visibility.from_padding(40, 40, None, causal=True)
    plan = _tile_plan(40, 40, 16, 16, causal, torch.device("meta"))
    mixed = [tile for *_, tile in plan if tile is not None]
    assert mixed and all(tile.device.type == "meta" for tile in mixed)
