"""The kNN-MT read-out study (experiments/readout_study.py) on the tiny demo run of conftest."""
import json

import pytest

from reluformer_mt.experiments import readout_study


def test_readout_study_per_k_and_band_on_a_demo_run(tiny_demo, capsys):
    assert tiny_demo["code"] == 0
    out = tiny_demo["out"]
    assert readout_study.main([str(out), "--families", "softmax,reluformer", "--ks", "4,16", "--decode", "softmax"]) == 0
    study = json.loads((out / "report" / "readout_study.json").read_text())
    for family in ("softmax", "reluformer"):
        r = study["families"][family]
        assert [(s["readout"], s["k"]) for s in r["settings"]] == [("softmax", 4), ("softmax", 16), ("relu", 4), ("relu", 16)]
        assert r["tokens"]["all"] == sum(r["tokens"][b] for b in ("<50", "50-70", "70-90", ">=90")) > 0
        for s in r["settings"]:  # lambda chosen on validation, the test tokens only scored
            assert 0 < s["lam"] <= 1 and s["test_nll"]["all"] > 0
    decoded = study["decoded"]["softmax"]
    assert decoded["systems"] == ["model alone", "softmax k=4", "softmax k=16", "relu k=4", "relu k=16", "copy of the match"]
    assert decoded["bands"][-1]["band"] == "all" and decoded["bands"][-1]["copy of the match"] > 0
    printed = capsys.readouterr().out
    assert "Test NLL per token" in printed and "| relu | 16 |" in printed
    assert (out / "report" / "readout_study.md").read_text(encoding="utf-8").startswith("Test NLL per token")


def test_readout_study_bad_options_are_one_line_errors(tmp_path, capsys):
    assert readout_study.main([str(tmp_path), "--ks", "4,1000"]) == 2
    assert "--ks: expected comma-separated k from 1 to 256" in capsys.readouterr().err
    assert readout_study.main([str(tmp_path)]) == 2
    assert "report/report.json: no such file" in capsys.readouterr().err
