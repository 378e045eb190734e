#!/usr/bin/env python
"""CPU seconds per update of ``make demo``'s own fairseq-train, per family and phase.

    python benchmarks/demo_training.py DATA --families softmax,reluformer,softmax+tm --updates 40 --reps 2
    python benchmarks/demo_training.py DATA --families softmax+tm --profile cprofile   # where an update goes

``DATA`` holds the demo's prepared folders ``doc128.v2000`` and ``sentence.v2000`` (``runs/demo/data``
after a demo; a ``+tm`` family needs them prepared with memory neighbours, as the demo prepares them).
Each family trains in this process with the exact arguments the demo gives fairseq-train
(``reluformer_mt.experiments.demo.family_run`` and ``experiments.run.train_args``, the tuned settings
included), for ``--updates`` updates of the ``--phase`` (``sentence`` or ``document``) from fresh
weights, on one thread, validation off unless ``--validate`` (then once, at the end). The clock is
this thread's CPU time (``time.thread_time``), robust on a shared machine: the seconds per update are
those between the end of update ``--skip`` and the last one (start-up and the first updates' memory
growth left out), the validation seconds those of fairseq's ``valid_step`` calls (the loss pass and
the greedy s-BLEU decode). Repetitions run the families in turn (rotating the first), and each family's
median and [min, max] are printed. ``--profile cprofile|torch`` profiles one run instead (functions by
cumulative and own time, or operators by self CPU time). Checkpoints go to a temporary folder.
"""
import argparse
import cProfile
import json
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def demo_train_argv(family: str, phase_name: str, data: Path, save_dir: Path, updates: int, validate: bool):
    """The demo's fairseq-train arguments for one family's phase, cut to ``updates`` updates."""
    from reluformer_mt.cli.demo import build_parser, options_from_args
    from reluformer_mt.experiments.demo import family_run, positions
    from reluformer_mt.experiments.run import train_args

    args = build_parser().parse_args(["--out", str(save_dir)])
    args.device = "cpu"
    run = family_run(options_from_args(args, [family]), family)
    phase = next((p for p in run.phases if p.name == phase_name), None)
    if phase is None:
        raise SystemExit(f"--phase: {family} trains the phases {', '.join(p.name for p in run.phases)}, "
                         f"not {phase_name!r}")
    dirs = {"doc": data / f"doc{run.phases[-1].level}.v2000", "sentence": data / "sentence.v2000"}
    folder = dirs["sentence" if phase.level == "sentence" else "doc"]
    argv = train_args(run, phase, folder, save_dir / family, None, positions(dirs), None)
    # options given last win: the phase's validation interval stays the demo's
    return argv + ["--max-update", str(updates)] + ([] if validate else ["--disable-validation"])


class UpdateClock:
    """The thread's CPU time at the end of every update and inside every validation step."""

    def __init__(self):
        import fairseq.trainer

        self.trainer, self.ends, self.valid = fairseq.trainer.Trainer, [], 0.0
        self.saved = (self.trainer.train_step, self.trainer.valid_step)

    def __enter__(self):
        train_step, valid_step = self.saved
        clock = self

        def timed_train(trainer, *args, **kwargs):
            out = train_step(trainer, *args, **kwargs)
            clock.ends.append(time.thread_time())
            return out

        def timed_valid(trainer, *args, **kwargs):
            start = time.thread_time()
            try:
                return valid_step(trainer, *args, **kwargs)
            finally:
                clock.valid += time.thread_time() - start

        self.trainer.train_step, self.trainer.valid_step = timed_train, timed_valid
        return self

    def __exit__(self, *exc):
        self.trainer.train_step, self.trainer.valid_step = self.saved
        return False


def train_once(argv, skip: int, profile: str = "none", top: int = 40) -> dict:
    from reluformer_mt.fairseq_runner import run_fairseq

    with UpdateClock() as clock:
        if profile == "cprofile":
            profiler = cProfile.Profile(time.thread_time)
            profiler.runcall(run_fairseq, "train", argv)
            stats = pstats.Stats(profiler)
            stats.sort_stats("cumulative").print_stats(top)
            stats.sort_stats("tottime").print_stats(top)
        elif profile == "torch":
            from torch.profiler import ProfilerActivity
            with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
                run_fairseq("train", argv)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))
        else:
            run_fairseq("train", argv)
    ends = clock.ends
    if len(ends) <= skip + 1:
        raise SystemExit(f"--updates: {len(ends)} updates ran; expected more than --skip {skip} + 1")
    return {"seconds_per_update": (ends[-1] - ends[skip]) / (len(ends) - 1 - skip), "valid_seconds": clock.valid}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", type=Path, help="folder with the demo's doc128.v2000 and sentence.v2000")
    p.add_argument("--families", default="reluformer,rela,softmax,softmax+tm")
    p.add_argument("--phase", default="sentence", choices=["sentence", "document"])
    p.add_argument("--updates", type=int, default=40)
    p.add_argument("--skip", type=int, default=5, help="first updates left out of the per-update seconds")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--validate", action="store_true", help="validate once at the end (greedy s-BLEU), timed apart")
    p.add_argument("--profile", choices=["none", "cprofile", "torch"], default="none")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    for name in ("doc128.v2000", "sentence.v2000"):
        if not (args.data / name).is_dir():
            raise SystemExit(f"DATA: {args.data} has no {name}; expected the demo's prepared data folder")
    torch.set_num_threads(1)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    results = {f: [] for f in families}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(1 if args.profile != "none" else args.reps):
            for family in families[rep % len(families):] + families[:rep % len(families)]:
                save = Path(tmp) / f"rep{rep}"
                train = demo_train_argv(family, args.phase, args.data, save, args.updates, args.validate)
                results[family].append(train_once(train, args.skip, args.profile, args.top))
                shutil.rmtree(save, ignore_errors=True)
                print(f"rep {rep} {family}: {results[family][-1]}", file=sys.stderr)
    summary = {}
    for family, runs in results.items():
        per = [r["seconds_per_update"] for r in runs]
        summary[family] = {"seconds_per_update": round(statistics.median(per), 4), "spread": [round(min(per), 4), round(max(per), 4)],
                           "valid_seconds": round(statistics.median(r["valid_seconds"] for r in runs), 2), "runs": len(runs)}
        print(f"{family:12s} {args.phase}: {summary[family]['seconds_per_update']:.4f} CPU s/update "
              f"[{summary[family]['spread'][0]:.4f}, {summary[family]['spread'][1]:.4f}] over {len(runs)} run(s)"
              + (f", validation {summary[family]['valid_seconds']:.2f} s" if args.validate else ""))
    if args.json:
        args.json.write_text(json.dumps({"phase": args.phase, "updates": args.updates, "skip": args.skip,
                                         "families": summary}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
