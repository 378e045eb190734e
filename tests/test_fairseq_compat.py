"""The two traps of the Python-3.11 fairseq builds, neutralised when the plugin registers."""
import argparse

import numpy as np
import pytest
import torch

from reluformer_mt.plugin import register
from reluformer_mt import fairseq_compat

from helpers import USER_DIR, needs_shared_data, run_fairseq, run_subprocess

register()  # models, criterion, task and the fairseq fixes: importing the package does not register

pytestmark = needs_shared_data


class NotAllowedInCheckpoints:
    """A class no checkpoint should carry: the allowlist must still refuse it."""


def count_hypotheses(output: str) -> int:
    return sum(1 for line in output.splitlines() if line.startswith("H-"))


def test_generate_sees_every_sentence(sentence_data, trained_checkpoint, monkeypatch):
    """101 test sentences, default batching flags: the unpatched build loses some, the plugin none."""
    from fairseq.data import data_utils

    args = [sentence_data["bin"], "--user-dir", USER_DIR, "--path", trained_checkpoint,
            "--gen-subset", "test", "--beam", "2", "--max-len-b", "10", "--num-workers", "0",
            "--batch-size", "16"]
    n = sentence_data["sizes"]["test"]
    assert n % 8 != 0

    monkeypatch.setattr(data_utils, "batch_by_size", data_utils.batch_by_size.__wrapped__)
    assert count_hypotheses(run_fairseq("generate", args, capture=True)) < n  # the trap is real
    monkeypatch.undo()
    assert count_hypotheses(run_fairseq("generate", args, capture=True)) == n


def test_batches_cover_all_indices_for_any_multiple():
    from fairseq.data import data_utils

    sizes = np.random.RandomState(0).randint(1, 40, size=103)
    indices = np.argsort(sizes, kind="stable")
    for multiple in (1, 3, 8):
        for max_sentences in (None, 5, 16):
            batches = data_utils.batch_by_size(indices, lambda i: sizes[i], max_tokens=300,
                                               max_sentences=max_sentences, required_batch_size_multiple=multiple)
            seen = np.concatenate(batches)
            assert sorted(seen.tolist()) == list(range(103))
            if max_sentences:
                assert max(len(b) for b in batches) <= max_sentences


def test_checkpoint_types_are_allowlisted_not_unchecked(tmp_path):
    """fairseq's checkpoint contents load with weights_only=True; other objects are still refused."""
    from omegaconf import OmegaConf

    state = {"args": argparse.Namespace(lr=[0.1]), "cfg": OmegaConf.create({"a": {"b": 1}}),
             "extra_state": {"best": np.float64(31.5), "arr": np.arange(3)}}
    torch.save(state, tmp_path / "ok.pt")
    loaded = torch.load(tmp_path / "ok.pt", weights_only=True)
    assert loaded["args"].lr == [0.1] and loaded["extra_state"]["best"] == 31.5

    torch.save({"x": NotAllowedInCheckpoints()}, tmp_path / "bad.pt")
    with pytest.raises(Exception, match="weights_only|Unsupported global"):
        torch.load(tmp_path / "bad.pt", weights_only=True)


def test_subprocess_generate_and_interactive(sentence_data, trained_checkpoint):
    """Real console commands, no environment variable set: checkpoints load under torch >= 2.6."""
    gen = run_subprocess(["fairseq-generate", sentence_data["bin"], "--user-dir", USER_DIR,
                          "--path", trained_checkpoint, "--gen-subset", "test", "--beam", "2",
                          "--max-len-b", "10", "--num-workers", "0"], timeout=300)
    assert gen.returncode == 0, gen.stderr[-2000:]
    assert count_hypotheses(gen.stdout) == sentence_data["sizes"]["test"]

    sentences = (sentence_data["raw"] / "test.en").read_text().splitlines()[:3]
    inter = run_subprocess(["fairseq-interactive", sentence_data["bin"], "--user-dir", USER_DIR,
                            "--path", trained_checkpoint, "--source-lang", "en", "--target-lang", "de",
                            "--beam", "2", "--max-len-b", "10"],
                           input="\n".join(sentences) + "\n", timeout=300)
    assert inter.returncode == 0, inter.stderr[-2000:]
    assert count_hypotheses(inter.stdout) == 3
