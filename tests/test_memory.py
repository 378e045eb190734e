"""Key-value memories: top-k MIPS reads, their gradients and index refresh; FFN variants and a
MIPS memory layer training through fairseq-train on real data; memory diagnostics; bad options."""
import re

import pytest
import torch

from reluformer_mt.plugin import register
from reluformer_mt.memory import (MemoryOptionError, MipsFfn, TopKMemory, check_memory_options,
                                  parse_memory_layers, topk_read)
from reluformer_mt.memory.maintenance.stats import anisotropy, memory_stats_report, top_score_ratio

from helpers import USER_DIR, needs_shared_data, run_fairseq

register()  # models, criterion, task and the fairseq fixes: importing the package does not register

TINY = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
        "--decoder-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]


def dense_restricted(q, keys, values, ids, activation):
    """The dense read q K^T -> act -> V with every slot outside ``ids`` switched off."""
    scores = q @ keys.T
    keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, ids, True)
    if activation == "relu":
        weights = torch.relu(scores) * keep
    else:
        weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    return weights @ values


@pytest.mark.parametrize("activation", ["relu", "softmax"])
def test_topk_read_equals_dense_restricted_to_the_same_slots(activation):
    torch.manual_seed(0)
    mem = TopKMemory(3000, 16, 12, topk=20, activation=activation, index="exact")
    q = torch.randn(50, 16)
    ids = mem.search(q)
    # the exact index retrieves the true top-k of the dense scores
    dense_top = (q @ mem.keys.weight.T).topk(20).indices
    assert torch.equal(ids.sort(-1).values, dense_top.sort(-1).values)
    expected = dense_restricted(q, mem.keys.weight, mem.values.weight, ids, activation)
    torch.testing.assert_close(mem(q), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("index", ["hnsw", "ivf"])
def test_approximate_indexes_read_like_dense_on_what_they_retrieve(index):
    torch.manual_seed(1)
    mem = TopKMemory(4000, 8, 4, topk=10, index=index)
    q = torch.randn(30, 8)
    ids = mem.search(q)
    assert ids.shape == (30, 10)
    ok = ids >= 0
    assert ok.float().mean() > 0.9
    out, _ = topk_read(q, ids, mem.keys.weight, mem.values.weight, "relu")
    expected = dense_restricted(q, mem.keys.weight, mem.values.weight, ids.clamp(min=0), "relu")
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_gradients_reach_the_retrieved_rows_only():
    torch.manual_seed(0)
    mem = TopKMemory(500, 8, 6, topk=5, activation="softmax")
    q = torch.randn(4, 8, requires_grad=True)
    mem(q).pow(2).sum().backward()
    ids = set(mem.search(q.detach()).flatten().tolist())
    key_rows = set(torch.nonzero(mem.keys.weight.grad.abs().sum(-1)).flatten().tolist())
    value_rows = set(torch.nonzero(mem.values.weight.grad.abs().sum(-1)).flatten().tolist())
    assert key_rows <= ids and value_rows == ids and len(key_rows) > 0
    assert q.grad is not None and q.grad.abs().sum() > 0


def test_index_refresh_follows_the_keys():
    torch.manual_seed(0)
    mem = TopKMemory(200, 4, 4, topk=1, refresh_updates=3)
    q = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    mem.search(q)
    assert mem.num_builds == 1
    with torch.no_grad():  # a training step makes slot 7 the best match
        mem.keys.weight[7] = torch.tensor([100.0, 0, 0, 0])
    mem.set_num_updates(1)
    mem.set_num_updates(2)
    assert mem.search(q).item() != 7 and mem.num_builds == 1  # stale until the period is over
    mem.set_num_updates(3)
    assert mem.search(q).item() == 7 and mem.num_builds == 2
    # loading a state dict marks the index stale as well
    state = {k: v.clone() for k, v in mem.state_dict().items()}
    state["keys.weight"][7] = 0
    state["keys.weight"][9] = torch.tensor([100.0, 0, 0, 0])
    mem.load_state_dict(state)
    assert mem.search(q).item() == 9 and mem.num_builds == 3


def test_diagnostics_on_known_rows():
    acts = torch.tensor([[10.0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [1.0] * 10])
    torch.testing.assert_close(top_score_ratio(acts, 10.0), torch.tensor([1.0, 0.1]))
    assert abs(anisotropy(torch.ones(5, 3)) - 1.0) < 1e-9
    assert abs(anisotropy(torch.eye(4))) < 1e-9


@pytest.mark.parametrize("call, option", [
    (lambda: TopKMemory(10, 4, 4, topk=11), "--memory-topk"),
    (lambda: check_memory_options(10, 2, index="kdtree"), "--memory-index"),
    (lambda: check_memory_options(10, 2, activation="gelu"), "--memory-activation"),
    (lambda: parse_memory_layers("encoder:3", 2, 2), "--memory-layers"),
    (lambda: parse_memory_layers("middle:0", 2, 2), "--memory-layers"),
])
def test_bad_memory_options_name_the_option(call, option):
    with pytest.raises(MemoryOptionError, match=f"^{option}: .*expected"):
        call()


def train_args(data, save, extra, max_update):
    return [data, "--user-dir", USER_DIR, "--arch", "softmax_tiny", *TINY,
            "--task", "translation", "--source-lang", "en", "--target-lang", "de",
            "--criterion", "reluformer_cross_entropy", "--label-smoothing", "0.1",
            "--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "5",
            "--max-tokens", "1000", "--max-update", str(max_update), "--num-workers", "0", "--seed", "1",
            "--save-dir", save, "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", "4",
            "--no-progress-bar", "--disable-validation", *extra]


def train_losses(text):
    return [float(m) for m in re.findall(r'"loss": "([0-9.]+)"', text)]


@needs_shared_data
@pytest.mark.parametrize("variant, extra", [
    ("relu", []),
    ("softmax", []),
    ("softmax_ln", []),
    ("relu", ["--memory-layers", "encoder:0,decoder:0", "--memory-slots", "2048", "--memory-topk", "16",
              "--memory-index", "hnsw", "--memory-refresh-updates", "5"]),
], ids=["relu", "softmax", "softmax_ln", "mips-hnsw"])
def test_ffn_variants_train_through_fairseq(variant, extra, sentence_data, tmp_path, caplog):
    caplog.set_level("INFO")
    save = tmp_path / "ckpt"
    run_fairseq("train", train_args(sentence_data["bin"], save,
                                    ["--ffn-variant", variant, "--ffn-slots", "48", *extra], max_update=20))
    losses = train_losses(caplog.text)
    assert len(losses) >= 3 and all(l == l for l in losses), caplog.text[-2000:]
    assert losses[-1] < losses[0] - 0.5, losses
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    params = state["model"]
    assert params["encoder.layers.0.fc1.weight" if not extra else "encoder.layers.0.fc1.memory.keys.weight"].shape[0] \
        == (48 if not extra else 2048)
    assert ("decoder.layers.0.fc2.ln.weight" in params) == (variant == "softmax_ln")

    report = memory_stats_report(save / "checkpoint_last.pt", sentence_data["bin"], "valid", (1.0, 10.0), quiet=True)
    assert [l["layer"] for l in report["layers"]] == ["encoder.0", "decoder.0"]
    for layer in report["layers"]:
        assert layer["rows"] > 100 and 0 < layer["top_score_ratio"]["10.0"] <= 1.0 + 1e-6
        assert -1.0 <= layer["anisotropy"] <= 1.0
    if extra:
        assert report["layers"][0]["kind"].startswith("mips-hnsw") and report["layers"][0]["slots"] == 2048
    elif variant == "relu":
        assert report["mean"]["zero_fraction"] > 0.2  # ReLU rows are sparse
    else:
        assert report["mean"]["zero_fraction"] == 0.0  # a softmax row has no zeros


@needs_shared_data
@pytest.mark.parametrize("extra, option", [
    (["--ffn-variant", "gelu_memory"], "--ffn-variant"),
    (["--memory-layers", "encoder:0", "--memory-slots", "8", "--memory-topk", "9"], "--memory-topk"),
])
def test_bad_options_fail_fairseq_train_in_one_line(extra, option, sentence_data, tmp_path):
    with pytest.raises(MemoryOptionError, match=f"^{option}: got .*expected"):
        run_fairseq("train", train_args(sentence_data["bin"], tmp_path, extra, max_update=1))


def test_hnsw_over_the_mips_to_l2_transform_finds_inner_product_neighbours():
    from reluformer_mt.memory import MipsIndex

    rng = torch.Generator().manual_seed(0)
    keys = (torch.randn(2000, 8, generator=rng) * torch.rand(2000, 1, generator=rng) * 3).numpy()
    queries = torch.randn(50, 8, generator=rng).numpy()
    _, exact = MipsIndex("exact").build(keys).search(queries, 5)
    _, approx = MipsIndex("hnsw", hnsw_l2=True).build(keys).search(queries, 5)
    recall = sum(len(set(a) & set(e)) for a, e in zip(approx.tolist(), exact.tolist())) / exact.size
    assert recall > 0.9
