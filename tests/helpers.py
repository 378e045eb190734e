"""Shared test helpers: where the real data is, and fairseq CLIs run in-process."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reluformer_mt.cli.inprocess import run_fairseq  # noqa: F401  (re-exported for the tests)

REPO = Path(__file__).resolve().parents[1]
USER_DIR = str(REPO / "reluformer_mt")
SHARED_DATA = Path(os.environ.get("RELUFORMER_SHARED_DATA", REPO.parent / "shared" / "data"))
DOCMT = SHARED_DATA / "docmt_ende"

needs_shared_data = pytest.mark.skipif(
    not DOCMT.is_dir(), reason=f"real data not found at {SHARED_DATA} (set RELUFORMER_SHARED_DATA)")


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
        if en == "<d>" or not en or not de:
            continue
        if len(en.split()) > max_words or len(de.split()) > max_words:
            continue
        pairs.append((" ".join(en.split()), " ".join(de.split())))
        if len(pairs) == limit:
            break
    return pairs
