"""fairseq's own commands with ``--user-dir reluformer_mt`` (issue 23, class 3): the plugin
refuses what fairseq would die on with a traceback (or, for a missing --restore-file, train
from scratch without a word) before any work, and fairseq's console commands print the
plugin's errors as one line."""
import errno

import pytest
import torch

from helpers import USER_DIR, needs_shared_data, run_fairseq, run_subprocess, tiny_train_args
from reluformer_mt.fairseq_compat import FairseqInputError, one_line_error


@pytest.fixture
def truncated(tmp_path):
    """A checkpoint cut short, as a crash while copying leaves it."""
    whole, cut = tmp_path / "whole.pt", tmp_path / "cut.pt"
    torch.save({"model": {"w": torch.zeros(2000)}}, whole)
    cut.write_bytes(whole.read_bytes()[:3000])
    return cut


def train(data, save, *extra):
    run_fairseq("train", tiny_train_args(data, save, max_update=1, extra=["--disable-validation", *extra]))


@needs_shared_data
def test_train_refuses_bad_input_before_any_work(sentence_data, tmp_path, truncated, monkeypatch):
    data = sentence_data["bin"]
    cases = [
        ((tmp_path / "none", "--cpu"), f"DATA {tmp_path / 'none'}: no such folder; give the directory written by "
                                        "fairseq-preprocess or reluformer-prepare"),
        ((data, "--cpu", "--fp16"), "--fp16: fairseq trains in float16 on CUDA GPUs only (--cpu is given); "
                                    "drop it to train in float32"),
        ((data, "--bf16"), "--bf16: fairseq's --bf16 implies --tpu and needs torch_xla (not installed)"),
        ((data, "--cpu", "--restore-file", tmp_path / "gone.pt"),
         f"--restore-file {tmp_path / 'gone.pt'}: checkpoint not found (fairseq would train from scratch)"),
        ((data, "--cpu", "--restore-file", truncated),
         f"--restore-file {truncated}: not a complete checkpoint (truncated, or not written by torch.save)"),
    ]
    for argv, says in cases:
        with pytest.raises(FairseqInputError) as e:
            train(argv[0], tmp_path / "save", *argv[1:])
        assert str(e.value).startswith(says), str(e.value)
        assert not (tmp_path / "save" / "checkpoint_last.pt").exists()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a GPU machine: the CPU case
    with pytest.raises(FairseqInputError, match=r"^--fp16: .*\(torch sees no CUDA device here\)"):
        train(data, tmp_path / "save", "--fp16")


@needs_shared_data
def test_generate_refuses_missing_and_truncated_checkpoints(sentence_data, tmp_path, truncated):
    for path, says in ((tmp_path / "gone.pt", "checkpoint not found"), (truncated, "not a complete checkpoint"),
                       (tmp_path, "is a directory, expected a checkpoint file")):
        with pytest.raises(FairseqInputError, match=f"^--path {path}: {says}"):
            run_fairseq("generate", [sentence_data["bin"], "--user-dir", USER_DIR, "--path", path, "--cpu"])
    with pytest.raises(FairseqInputError, match=f"^DATA {tmp_path / 'none'}: no such folder"):
        run_fairseq("generate", [tmp_path / "none", "--user-dir", USER_DIR, "--path", truncated, "--cpu"])


@needs_shared_data
def test_full_disk_while_saving_is_one_line_and_leaves_no_partial_file(sentence_data, tmp_path, monkeypatch):
    from fairseq import checkpoint_utils

    def disk_full(obj, f, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    monkeypatch.setattr(checkpoint_utils.time, "sleep", lambda s: None)  # fairseq retries twice, 2.5 s apart
    save = tmp_path / "save"
    with pytest.raises(FairseqInputError, match=rf"^cannot write {save}/checkpoint_\w+\.pt: No space left on device$"):
        train(sentence_data["bin"], save, "--cpu")
    assert not list(save.glob("*.tmp"))


@needs_shared_data
def test_plugin_option_errors_are_one_line(sentence_data, tmp_path):
    """The plugin's own checks (here the memory layer's) raised inside fairseq: the hook's line."""
    with pytest.raises(ValueError) as e:
        train(sentence_data["bin"], tmp_path, "--cpu", "--memory-layers", "encoder:0", "--memory-slots", "8",
              "--memory-topk", "9")
    assert one_line_error(e.value) == str(e.value) and str(e.value).startswith("--memory-topk")
    assert one_line_error(OSError(errno.ENOSPC, "No space left on device", "/x/c.pt")) == "/x/c.pt: No space left on device"
    assert one_line_error(RuntimeError("a bug")) is None and one_line_error(KeyError("k")) is None


@needs_shared_data
def test_fairseq_train_console_command_prints_one_line(sentence_data, tmp_path):
    """The real console script: no traceback, the plugin's line, exit status 1."""
    result = run_subprocess(["fairseq-train", tmp_path / "none", "--user-dir", USER_DIR, "--arch", "reluformer_tiny",
                             "--task", "translation", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "500",
                             "--cpu"], timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (f"fairseq-train: error: DATA {tmp_path / 'none'}: no such "
                                                       "folder; give the directory written by fairseq-preprocess or "
                                                       "reluformer-prepare")
