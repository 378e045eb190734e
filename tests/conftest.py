import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("OMP_NUM_THREADS", "2")

from helpers import DOCMT, read_docmt_pairs, run_fairseq  # noqa: E402


@pytest.fixture(scope="session")
def sentence_data(tmp_path_factory):
    """A binarised en->de sentence-level directory from real IWSLT2017 dev pairs (word level).

    train: 300 pairs, valid: 37 pairs and test: 101 pairs (odd sizes on purpose: they are not
    multiples of fairseq's default --required-batch-size-multiple 8).
    """
    if not DOCMT.is_dir():
        pytest.skip(f"real data not found at {DOCMT}")
    root = tmp_path_factory.mktemp("sentence_data")
    raw = root / "raw"
    raw.mkdir()
    pairs = read_docmt_pairs(limit=438, max_words=25)
    splits = {"train": pairs[:300], "valid": pairs[300:337], "test": pairs[337:438]}
    for split, rows in splits.items():
        (raw / f"{split}.en").write_text("\n".join(en.lower() for en, _ in rows) + "\n", encoding="utf-8")
        (raw / f"{split}.de").write_text("\n".join(de.lower() for _, de in rows) + "\n", encoding="utf-8")
    bin_dir = root / "bin"
    run_fairseq("preprocess", [
        "--source-lang", "en", "--target-lang", "de",
        "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
        "--destdir", bin_dir, "--joined-dictionary", "--workers", "1", "--nwordssrc", "1500",
    ])
    return {"raw": raw, "bin": bin_dir, "sizes": {k: len(v) for k, v in splits.items()}}


TINY_ARGS = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
             "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
             "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]


@pytest.fixture(scope="session")
def trained_checkpoint(sentence_data, tmp_path_factory):
    """A tiny ReLUFormer trained for 30 updates on ``sentence_data``: path of checkpoint_last.pt."""
    from helpers import USER_DIR

    save = tmp_path_factory.mktemp("trained_reluformer")
    run_fairseq("train", [
        sentence_data["bin"], "--user-dir", USER_DIR, "--arch", "reluformer_tiny", *TINY_ARGS,
        "--task", "translation", "--source-lang", "en", "--target-lang", "de",
        "--criterion", "reluformer_cross_entropy", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "5",
        "--max-tokens", "1000", "--max-update", "30", "--num-workers", "0", "--seed", "1",
        "--save-dir", save, "--no-epoch-checkpoints", "--no-progress-bar", "--disable-validation",
    ])
    return save / "checkpoint_last.pt"
