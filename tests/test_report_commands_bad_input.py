"""The demo's and the studies' report commands on bad input: one line naming the file or option,
exit 2, before any work (a family given twice, a report.json of another shape, a read-only
package for demo_timing --write, a cell.json that is truncated, not UTF-8, a list or holds a
string score), and seeds --report-dir in a folder that does not exist yet."""
import json
import os
import stat

import pytest

from test_hardening_outputs_and_rekeying import one_line


def test_demo_refuses_a_family_given_twice(tmp_path, capsys):
    """It passed the option check and failed with an IndexError in demo_timing.simulate after torch loaded."""
    from reluformer_mt.cli.demo import main

    with pytest.raises(SystemExit) as exit_:
        main(["--families", "softmax,softmax", "--out", str(tmp_path / "demo")])
    one_line(exit_.value.code, capsys.readouterr().err, r"--families: softmax given twice; give each family once")
    assert not (tmp_path / "demo").exists()


def timing_main(argv, capsys):
    from reluformer_mt.experiments.demo_timing import main

    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("report,said", [([1, 2], r"a JSON object, got a list"),
                                         ({"options": {}, "models": [], "stage_seconds": {}, "versions": {}},
                                          r"models: an object, got list"),
                                         ({"options": {}, "models": {"softmax": [3]}, "stage_seconds": {},
                                           "versions": {}}, r"models\.softmax: an object with a job_seconds object")])
def test_demo_timing_on_a_report_of_another_shape_is_one_line(report, said, tmp_path, capsys):
    """A list, or models a list: TypeError / AttributeError tracebacks."""
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report), encoding="utf-8")
    code, err = timing_main([path], capsys)
    one_line(code, err, rf"demo_timing: error: .*report\.json: expected a finished demo run's report\.json: {said}")


@pytest.mark.parametrize("folder", ["read-only", "a file"])
def test_demo_timing_write_where_it_cannot_is_one_line_before_reading(folder, tmp_path, capsys, monkeypatch):
    """An OSError traceback after the work (a read-only package); the write was not atomic either."""
    from reluformer_mt.experiments import demo_timing

    package = tmp_path / "package"
    if folder == "a file":  # unwritable for root too
        package.write_text("not a folder\n", encoding="utf-8")
    else:
        package.mkdir()
        package.chmod(stat.S_IRUSR | stat.S_IXUSR)
        if os.access(package, os.W_OK):
            package.chmod(stat.S_IRWXU)
            pytest.skip("running as a user who may write into read-only folders")
    monkeypatch.setattr(demo_timing, "TIMING_FILE", package / "demo_timing.json")
    try:
        code, err = timing_main([tmp_path / "missing.json", "--write"], capsys)
    finally:
        package.chmod(stat.S_IRWXU)
    one_line(code, err,
             r"demo_timing: error: --write: cannot write .*demo_timing\.json: .*package is not a writable folder")


@pytest.mark.parametrize("content,said", [(b"[1, 2]", r"expected a JSON object \(a finished cell\), got a list"),
                                          (b'{"s_bleu": "12.3"}', r's_bleu "12\.3": expected a number'),
                                          (b'{"s_bleu": 1', r"not readable JSON"),
                                          (b'{"s_bleu": "\xff"}', r"not readable JSON")])
def test_length_study_report_on_a_bad_cell_names_it_before_the_baselines(content, said, tmp_path, capsys, monkeypatch):
    """AttributeError / TypeError after ~35 s (the baselines' corpus prepared first); a truncated or
    non-UTF-8 cell did not say which of the 36 cells it was."""
    from reluformer_mt.cli.study import main
    from reluformer_mt.experiments import lengths

    def no_baselines(*args):
        raise AssertionError("the baselines were computed before the cells were read")

    monkeypatch.setattr(lengths, "report_baselines", no_baselines)
    good = {"length": "128", "s_bleu": 1.0, "d_bleu": 2.0}
    for family in ("softmax", "reluformer"):
        cell = tmp_path / family / "seed-1" / "doc128" / "cell.json"
        cell.parent.mkdir(parents=True)
        cell.write_text(json.dumps(good), encoding="utf-8")
    bad = tmp_path / "reluformer" / "seed-1" / "doc128" / "cell.json"
    bad.write_bytes(content)
    code = main(["--lengths", "128", "--tune-families", "softmax,reluformer", "--seeds", "1", "--out", str(tmp_path),
                 "--report-only", "--untuned"])
    one_line(code, capsys.readouterr().err, rf"reluformer/seed-1/doc128/cell\.json: .*{said}")
    assert not (tmp_path / "lengths.json").exists()


def test_seeds_report_dir_that_does_not_exist_yet_gets_the_page_too(tmp_path, capsys):
    """seeds.md was written, then the page said there was nothing to show (exit 2)."""
    from test_hardening_loading import demo_run, good_summary, seeds_main

    runs = [demo_run(tmp_path / "a", 1, good_summary()), demo_run(tmp_path / "b", 2, good_summary(5.5))]
    out = tmp_path / "newdir" / "rep"
    code, err = seeds_main([*runs, "--report-dir", out], capsys)
    assert code == 0, err
    assert {"seeds.json", "seeds.md", "index.html"} <= {f.name for f in out.iterdir()}
    assert 'id="seeds"' in (out / "index.html").read_text(encoding="utf-8")
