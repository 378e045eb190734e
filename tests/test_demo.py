"""The demo end to end at toy scale: every stage runs and the report holds every number."""
import json

import pytest

from reluformer_mt.cli import demo


def test_demo_runs_every_stage_and_writes_the_report(tmp_path, capsys):
    pytest.importorskip("bible_alignments")
    out = tmp_path / "demo"
    code = demo.main(["--out", str(out), "--families", "softmax,reluformer", "--max-update", "4",
                      "--eval-chapters", "1", "--beam", "1", "--vocab-size", "1000", "--segment-tokens", "128"])
    assert code == 0
    report_dir = out / "report"
    report = json.loads((report_dir / "report.json").read_text())
    assert set(report["models"]) == {"softmax", "reluformer"}
    for family, r in report["models"].items():
        assert r["updates"] == 4
        assert r["verses"] > 0 and 0 <= r["s_bleu"] <= 100 and 0 <= r["d_bleu"] <= 100
        assert len(r["aer"]["normal"]["best_head"]) == 2  # one AER per decoder layer
        assert r["learning_curve"]["valid"], "validation losses are parsed from the training log"
    assert report["models"]["softmax"]["cross_sparsity"] == 0
    assert report["models"]["reluformer"]["cross_sparsity"] > 0
    chapter = report["translated_chapter"]
    source_lines = open(chapter["source"], encoding="utf-8").read().splitlines()
    assert len(open(chapter["translation"], encoding="utf-8").read().splitlines()) == len(source_lines)
    for picture in ("learning_curves.png", "attention_heatmaps.png", "aer_per_layer.png", "sparsity_per_layer.png"):
        assert (report_dir / picture).stat().st_size > 1000
    table = capsys.readouterr().out
    assert "s-BLEU" in table and "reluformer" in table and "softmax" in table


def test_bad_family_is_a_one_line_error(capsys, tmp_path):
    assert demo.main(["--out", str(tmp_path), "--families", "relu,softmax"]) == 2
    err = capsys.readouterr().err
    assert "--families: unknown relu" in err and err.count("\n") == 1
