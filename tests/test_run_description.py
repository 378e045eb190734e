"""One description of a training run (issue 35): the demo, the study, the sweep and the memory
studies build their fairseq-train arguments from :class:`reluformer_mt.experiments.run.TrainingRun`,
and give fairseq-train what they gave it before, pinned in ``tests/data/train_args_main.json``
(captured on main at 6c3b1c9 by ``tests/data/capture_train_args_6c3b1c9.py``, through the same
functions with fairseq replaced by a recorder)."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import reluformer_mt
from reluformer_mt.experiments.run import Phase, TrainingRun, train_args

PINNED = json.loads((Path(__file__).parent / "data" / "train_args_main.json").read_text(encoding="utf-8"))["cases"]
PACKAGE = str(Path(reluformer_mt.__file__).parent)


class Stop(Exception):
    pass


def normalise(argv, out):
    return [str(a).replace(PACKAGE, "PKG").replace(str(out), "OUT") for a in argv]


def options(argv):
    """The data folder and the (option, value) pairs of an argument list, in any order."""
    pairs, i = [], 1
    while i < len(argv):
        value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
        pairs.append((argv[i], value))
        i += 1 if value is None else 2
    return argv[0], sorted(pairs, key=str)


def cases(command):
    chosen = [c for c in PINNED if c["command"] == command]
    return pytest.mark.parametrize("case", chosen, ids=[f"{command}{i}" for i in range(len(chosen))])


@cases("demo")
def test_the_demo_trains_with_the_arguments_it_had(case, tmp_path, monkeypatch):
    """Word for word, in the same order: every default family and preset, the time budget, a
    resized architecture, the memory families, --train-args. The pinned arguments predate the
    tuned presets, so the demo runs ``--untuned`` here (tests/test_demo.py checks the tuned
    settings arrive)."""
    from reluformer_mt.cli import demo as cli
    from reluformer_mt.experiments import demo

    argv = ["--out", str(tmp_path), "--untuned", *case["argv"]]
    o = cli.options_from_args(cli.build_parser().parse_args(argv), [case["family"]])
    calls = []

    def recorded(tool, argv):
        calls.append(list(argv))
        Path(argv[argv.index("--save-dir") + 1]).mkdir(parents=True, exist_ok=True)
        Path(argv[argv.index("--log-file") + 1]).write_text("")

    monkeypatch.setattr(demo, "run_fairseq", recorded)
    monkeypatch.setattr(demo, "positions", lambda dirs: 256)
    demo.train_family(o, case["family"], {"doc": tmp_path / "data/doc", "sentence": tmp_path / "data/sentence"})
    assert [normalise(c, tmp_path) for c in calls] == case["train"]


@pytest.mark.parametrize("module", ["tm_study", "tm_keys"])
def test_the_memory_studies_train_with_the_arguments_they_had(module, tmp_path, monkeypatch):
    import importlib

    lib = importlib.import_module(f"reluformer_mt.experiments.{module}")
    for i, case in enumerate(c for c in PINNED if c["command"] == module):
        out, calls = tmp_path / str(i), []

        def recorded(tool, argv):
            calls.append(list(argv))
            raise Stop

        monkeypatch.setattr(lib, "run_fairseq", recorded)
        monkeypatch.setattr(lib, "prepare_corpus", lambda o: {"doc": o.out / "data/doc", "sentence": o.out / "data/sentence"})
        command = importlib.import_module(f"reluformer_mt.cli.{module}") if module == "tm_study" else lib
        with pytest.raises(Stop):
            command.main(["--out", str(out), *case["argv"]])
        assert [normalise(c, out) for c in calls] == case["train"]


@cases("study")
def test_the_study_trains_with_the_options_it_had(case, tmp_path, monkeypatch):
    """The same options and values (the order changed: one spelling for all experiments); the
    budget in hours is no longer rounded to 4 digits (0.3333 h was 1199.88 s of 20 minutes)."""
    from reluformer_mt.experiments import study

    calls = []
    monkeypatch.setattr(study, "Prepared", SimpleNamespace(load=lambda d: SimpleNamespace(positions=256)))
    monkeypatch.setattr(study, "subprocess", SimpleNamespace(
        run=lambda command, **kw: calls.append(command[1:]) or SimpleNamespace(returncode=0), STDOUT=None))
    study.train(study.RUNS[case["run"]], tmp_path / "data", tmp_path / "run", case["budget_minutes"], case["threads"],
                case["max_update"], case["device"], progress=False)
    (data, got), (pinned_data, pinned) = options(normalise(calls[0], tmp_path)), options(case["train"][0])
    hours = [(float(a[1]), float(b[1])) for a, b in zip(got, pinned) if a[0] == b[0] == "--stop-time-hours"]
    assert all(abs(a - b) <= 5e-5 for a, b in hours) and len(hours) == bool(case["budget_minutes"])
    drop = [p for p in got + pinned if p[0] == "--stop-time-hours"]
    assert data == pinned_data and [p for p in got if p not in drop] == [p for p in pinned if p not in drop]


@cases("sweep")
def test_the_sweep_trains_with_the_options_it_had(case, tmp_path, monkeypatch):
    """The same options and values, and the options given after ``--`` still last (they win)."""
    from reluformer_mt.cli import sweep as cli
    from reluformer_mt.experiments import sweep

    o = cli.options_from_args(cli.build_parser().parse_args(
        ["--out", str(tmp_path), "--data-bin", str(tmp_path / "bin"), *case["argv"]]))
    o.check()
    calls = []
    monkeypatch.setattr(sweep, "run_fairseq", lambda tool, argv: calls.append(list(argv)))
    sweep.train(tmp_path / "bin", tmp_path / "save", case["variant"], case["slots"], o)
    got = normalise(calls[0], tmp_path)
    assert options(got) == options(case["train"][0])
    extra = case["argv"][case["argv"].index("--") + 1:] if "--" in case["argv"] else []
    assert got[len(got) - len(extra):] == extra


def test_a_phase_after_the_first_starts_from_its_weights_at_its_own_learning_rate(tmp_path):
    run = TrainingRun(phases=(Phase("sentence", "sentence", 100), Phase("document", "128", 50, lr=1e-3)),
                      tm_fusion="concat", extra=("--seed", "9"))
    first = train_args(run, run.phases[0], tmp_path, tmp_path, positions=300)
    second = train_args(run, run.phases[1], tmp_path, tmp_path, positions=300, init_from=tmp_path / "c.pt")
    assert first[first.index("--lr") + 1] == "0.005" and second[second.index("--lr") + 1] == "0.001"
    assert "--finetune-from-model" not in first and second[second.index("--finetune-from-model") + 1] == str(tmp_path / "c.pt")
    assert first[first.index("--max-source-positions") + 1] == "1024"  # a concat model reads source + matches
    assert first[first.index("--validate-interval-updates") + 1] == "33" and first[-2:] == ["--seed", "9"]


def test_the_commands_declare_the_run_options_once():
    """Each run option has one name, type and help in every command that has it (the sweep's
    --warmup is --warmup-updates' second name)."""
    from reluformer_mt.cli import demo, study, sweep
    from reluformer_mt.cli.run_options import RUN_OPTIONS

    declared = {}
    for module in (demo, study, sweep):
        for action in module.build_parser()._actions:
            for name, (flags, kwargs) in RUN_OPTIONS.items():
                if action.option_strings == list(flags) and action.type is kwargs.get("type"):
                    declared.setdefault(name, []).append(module.__name__)
                    assert action.help.startswith(kwargs["help"])
    assert declared["lr"] == declared["max_tokens"] == ["reluformer_mt.cli.demo", "reluformer_mt.cli.sweep"]
    assert declared["budget_minutes"] == ["reluformer_mt.cli.demo", "reluformer_mt.cli.study"]
    assert "reluformer_mt.cli.sweep" in declared["warmup_updates"]
