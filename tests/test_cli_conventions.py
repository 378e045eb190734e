"""The console scripts follow fairseq's and sacreBLEU's habits (issue 25): --help shows defaults and
nothing before the usage, every option has help, one exit-code convention, no debug floods, and
the demo prints one line per stage with the time left."""
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run_script(name, *args, stdin=None):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([str(BIN / name), *map(str, args)], input=stdin, capture_output=True, text=True, env=env,
                          timeout=300)


def test_demo_help_starts_with_the_usage_and_has_no_none_defaults():
    """Importing fairseq used to print a tensorboardX notice and matplotlib DEBUG lines first."""
    run = run_script("reluformer-demo", "--help")
    assert run.returncode == 0
    assert run.stdout.startswith("usage: reluformer-demo"), run.stdout[:300]
    assert run.stderr == "", run.stderr[:300]
    text = " ".join(run.stdout.split())
    assert "(default: None)" not in text and "(default: False)" not in text
    # a flag shows no default: "--no-knn ... (default: True)" read as kNN-MT being off
    assert "(default: True)" not in text and "--no-knn skip kNN-MT" in text
    assert "--embed-dim EMBED_DIM model width (default: the preset's)" in text
    assert "(default: runs/demo)" in text and "(default: 0)" in text  # --out, --budget-minutes


def _help_of(parser):
    buffer = io.StringIO()
    parser.print_help(buffer)
    return " ".join(buffer.getvalue().split())


def test_translate_and_eval_help_show_defaults_and_the_demo_beam():
    from reluformer_mt.cli import eval as eval_cli
    from reluformer_mt.cli import translate
    from reluformer_mt.experiments.demo import PRESETS
    from reluformer_mt.inference.options import SearchOptions

    text = _help_of(translate.build_parser())
    beam = PRESETS["quick"]["beam"]
    assert f"(default: {beam})" in text and "--lenpen LENPEN length penalty (default: 1.0)" in text
    assert translate.build_parser().parse_args(["-c", "x.pt"]).beam == beam  # the README's chapter, reproduced
    assert SearchOptions().beam == beam
    sub = eval_cli.build_parser()._subparsers._group_actions[0].choices
    assert "--max-tokens MAX_TOKENS force-decoding batch size in tokens (default: 4000)" in _help_of(sub["align"])
    assert "sacreBLEU tokenizer (default: 13a)" in _help_of(sub["bleu"])
    assert "-b, --score-only" in _help_of(sub["bleu"])


def test_memory_help_prints_percent_signs_once():
    run = run_script("reluformer-eval", "memory", "--help")
    assert run.returncode == 0 and "%%" not in run.stdout and "top-p% score ratio" in run.stdout


def test_every_sweep_and_study_option_has_help():
    from reluformer_mt.cli import study, sweep

    for parser in (sweep.build_parser(), study.build_parser()):
        missing = [a.option_strings or [a.dest] for a in parser._actions if not a.help]
        assert missing == [], f"{parser.prog}: options without help: {missing}"


@pytest.mark.parametrize("argv", [["bleu", "--hyp", "missing.txt", "--ref", "missing.txt"],  # an input error
                                  ["bleu", "--levels", "x"],  # a usage error (argparse: --hyp missing)
                                  ["aer", "--gold", "g", "--gold-base", "1", "--pred", "missing.align"]])
def test_eval_input_and_usage_errors_exit_2(argv, tmp_path, capsys):
    from reluformer_mt.cli.eval import main

    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = e.code
    assert rc == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"reluformer-eval {argv[0]}: error: ")


def test_sweep_and_study_input_errors_exit_2(tmp_path, capsys):
    from reluformer_mt.cli import study, sweep

    with pytest.raises(SystemExit) as exit_info:  # refused by the parser itself: one line, exit 2
        sweep.main(["--out", str(tmp_path), "--slots", "a,b"])
    assert exit_info.value.code == 2
    assert "argument --slots: expected a comma list of positive integers, got 'a,b'" in capsys.readouterr().err
    assert study.main(["--out", str(tmp_path), "--runs", "no-such-run"]) == 2


def test_plot_writes_no_debug_lines(trained_checkpoint, sentence_data, tmp_path):
    """--plot loads matplotlib after fairseq: no 'DEBUG:matplotlib' flood on standard error."""
    plot = tmp_path / "sparsity.png"
    run = run_script("reluformer-eval", "attn-stats", "--checkpoint", trained_checkpoint, "--data", sentence_data["bin"],
                     "--split", "test", "--limit", "3", "--kinds", "cross", "--plot", plot)
    assert run.returncode == 0, run.stderr[-2000:]
    assert plot.stat().st_size > 1000
    assert "DEBUG" not in run.stderr and "tensorboardX" not in run.stderr, run.stderr[:500]


# ---------------------------------------------------------------------------------------------- demo stages

def test_stage_lines_estimate_the_time_left_and_send_the_rest_to_the_log(tmp_path):
    import logging

    from reluformer_mt.experiments.progress import Stages, remaining_estimate

    # 2 stages done twice as slowly as expected: the 30 s left are expected to take 60 s
    assert remaining_estimate([10, 20, 30], [20, 40]) == pytest.approx(60)
    # a stage far faster than expected was skipped (already done) and says nothing about the speed
    assert remaining_estimate([10, 20, 30], [20, 0.5]) == pytest.approx(60)
    assert remaining_estimate([10, 20], []) == pytest.approx(30)

    console, log = io.StringIO(), tmp_path / "logs" / "demo.log"
    stages = Stages(plan=[("prepare", 0.01), ("train", 0.01)], log_file=log, console=console)
    stages.announce()
    handler = logging.StreamHandler(sys.stderr)
    logging.getLogger().addHandler(handler)
    try:
        with stages.stage("prepare"):
            print("a model printout")
            logging.getLogger("fairseq.test").warning("a fairseq log line")
            time.sleep(0.02)
        with stages.stage("train"):
            print("{\"epoch\": 1}", file=sys.stderr)
    finally:
        logging.getLogger().removeHandler(handler)
    lines = console.getvalue().splitlines()
    assert len(lines) == 3 and lines[0].startswith("[demo] 2 stages") and str(log) in lines[0]
    assert lines[1].startswith("[demo 1/2] prepare ... ") and "left)" in lines[1] and "total" in lines[1]
    assert lines[2].startswith("[demo 2/2] train ... ") and "left" not in lines[2]  # the last stage
    written = log.read_text(encoding="utf-8")
    assert "a model printout" in written and "a fairseq log line" in written and '{"epoch": 1}' in written
    assert handler.stream is sys.stderr  # the console handler is given back its stream


def test_a_failing_stage_says_so_on_the_console(tmp_path):
    from reluformer_mt.experiments.progress import Stages

    console = io.StringIO()
    stages = Stages(plan=[("prepare", 1.0)], log_file=tmp_path / "demo.log", console=console)
    with pytest.raises(RuntimeError):
        with stages.stage("prepare"):
            raise RuntimeError("broken")
    assert "failed after" in console.getvalue() and "demo.log" in console.getvalue()


def test_demo_plan_counts_every_stage():
    """The stage counter used to end at 6/7: the plan has a row for every stage run_demo opens."""
    from reluformer_mt.experiments.demo import DEFAULT_FAMILIES, DemoOptions
    from reluformer_mt.experiments.progress import demo_plan

    one_by_one = demo_plan(DemoOptions(out=Path("x"), families=["a", "b", "c"], jobs=1))
    assert [kind for kind, _ in one_by_one] == ["prepare", "train", "train", "train", "decode", "evaluate", "translate",
                                                "report"]
    side_by_side = demo_plan(DemoOptions(out=Path("x"), families=["a", "b", "c"], jobs=2))
    assert [kind for kind, _ in side_by_side] == ["prepare", "train and decode", "evaluate", "report"]
    assert sum(s for _, s in side_by_side) < sum(s for _, s in one_by_one)
    default = demo_plan(DemoOptions(out=Path("x"), families=list(DEFAULT_FAMILIES)))
    without_knn = demo_plan(DemoOptions(out=Path("x"), families=list(DEFAULT_FAMILIES), knn=False, pieces_weight=10.0))
    assert sum(seconds for _, seconds in without_knn) < sum(seconds for _, seconds in default)
    # one row per `with stages.stage(...)` of run_demo: prepare, the families (train_stage: side by
    # side with their decoding, or one stage each), decode, evaluate, translate, the report
    import inspect

    from reluformer_mt.experiments.demo import report_stage, run_demo, train_stage
    calls = sum(inspect.getsource(f).count("stages.stage(") for f in (run_demo, train_stage, report_stage))
    assert calls == 7, "a stage was added to run_demo: give it a row in demo_timing.stage_plan"


def test_prepare_help_shows_the_defaults():
    """reluformer-prepare --help names the defaults of --format, --segment-tokens and --workers (issue 33)."""
    from reluformer_mt.cli.prepare import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "(default: docmt)" in text and "(default: sentence)" in text and "(default: 1)" in text
    assert "(default: [])" not in text  # --train/--valid/--test: nothing until given


@pytest.mark.parametrize("module", ["tm_study", "study", "sweep", "demo"])
def test_help_of_the_study_commands_prints_no_library_lines(module):
    """`python -m reluformer_mt.cli.tm_study --help` printed matplotlib's DEBUG lines and fairseq's
    tensorboardX notice: the help alone, on standard output, and nothing on standard error."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-m", f"reluformer_mt.cli.{module}", "--help"], capture_output=True,
                         text=True, env=env, timeout=300)
    assert run.returncode == 0 and run.stdout.startswith("usage:"), run.stderr[-500:]
    assert run.stderr == "", run.stderr[:500]
