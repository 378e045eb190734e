"""The 2022-2025 families: sigmoid (Ramapuram et al. 2024), softpick (Zuhri et al. 2025) and
squared ReLU (FLASH, Hua et al. 2022) against independent float64 formulas, on every path,
through the model options, the criterion, the alignment extraction and fairseq-train."""
import math
import re

import pytest
import torch

from reluformer_mt.plugin import register
from reluformer_mt.attention import AttentionConfig, AttentionOptionError, ReluformerAttention
from reluformer_mt.attention.blocked import tiled_attention
from reluformer_mt.attention.functions import FUNCTIONS, Params, SIGMOID_LEARNED_BIAS_LENGTH

from helpers import route_of, run_fairseq, tiny_train_args
from test_models import build, tiny_task

register()  # models, criterion, task and the fairseq fixes: importing the package does not register

E, H = 16, 2


def visible_mask(B, T, S, causal):
    """(B, 1, T, S): left padding in batch 1, causal or not; one query row of batch 0 sees nothing."""
    keep = torch.ones(B, 1, T, S, dtype=torch.bool)
    keep[1, :, :, :2] = False
    if causal:
        keep &= torch.ones(T, S, dtype=torch.bool).tril(S - T)
    keep[0, 0, 0] = False
    return keep


# --------------------------------------------------------------------------- formulas in float64
def sigmoid_loop(s, keep, bias):
    """sigmoid(s_ij + b) with b = -log n_i ('auto'), a per-head list, or a number; masked 0."""
    out = torch.zeros(s.shape, dtype=torch.float64)
    B, Hh, T, S = s.shape
    for b in range(B):
        for h in range(Hh):
            for i in range(T):
                n = int(keep[b, 0, i].sum())
                if n == 0:
                    continue
                bias_i = -math.log(n) if bias == "auto" else (bias[h] if isinstance(bias, list) else bias)
                for j in range(S):
                    if keep[b, 0, i, j]:
                        out[b, h, i, j] = 1.0 / (1.0 + math.exp(-(float(s[b, h, i, j]) + bias_i)))
    return out


def softpick_loop(s, keep, eps=1e-6):
    """ReLU(e^s - 1) / (sum_j |e^s_j - 1| + eps) over visible keys, straight from the paper."""
    out = torch.zeros(s.shape, dtype=torch.float64)
    B, Hh, T, S = s.shape
    for b in range(B):
        for h in range(Hh):
            for i in range(T):
                cols = [j for j in range(S) if keep[b, 0, i, j]]
                den = sum(abs(math.exp(float(s[b, h, i, j])) - 1.0) for j in cols) + eps
                for j in cols:
                    out[b, h, i, j] = max(math.exp(float(s[b, h, i, j])) - 1.0, 0.0) / den
    return out


def params_for(fn, **options):
    return AttentionConfig(fn=fn, **options).validate()


@pytest.mark.parametrize("bias", ["auto", "learned", -1.5])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sigmoid_weights_match_the_formula(bias, dtype):
    torch.manual_seed(0)
    s = (torch.randn(2, H, 5, 6) * 3).to(dtype)
    keep = visible_mask(2, 5, 6, causal=True)
    config = params_for("sigmoid", sigmoid_bias=bias)
    learned = {}
    expected_bias = bias
    if bias == "learned":
        learned = {"sigmoid_bias": torch.tensor([-1.0, -3.0])}
        expected_bias = [-1.0, -3.0]
    w = FUNCTIONS["sigmoid"].weights(s, keep, keep.sum(-1, keepdim=True), Params(config, learned))
    assert w.dtype == dtype
    torch.testing.assert_close(w.double(), sigmoid_loop(s.double(), keep, expected_bias),
                               atol=1e-12 if dtype == torch.float64 else 1e-6, rtol=1e-6)
    assert torch.all(w.masked_select(~keep.expand_as(w)) == 0)


@pytest.mark.parametrize("scale", [1.0, 3.0, 40.0])
def test_softpick_weights_match_the_formula_and_stay_finite(scale):
    """Logits up to ~150 overflow e^s in float32; the max-subtracted form does not."""
    torch.manual_seed(1)
    s = torch.randn(2, H, 5, 7) * scale
    keep = visible_mask(2, 5, 7, causal=False)
    s.requires_grad_(True)
    w = FUNCTIONS["softpick"].weights(s, keep, keep.sum(-1, keepdim=True), Params(params_for("softpick"), {}))
    expected = softpick_loop(s.detach().double(), keep)
    torch.testing.assert_close(w.double(), expected, atol=1e-6, rtol=1e-5)
    assert torch.all(w[~keep.expand_as(w)] == 0)
    assert torch.all(w[0, :, 0] == 0)  # the row that sees no key
    assert bool((w.sum(-1) <= 1 + 1e-6).all())  # rows sum to at most one
    grad, = torch.autograd.grad((w * torch.randn_like(w)).sum(), s)
    assert torch.isfinite(grad).all()
    assert torch.all(grad[~keep.expand_as(grad)] == 0)


def test_softpick_all_negative_row_is_null_and_large_masked_logits_do_not_leak():
    s = torch.full((1, 1, 2, 4), -5.0)
    s[0, 0, 1] = torch.tensor([1.0, 2.0, 500.0, 500.0])  # huge masked logits
    keep = torch.tensor([True, True, False, False]).view(1, 1, 1, 4).expand(1, 1, 2, 4)
    s.requires_grad_(True)
    w = FUNCTIONS["softpick"].weights(s, keep, keep.sum(-1, keepdim=True), Params(params_for("softpick"), {}))
    assert torch.all(w[0, 0, 0] == 0)  # every e^s - 1 < 0: a null row, no attention sink
    e1, e2 = math.e - 1, math.e ** 2 - 1
    torch.testing.assert_close(w[0, 0, 1].double(), torch.tensor([e1, e2, 0, 0], dtype=torch.float64) / (e1 + e2 + 1e-6))
    grad, = torch.autograd.grad(w.sum(), s)
    assert torch.isfinite(grad).all() and torch.all(grad[0, 0, 1, 2:] == 0)


def test_sigmoid_counts_visible_keys_per_causal_position():
    """Row i of causal sigmoid attention has b = -log(i + 1), also step by step."""
    torch.manual_seed(0)
    module = ReluformerAttention(E, H, AttentionConfig(fn="sigmoid"), self_attention=True).eval()
    for p in (module.q_proj, module.k_proj):
        torch.nn.init.zeros_(p.weight)
        torch.nn.init.constant_(p.bias, 1.0)
    x = torch.randn(5, 1, E)
    mask = torch.triu(torch.full((5, 5), float("-inf")), 1)
    _, w = module(x, x, x, attn_mask=mask, need_head_weights=True)
    s = (E // H) / math.sqrt(E // H)
    for i in range(5):
        expected = torch.tensor([1 / (1 + math.exp(-(s - math.log(i + 1))))] * (i + 1) + [0.0] * (4 - i))
        torch.testing.assert_close(w[0, 0, i], expected)


# --------------------------------------------------------------------------- the tiled kernel's row bias
@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_tiled_row_bias_forward_and_gradients_equal_autograd(blocked, causal):
    """a = c_i sigmoid(s_ij + b_i) with a learned per-head bias and a row factor, float64."""
    torch.manual_seed(2)
    B, T, S, D = 2, 9, 9 if causal else 11, 4
    q, k, v = (torch.randn(B, H, n, D, dtype=torch.float64, requires_grad=True) for n in (T, S, S))
    keep = visible_mask(B, T, S, causal)
    bias = torch.tensor([-0.7, -2.0], dtype=torch.float64, requires_grad=True)
    factor = torch.rand(B, 1, T, 1, dtype=torch.float64).add(0.5).requires_grad_(True)
    out, rows, _ = tiled_attention(q, k, v, keep, activation="sigmoid", scaling=0.5, row_factor=factor,
                                   row_bias=bias.view(-1, 1, 1), route="blocked" if blocked else "dense",
                                   block_q=4, block_k=4,
                                   want_rows=True)
    a = factor * torch.sigmoid((q * 0.5) @ k.transpose(-1, -2) + bias.view(-1, 1, 1)) * keep
    ref_out = a @ v
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(rows[0], a.sum(-1), atol=1e-12, rtol=1e-10)
    g = torch.randn_like(out)
    inputs = (q, k, v, bias, factor)
    fast = torch.autograd.grad((out * g).sum() + rows[0].sum() + 0.1 * rows[1].sum(), inputs)
    xlogx = (a * torch.log(torch.where(keep, a, torch.ones_like(a)))).sum(-1)  # 0 log 0 = 0, finite gradient
    ref = torch.autograd.grad((ref_out * g).sum() + a.sum(-1).sum() + 0.1 * xlogx.sum(), inputs)
    for x, y in zip(fast, ref):
        torch.testing.assert_close(x, y, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("impl", ["dense", "blocked", "fused"])
@pytest.mark.parametrize("fn,options", [("sigmoid", {}), ("sigmoid", {"sigmoid_bias": "learned"}),
                                        ("pointwise", {"pointwise_activation": "relu2"})])
def test_module_fast_path_equals_reference_and_weights(impl, fn, options):
    """Causal + padded self-attention: outputs, returned weights and every gradient."""
    def run(path):
        torch.manual_seed(0)
        config = AttentionConfig(fn=fn, impl="reference" if path == "reference" else impl, block_size=4, **options)
        module = ReluformerAttention(E, H, config, self_attention=True).eval()
        torch.manual_seed(1)
        x = torch.randn(10, 2, E, requires_grad=True)
        kpm = torch.zeros(2, 10, dtype=torch.bool)
        kpm[1, 7:] = True
        mask = torch.triu(torch.full((10, 10), float("-inf")), 1)
        out, _ = module(x, x, x, key_padding_mask=kpm, attn_mask=mask, need_weights=False)
        _, w = module(x, x, x, key_padding_mask=kpm, attn_mask=mask, need_head_weights=True)
        grads = torch.autograd.grad(out.pow(2).sum(), [x] + [p for _, p in sorted(module.named_parameters())])
        return out, w, grads, route_of(module, 10, 10)

    ref_out, ref_w, ref_grads, _ = run("reference")
    out, w, grads, path = run("fast")
    assert path == ("blocked" if impl == "fused" else impl)  # the C++ kernel is for h = relu only
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=1e-5)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_paths_follow_the_declared_capabilities():
    def path(fn, impl="auto", src=100, **options):
        module = ReluformerAttention(E, H, AttentionConfig(fn=fn, impl=impl, blocked_min_len=64, **options),
                                     self_attention=True)
        return route_of(module, src, src)

    assert FUNCTIONS["sigmoid"].tiled and not FUNCTIONS["sigmoid"].fused_relu(AttentionConfig(fn="sigmoid"))
    assert not FUNCTIONS["softpick"].tiled and not FUNCTIONS["softpick"].normalised
    assert path("sigmoid") == "blocked" and path("sigmoid", src=20) == "dense"
    assert path("sigmoid", impl="fused") == "blocked"
    assert path("softpick", impl="blocked") == "reference"
    assert path("pointwise", impl="fused", pointwise_activation="relu2") == "blocked"


# --------------------------------------------------------------------------- module behaviour
@pytest.mark.parametrize("fn,options", [("sigmoid", {"sigmoid_bias": "learned", "output_norm": True}),
                                        ("sigmoid", {"sigmoid_bias": 0.5}), ("softpick", {}),
                                        ("pointwise", {"pointwise_activation": "relu2", "qk_layernorm": True})])
def test_incremental_and_padding_invariance(fn, options):
    torch.manual_seed(0)
    config = AttentionConfig(fn=fn, **options)
    module = ReluformerAttention(E, H, config, self_attention=True).eval()
    if module.sigmoid_bias is not None:
        module.sigmoid_bias.data = torch.tensor([-1.0, -2.5])
    x = torch.randn(6, 2, E)
    mask = torch.triu(torch.full((6, 6), float("-inf")), 1)
    full, _ = module(x, x, x, attn_mask=mask)
    state = {}
    steps = [module(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state)[0] for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 0), full, atol=1e-5, rtol=1e-5)

    padded = torch.cat([torch.randn(3, 2, E), x], 0)
    kpm = torch.zeros(2, 9, dtype=torch.bool)
    kpm[:, :3] = True
    out_padded, _ = module(padded, padded, padded, key_padding_mask=kpm)
    torch.testing.assert_close(out_padded[3:], module(x, x, x)[0], atol=1e-5, rtol=1e-5)

    cross = ReluformerAttention(E, H, config, encoder_decoder_attention=True).eval()
    enc = torch.randn(5, 2, E)
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[0, :2] = True
    full, w = cross(x, enc, enc, key_padding_mask=kpm, static_kv=True, need_head_weights=True)
    assert torch.all(w[:, 0, :, :2] == 0)
    state = {}
    steps = [cross(x[t:t + 1], enc, enc, key_padding_mask=kpm, incremental_state=state, static_kv=True)[0]
             for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 0), full, atol=1e-5, rtol=1e-5)


def test_bad_sigmoid_bias_is_a_one_line_error():
    from test_training_objective import parse_error
    from helpers import USER_DIR

    with pytest.raises(AttentionOptionError, match=r"--sigmoid-bias: got 'often', expected auto, learned or a finite number"):
        AttentionConfig(fn="sigmoid", sigmoid_bias="often").validate()
    for bad in ("often", "inf", "nan"):
        message = parse_error(["/tmp", "--user-dir", USER_DIR, "--arch", "sigmoid_tiny", "--task", "translation",
                               "--sigmoid-bias", bad])
        assert f"argument --sigmoid-bias: expected auto, learned or a finite number, got '{bad}'" in message
        assert "Traceback" not in message


# --------------------------------------------------------------------------- architectures and criterion
def test_new_architectures_and_their_parameters():
    task = tiny_task()
    relu2 = build("relu2_tiny", task).encoder.layers[0].self_attn
    assert (relu2.fn, relu2.config.pointwise_activation, relu2.config.pointwise_alpha) == ("pointwise", "relu2", 1.0)
    assert relu2.q_norm is not None and relu2.output_norm is None
    sigmoid = build("sigmoid_tiny", task)
    for _, m in sigmoid.attention_modules():
        assert m.fn == "sigmoid" and m.config.sigmoid_bias == "auto" and m.output_norm is not None
        assert m.sigmoid_bias is None and m.q_norm is None
    learned = build("sigmoid_tiny", task, sigmoid_bias="learned")
    biases = [n for n, _ in learned.named_parameters() if n.endswith("sigmoid_bias")]
    assert len(biases) == 6  # 2 encoder self, 2 decoder self, 2 cross
    torch.testing.assert_close(learned.encoder.layers[0].self_attn.sigmoid_bias.detach(),
                               torch.full((4,), -math.log(SIGMOID_LEARNED_BIAS_LENGTH)))
    assert {m.fn for _, m in build("softpick_tiny", task).attention_modules()} == {"softpick"}
    # every parameter gets a gradient (DDP without find_unused_parameters)
    src = torch.tensor([[4, 5, 6, 2]])
    out, _ = learned(src, torch.tensor([4]), torch.tensor([[2, 7, 8]]))
    out.sum().backward()
    assert [n for n, p in learned.named_parameters() if p.grad is None] == []


def test_demo_accepts_the_new_families():
    from reluformer_mt.models import FAMILIES

    assert {"sigmoid", "softpick", "relu2"} <= set(FAMILIES)


# --------------------------------------------------------------------------- fairseq-train, stats, alignment
@pytest.mark.parametrize("family", ["sigmoid", "softpick", "relu2"])
def test_family_trains_logs_statistics_and_aligns(family, sentence_data, tmp_path, caplog):
    from reluformer_mt.evaluation import align, extract

    save = tmp_path / "ckpt"
    caplog.set_level("INFO")
    run_fairseq("train", tiny_train_args(sentence_data["bin"], save, f"{family}_tiny", max_update=30,
                                         extra=["--log-format", "json", "--log-interval", "5", "--disable-validation"]))
    losses = [float(m) for m in re.findall(r'"loss": "([0-9.]+)"', caplog.text)]
    sparsity = [float(m) for m in re.findall(r'"attn_sparsity": "([0-9.]+)"', caplog.text)]
    null = [float(m) for m in re.findall(r'"attn_null": "([0-9.]+)"', caplog.text)]
    print(f"{family}: loss {losses} sparsity {sparsity[-1]} null {null[-1]}")
    assert len(losses) >= 3 and all(l == l for l in losses), caplog.text[-2000:]
    assert losses[-1] < losses[0] - 0.5, losses
    assert sparsity and null and len(sparsity) == len(losses)
    if family == "sigmoid":
        assert sparsity[-1] == 0.0 and null[-1] == 0.0  # sigmoid weights are never exactly 0
    else:
        assert sparsity[-1] > 0.0

    loaded = extract.load_checkpoint(save / "checkpoint_last.pt")
    src, tgt = ((sentence_data["raw"] / f"valid.{lang}").read_text(encoding="utf-8").splitlines()[:6] for lang in ("en", "de"))
    pairs = extract.encode_pairs(loaded, [line.split() for line in src], [line.split() for line in tgt])
    attention = extract.attention_of_pairs(loaded, pairs, ("cross", "decoder_self"))
    for pair, attn in zip(pairs, attention):
        cross = attn["cross"]  # (layers, heads, target tokens, source tokens)
        assert cross.shape[:2] == (1, 2) and torch.isfinite(cross).all() and bool((cross >= 0).all())
        assert torch.all(torch.triu(attn["decoder_self"], 1) == 0)
    links = align.induce_links(loaded, pairs)
    assert any(links.get("normal", 0, None)), "no alignment links"
