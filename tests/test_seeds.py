"""The spread over training seeds (experiments/seeds.py, ``reluformer-demo --seeds``)."""
import json
import statistics

import pytest

from reluformer_mt.experiments import seeds as seeds_lib

# s-BLEU of three seeds: reluformer always below softmax, rela overlapping it
SCORES = {"softmax": [5.0, 5.6, 5.3], "reluformer": [3.4, 3.9, 3.1], "rela": [3.8, 5.4, 4.4]}


def fake_run(folder, seed, families, knn=True):
    """A finished demo run's two report files, as run_demo writes them."""
    report = folder / "report"
    report.mkdir(parents=True, exist_ok=True)
    summary = {"families": {}, "baselines": {"nearest_verse": {"s_bleu": 16.38, "d_bleu": 22.21}}}
    for family in families:
        s = SCORES[family][seed - 1]
        modes = {"constrained": {"s_bleu": s, "d_bleu": 2 * s}, "sentence": {"s_bleu": s + 0.5, "d_bleu": 2 * s}}
        if knn:
            modes["knn"] = {"s_bleu": s + 1, "d_bleu": 2 * s + 1}
        summary["families"][family] = {"s_bleu": s, "d_bleu": 2 * s, "aer_best_head": 0.8 - s / 100,
                                       "aer_head_average": 0.75, "cross_sparsity": 0.5, "modes": modes}
    (report / "summary.json").write_text(json.dumps(summary))
    (report / "report.json").write_text(json.dumps({"options": {"seed": seed}, "table": "the table"}))
    (report / "table.md").write_text("# reluformer-demo\n\n| model |\n")
    return folder


def test_seed_report_gives_mean_std_range_and_separation(tmp_path):
    runs = [fake_run(tmp_path / "demo", 1, ["reluformer", "rela", "softmax"]),
            fake_run(tmp_path / "demo/seeds/seed-2", 2, ["reluformer", "rela", "softmax"], knn=False),
            fake_run(tmp_path / "demo/seeds/seed-3", 3, ["reluformer", "softmax"], knn=False)]
    result = seeds_lib.write_seed_report(runs)
    assert result["seeds"] == [1, 2, 3] and result["left_out_families"] == ["rela"]
    softmax = result["families"]["softmax"]["s_bleu"]
    assert softmax["mean"] == pytest.approx(statistics.fmean(SCORES["softmax"]))
    assert softmax["std"] == pytest.approx(statistics.stdev(SCORES["softmax"]))
    assert (softmax["min"], softmax["max"]) == (5.0, 5.6)
    # kNN-MT only in the first seed's run: no column; the verse-by-verse mode in all: a column
    assert "mode:knn" not in softmax and "mode:sentence" in result["families"]["softmax"]
    verdicts = result["comparison"]["reluformer"]
    assert verdicts["s_bleu"]["verdict"] == "worse" and verdicts["s_bleu"]["separated"]
    assert verdicts["aer_best_head"]["verdict"] == "worse"  # higher AER is worse
    assert verdicts["cross_sparsity"]["verdict"] == "within the seed spread"

    report = tmp_path / "demo" / "report"
    assert json.loads((report / "seeds.json").read_text())["families"]["reluformer"]["s_bleu"]["n"] == 3
    section = (report / "seeds.md").read_text(encoding="utf-8")
    assert "3.47 ± 0.40 (3.10–3.90)" in section and "| reluformer | s-BLEU (document translator) | -1.83 | worse |" in section
    page = (report / "index.html").read_text(encoding="utf-8")
    assert 'id="seeds-table"' in page and "within the seed spread" in page
    # a rerun replaces table.md's section instead of adding a second one
    seeds_lib.write_seed_report(runs)
    assert (report / "table.md").read_text(encoding="utf-8").count(seeds_lib.SECTION_TITLE) == 1


def test_overlapping_seeds_are_within_the_spread(tmp_path):
    runs = [fake_run(tmp_path / f"s{seed}", seed, ["rela", "softmax"]) for seed in (1, 2, 3)]
    assert seeds_lib.write_seed_report(runs)["comparison"]["rela"]["s_bleu"]["verdict"] == "within the seed spread"


def test_bad_seed_folders_are_one_line_errors(tmp_path, capsys):
    one = fake_run(tmp_path / "a", 1, ["softmax"])
    again = fake_run(tmp_path / "b", 1, ["softmax"])
    assert seeds_lib.main([str(one), str(again)]) == 2
    assert "repeat a seed" in capsys.readouterr().err
    assert seeds_lib.main([str(one), str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert "missing/report/summary.json: no such file" in err and "\n" not in err
    assert seeds_lib.main([str(one)]) == 2 and "two runs or more" in capsys.readouterr().err


def test_demo_seeds_option_runs_each_seed_in_its_folder(tmp_path, monkeypatch, capsys):
    """--seeds 3: the demo's options once per seed (only seed and folder differ), the later seeds
    starting from a copy of the first's prepared corpus, then the seed report."""
    from reluformer_mt.cli import demo

    calls = []

    def fake_run_demo(options):
        calls.append(options)
        if options.seed == 1:  # the first run prepares the corpus
            (options.out / "data").mkdir(parents=True)
            (options.out / "data" / "prepared.json").write_text("{}")
        else:
            assert (options.out / "data" / "prepared.json").exists()
        fake_run(options.out, options.seed, ["reluformer", "softmax"])

    monkeypatch.setattr(demo, "run_demo", fake_run_demo)
    out = tmp_path / "demo"
    assert demo.main(["--out", str(out), "--families", "reluformer,softmax", "--seeds", "3", "--beam", "2"]) == 0
    assert [(o.seed, o.out) for o in calls] == [(1, out), (2, out / "seeds" / "seed-2"), (3, out / "seeds" / "seed-3")]
    assert all(o.beam == 2 and o.families == ["reluformer", "softmax"] for o in calls)
    assert json.loads((out / "report" / "seeds.json").read_text())["seeds"] == [1, 2, 3]
    assert "Spread over training seeds" in capsys.readouterr().out


def test_columns_can_be_left_out_and_mixed_commits_are_said(tmp_path, capsys):
    runs = [fake_run(tmp_path / f"s{seed}", seed, ["reluformer", "softmax"]) for seed in (1, 2)]
    summary = json.loads((runs[1] / "report" / "summary.json").read_text())
    (runs[1] / "report" / "summary.json").write_text(json.dumps({**summary, "commit": "abc1234"}))
    result = seeds_lib.write_seed_report(runs, exclude=["mode:knn"])
    assert "mode:knn" not in result["families"]["softmax"] and "mode:sentence" in result["families"]["softmax"]
    text = seeds_lib.render(result)
    assert "different commits (None, abc1234)" in text and "left out on request (--exclude): mode:knn" in text
    assert seeds_lib.main([str(r) for r in runs] + ["--exclude", "mode:nope"]) == 2
    assert "--exclude: unknown column(s) mode:nope" in capsys.readouterr().err
