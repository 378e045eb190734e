"""The hydra presets in configs/ run through fairseq-hydra-train."""
from pathlib import Path

import pytest

from helpers import REPO, USER_DIR, needs_shared_data, run_subprocess

pytestmark = needs_shared_data

CONFIGS = REPO / "configs"


def test_every_family_has_a_preset_per_setup():
    families = {"softmax", "reluformer", "rela", "pointwise", "sparsemax", "entmax15"}
    for setup in ("demo", "iwslt14_de_en", "europarl7_doc"):
        assert {p.stem for p in (CONFIGS / setup).glob("*.yaml")} == families


def test_preset_trains_through_fairseq_hydra_train(sentence_data, tmp_path):
    result = run_subprocess([
        "fairseq-hydra-train", "--config-dir", CONFIGS / "demo", "--config-name", "rela",
        f"task.data={sentence_data['bin']}", "task.source_lang=en", "task.target_lang=de",
        f"common.user_dir={USER_DIR}", "common.log_interval=1", "optimization.max_update=3",
        "checkpoint.no_save=true", f"hydra.run.dir={tmp_path}",
        "+model.encoder_layers=1", "+model.decoder_layers=1",
    ], timeout=300, cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    log = result.stdout + result.stderr
    assert "num_updates=3" in log and "attn_null=" in log
    assert "'_name': 'rela_tiny'" in log
