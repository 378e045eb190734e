"""A bad option or a missing file is answered before torch and fairseq are imported (seconds on
a busy machine), by every console script that can check it: a fresh interpreter runs the entry
point and reports which of the two it had loaded when the one-line error came."""
import json
import subprocess
import sys
import time

import pytest

from helpers import REPO

PROBE = """
import json, sys, time
from importlib import import_module
start = time.time()
try:
    rc = import_module(sys.argv[1]).main(sys.argv[2:])
except SystemExit as e:  # argparse's parser.error
    rc = e.code
print(json.dumps({"rc": rc, "seconds": time.time() - start,
                  "loaded": sorted(m for m in ("torch", "fairseq") if m in sys.modules)}), file=sys.stderr)
"""


def answer(module, argv, cwd):
    """(exit status, the error lines, what the probe saw) of ``module.main(argv)`` in a fresh
    interpreter with no GPU visible (so --fp16 meets a CPU on every machine)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    start = time.time()
    proc = subprocess.run([sys.executable, "-c", PROBE, module, *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)
    wall = time.time() - start
    *lines, probe = proc.stderr.strip().splitlines()
    seen = json.loads(probe)
    return seen["rc"], lines, dict(seen, wall=wall)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "empty.pt").write_bytes(b"")  # exists: the option checks come first
    (tmp_path / "in.txt").write_text("Hello.\n", encoding="utf-8")
    (tmp_path / "runs").mkdir()
    return tmp_path


CASES = [
    ("reluformer_mt.cli.translate", ["-c", "missing.pt", "-i", "in.txt"], "missing.pt: checkpoint not found"),
    ("reluformer_mt.cli.translate", ["-c", "empty.pt", "-i", "in.txt", "--nbest", "5"], "--nbest 5: expected 1 <= N <= --beam (4)"),
    ("reluformer_mt.cli.translate", ["-c", "empty.pt", "-i", "in.txt", "--fp16"], "--fp16: half precision is for CUDA only"),
    ("reluformer_mt.cli.translate", ["-c", "empty.pt", "-i", "missing.txt"], "--input missing.txt: input file not found"),
    ("reluformer_mt.cli.translate", ["-c", "empty.pt", "-i", "in.txt", "--data", "nowhere"], "--data nowhere: no such folder"),
    ("reluformer_mt.cli.translate", ["-c", "empty.pt", "-i", "in.txt", "--device", "cuda"], "--device cuda: CUDA is not available"),
    ("reluformer_mt.cli.memory", ["tune", "-c", "missing.pt"], "--checkpoint missing.pt: not found"),
    ("reluformer_mt.cli.memory", ["datastore", "build", "-c", "empty.pt", "-o", "ds", "--data", "nowhere"],
     "--data nowhere: no such folder"),
    ("reluformer_mt.cli.memory", ["tune", "-c", "empty.pt", "--adaptive-k", "3"], "--adaptive-k: expected a power of two"),
    ("reluformer_mt.cli.eval", ["cxmi", "--checkpoint", "missing.pt"], "missing.pt: checkpoint not found"),
    ("reluformer_mt.cli.eval", ["attn-stats", "--checkpoint", "empty.pt", "missing.pt"], "missing.pt: checkpoint not found"),
    ("reluformer_mt.cli.average", ["--dir", "runs", "--last", "5", "-o", "avg.pt"], "--last 5 asks for 5 checkpoints but it holds 0"),
    ("reluformer_mt.cli.average", ["--inputs", "empty.pt", "missing.pt", "-o", "avg.pt"], "missing.pt: checkpoint not found"),
    ("reluformer_mt.cli.prepare", ["--format", "docmt", "--train", "in.txt", "missing.de", "--out", "bin"],
     "--train missing.de: file not found"),
    ("reluformer_mt.cli.demo", ["--families", "softmax,nope"], "--families: unknown nope"),
    ("reluformer_mt.cli.demo", ["--families", "softmax+memory"], "expected FAMILY or FAMILY+tm|concat|attention"),
    ("reluformer_mt.cli.demo", ["--out", "in.txt"], "--out in.txt: is a file, expected a folder"),
]


@pytest.mark.parametrize("module, argv, says", CASES, ids=[f"{m.rsplit('.', 1)[1]}:{s.split(':')[0]}" for m, _, s in CASES])
def test_a_bad_option_or_path_is_answered_before_torch_and_fairseq_load(module, argv, says, files):
    rc, lines, seen = answer(module, argv, files)
    assert rc == 2 and len(lines) == 1 and says in lines[0], lines
    assert seen["loaded"] == [], f"{lines[0]} came after importing {seen['loaded']}"
    assert seen["wall"] < 4, seen  # a fresh interpreter included; torch + fairseq alone take longer when busy


def test_a_copied_checkpoint_whose_data_path_is_relative_is_answered_before_torch(doc_checkpoint, tmp_path, monkeypatch):
    """A checkpoint trained with a relative data path (`fairseq-train data-bin/x`), copied away
    from where it was trained: the resources are looked for (beside it, then data-bin/x from the
    current folder) before torch loads, and the one-line error says where it looked."""
    import os
    import shutil

    import torch

    from reluformer_mt.cli.stored_config import check_resources_findable

    data = torch.load(doc_checkpoint, map_location="cpu", weights_only=False)["cfg"]["task"]["data"]
    trained_in = tmp_path / "trained_in"
    (trained_in / "data-bin").mkdir(parents=True)
    shutil.copytree(data, trained_in / "data-bin" / "doc")
    state = torch.load(doc_checkpoint, map_location="cpu", weights_only=False)
    state["cfg"]["task"]["data"] = os.path.join("data-bin", "doc")
    copied = tmp_path / "copied"
    copied.mkdir()
    torch.save(state, copied / "checkpoint_best.pt")
    (tmp_path / "in.txt").write_text("Hello.\n", encoding="utf-8")

    rc, lines, seen = answer("reluformer_mt.cli.translate", ["-c", copied / "checkpoint_best.pt", "-i", "in.txt"], tmp_path)
    assert rc == 2 and len(lines) == 1, lines
    assert "checkpoint_best.pt: cannot find its resources" in lines[0] and "looked in" in lines[0]
    assert "data-bin/doc" in lines[0] and "give --data DIR" in lines[0], lines[0]
    assert seen["loaded"] == [] and seen["wall"] < 4, seen
    monkeypatch.chdir(trained_in)  # where the relative path holds: no complaint
    check_resources_findable(copied / "checkpoint_best.pt")
