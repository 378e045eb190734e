"""benchmarks/gpu_check.py on a machine without a GPU: it stops at the CUDA check with one clear
message and exit code 2, and every measuring section runs end to end on the CPU (--smoke-cpu,
the kernel in Triton's interpreter) so the one GPU run is not lost to a bug in the script."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import REPO

pytest.importorskip("triton", reason="triton is not installed: gpu_check needs it")
SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_stops_with_a_clear_message_without_cuda(capsys):
    gpu_check = load_gpu_check()
    facts = {"models_built": ["transformer_iwslt_de_en"], "triton": "x"}
    with pytest.raises(SystemExit) as stop:
        gpu_check.require_cuda(facts)
    assert stop.value.code == gpu_check.NO_CUDA_EXIT == 2
    message = capsys.readouterr().err
    assert message.startswith("gpu_check: no CUDA device") and message.rstrip().endswith("stopping here.")
    assert message.count("\n") == 1


def test_every_section_runs_on_the_cpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke-cpu", "--out", str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "report.json").read_text())
    assert not results["errors"] and not results["skipped"]
    impls = {row["impl"] for row in results["kernel"]}
    assert {"sdpa", "triton", "triton+stats", "blocked+stats"} <= impls
    assert not any("error" in row for section in ("kernel", "sublayer", "training", "decoding") for row in results[section])
    assert {row["model"] for row in results["training"]} == set(load_gpu_check().MODELS)
    # beam search with the keys shared by a sentence's beams finds what one copy per beam finds
    assert [(row["same_hypotheses"], row["identical_best"]) for row in results["decoding"]] == [("yes", "2 / 2")] * 2
    assert max(v for k, v in results["kernel_vs_blocked"].items() if k != "L") < 1e-5  # float32, interpreted
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# GPU check (issue 24)") and "## Targets" in report
    assert "## Beam-4 decoding" in report
