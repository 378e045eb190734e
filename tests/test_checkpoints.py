"""The one checkpoint loader (:mod:`reluformer_mt.checkpoints`) and its one weights_only policy:
always ``weights_only=True`` with the plugin's allowlist, a checkpoint holding any other pickled
object refused in one line by every entry point."""
import re
from pathlib import Path

import pytest
import torch

from helpers import SHARED_DATA
from reluformer_mt import checkpoints
from reluformer_mt.checkpoints import CheckpointError, checkpoint_info, read_state

PACKAGE = Path(checkpoints.__file__).parent
CONTRAPRO = SHARED_DATA / "contrapro_ctx1"


class Payload:
    """A class no checkpoint should carry: unpickling it could run any code."""


CFG = {"model": {"_name": "reluformer", "arch": "reluformer_tiny"}, "task": {"_name": "translation", "data": "/gone"}}


def fake_state(**extra) -> dict:
    """The entries of a fairseq checkpoint, small enough to write in a test."""
    return {"cfg": CFG, "model": {"encoder.w": torch.zeros(3, 4), "encoder.embed_positions._float_tensor": torch.zeros(1)},
            "optimizer_history": [{"num_updates": 7, "lr_scheduler_state": {}, "optimizer_name": "adam"}],
            "extra_state": {"train_iterator": None}, **extra}


@pytest.fixture
def bad_checkpoint(tmp_path) -> Path:
    path = tmp_path / "evil" / "checkpoint_best.pt"
    path.parent.mkdir()
    torch.save(fake_state(payload=Payload()), path)
    return path


def assert_refused(text: str, path: Path) -> None:
    lines = [l for l in text.strip().splitlines() if "error" in l.lower()]
    assert len(lines) == 1 and "Traceback" not in text, text
    assert re.search(rf"{re.escape(str(path))}: refused: the checkpoint holds a pickled [\w.]*Payload\b", lines[0]), text


def test_read_state_allows_fairseq_entries_and_refuses_other_types(tmp_path, bad_checkpoint, monkeypatch):
    calls = []
    original = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(k) or original(*a, **k))
    torch.save(fake_state(), tmp_path / "ok.pt")
    info = checkpoint_info(tmp_path / "ok.pt")
    assert (info.arch, info.task, info.parameters, info.updates) == ("reluformer_tiny", "translation", 12, 7)
    with pytest.raises(CheckpointError) as e:
        read_state(bad_checkpoint)
    assert_refused(f"error: {e.value}", bad_checkpoint)
    assert calls and all(k.get("weights_only") is True for k in calls)  # the one policy, on every torch version


@pytest.mark.parametrize("content, pattern", [
    (None, r"nope.pt: checkpoint not found"),
    (b"not a checkpoint", r"junk.pt: cannot load the checkpoint \("),
    ({"model": {}}, r"junk.pt: not a fairseq checkpoint \(no 'cfg' and 'model' entries\)"),
])
def test_unusable_files_are_one_line_errors(tmp_path, content, pattern):
    path = tmp_path / ("nope.pt" if content is None else "junk.pt")
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    with pytest.raises(CheckpointError, match=pattern) as e:
        read_state(path)
    assert "\n" not in str(e.value)
    with pytest.raises(CheckpointError, match=r"is a directory; give the checkpoint file"):
        read_state(tmp_path)


def test_no_tool_loads_checkpoints_outside_the_loader():
    """Every torch.load of the package is the loader's, and none switches the allowlist off."""
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if p.name != "checkpoints.py" and re.search(r"torch\.load\(|weights_only\s*=\s*False", p.read_text("utf-8"))]
    assert offenders == []


# ---------------------------------------------------------------------------------------------- entry points

def _eval(argv, capsys):
    from reluformer_mt.cli.eval import main

    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err


def _texts(tmp_path):
    src, tgt = tmp_path / "t.src", tmp_path / "t.tgt"
    src.write_text("a small house\n", encoding="utf-8")
    tgt.write_text("ein kleines haus\n", encoding="utf-8")
    return src, tgt


ENTRY_POINTS = ["translate", "align", "attn-stats", "contrastive", "cxmi", "memory", "sweep", "checkpoint_info"]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_refuses_an_arbitrary_pickled_class(entry, bad_checkpoint, tmp_path, capsys, monkeypatch):
    src, tgt = _texts(tmp_path)
    if entry == "translate":
        from reluformer_mt.cli.translate import main

        rc, err = main([str(a) for a in ("-c", bad_checkpoint, "-i", src, "-o", tmp_path / "out.txt")]), capsys.readouterr().err
        assert rc == 2 and not (tmp_path / "out.txt").exists()
    elif entry == "align":
        rc, err = _eval(["align", "--checkpoint", bad_checkpoint, "--src", src, "--tgt", tgt, "--output", tmp_path / "a.align"], capsys)
    elif entry == "attn-stats":
        rc, err = _eval(["attn-stats", "--checkpoint", bad_checkpoint, "--src", src, "--tgt", tgt], capsys)
    elif entry == "contrastive":
        if not CONTRAPRO.is_dir():
            pytest.skip(f"ContraPro not found at {CONTRAPRO}")  # the suite is read before the model
        rc, err = _eval(["contrastive", "--checkpoint", bad_checkpoint, "--suite", "contrapro", "--suite-dir", CONTRAPRO,
                         "--limit", "1"], capsys)
    elif entry == "cxmi":
        rc, err = _eval(["cxmi", "--checkpoint", bad_checkpoint], capsys)
    elif entry == "memory":
        rc, err = _eval(["memory", "--checkpoint", bad_checkpoint, "--data", tmp_path], capsys)
    elif entry == "sweep":
        from reluformer_mt.cli import sweep as sweep_cli
        from reluformer_mt.experiments import sweep

        def train(data, save, variant, slots, o):  # the training run leaves a poisoned checkpoint
            save.mkdir(parents=True)
            (save / "checkpoint_last.pt").write_bytes(bad_checkpoint.read_bytes())
            return 1.0, [], []

        monkeypatch.setattr(sweep, "train", train)
        rc = sweep_cli.main(["--out", str(tmp_path / "sweep"), "--data-bin", str(tmp_path), "--variants", "relu",
                             "--slots", "32"])
        err = capsys.readouterr().err
        bad_checkpoint = tmp_path / "sweep" / "checkpoints" / "relu_32" / "checkpoint_last.pt"
    else:  # the demo's and the sweep's parameter and update counts
        with pytest.raises(CheckpointError) as e:
            checkpoint_info(bad_checkpoint)
        rc, err = 1, f"error: {e.value}"
    assert rc in (1, 2)
    assert_refused(err, bad_checkpoint)


def test_the_translator_registers_the_plugin_and_the_loader_says_to(trained_checkpoint, doc_checkpoint):
    """A Python user who never called register() (PYTHON_API's examples) gets a working
    DocumentTranslator, an entry point that registers the plugin; the checkpoint loader below the
    plugin registers nothing and, asked for a reluformer architecture first, says to call
    register(): a fresh process, no register() call."""
    import subprocess
    import sys

    code = ("from reluformer_mt.plugin import is_registered\n"
            "from reluformer_mt.checkpoints import CheckpointError, open_checkpoint\n"
            "try:\n"
            f"    open_checkpoint({str(trained_checkpoint)!r})\n"
            "except CheckpointError as e:\n"
            "    print(e)\n"
            "print(is_registered())\n"
            "from reluformer_mt.inference import DocumentTranslator\n"
            f"DocumentTranslator({str(doc_checkpoint)!r}, device='cpu')\n"
            f"print(open_checkpoint({str(trained_checkpoint)!r}).cfg.model._name, is_registered())\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    refused, before, after = result.stdout.strip().splitlines()[-3:]
    assert refused.endswith("architecture 'reluformer_tiny' is not registered with fairseq: call "
                            "reluformer_mt.register() before loading a checkpoint in your own code")
    assert (before, after) == ("False", "reluformer_tiny True")
