"""What training optimises: padding rows stay out of ReLUFormer's regularisers and the attention
statistics, mixed precision stays finite, gamma stays positive, the logged loss is the optimised
one, bad criterion/model values stop at option parsing, and shared-encoder beam search works."""
import argparse
import contextlib
import io
import math

import pytest
import torch
from fairseq import options, tasks
from fairseq.data import Dictionary, LanguagePairDataset

from reluformer_mt.plugin import register
from reluformer_mt.attention import AttentionConfig, ReluformerAttention, record_attention
from reluformer_mt.attention.functions import relu_gamma, rela_gate_init_range
from reluformer_mt.criteria.reluformer_criterion import ReluformerCriterion

from helpers import USER_DIR
from test_models import build, tiny_task

register()  # models, criterion, task and the fairseq fixes: importing the package does not register

E, H = 16, 2
PATHS = ["reference", "dense", "blocked", "fused"]


def attention(fn="relu", path="dense", seed=0, **options):
    torch.manual_seed(seed)
    config = AttentionConfig(fn=fn, impl=path, block_size=8, blocked_min_len=10_000, **options)
    return ReluformerAttention(E, H, config, self_attention=True)


def recorded(module, *args, **kwargs):
    """The module's output and what it recorded, regularisers included."""
    with record_attention(module, regularise=True) as record:
        out, _ = module(*args, need_weights=False, **kwargs)
    return out, record.totals()


def stats_of(module, x, kpm, causal):
    T = x.size(0)
    mask = torch.triu(torch.full((T, T), float("-inf")), 1) if causal else None
    return {k: float(v) for k, v in recorded(module, x, x, x, key_padding_mask=kpm, attn_mask=mask)[1].items()}


# --------------------------------------------------------------------------- padded query rows
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("causal", [False, True])
def test_padding_rows_do_not_enter_statistics_or_regularisers(path, causal):
    """A padded batch records exactly the sum of its sentences recorded alone."""
    module = attention(path=path)
    lengths = [11, 6, 9]
    T = max(lengths)
    torch.manual_seed(3)
    x = torch.randn(T, len(lengths), E)
    # decoder targets are right-padded, sources left-padded (fairseq's defaults)
    real = [slice(0, n) if causal else slice(T - n, T) for n in lengths]
    kpm = torch.ones(len(lengths), T, dtype=torch.bool)
    for b, rows in enumerate(real):
        kpm[b, rows] = False
    batch = stats_of(module, x, kpm, causal)
    alone = {}
    for b, rows in enumerate(real):
        for k, v in stats_of(module, x[rows, b:b + 1], None, causal).items():
            alone[k] = alone.get(k, 0.0) + v
    assert batch.keys() == alone.keys()
    for key in batch:
        assert batch[key] == pytest.approx(alone[key], rel=1e-5, abs=1e-4), key


def real_batches(sentence_data, n=12):
    task = tiny_task_from(sentence_data)
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    indices = list(range(n))
    return task, dataset, dataset.collater([dataset[i] for i in indices]), [dataset.collater([dataset[i]]) for i in indices]


def tiny_task_from(sentence_data):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(sentence_data["bin"]), "--user-dir", USER_DIR,
                                                "--task", "translation", "-s", "en", "-t", "de",
                                                "--arch", "reluformer_tiny"])
    return tasks.setup_task(args)


@pytest.mark.parametrize("arch", ["reluformer_tiny", "rela_tiny", "softmax_tiny", "sigmoid_tiny", "softpick_tiny",
                                  "relu2_tiny"])
def test_criterion_on_a_real_padded_batch_equals_the_sum_of_its_sentences(sentence_data, arch):
    """Encoder self-, decoder self- and cross-attention: the statistics and regularisers of a
    padded IWSLT batch are those of its sentences alone (the cross-attention is told which
    decoder positions are padding by the decoder layer)."""
    task, _, batch, singles = real_batches(sentence_data)
    assert (batch["net_input"]["src_tokens"] == task.source_dictionary.pad()).any()
    assert (batch["target"] == task.target_dictionary.pad()).any()
    model = build(arch, task).eval()
    criterion = ReluformerCriterion(task, False, 0.1)
    with torch.no_grad():
        _, _, log = criterion(model, batch)
        alone = {}
        for single in singles:
            for k, v in criterion(model, single)[2].items():
                if k.startswith("attn_"):
                    alone[k] = alone.get(k, 0.0) + float(v)
    for key in ("attn_rows", "attn_null_rows", "attn_zeros", "attn_visible", "attn_norm_loss", "attn_entropy_margin"):
        assert float(log[key]) == pytest.approx(alone[key], rel=1e-4, abs=1e-3), key
    if arch == "reluformer_tiny":
        assert log["attn_reg_rows"] > 0


# --------------------------------------------------------------------------- mixed precision
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_regularisers_are_finite_and_accurate_in_half_precision(path, dtype):
    """CPU autocast: ``0 log 0`` must not become NaN, and row sums accumulate in float32."""
    def run(autocast_dtype):
        module = attention(path=path, seed=1)
        torch.manual_seed(2)
        x = torch.randn(40, 3, E, requires_grad=True)
        kpm = torch.zeros(3, 40, dtype=torch.bool)
        kpm[1, -7:] = True
        mask = torch.triu(torch.full((40, 40), float("-inf")), 1)
        context = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
        with context:
            out, stats = recorded(module, x, x, x, key_padding_mask=kpm, attn_mask=mask)
            loss = out.float().sum() + stats["norm_loss"] + stats["entropy_margin"]
        grad, = torch.autograd.grad(loss, [x])
        return stats, grad

    full, _ = run(None)
    half, grad = run(dtype)
    assert torch.isfinite(grad).all()
    for key in ("norm_loss", "entropy_margin"):
        assert torch.isfinite(half[key])
        # the logits themselves are rounded to 8 (bf16) or 11 (fp16) bits; the sums are not
        assert float(half[key]) == pytest.approx(float(full[key]), rel=0.05), key
    assert half["norm_loss"].dtype == torch.float32


@pytest.mark.parametrize("blocked", [False, True])
def test_row_sums_of_bf16_weights_accumulate_in_float32(blocked):
    """Over 2048 keys a bf16 running sum keeps ~2 digits; the rows must be summed in float32."""
    from reluformer_mt.attention.blocked import tiled_attention

    torch.manual_seed(0)
    q = torch.randn(1, 2, 8, 16).bfloat16()
    k, v = torch.randn(1, 2, 2048, 16).bfloat16(), torch.randn(1, 2, 2048, 16).bfloat16()
    keep = torch.ones(1, 1, 8, 2048, dtype=torch.bool)
    _, (mass, xlogx, _, _), _ = tiled_attention(q, k, v, keep, activation="relu", scaling=0.25,
                                                route="blocked" if blocked else "dense",
                                                block_q=8, block_k=256, want_rows=True)
    a = torch.relu(torch.matmul(q * 0.25, k.transpose(-1, -2))).double()  # the same bf16 weights
    assert mass.dtype == torch.float32
    torch.testing.assert_close(mass.double(), a.sum(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xlogx.double(), torch.special.xlogy(a, a).sum(-1), rtol=1e-4, atol=1e-4)


def test_criterion_on_a_real_batch_under_fp16_and_bf16_autocast(sentence_data):
    task, _, batch, _ = real_batches(sentence_data)
    model = build("reluformer_tiny", task).train()
    criterion = ReluformerCriterion(task, False, 0.1)
    results = {}
    for dtype in (None, torch.float16, torch.bfloat16):
        model.zero_grad()
        context = torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()
        torch.manual_seed(0)  # same dropout masks
        with context:
            loss, _, log = criterion(model, batch)
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert all(torch.isfinite(g).all() for g in grads), dtype
        results[dtype] = log
    for dtype in (torch.float16, torch.bfloat16):
        for key in ("attn_norm_loss", "attn_entropy_margin"):
            assert math.isfinite(results[dtype][key])
            assert results[dtype][key] == pytest.approx(results[None][key], rel=0.05), (dtype, key)


def test_float64_inputs_get_float64_row_factor_and_sums():
    module = attention(path="blocked").double()
    x = torch.randn(30, 2, E, dtype=torch.float64)
    _, stats = recorded(module, x, x, x)
    assert stats["norm_loss"].dtype == torch.float64
    _, reference = recorded(attention(path="reference").double(), x, x, x)
    torch.testing.assert_close(stats["entropy_margin"], reference["entropy_margin"], rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- gamma, ReLA gate
@pytest.mark.parametrize("mode", ["layer", "head"])
def test_learned_gamma_stays_positive_and_fast_paths_follow_the_formula(mode):
    """Whatever the optimiser does to the parameter, gamma = exp(log_gamma) > 0, so folding the
    row factor into the queries stays valid and every path computes the same thing."""
    outs = []
    for path in PATHS:
        module = attention(path=path, relu_gamma_mode=mode, relu_gamma=0.5).eval()
        with torch.no_grad():
            module.log_gamma.fill_(-3.0)  # a large negative step on the parameter
        assert bool((relu_gamma(module._params(), torch.float32) > 0).all())
        torch.manual_seed(4)
        x = torch.randn(9, 2, E)
        outs.append(recorded(module, x, x, x)[0])
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=1e-5, rtol=1e-5)


def test_gamma_exists_only_where_the_function_uses_it():
    task = tiny_task()
    for arch, expected in (("rela_tiny", 0), ("softmax_tiny", 0), ("reluformer_tiny", 6)):
        model = build(arch, task, relu_gamma_mode="layer")
        assert sum("log_gamma" in name for name, _ in model.named_parameters()) == expected, arch
    # every parameter of a ReLA model gets a gradient (DDP without find_unused_parameters)
    model = build("rela_tiny", task, relu_gamma_mode="head")
    src = torch.tensor([[4, 5, 6, 2]])
    out, _ = model(src, torch.tensor([4]), torch.tensor([[2, 7, 8]]))
    out.sum().backward()
    unused = [n for n, p in model.named_parameters() if p.grad is None]
    assert unused == []


def test_checkpoint_with_old_gamma_parameter_is_upgraded():
    module = attention(relu_gamma_mode="head", relu_gamma=1.0)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    state["gamma"] = torch.tensor([0.5, 2.0])
    del state["log_gamma"]
    module.upgrade_state_dict_named(state, "")
    module.load_state_dict(state)
    torch.testing.assert_close(relu_gamma(module._params(), torch.float32).flatten(), torch.tensor([0.5, 2.0]))
    state["gamma"] = torch.tensor([-0.5, 2.0])
    with pytest.raises(ValueError, match="must be > 0"):
        module.upgrade_state_dict_named(state, "")


@pytest.mark.parametrize("dim", [64, 512])
def test_rela_gate_initialisation_scales_with_width(dim):
    torch.manual_seed(0)
    module = ReluformerAttention(dim, 4, AttentionConfig(fn="rela"), self_attention=True)
    bound = math.sqrt(3.0 / dim)
    assert rela_gate_init_range(dim) == pytest.approx(bound)
    gate = module.rela_gate.detach()
    assert gate.abs().max() <= bound
    assert gate.abs().max() > 0.9 * bound  # uses the whole range


def test_length_factor_ablation():
    """--relu-no-length-scale: weights ReLU(s)/gamma, on every path."""
    outs = []
    for path in PATHS:
        module = attention(path=path, relu_length_scale=False, relu_gamma=2.0).eval()
        torch.manual_seed(5)
        x = torch.randn(12, 2, E)
        out, _ = module(x, x, x, need_weights=False)
        outs.append(out)
    with torch.no_grad():
        module = attention(path="reference", relu_length_scale=False, relu_gamma=2.0).eval()
        q = module._split_heads(module.q_proj(x), 2) * module.scaling
        k = module._split_heads(module.k_proj(x), 2)
        v = module._split_heads(module.v_proj(x), 2)
        expected = torch.relu(q @ k.transpose(-1, -2)) / 2.0 @ v
        expected = module.out_proj(expected.permute(2, 0, 1, 3).reshape(12, 2, E))
    for out in outs:
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- logged loss
def test_logged_loss_is_the_optimised_loss(sentence_data):
    task, _, batch, _ = real_batches(sentence_data)
    model = build("reluformer_tiny", task).eval()
    with torch.no_grad():
        loss, sample_size, log = ReluformerCriterion(task, False, 0.1)(model, batch)
        plain, _, plain_log = ReluformerCriterion(task, False, 0.1, norm_loss_weight=0, entropy_margin_weight=0)(model, batch)
    assert float(log["loss"]) == pytest.approx(float(loss))
    assert float(log["loss"]) == pytest.approx(float(plain_log["loss"]) + log["attn_reg_loss"], rel=1e-5)
    assert log["attn_reg_loss"] > 0 and plain_log["attn_reg_loss"] == 0
    assert float(log["nll_loss"]) == pytest.approx(float(plain_log["nll_loss"]))


# --------------------------------------------------------------------------- option parsing
def parse_error(argv):
    parser = options.get_training_parser()
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exit_info:
        options.parse_args_and_arch(parser, argv)
    assert exit_info.value.code == 2
    return stderr.getvalue()


@pytest.mark.parametrize("flags,expected", [
    (["--relu-gamma", "inf"], "argument --relu-gamma: expected a finite number > 0, got 'inf'"),
    (["--relu-gamma", "nan"], "argument --relu-gamma: expected a finite number > 0, got 'nan'"),
    (["--rela-gain-init", "nan"], "argument --rela-gain-init: expected a finite number, got 'nan'"),
    (["--attn-block-size", "0"], "argument --attn-block-size: expected an integer >= 1, got '0'"),
    (["--attn-blocked-min-len", "-5"], "argument --attn-blocked-min-len: expected an integer >= 1, got '-5'"),
    (["--norm-loss-weight", "-1"], "argument --norm-loss-weight: got '-1', expected a finite number >= 0"),
    (["--entropy-margin-weight", "inf"], "argument --entropy-margin-weight: got 'inf', expected a finite number >= 0"),
    (["--entropy-margin-ratio", "-0.5"], "argument --entropy-margin-ratio: got '-0.5', expected a finite number >= 0"),
    (["--regularise-fns", "relu,bogus"], "argument --regularise-fns: unknown bogus; expected comma-separated names"),
])
def test_bad_values_stop_at_option_parsing(tmp_path, flags, expected):
    message = parse_error([str(tmp_path), "--user-dir", USER_DIR, "--arch", "reluformer_tiny", "--task", "translation",
                           "--criterion", "reluformer_cross_entropy", *flags])
    assert expected in message, message
    assert "Traceback" not in message


# --------------------------------------------------------------------------- beam search
@pytest.mark.parametrize("arch", ["softmax_tiny", "reluformer_tiny", "rela_tiny", "sigmoid_tiny", "softpick_tiny"])
def test_shared_encoder_beam_search_gives_the_same_beams(arch):
    """Beam search keeps one copy of the encoder keys per sentence (the decoder sets fairseq's
    set_beam_size at the first step); the beams must be those of ordinary beam search (fairseq's
    own transformer is the model of this), and a full forward afterwards is not shared."""
    from fairseq.sequence_generator import SequenceGenerator

    task = tiny_task()
    torch.manual_seed(0)
    model = build(arch, task).eval()
    src = torch.tensor([[4, 5, 6, 7, 2], [1, 1, 8, 9, 2]])
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([5, 3])}}
    tokens = torch.tensor([[2, 4, 5, 6], [2, 8, 9, 4], [2, 5, 5, 7], [2, 9, 4, 8]])
    with torch.no_grad():  # four rows: a beam of 4 left set would take them for one sentence's beams
        before = model(src.repeat(2, 1), torch.tensor([5, 3, 5, 3]), tokens)[0]
    cached_rows = []
    decode = model.decoder.forward

    def recording(*args, incremental_state=None, **kwargs):
        out = decode(*args, incremental_state=incremental_state, **kwargs)
        # the smallest attention cache is the cross-attention's: self-attention holds a row per beam
        cached_rows.append(min(v["prev_key"].size(0) for v in incremental_state.values() if v.get("prev_key") is not None))
        return out
    model.decoder.forward = recording

    def beams(shared):
        model.decoder.share_keys_across_beams = shared
        cached_rows.clear()
        generator = SequenceGenerator([model], task.target_dictionary, beam_size=4, max_len_b=8)
        with torch.no_grad():
            hypos = generator.generate([model], sample)
        # the encoder-decoder caches hold one row per sentence when shared, one per beam when not
        assert cached_rows[0] == (2 if shared else 8), cached_rows
        return [[(h["tokens"].tolist(), round(float(h["score"]), 4)) for h in sent] for sent in hypos]

    assert beams(shared=True) == beams(shared=False)
    beams(shared=True)
    # a teacher-forced forward after beam search: no module still slices its keys by the beam
    del model.decoder.forward
    with torch.no_grad():
        after = model(src.repeat(2, 1), torch.tensor([5, 3, 5, 3]), tokens)[0]
    assert torch.equal(before, after)
    assert all(module.beam_size == 1 for module in model.modules() if hasattr(module, "beam_size"))
