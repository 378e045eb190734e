"""reluformer-demo, -study and -sweep refuse every bad option at parsing: one line, exit 2, and
no work started (issue 23, class 1). Each case gives one option one bad value."""
import os
import re

import pytest

from reluformer_mt.cli import demo, study, sweep


def refused(main, argv, capsys):
    """(exit code, stderr) of a command line that must stop before any work."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.fixture
def no_work(monkeypatch):
    """Any stage that starts means a check came too late."""
    def started(*args, **kwargs):
        raise AssertionError("work started before the options were checked")

    monkeypatch.setattr(demo, "run_demo", started)
    monkeypatch.setattr(sweep, "run_sweep", started)
    import reluformer_mt.experiments.study as study_lib

    monkeypatch.setattr(study_lib, "run_study", started)


def a_file(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("x")
    return path


DEMO_CASES = [  # (argv, what the one line says)
    (["--seeds", "0"], "argument --seeds: expected a positive integer, got '0'"),
    (["--max-update", "-5"], "argument --max-update: expected a positive integer, got '-5'"),
    (["--max-update", "0"], "argument --max-update: expected a positive integer, got '0'"),
    (["--sentence-updates", "-1"], "argument --sentence-updates: expected an integer >= 0, got '-1'"),
    (["--lr", "-1"], "argument --lr: expected a finite number > 0, got '-1'"),
    (["--lr", "0"], "argument --lr: expected a finite number > 0, got '0'"),
    (["--document-lr", "nan"], "argument --document-lr: expected a finite number > 0, got 'nan'"),
    (["--budget-minutes", "-3"], "argument --budget-minutes: expected a finite number >= 0, got '-3'"),
    (["--eval-chapters", "-1"], "argument --eval-chapters: expected an integer >= 0, got '-1'"),
    (["--dropout", "1.5"], "argument --dropout: expected a number in [0, 1), got '1.5'"),
    (["--dropout", "-0.1"], "argument --dropout: expected a number in [0, 1), got '-0.1'"),
    (["--beam", "0"], "argument --beam: expected a positive integer, got '0'"),
    (["--tm-k", "0"], "argument --tm-k: expected a positive integer, got '0'"),
    (["--pieces-weight", "-1"], "argument --pieces-weight: expected a finite number >= 0, got '-1'"),
    (["--pieces-k", "0"], "argument --pieces-k: expected a positive integer, got '0'"),
    (["--jobs", "0"], "argument --jobs: expected a positive integer, got '0'"),
    (["--pieces-floor", "1.5"], "argument --pieces-floor: expected a number in [0, 1], got '1.5'"),
    (["--knn-memory-k", "0"], "argument --knn-memory-k: expected a positive integer, got '0'"),
    (["--tune-chapters", "-1"], "argument --tune-chapters: expected an integer >= 0, got '-1'"),
    (["--tm-fusion", "bogus"], "argument --tm-fusion: invalid choice: 'bogus'"),
    (["--families", "softmax+bogus"], "--families: 'softmax+bogus': expected FAMILY or FAMILY+tm|concat|attention"),
    (["--embed-dim", "0"], "argument --embed-dim: expected a positive integer, got '0'"),
    (["--ffn-dim", "x"], "argument --ffn-dim: expected a positive integer, got 'x'"),
    (["--layers", "0"], "argument --layers: expected a positive integer, got '0'"),
    (["--heads", "-4"], "argument --heads: expected a positive integer, got '-4'"),
    (["--vocab-size", "0"], "argument --vocab-size: expected a positive integer, got '0'"),
    (["--max-tokens", "0"], "argument --max-tokens: expected a positive integer, got '0'"),
    (["--warmup-updates", "0"], "argument --warmup-updates/--warmup: expected a positive integer, got '0'"),
    (["--warmup", "-1"], "argument --warmup-updates/--warmup: expected a positive integer, got '-1'"),
    (["--validations", "0"], "argument --validations: expected a positive integer, got '0'"),
    (["--seed", "-1"], "argument --seed: expected an integer >= 0, got '-1'"),
    (["--segment-tokens", "-8"], "argument --segment-tokens:"),
    (["--train-args", "--foo 'bar"], "argument --train-args: no closing quotation in \"--foo 'bar\""),
    (["--embed-dim", "30", "--heads", "4"], "--embed-dim 30 is not divisible by --heads 4"),
    (["--families", "relu"], "--families: unknown relu"),
    (["--preset", "huge"], "argument --preset: invalid choice: 'huge'"),
    (["--size", "huge"], "argument --size: invalid choice: 'huge'"),
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["--train-lengths", "sentence,,512"], "argument --train-lengths: expected comma-separated lengths"),
    (["--extra-target", "missing.tsv"], "--extra-target missing.tsv: file not found"),
    (["--families", "softmax+tm", "--train-lengths", "sentence,512"], "--train-lengths does not go with the memory"),
]


@pytest.mark.parametrize("argv,says", DEMO_CASES, ids=[" ".join(c[0]) for c in DEMO_CASES])
def test_demo_refuses_a_bad_number_in_one_line(argv, says, tmp_path, capsys, no_work):
    code, err = refused(demo.main, ["--out", str(tmp_path / "out"), *argv], capsys)
    assert code == 2 and err.startswith("reluformer-demo: error: ") and says in err and err.count("\n") == 1, err


def test_demo_and_study_refuse_bad_paths_and_devices(tmp_path, capsys, no_work, monkeypatch):
    f = a_file(tmp_path)
    for main, prog in ((demo.main, "reluformer-demo"), (study.main, "reluformer-study"),
                       (sweep.main, "reluformer-sweep")):
        extra = ["--data-bin", str(tmp_path)] if main is sweep.main else []
        for out, says in ((f, "is a file, expected a folder"), (f / "sub", f"lies under the file {f}, expected a folder")):
            code, err = refused(main, ["--out", str(out), *extra], capsys)
            assert code == 2 and err == f"{prog}: error: --out {out}: {says}\n", err
        if main is not sweep.main:
            code, err = refused(main, ["--out", str(tmp_path / "o"), "--bible-root", str(tmp_path / "none")], capsys)
            assert code == 2 and err == f"{prog}: error: --bible-root {tmp_path / 'none'}: no such folder\n"
    # a read-only mount: access() answers EROFS even for root
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(tmp_path) else real_access(p, mode))
    code, err = refused(demo.main, ["--out", str(tmp_path / "new" / "out")], capsys)
    assert code == 2 and err == (f"reluformer-demo: error: --out {tmp_path / 'new' / 'out'}: cannot write {tmp_path} "
                                 "(read-only or permission denied)\n"), err
    monkeypatch.undo()
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for main, prog in ((demo.main, "reluformer-demo"), (study.main, "reluformer-study")):
        code, err = refused(main, ["--out", str(tmp_path / "o"), "--device", "cuda"], capsys)
        assert code == 2 and err.startswith(f"{prog}: error: --device cuda: CUDA is not available") \
            and err.endswith("use --device cpu\n"), err


STUDY_CASES = [
    (["--seeds", "-1"], "argument --seeds: expected a positive integer, got '-1'"),
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["--budget-minutes", "-1"], "argument --budget-minutes: expected a finite number >= 0, got '-1'"),
    (["--max-update", "-2"], "argument --max-update: expected an integer >= 0, got '-2'"),
    (["--threads", "0"], "argument --threads: expected a positive integer, got '0'"),
    (["--budget-minutes", "0", "--max-update", "0"], "--budget-minutes or --max-update must be > 0"),
    (["--runs", "nope"], "--runs: unknown nope"),
    (["--tune", "nope"], "argument --tune: unknown nope"),  # the other modes, which its --help lists
    (["--lengths", "nope"], "argument --lengths: unknown nope"),
    (["--trials", "3"], "--trials goes with --tune FAMILY,..."),
    (["--tune", "softmax", "--space", "huge"], "argument --space: invalid choice: 'huge'"),
    (["--tune", "softmax", "--first-rung", "-1"], "argument --first-rung: expected an integer >= 0, got '-1'"),
    (["--tune", "softmax", "--rung-factor", "1"], "--rung-factor: got 1, expected an integer >= 2"),
    (["--tune", "softmax", "--rung-metric", "loss"], "argument --rung-metric: invalid choice: 'loss'"),
    (["--tune", "softmax", "--extra-target", "missing.tsv"], "--extra-target missing.tsv: file not found"),
    (["--tune", "softmax", "--train-lengths", "12x"], "argument --train-lengths: segment length must be"),
]


@pytest.mark.parametrize("argv,says", STUDY_CASES, ids=[" ".join(c[0]) for c in STUDY_CASES])
def test_study_refuses_a_bad_number_in_one_line(argv, says, tmp_path, capsys, no_work):
    code, err = refused(study.main, ["--out", str(tmp_path / "out"), *argv], capsys)
    assert code == 2 and re.match(r"reluformer-study( --tune| --lengths)?: error: ", err), err
    assert says in err and err.count("\n") == 1, err


SWEEP_CASES = [
    (["--variants", "relu,bogus"], "argument --variants: expected a comma list of"),
    (["--slots", "32,-4"], "argument --slots: expected a comma list of positive integers, got '32,-4'"),
    (["--slots", "a"], "argument --slots: expected a comma list of positive integers, got 'a'"),
    (["--valid-size", "0"], "argument --valid-size: expected a positive integer, got '0'"),
    (["--test-size", "-1"], "argument --test-size: expected a positive integer, got '-1'"),
    (["--nwords", "0"], "argument --nwords: expected a positive integer, got '0'"),
    (["--max-words", "0"], "argument --max-words: expected a positive integer, got '0'"),
    (["--max-update", "0"], "argument --max-update: expected a positive integer, got '0'"),
    (["--max-tokens", "0"], "argument --max-tokens: expected a positive integer, got '0'"),
    (["--lr", "-1"], "argument --lr: expected a finite number > 0, got '-1'"),
    (["--warmup", "0"], "argument --warmup-updates/--warmup: expected a positive integer, got '0'"),
    (["--warmup-updates", "x"], "argument --warmup-updates/--warmup: expected a positive integer, got 'x'"),
    (["--seed", "-3"], "argument --seed: expected an integer >= 0, got '-3'"),
    (["--beam", "0"], "argument --beam: expected a positive integer, got '0'"),
    (["--top-percent", "0"], "argument --top-percent: expected a comma list of percentages in (0, 100], got '0'"),
    (["--top-percent", "1,200"], "argument --top-percent: expected a comma list of percentages in (0, 100]"),
    (["--stats-batches", "-1"], "argument --stats-batches: expected a positive integer, got '-1'"),
    (["--arch", "softmax_huge"], "--arch softmax_huge: unknown architecture; expected e.g."),
]


@pytest.mark.parametrize("argv,says", SWEEP_CASES, ids=[" ".join(c[0]) for c in SWEEP_CASES])
def test_sweep_refuses_a_bad_number_in_one_line(argv, says, tmp_path, capsys, no_work):
    code, err = refused(sweep.main, ["--out", str(tmp_path / "out"), "--data-bin", str(tmp_path), *argv], capsys)
    assert code == 2 and err.startswith("reluformer-sweep: error: ") and says in err and err.count("\n") == 1, err


def test_sweep_refuses_missing_data_folders(tmp_path, capsys, no_work):
    for argv, says in ((["--data-bin", str(tmp_path / "none")], f"--data-bin {tmp_path / 'none'}: no such folder"),
                       (["--corpus", str(tmp_path / "none")], f"--corpus {tmp_path / 'none'}: no such folder")):
        code, err = refused(sweep.main, ["--out", str(tmp_path / "out"), *argv], capsys)
        assert code == 2 and err == f"reluformer-sweep: error: {says}\n", err


def test_good_options_reach_the_work(tmp_path, capsys, monkeypatch):
    """The checks refuse only bad values: the defaults pass and the work starts."""
    calls = []
    monkeypatch.setattr(demo, "run_demo", lambda o: calls.append(o))
    assert demo.main(["--out", str(tmp_path / "d"), "--train-args=--relu-no-length-scale --foo 'a b'"]) == 0
    assert calls[0].train_args == ["--relu-no-length-scale", "--foo", "a b"] and calls[0].max_update == 1000
    monkeypatch.setattr(sweep, "run_sweep", lambda o, say: calls.append(o))
    assert sweep.main(["--out", str(tmp_path / "s"), "--data-bin", str(tmp_path), "--slots", "32,64"]) == 0
    assert calls[1].slots == [32, 64] and calls[1].top_percent == [1.0]


# options whose bad values the path and device test gives (--out, --bible-root, --data-bin,
# --corpus, --device cuda), and switches, which take no value
PATH_OPTIONS = {"--out", "--bible-root", "--data-bin", "--corpus", "-h", "--help"}


@pytest.mark.parametrize("module,cases", [(demo, DEMO_CASES), (study, STUDY_CASES), (sweep, SWEEP_CASES)],
                         ids=["demo", "study", "sweep"])
def test_every_option_has_a_bad_value_case(module, cases):
    """The tests above give each option of the command a bad value: none is left out."""
    parser = module.build_parser()
    tried = {argv[0] for argv, _ in cases} | {a for argv, _ in cases for a in argv if a.startswith("--")}
    options = {o for action in parser._actions if action.nargs != 0 for o in action.option_strings}
    assert options - tried - PATH_OPTIONS == set()
