"""The C++ memory-attention step (reluformer_mt/memory/csrc/memory_step.cpp) equals the PyTorch
reader step and copy step it replaces, up to float rounding, at the demo's sizes (C 64, 4 heads,
146 memory slots, 4 beams) and at the edges: padding, a sentence whose memory is all padding, a
row that reads nothing copyable; with its keys and values kept in float16 it equals the reference
over keys and values rounded to float16; and the retrieval's dense scores equal scipy's."""
import types

import pytest
import torch

from reluformer_mt.attention import AttentionConfig
from reluformer_mt.memory import fused, tm_attention
from reluformer_mt.memory.tm_attention import MemoryReader, copy_probabilities, sentence_copy_table

from helpers import DOCMT, needs_shared_data

pytestmark = pytest.mark.skipif(fused.KERNEL.load() is None, reason="C++ kernel not buildable here")

C, HEADS, SLOTS, BEAMS, SENTENCES = 64, 4, 146, 4, 5


@pytest.fixture
def counted_kernel(monkeypatch):
    """Counts the kernel's calls; ``counts['off'] = True`` runs the PyTorch reference instead."""
    counts = {"read_step": 0, "copy_step": 0, "off": False}
    for name in ("read_step", "copy_step"):
        def counting(*args, _name=name, _function=getattr(fused, name)):
            counts[_name] += 1
            return _function(*args)
        monkeypatch.setattr(fused, name, counting)
    available = fused.available
    monkeypatch.setattr(fused, "available", lambda *tensors: not counts["off"] and available(*tensors))
    return counts


def padded_memory(generator):
    """(slots, sentences x beams, C) memory states and their padding: sentence 1 all padding (no
    match), the others cut at different lengths, beams repeated as fairseq orders them."""
    memory = torch.randn(SLOTS, SENTENCES, C, generator=generator)
    lengths = torch.tensor([SLOTS, 0, 90, 17, 1])
    padding = torch.arange(SLOTS)[None, :] >= lengths[:, None]
    return memory.repeat_interleave(BEAMS, 1), padding.repeat_interleave(BEAMS, 0)


def reader(generator, keep_weights: bool, cache=torch.float32):
    dims = types.SimpleNamespace(embed_dim=C)
    cfg = types.SimpleNamespace(decoder=dims, encoder=dims, attention_dropout=0.0, dropout=0.0)
    module = MemoryReader(cfg, AttentionConfig(fn="softmax"), HEADS, step_cache_dtype=cache).eval()
    with torch.no_grad():  # parameters away from their initial zeros and ones
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    module.keep_weights = keep_weights
    module.attn.set_beam_size(BEAMS)
    return module


def decode(module, x, memory, padding, round_cache=None):
    """The first step (fairseq's forward, caches the keys) and the cached steps after it;
    ``round_cache``: the cached keys and values rounded to that dtype (and back) after the first."""
    state, outputs, weights = {}, [], []
    with torch.no_grad():
        outputs.append(module(x[:1], memory, padding, incremental_state=state))
        if round_cache is not None:
            saved = module.attn._get_input_buffer(state)
            for name in ("prev_key", "prev_value"):
                saved[name] = saved[name].to(round_cache).float()
            module.attn._set_input_buffer(state, saved)
        for t in range(1, x.size(0)):
            outputs.append(module(x[t:t + 1], None, None, incremental_state=state))
            weights.append(module.weights)
    return torch.cat(outputs), weights


@pytest.mark.parametrize("keep_weights", [True, False])
def test_kernel_reader_step_equals_the_reference(keep_weights, counted_kernel):
    g = torch.Generator().manual_seed(0)
    module = reader(g, keep_weights)
    memory, padding = padded_memory(g)
    x = torch.randn(4, SENTENCES * BEAMS, C, generator=g) * 2
    out, weights = decode(module, x, memory, padding)
    assert counted_kernel["read_step"] == 3
    counted_kernel["off"] = True
    expected, expected_weights = decode(module, x, memory, padding)
    assert counted_kernel["read_step"] == 3  # the reference ran
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert out.isfinite().all()
    for w, e in zip(weights, expected_weights):
        if not keep_weights:
            assert w is None and e is None
            continue
        torch.testing.assert_close(w, e, rtol=1e-5, atol=1e-6)
        assert w[BEAMS:2 * BEAMS].abs().sum() == 0  # the sentence without matches reads nothing
        torch.testing.assert_close(w[:BEAMS].sum(-1), torch.ones(BEAMS, 1))


@pytest.mark.parametrize("keep_weights", [True, False])
def test_kernel_reader_step_over_a_float16_cache(keep_weights, counted_kernel):
    """--memory-cache float16 (the default): the kernel reads keys and values rounded to float16 and
    computes in float32, so it equals the reference over the same rounded keys and values, and
    differs from the float32 cache by that rounding only."""
    g = torch.Generator().manual_seed(5)
    module = reader(g, keep_weights, cache=torch.float16)
    memory, padding = padded_memory(g)
    x = torch.randn(4, SENTENCES * BEAMS, C, generator=g) * 2
    out, weights = decode(module, x, memory, padding)
    assert counted_kernel["read_step"] == 3
    assert module._laid_out[1][0].dtype == module._laid_out[1][1].dtype == torch.float16
    counted_kernel["off"] = True
    expected, expected_weights = decode(module, x, memory, padding, round_cache=torch.float16)
    exact, _ = decode(module, x, memory, padding)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for w, e in zip(weights, expected_weights):
        assert (w is None) == (e is None) == (not keep_weights)
        if keep_weights:
            torch.testing.assert_close(w, e, rtol=1e-5, atol=1e-6)
    difference = (out - exact).abs().max().item()
    assert 0 < difference < 1e-3 * exact.abs().max().item()  # the rounding shows, and is small


def test_kernel_reader_step_without_padding(counted_kernel):
    """Memories that fill every slot (no padding bias cached)."""
    g = torch.Generator().manual_seed(1)
    module = reader(g, True)
    memory = torch.randn(SLOTS, SENTENCES * BEAMS, C, generator=g)
    padding = torch.zeros(SENTENCES * BEAMS, SLOTS, dtype=torch.bool)
    x = torch.randn(3, SENTENCES * BEAMS, C, generator=g)
    out, weights = decode(module, x, memory, padding)
    counted_kernel["off"] = True
    expected, expected_weights = decode(module, x, memory, padding)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for w, e in zip(weights, expected_weights):
        torch.testing.assert_close(w, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_kernel_copy_step_equals_the_reference(scale, counted_kernel):
    """Tokens held by several slots, padding, entry markers, a row reading nothing, a row reading
    only an entry marker, a sentence whose memory is all padding; gate logits far from 0 (scale 30)."""
    g = torch.Generator().manual_seed(2)
    vocab, pad, bos = 300, 1, 0
    tokens = torch.randint(2, 40, (SENTENCES, SLOTS), generator=g)  # many repeated tokens
    tokens[:, 0] = bos
    tokens[0, 100:] = pad
    tokens[1] = pad
    columns, column_tokens = sentence_copy_table(tokens, (pad, bos))
    rows = SENTENCES * BEAMS
    weights = torch.rand(rows, 1, SLOTS, generator=g)
    weights[2] = 0  # a row that reads nothing
    weights[3, 0, 1:] = 0  # a row reading only the entry marker
    copy = {"weights": weights, "gate_logit": torch.randn(rows, 1, 1, generator=g) * scale, "ignore": (pad, bos),
            "table": (tokens, columns, column_tokens)}
    logits = torch.randn(rows, 1, vocab, generator=g) * scale
    with torch.no_grad():
        step = copy_probabilities(logits, copy, log_probs=True)
        assert counted_kernel["copy_step"] == 1
        counted_kernel["off"] = True
        expected = copy_probabilities(logits, copy, log_probs=True)
    assert counted_kernel["copy_step"] == 1
    torch.testing.assert_close(step, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step.exp().sum(-1), torch.ones(rows, 1))


def test_the_decoder_takes_both_kernels(counted_kernel):
    """The copy step reads the weights the reader's kernel left (the decoder's path, as in beam search)."""
    g = torch.Generator().manual_seed(3)
    module = reader(g, True)
    memory, padding = padded_memory(g)
    tokens = torch.randint(2, 40, (SENTENCES, SLOTS), generator=g).masked_fill(padding[::BEAMS], 1)
    x = torch.randn(2, SENTENCES * BEAMS, C, generator=g)
    logits = torch.randn(SENTENCES * BEAMS, 1, 50, generator=g)
    table = (tokens, *sentence_copy_table(tokens, (1, 0)))
    results = []
    for off in (False, True):
        counted_kernel["off"] = off
        _, weights = decode(module, x, memory, padding)
        copy = {"weights": weights[-1], "gate_logit": torch.zeros(SENTENCES * BEAMS, 1, 1), "ignore": (1, 0),
                "table": table}
        with torch.no_grad():
            results.append(tm_attention.copy_probabilities(logits, copy, log_probs=True))
    assert counted_kernel["read_step"] == 1 and counted_kernel["copy_step"] == 1
    torch.testing.assert_close(results[0], results[1], rtol=1e-5, atol=1e-5)


def test_reader_reorders_its_cache_as_fairseq_does():
    """When sentences finish, the reader reorders its cache itself (keeping the keys' transposed
    layout): the same entries as fairseq's reorder, and the same next step."""
    import copy

    g = torch.Generator().manual_seed(4)
    module = reader(g, True)
    memory, padding = padded_memory(g)
    x = torch.randn(3, SENTENCES * BEAMS, C, generator=g)
    state = {}
    with torch.no_grad():
        module(x[:1], memory, padding, incremental_state=state)
        module(x[1:2], None, None, incremental_state=state)  # lays the keys out transposed
    fairseqs = copy.deepcopy(state)
    kept = torch.tensor([0, 2, 3])  # sentences 1 and 4 finished; a kept sentence's beams reordered
    new_order = torch.cat([s * BEAMS + torch.tensor([2, 0, 1, 3]) for s in kept])
    module.reorder_incremental_state(state, new_order)
    module.attn.reorder_incremental_state(state, new_order)  # fairseq then visits the attention
    type(module.attn).reorder_incremental_state(module.attn, fairseqs, new_order)  # fairseq's alone
    ours, theirs = module.attn._get_input_buffer(state), module.attn._get_input_buffer(fairseqs)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
    assert ours["prev_key"].transpose(-1, -2).is_contiguous()  # no copy back at the next step
    rows = x[2:3, :len(new_order)]
    with torch.no_grad():
        torch.testing.assert_close(module(rows, None, None, incremental_state=state),
                                   module(rows, None, None, incremental_state=fairseqs), rtol=0, atol=0)


@needs_shared_data
@pytest.mark.parametrize("weighting,units", [("bm25", "chars"), ("tfidf", "words")])
def test_kernel_retrieval_scores_equal_scipys(weighting, units, monkeypatch):
    """The retrieval's dense scores (sparse_scores.SparseSpace.scores) from the C++ loop equal
    scipy's sparse product bit for bit, on 3,000 real sentences and 200 real queries."""
    import numpy as np

    from reluformer_mt.memory.sparse_scores import SparseSpace

    lines = (DOCMT / "IWSLT2017" / "concatenated_en2de_dev_en.txt").read_text(encoding="utf-8").splitlines()
    sentences = [s for line in lines for s in line.split(" </s> ")][:3200]
    space = SparseSpace(weighting, units).fit(sentences[:3000])
    queries = space.queries(sentences[3000:3200])
    ours = space.scores(queries)
    monkeypatch.setattr(fused, "sparse_scores", lambda *a: None)
    theirs = space.scores(queries)
    assert ours.shape == theirs.shape == (200, 3000) and ours.dtype == theirs.dtype == np.float32
    assert np.array_equal(ours, theirs) and (ours > 0).sum() > 10_000


@pytest.mark.parametrize("switch", ["RELUFORMER_NO_AVX2", "RELUFORMER_NO_AVX512"])
def test_the_portable_loops_equal_the_reference_too(switch):
    """The kernels' loops for CPUs without AVX2 (RELUFORMER_NO_AVX2=1 picks them here) and the AVX2
    loops on a CPU with AVX-512 (RELUFORMER_NO_AVX512=1): the same kernel-against-reference tests, in
    a process of their own (the choice is made once a process)."""
    import os
    import subprocess
    import sys

    from helpers import REPO

    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                          "tests/test_memory_fused.py", "tests/test_knn_fused.py", "-k", "kernel and not portable"],
                         cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={**os.environ, switch: "1", "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout[-3000:]
    assert " passed" in run.stdout and " failed" not in run.stdout


def test_the_memory_cache_option_is_checked():
    from reluformer_mt.cli.translate import build_parser
    from reluformer_mt.guidance import TranslationError
    from reluformer_mt.inference.options import MEMORY_CACHE_PRECISIONS, PrecisionOptions

    assert PrecisionOptions().memory_cache == "float16"
    option = next(a for a in build_parser()._actions if "--memory-cache" in a.option_strings)
    assert tuple(option.choices) == MEMORY_CACHE_PRECISIONS and option.default == "float16"
    with pytest.raises(TranslationError, match="--memory-cache bfloat16: expected one of float16, float32"):
        PrecisionOptions(memory_cache="bfloat16")
