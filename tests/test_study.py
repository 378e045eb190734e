"""The quality study end to end at toy scale: training with validation BLEU, AER of every kept
checkpoint, the learning curve against updates and minutes, the table and the plot."""
import json

import pytest

from reluformer_mt.experiments.curves import read_learning_curve
from reluformer_mt.experiments.study import RUNS, run_study, study_run


def test_study_of_one_tiny_run_writes_curves_table_and_plot(tmp_path):
    pytest.importorskip("bible_alignments")
    run = study_run("toy", vocab=1000, embed_dim=32, ffn_dim=64, layers=1, heads=2, validate_every=4, lr=1e-3)
    report = run_study(tmp_path, [run], budget_minutes=10, max_update=8)
    summary = report["runs"][0]
    assert summary["updates"] == 8
    valid = summary["curve"]["valid"]
    assert [p["update"] for p in valid] == [4, 8]
    for point in valid:  # greedy BLEU from --eval-bleu, AER of the checkpoint kept at that update
        assert 0 <= point["s_bleu"] <= 100 and point["wall"] is not None
        assert 0 < point["aer_best_head"] <= 1 and 0 < point["aer_head_average"] <= 1
    assert 0.5 < report["diagonal_aer_valid"] < 1  # the line attention must beat
    saved = json.loads((tmp_path / "study.json").read_text())
    assert saved["runs"][0]["run"] == "toy"
    assert "toy" in (tmp_path / "study.md").read_text()
    assert (tmp_path / "study.png").stat().st_size > 1000
    # resumable: a second call trains nothing and gives the same curve
    again = run_study(tmp_path, [run], budget_minutes=10, max_update=8)
    assert again["runs"][0]["curve"] == summary["curve"]


def test_every_configuration_describes_itself():
    for name, run in RUNS.items():
        assert run.name == name and run.training.family in run.describe()


def test_learning_curve_gives_validation_points_the_wall_time_after_them(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("\n".join([
        '{"epoch": 1, "update": 0.5, "loss": "9.0", "num_updates": "25", "wall": "10"}',
        '{"epoch": 1, "valid_loss": "8.0", "valid_s_bleu": "1.5", "valid_d_bleu": "2.5", "valid_num_updates": "50"}',
        '{"epoch": 1, "train_loss": "8.5", "train_num_updates": "50", "train_train_wall": "15", "train_wall": "30"}',
        'not json',
    ]) + "\n")
    curve = read_learning_curve(log)
    assert curve["train"] == [{"update": 25, "loss": 9.0, "wall": 10.0}, {"update": 50, "loss": 8.5, "wall": 30.0}]
    assert curve["valid"][0]["wall"] == 30.0 and curve["valid"][0]["s_bleu"] == 1.5


def test_seeds_expand_each_configuration_and_the_table_gives_their_spread():
    """--seeds 3: seed 1 keeps the configuration's name and folder, seeds 2 and 3 are NAME-seedS runs
    that differ only in their seed; the seed table gives mean ± std (min–max) per configuration."""
    import dataclasses

    from reluformer_mt.experiments.study import RUNS, seed_table, seeded_runs

    runs = seeded_runs([RUNS["tiny-sent-v2k"], RUNS["demo-old"]], 3)
    assert [r.name for r in runs] == ["tiny-sent-v2k", "tiny-sent-v2k-seed2", "tiny-sent-v2k-seed3",
                                      "demo-old", "demo-old-seed2", "demo-old-seed3"]
    assert [r.training.seed for r in runs] == [1, 2, 3, 1, 2, 3]
    assert dataclasses.replace(runs[2].training, seed=1) == RUNS["tiny-sent-v2k"].training
    summaries = [{"run": r.name, "config": dataclasses.asdict(r), "best_s_bleu": b, "last_d_bleu": 2 * b,
                  "best_aer": 0.7, "best_aer_head_average": None}
                 for r, b in zip(runs, [3.0, 4.0, 5.0, 1.0, 1.0, 1.0])]
    table = seed_table(summaries, 3)
    line = next(l for l in table.splitlines() if l.startswith("tiny-sent-v2k"))
    assert "4.00 ± 1.00 (3.00–5.00)" in line and "8.00 ± 2.00 (6.00–10.00)" in line and "n/a" in line
    assert "1.00 ± 0.00 (1.00–1.00)" in next(l for l in table.splitlines() if l.startswith("demo-old"))
