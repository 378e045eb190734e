"""How tests/data/train_args_main.json was made: the fairseq-train argument lists of the demo, study,
sweep, tm study and tm-keys study on main at 6c3b1c9 (before the run description of issue 35), captured
through each one's own training function with fairseq replaced by a recorder; runs on that commit only
(``python tests/data/capture_train_args_6c3b1c9.py tests/data/train_args_main.json``).
Paths: OUT (the run folder), PKG (the package folder given to --user-dir)."""
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace


class Stop(Exception):
    pass


def normalise(argv, out):
    import reluformer_mt
    pkg = str(Path(reluformer_mt.__file__).parent)
    return [str(a).replace(pkg, "PKG").replace(str(out), "OUT") for a in argv]


DEMO = [([], f) for f in ("reluformer", "rela", "softmax", "softmax+tm")] + \
       [(["--preset", "long"], f) for f in ("reluformer", "rela", "softmax", "softmax+tm")] + [
    (["--budget-minutes", "30"], "softmax"), (["--budget-minutes", "30"], "softmax+tm"),
    (["--size", "iwslt_de_en", "--document-lr", "3e-4", "--train-args=--relu-no-length-scale --foo 'a b'", "--seed", "3",
      "--tm-fusion", "concat", "--tm-k", "4"], "softmax+tm"),
    (["--size", "iwslt_de_en", "--document-lr", "3e-4", "--seed", "3"], "reluformer"),
    (["--sentence-updates", "0"], "rela"), (["--device", "cuda"], "softmax"),
    (["--validations", "5", "--max-update", "7", "--lr", "1e-3", "--warmup-updates", "9", "--dropout", "0.3",
      "--max-tokens", "1000", "--embed-dim", "32", "--ffn-dim", "48", "--layers", "1", "--heads", "2"], "softmax"),
    ([], "softmax+attention"), ([], "softmax+concat"), (["--tm-k", "3"], "rela+attention"),
]
STUDY = [dict(run=name, budget_minutes=20, max_update=0, threads=1, device="cpu") for name in
         ["demo-old", "tiny-sent-v2k", "small-sent-v2k", "small-sent-v4k", "small-doc128-v2k", "tiny-sent-v1k",
          "tiny-sent-v2k-lr5", "base256-sent-v2k"]] + [
    dict(run="tiny-sent-v2k", budget_minutes=10, max_update=8, threads=2, device="cuda"),
    dict(run="small-doc128-v2k", budget_minutes=30, max_update=100, threads=1, device="cpu"),
    dict(run="tiny-sent-v2k", budget_minutes=0, max_update=100, threads=1, device="cpu")]
SWEEP = [([], "relu", 32), ([], "softmax_ln", 4096),
         (["--arch", "reluformer_tiny", "--max-update", "300", "--lr", "1e-3", "--warmup", "50", "--seed", "2",
           "--max-tokens", "1000", "--", "--foo", "--bar", "1"], "softmax", 64),
         (["--max-update", "100", "--warmup", "200"], "relu", 32)]  # the check lowers the warm-up
TM_STUDY = [["--families", "softmax", "--ks", "1", "--updates", "50"], ["--families", "rela", "--ks", "16"]]
TM_KEYS = [["--updates", "30", "--key-loss", "0.5", "--key-temperature", "0.1"], []]


def capture_demo(tmp):
    from reluformer_mt.cli import demo as cli
    from reluformer_mt.experiments import demo
    got = []
    for argv, family in DEMO:
        out = Path(tempfile.mkdtemp(dir=tmp))
        o = cli.options_from_args(cli.build_parser().parse_args(["--out", str(out), *argv]), [family])
        calls = []

        def fake(tool, args):
            calls.append(list(args))
            save = Path(args[args.index("--save-dir") + 1])
            save.mkdir(parents=True, exist_ok=True)
            Path(args[args.index("--log-file") + 1]).write_text("")
        demo.run_fairseq, demo.positions = fake, lambda dirs: 256
        demo.train_family(o, family, {"doc": out / "data/doc", "sentence": out / "data/sentence"})
        got.append({"command": "demo", "argv": argv, "family": family, "train": [normalise(c, out) for c in calls]})
    return got


def capture_study(tmp):
    from reluformer_mt.experiments import study
    got = []
    for s in STUDY:
        out = Path(tempfile.mkdtemp(dir=tmp))
        calls = []
        study.Prepared = SimpleNamespace(load=lambda d: SimpleNamespace(positions=256))
        study.subprocess = SimpleNamespace(run=lambda command, **kw: calls.append(command[1:]) or SimpleNamespace(returncode=0),
                                           STDOUT=None)
        study.train(study.RUNS[s["run"]], out / "data", out / "run", s["budget_minutes"], s["threads"], s["max_update"],
                    s["device"], progress=False)
        got.append({"command": "study", **s, "train": [normalise(c, out) for c in calls]})
    return got


def capture_sweep(tmp):
    from reluformer_mt.cli import sweep as cli
    from reluformer_mt.experiments import sweep
    got = []
    for argv, variant, slots in SWEEP:
        out = Path(tempfile.mkdtemp(dir=tmp))
        o = cli.options_from_args(cli.build_parser().parse_args(["--out", str(out), "--data-bin", str(out / "bin"), *argv]))
        o.check()
        calls = []
        sweep.run_fairseq = lambda tool, args: calls.append(list(args))
        sweep.train(out / "bin", out / "save", variant, slots, o)
        got.append({"command": "sweep", "argv": argv, "variant": variant, "slots": slots,
                    "train": [normalise(c, out) for c in calls]})
    return got


def capture_main(module, cases, tmp):
    got = []
    for argv in cases:
        out = Path(tempfile.mkdtemp(dir=tmp))
        calls = []

        def fake(tool, args):
            calls.append(list(args))
            raise Stop
        module.run_fairseq = fake
        module.prepare_corpus = lambda o: {"doc": o.out / "data/doc", "sentence": o.out / "data/sentence"}
        try:
            module.main(["--out", str(out), *argv])
        except Stop:
            pass
        got.append({"command": module.__name__.rsplit(".", 1)[1], "argv": argv, "train": [normalise(c, out) for c in calls]})
    return got


if __name__ == "__main__":
    from reluformer_mt.experiments import tm_keys, tm_study
    with tempfile.TemporaryDirectory() as tmp:
        cases = capture_demo(tmp) + capture_study(tmp) + capture_sweep(tmp) + capture_main(tm_study, TM_STUDY, tmp) \
            + capture_main(tm_keys, TM_KEYS, tmp)
    Path(sys.argv[1]).write_text(json.dumps({"captured_from": "main 6c3b1c9", "cases": cases}, indent=1) + "\n")
    print(len(cases), "cases", sum(len(c["train"]) for c in cases), "argument lists")
