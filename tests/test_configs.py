"""The hydra presets in configs/: every one composes with its setup's base, and one trains through fairseq-hydra-train."""
import copy
import json
import subprocess
import sys

from helpers import REPO, USER_DIR, needs_shared_data, run_subprocess
from reluformer_mt.models import FAMILIES

CONFIGS = REPO / "configs"
SETUPS = {"demo": ("tiny", "translation"), "iwslt14_de_en": ("iwslt_de_en", "translation"),
          "europarl7_doc": ("base", "document_translation")}

# compose every preset the way fairseq-hydra-train does: fairseq's schema stored under the
# preset's name (hydra_init), hydra 1.1 semantics (fairseq's @hydra.main gives no version_base)
COMPOSE = """
import json, sys
from pathlib import Path
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from fairseq.dataclass.initialize import hydra_init
out = {}
for preset in sorted(Path(sys.argv[1]).glob("*/*.yaml")):
    GlobalHydra.instance().clear()
    hydra_init(preset.stem)
    with initialize_config_dir(config_dir=str(preset.parent), version_base="1.1"):
        out[f"{preset.parent.name}/{preset.stem}"] = OmegaConf.to_container(compose(config_name=preset.stem))
print(json.dumps(out, default=str))
"""


def tuned_keys(path):
    """(group, key) of every setting a tuned override file sets (none when it is not written)."""
    if not path.exists():
        return []
    keys, group = [], None
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            if not line.startswith(" "):
                group = line.rstrip(":")
            else:
                keys.append((group, line.strip().split(":")[0]))
    return keys


def test_every_family_has_a_preset_per_setup():
    """Enumerates the registry (models.FAMILIES): a new family without presets fails here."""
    for setup in SETUPS:
        assert {p.stem for p in (CONFIGS / setup).glob("*.yaml")} == set(FAMILIES), setup


def test_every_preset_composes_with_its_setup_base():
    result = subprocess.run([sys.executable, "-c", COMPOSE, str(CONFIGS)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    composed = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(composed) == len(FAMILIES) * len(SETUPS)
    bases = {}
    for name, cfg in composed.items():
        setup, family = name.split("/")
        size, task = SETUPS[setup]
        assert cfg["model"]["_name"] == f"{family}_{size}", name
        assert cfg["checkpoint"]["save_dir"] == f"checkpoints/{setup}/{family}", name
        assert cfg["task"]["_name"] == task and cfg["criterion"]["_name"] == "reluformer_cross_entropy", name
        # everything else is the setup's base, the same for every family (not fairseq's defaults),
        # but for what the family's tuned settings (tuned/FAMILY.yaml, when written) set
        # (the keys any family of the setup tunes are left out of every family's comparison)
        cfg = copy.deepcopy(cfg)
        for group, key in {k for f in FAMILIES for k in tuned_keys(CONFIGS / setup / "tuned" / f"{f}.yaml")}:
            cfg[group].pop(key, None)
        rest = {k: v for k, v in cfg.items() if k not in ("model", "checkpoint")}
        rest["model"] = {k: v for k, v in cfg["model"].items() if k != "_name"}
        assert bases.setdefault(setup, rest) == rest, name
    assert bases["europarl7_doc"]["dataset"]["max_tokens"] == 8192
    assert composed["demo/sigmoid"]["optimization"]["lr"] == [0.003]  # a family without tuned settings: the base
    presets = REPO / "reluformer_mt" / "experiments" / "tuned_presets.json"
    if presets.exists():  # the demo's tuned families get the tuner's values in hydra too
        for family, settings in json.loads(presets.read_text())["families"].items():
            assert composed[f"demo/{family}"]["optimization"]["lr"] == [settings["lr"]], family


def test_a_family_preset_reads_its_tuned_settings_when_written(tmp_path):
    """configs/demo/FAMILY.yaml merges tuned/FAMILY.yaml (written by ``reluformer-study --tune
    --write-presets``) after the shared base: the tuned values win, other families keep the base."""
    import shutil

    from reluformer_mt.experiments.tune import hydra_overrides

    demo = tmp_path / "configs" / "demo"
    shutil.copytree(CONFIGS / "demo", demo, ignore=shutil.ignore_patterns("tuned"))
    (demo / "tuned").mkdir()
    preset = {"lr": 0.0071, "warmup_updates": 400, "dropout": 0.15, "sentence_updates": 1500, "max_update": 1000,
              "train_args": ["--relu-gamma", "2.5", "--relu-gamma-mode", "head", "--relu-no-length-scale",
                             "--norm-loss-weight", "0.03", "--entropy-margin-weight", "0.0"]}
    (demo / "tuned" / "reluformer.yaml").write_text(hydra_overrides("reluformer", preset, "reluformer-study --tune"))
    result = subprocess.run([sys.executable, "-c", COMPOSE, str(tmp_path / "configs")], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    composed = json.loads(result.stdout.strip().splitlines()[-1])
    tuned, other = composed["demo/reluformer"], composed["demo/rela"]
    assert tuned["optimization"]["lr"] == [0.0071] and tuned["lr_scheduler"]["warmup_updates"] == 400
    assert tuned["model"]["dropout"] == 0.15 and tuned["model"]["relu_gamma"] == 2.5
    assert tuned["model"]["relu_gamma_mode"] == "head" and tuned["model"]["relu_no_length_scale"] is True
    assert tuned["criterion"]["norm_loss_weight"] == 0.03 and tuned["criterion"]["entropy_margin_weight"] == 0.0
    assert other["optimization"]["lr"] == [0.003] and other["model"]["dropout"] == 0.1


@needs_shared_data
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
