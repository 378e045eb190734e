"""The demo end to end at toy scale: every stage runs and the report holds every number."""
import json
import re

from conftest import TINY_DEMO_FAMILIES

import pytest

from reluformer_mt.cli import demo
from reluformer_mt.evaluation.baselines import nearest_verse_translations


def test_demo_runs_every_stage_and_writes_the_report(tiny_demo):
    # both phases of G-Transformer's recipe: 2 updates on sentences, then 4 on document segments
    # (the run is conftest's tiny_demo, shared with test_html_report)
    out, code = tiny_demo["out"], tiny_demo["code"]
    assert code == 0
    report_dir = out / "report"
    report = json.loads((report_dir / "report.json").read_text())
    assert set(report["models"]) == set(TINY_DEMO_FAMILIES)
    assert report["options"]["preset"] == "quick" and report["options"]["lr"] == demo.PRESETS["quick"]["lr"]
    for family, r in report["models"].items():
        assert r["updates"] == 4  # the document phase starts from the sentence model with fresh counters
        assert r["verses"] > 0 and 0 <= r["s_bleu"] <= 100 and 0 <= r["d_bleu"] <= 100
        assert len(r["aer"]["normal"]["best_head"]) == 2  # one AER per decoder layer
        phases = {p["phase"] for p in r["learning_curve"]["valid"]}
        assert phases == {"sentence", "document"}, "validation points of both phases are parsed from the logs"
        assert all(p["wall"] is not None for p in r["learning_curve"]["valid"])
        starts = r["learning_curve"]["phase_starts"]  # the plot marks where the document phase begins
        assert list(starts) == ["sentence", "document"] and starts["sentence"] == 0 < starts["document"]
        assert 0 <= r["fallback_rate"] <= 1
        free = r["modes"]["free"]  # the same chapters decoded with --separators free
        assert free["separators"] == "free" and r["separators"] == "constrained"
        assert free["segments"] == r["segments"] and 0 <= free["fallbacks"] <= free["segments"]
    baselines = report["baselines"]
    assert 0 < baselines["nearest_verse"]["s_bleu"] < 100 and 0.5 < baselines["diagonal"]["aer"] < 1
    assert report["models"]["softmax"]["cross_sparsity"] == 0
    assert report["models"]["reluformer"]["cross_sparsity"] > 0
    chapter = report["translated_chapter"]
    source_lines = open(chapter["source"], encoding="utf-8").read().splitlines()
    assert len(open(chapter["translation"], encoding="utf-8").read().splitlines()) == len(source_lines)
    for picture in ("learning_curves.png", "attention_heatmaps.png", "aer_per_layer.png", "sparsity_per_layer.png"):
        assert (report_dir / picture).stat().st_size > 1000
    side = (report_dir / f"chapter_{chapter['chapter']}.side_by_side.md").read_text(encoding="utf-8").splitlines()
    assert len(side) == 4 + len(source_lines) and "reference (BSB)" in side[2]
    summary = json.loads((report_dir / "summary.json").read_text())
    assert summary["preset"] == "quick" and set(summary["families"]) == set(TINY_DEMO_FAMILIES)
    assert summary["families"]["softmax"]["s_bleu"] == round(report["models"]["softmax"]["s_bleu"], 2)
    table = tiny_demo["stdout"]
    # the console: the stage lines, the report's step among them, then the table; libraries' lines
    # (sacreBLEU's INFO, torch's warnings, eflomal's) went to the log
    head = table.split("\nHTML report", 1)[0].strip().splitlines()
    job_done = re.compile(r"  (train|tune|guided modes|plain modes) [a-z+]+: done in |  reluformer-translate: done in ")
    assert all(line.startswith(("[demo", "  train: ")) or job_done.match(line) for line in head), head
    assert head[-1].startswith("[demo 4/4] write the report: summary, tables, bootstrap intervals, index.html ... ")
    # the families' jobs side by side: each trained, tuned and decoded (plain and guided modes), one chapter
    # with reluformer-translate, each job's seconds in report.json (the demo's time model reads them)
    assert sum(bool(job_done.match(line)) for line in head) == 4 * len(TINY_DEMO_FAMILIES) + 1
    for family, r in report["models"].items():
        assert set(r["job_seconds"]) == {"train", "tune", "guided", "plain"} and min(r["job_seconds"].values()) > 0
    assert list(report["stage_seconds"])[-1].startswith("write the report")
    assert_the_schedule_explains_the_stage(report)
    assert tiny_demo["stderr"] == "", tiny_demo["stderr"][:2000]
    assert "s-BLEU" in table and "reluformer" in table and "softmax" in table and "free: fallbacks" in table
    assert "baseline: nearest training verse" in table and "baseline: diagonal alignment" in table
    # every family in every decoding mode, each mode's hypotheses in a plain file that recomputes its numbers
    from reluformer_mt.evaluation.bleu import corpus_dbleu, corpus_sbleu, group_by_doc_ids

    refs = (report_dir / "test.ref.en.txt").read_text(encoding="utf-8").splitlines()
    chapters = (report_dir / "test.chapters.txt").read_text(encoding="utf-8").splitlines()
    ref_docs = group_by_doc_ids(refs, chapters)
    for family, r in report["models"].items():
        expected = {"constrained", "free", "sentence", "pieces", "knn", "knn-memory", "knn+pieces"}
        expected |= {"without-memory"} if "+" in family else set()
        # tm-first where the tuner's threshold beat its mode on validation (it decodes nothing)
        assert set(r["modes"]) - {"tm-first"} == expected, family
        for mode, m in r["modes"].items():
            hyps = (report_dir / m["hypothesis_file"]).read_text(encoding="utf-8").splitlines()
            assert len(hyps) == r["verses"] and m["verses"] == r["verses"]
            assert corpus_sbleu(hyps, refs).score == pytest.approx(m["s_bleu"], abs=1e-9), (family, mode)
            # d-BLEU: the same verses joined per chapter (test.chapters.txt names each verse's chapter)
            d_bleu = corpus_dbleu(list(group_by_doc_ids(hyps, chapters).values()), list(ref_docs.values()))
            assert d_bleu.score == pytest.approx(m["d_bleu"], abs=1e-9), (family, mode)
            assert summary["families"][family]["modes"][mode]["d_bleu"] == round(m["d_bleu"], 2)
            assert summary["families"][family]["modes"][mode]["s_bleu"] == round(m["s_bleu"], 2)
        assert r["modes"]["knn"]["knn_steps"] > 0  # the datastore was consulted at every step
        # the values tuned on the validation chapters, and the mode chosen there
        tuned = r["tuned"]
        assert set(tuned["chosen"]) == {"pieces", "full", "per_input", "tm_first"} and tuned["datastore"]["entries"] > 0
        for store in ("full", "per_input"):  # the search chosen on validation: exact, or faster within the tolerance
            search = tuned["chosen"][store]["search"]
            assert search["table"][0]["exact"] and search["chosen"] in [row["options"] for row in search["table"]]
        assert r["best_mode"] in r["modes"]
        assert json.loads(open(tuned["report"], encoding="utf-8").read())["split"] == "valid"
        # bands of every mode beside copying the match
        bands = r["bands"]
        assert [b["band"] for b in bands["bands"]] == ["<50", "50-70", "70-90", ">=90", ">=50", "all"]
        assert bands["bands"][-1]["sentences"] == r["verses"] and "copy of the match" in bands["systems"]
    assert 0 < report["baselines"]["tm_copy"]["s_bleu"] < 100
    assert "baseline: copy of the memory's match" in table and "by the best memory match's fuzzy-match band" in table
    assert "s-BLEU of every decoding mode" in table and "+ kNN-MT (per-input)" in table
    assert "values tuned on the validation chapters" in table


def assert_the_schedule_explains_the_stage(report):
    """The time model's simulation of the jobs, from their measured seconds, is within 20 % of the
    stage where they ran side by side (the rest: the workers' start, the scores' collection)."""
    from pathlib import Path

    from reluformer_mt.experiments.demo_schedule import simulate
    from reluformer_mt.experiments.demo_timing import family_jobs, timing_from_report, workers

    options = {k: v for k, v in report["options"].items() if k in demo.DemoOptions.__dataclass_fields__}
    o = demo.DemoOptions(**{**options, "out": Path(options["out"])})
    scheduled, _ = simulate(family_jobs(o, timing_from_report(report)), workers(o))
    stage = next(v for k, v in report["stage_seconds"].items() if k.startswith("train "))
    assert 0.8 * stage <= scheduled <= 1.2 * stage, (scheduled, stage)


def test_reference_run_rows_come_from_its_summary():
    from reluformer_mt.experiments.demo import TABLE_HEADERS, reference_rows

    reference = {"preset": "long", "families": {"softmax": {
        "updates": "2500+400", "train_minutes": 60.0, "s_bleu": 9.1, "d_bleu": 14.2, "aer_best_head": 0.6,
        "aer_head_average": 0.65, "fallbacks": "1/60"}}}
    (row,) = reference_rows(reference)
    assert len(row) == len(TABLE_HEADERS) and row[0] == "reference run (long): softmax"
    assert row[TABLE_HEADERS.index("s-BLEU")] == 9.1 and row[TABLE_HEADERS.index("AER best layer")] == 0.6
    assert reference_rows(None) == [] and reference_rows({"preset": "long", "families": {}}) == []


def test_bad_family_is_a_one_line_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:  # checked with the other options, before any import
        demo.main(["--out", str(tmp_path), "--families", "relu,softmax"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--families: unknown relu" in err and err.count("\n") == 1


def test_nearest_verse_baseline_copies_the_most_similar_training_verse():
    train_src = ["a b c", "d e f", "a x y"]
    train_tgt = ["first", "second", "third"]
    assert nearest_verse_translations(train_src, train_tgt, ["d e", "a b z", "q"]) == ["second", "first", "first"]


def test_every_command_line_option_reaches_the_demo_options():
    """An option the parser accepts but options_from_args drops would be ignored silently
    (--document-lr once was): give each a non-default value and find it in DemoOptions."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(demo.DemoOptions)}
    parser = demo.build_parser()
    checked = []
    for action in parser._actions:
        if action.dest not in fields or action.dest in ("out", "families", "preset"):
            continue
        if isinstance(action, type(parser._option_string_actions["--force"])):  # store_true
            argv, expected = [action.option_strings[0]], True
        elif isinstance(action, type(parser._option_string_actions["--no-knn"])):  # store_false
            argv, expected = [action.option_strings[0]], False
        elif action.choices:
            value = [c for c in action.choices if c != action.default][0]
            argv, expected = [action.option_strings[0], value], value
        elif action.dest == "train_args":
            argv, expected = ["--train-args=--relu-no-length-scale"], ["--relu-no-length-scale"]
        elif action.dest == "train_lengths":
            argv, expected = ["--train-lengths", "sentence,512"], ["sentence", "512"]
        else:
            kind = action.type or str
            value = "256" if kind is str else kind("0.5" if action.dest in ("dropout", "pieces_floor") else "7")
            argv, expected = [action.option_strings[0], str(value)], value
        options = demo.options_from_args(parser.parse_args(argv), ["softmax"])
        assert getattr(options, action.dest) == expected, f"{action.option_strings[0]} did not reach DemoOptions"
        checked.append(action.dest)
    assert "document_lr" in checked and "lr" in checked and len(checked) >= 20


def test_document_phase_learning_rate(tmp_path):
    """The document phase restarts at --lr unless --document-lr is given (it reaches fairseq-train)."""
    from pathlib import Path

    from reluformer_mt.experiments import demo as demo_lib

    data = Path(tmp_path)

    def lr_of(argv, phase):
        options = demo.options_from_args(demo.build_parser().parse_args(argv), ["softmax"])
        run = demo_lib.family_run(options, "softmax")
        assert [p.name for p in run.phases] == ["sentence", "document"]
        train = demo_lib.train_args(run, run.phases[phase], data, data, data / "log", 256, data / "checkpoint_last.pt")
        return float(train[train.index("--lr") + 1])

    lr = demo.PRESETS["quick"]["lr"]
    assert lr_of(["--untuned"], 0) == lr_of(["--untuned"], 1) == lr
    assert lr_of(["--untuned", "--document-lr", "3e-4"], 0) == lr  # the sentence phase keeps --lr
    assert lr_of(["--untuned", "--document-lr", "3e-4"], 1) == 3e-4
    assert lr_of(["--lr", "2e-3"], 0) == lr_of(["--lr", "2e-3"], 1) == 2e-3  # the command line beats a tuned value
    tuned = demo.tuned_settings(demo.build_parser().parse_args([])).get("softmax", {})
    assert lr_of([], 0) == lr_of([], 1) == tuned.get("lr", lr)  # the family's tuned rate when one is written


def test_no_knn_leaves_out_every_knn_mode_and_table_row(tmp_path):
    """--no-knn: the tuner tunes the pieces only, and no kNN-MT mode is decoded (it once decoded them
    anyway from a tuning that had built the datastores)."""
    from reluformer_mt.experiments import demo as demo_lib
    from reluformer_mt.experiments.demo_translate import MODES, best_validation_mode, mode_options

    options = demo_lib.DemoOptions(out=tmp_path, families=["softmax"], knn=False)
    pieces_only = {"chosen": {"pieces": {"pieces_weight": 5.0, "pieces_floor": 0.0, "s_bleu": 9.0}},
                   "decodes": [{"name": "plain", "s_bleu": 4.0}]}
    applicable = [m for m in MODES if m != "without-memory" and mode_options(options, m, pieces_only, tmp_path) is not None]
    assert applicable == ["constrained", "free", "sentence", "pieces"]
    with_knn = {**pieces_only, "chosen": {**pieces_only["chosen"], "full": {"options": {"k": 8}}}}
    assert mode_options(options, "knn", with_knn, tmp_path) is None  # a cached kNN tuning is not used either
    assert best_validation_mode(pieces_only, {"constrained": {}, "pieces": {}}) == "pieces"
    assert demo_lib.knn_table({"softmax": {"tuned": pieces_only}}) == ""
