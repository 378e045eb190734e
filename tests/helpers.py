"""Shared test helpers: where the real data is, and fairseq CLIs run in-process."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reluformer_mt.fairseq_runner import run_fairseq  # noqa: F401  (re-exported for the tests)
from reluformer_mt.data.documents import DOC_MARKER

REPO = Path(__file__).resolve().parents[1]
USER_DIR = str(REPO / "reluformer_mt")
SHARED_DATA = Path(os.environ.get("RELUFORMER_SHARED_DATA", REPO.parent / "shared" / "data"))
DOCMT = SHARED_DATA / "docmt_ende"

def route_of(module, tgt: int, src: int, want_weights: bool = False, want_rows: bool = False, q=None) -> str:
    """The route ``module`` takes for a call of ``tgt`` queries x ``src`` keys, every key visible
    (queries with gradients, as in training, unless ``q`` is given)."""
    import torch

    from reluformer_mt.attention.visibility import Visibility

    if q is None:
        q = torch.zeros(1, module.num_heads, tgt, module.head_dim, requires_grad=True)
    return module.route(q, src, Visibility(tgt, src), None, want_weights, want_rows)


def load_benchmark_script(name: str = "run"):
    """benchmarks/NAME.py as a module (a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


needs_shared_data = pytest.mark.skipif(
    not DOCMT.is_dir(), reason=f"real data not found at {SHARED_DATA} (set RELUFORMER_SHARED_DATA)")


TINY_MODEL = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
              "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
              "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]


def tiny_train_args(data, save_dir, arch="reluformer_tiny", max_update=40, max_tokens=1000, warmup=5, extra=()):
    """fairseq-train arguments of a 1+1-layer, 32-dim model on an en->de directory (the tests' budget)."""
    return [data, "--user-dir", USER_DIR, "--arch", arch, *TINY_MODEL,
            "--task", "translation", "--source-lang", "en", "--target-lang", "de",
            "--criterion", "reluformer_cross_entropy", "--label-smoothing", "0.1",
            "--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(warmup),
            "--max-tokens", str(max_tokens), "--max-update", str(max_update), "--num-workers", "0", "--seed", "1",
            "--save-dir", save_dir, "--no-epoch-checkpoints", "--no-progress-bar", *extra]


def run_subprocess(cmd, **kwargs) -> subprocess.CompletedProcess:
    """Run a console command from the venv (bin dir of this interpreter) and capture output."""
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, **kwargs)


def read_docmt_pairs(corpus: str = "IWSLT2017", split: str = "dev", limit: int = 300, max_words: int = 40):
    """The first ``limit`` real en/de sentence pairs of a docmt_ende file (document markers dropped)."""
    def lines(lang):
        path = DOCMT / corpus / f"concatenated_en2de_{split}_{lang}.txt"
        return [l.strip() for l in path.read_text(encoding="utf-8").splitlines()]
    pairs = []
    for en, de in zip(lines("en"), lines("de")):
        if en == DOC_MARKER or not en or not de:
            continue
        if len(en.split()) > max_words or len(de.split()) > max_words:
            continue
        pairs.append((" ".join(en.split()), " ".join(de.split())))
        if len(pairs) == limit:
            break
    return pairs
