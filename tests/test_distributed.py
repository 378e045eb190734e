"""fairseq's own distributed data-parallel training runs with the plugin: 2 CPU processes, gloo.

fairseq spawns one process per GPU and, under torchrun, divides by the GPU count, so on CPU
each rank is started explicitly with ``--distributed-init-method tcp://... --distributed-rank R
--distributed-no-spawn`` (the same command line works across machines: see docs/PERFORMANCE.md).
"""
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import torch

from helpers import needs_shared_data, tiny_train_args

pytestmark = needs_shared_data

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_gloo_training(sentence_data, tmp_path):
    port = free_port()
    save = tmp_path / "ckpt"
    common = tiny_train_args(sentence_data["bin"], save, max_update=4, max_tokens=500, warmup=2, extra=[
        "--disable-validation", "--log-format", "simple", "--log-interval", "1",
        "--cpu", "--distributed-world-size", "2", "--distributed-backend", "gloo",
        "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-no-spawn",
        # torch DDP refuses device_ids for CPU modules; fairseq's own all-reduce wrapper works
        "--ddp-backend", "legacy_ddp",
    ])
    train = Path(sys.executable).parent / "fairseq-train"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen([str(c) for c in [train, *common, "--distributed-rank", rank, "--device-id", 0]],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for rank in (0, 1)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {rank} failed:\n{log[-3000:]}"
    assert re.search(r"distributed init \(rank 0\)", logs[0]) and re.search(r"distributed init \(rank 1\)", logs[1])
    assert "training on 2 devices" in logs[0], logs[0][-2000:]
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == 4
    losses = [float(x) for x in re.findall(r"\| loss ([0-9.]+)", logs[0])]
    assert losses and all(l == l for l in losses), logs[0][-2000:]
