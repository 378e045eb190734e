"""How long each stage of ``reluformer-demo`` takes: the model behind its console estimates.

The seconds of each job and stage come from a measured run, stored in ``demo_timing.json`` beside
this module: every family's training seconds per update (two families side by side, one thread
each), the seconds of its tuning and of its decoding modes, and the seconds of the stages around
them. A run of other options is scaled from them (updates per family, chapters decoded, families),
and the stage that trains the families and decodes each one as soon as it is trained is predicted by
simulating its schedule (:func:`reluformer_mt.experiments.demo_schedule.simulate`).

A finished run writes what it measured into its ``report.json`` (``stage_seconds``, each family's
``job_seconds``); the stored file is made from one of them::

    python -m reluformer_mt.experiments.demo_timing runs/demo/report/report.json           # prints it
    python -m reluformer_mt.experiments.demo_timing runs/demo/report/report.json --write   # stores it
"""
import argparse
import json
import os
import sys
from pathlib import Path
from statistics import mean
from typing import Dict, List, Optional, Tuple

from reluformer_mt.experiments.demo_schedule import Job, simulate

TIMING_FILE = Path(__file__).resolve().parent / "demo_timing.json"
ALONE_SPEEDUP = 1.35  # one family training alone on two threads, against one of two side by side (one thread each)
TEST_CHAPTERS = 13  # the held-out chapters of the bible corpus (--eval-chapters 0)
JOB_KINDS = ("train", "tune", "guided", "plain")


def load_timing(path: Path = TIMING_FILE) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _per_family(table: Dict[str, float], family: str) -> float:
    """The family's measured value, else the mean of the measured families of its kind (with or
    without a translation memory)."""
    if family in table:
        return table[family]
    same = [v for f, v in table.items() if ("+" in f) == ("+" in family)] or list(table.values())
    return mean(same) if same else 0.0  # nothing measured (every job reused): no estimate of its own


def family_updates(o, family: str) -> Tuple[int, int]:
    """(phases, updates) of a family's training: the demo's, or the family's tuned split."""
    settings = (getattr(o, "family_settings", None) or {}).get(family.split("+")[0], {})
    sentence, document = settings.get("sentence_updates", o.sentence_updates), settings.get("max_update", o.max_update)
    return (2, sentence + document) if sentence and not o.budget_minutes else (1, document)


def train_seconds(o, family: str, timing: dict, side_by_side: bool = True) -> float:
    if o.budget_minutes:
        return o.budget_minutes * 60
    phases, updates = family_updates(o, family)
    seconds = phases * timing["train_phase_seconds"] + updates * _per_family(timing["train_seconds_per_update"], family)
    return seconds if side_by_side else seconds / ALONE_SPEEDUP


def tunes(o) -> bool:
    return bool(getattr(o, "knn", False)) or getattr(o, "pieces_weight", 0) is None


def decode_scales(o, timing: dict) -> Tuple[float, float]:
    """(tuning, test decoding) scale against the measured run: the validation chapters the tuner
    decodes, the held-out chapters decoded; without kNN-MT only the pieces (about a third of the
    tuner's decodes, a quarter of the guided modes' time)."""
    documents = min((c for c in (o.eval_chapters, o.tune_chapters) if c), default=TEST_CHAPTERS)
    tune = documents / timing["tune_chapters"] * (1.0 if o.knn else 0.3)
    test = (o.eval_chapters or TEST_CHAPTERS) / TEST_CHAPTERS
    return tune, test


REUSED_SECONDS = 5.0  # a job whose results the run folder already holds: loading them


def reused_jobs(o) -> frozenset:
    """The training and tuning jobs whose results ``o.out`` holds from an earlier run (reused, not
    redone, unless ``--force``): a ``make demo-full`` after ``make demo`` trains two families, not four."""
    if getattr(o, "force", False) or not getattr(o, "out", None):
        return frozenset()
    out, done = Path(o.out), set()
    for family in o.families:
        trained = out / "checkpoints" / family
        if (trained / "document" / "train_seconds.txt").is_file() or (trained / "train_seconds.txt").is_file():
            done.add(f"train {family}")
        if (out / "report" / f"tune_{family.replace('+', '_')}.json").is_file():
            done.add(f"tune {family}")
    return frozenset(done)


def family_jobs(o, timing: dict, reused: frozenset = frozenset()) -> List[Job]:
    """The jobs of the stage that trains every family and decodes each one as soon as it is trained,
    in the order given to the scheduler (memory families train first: the longest, so that none starts
    last and alone), without their calls (``reluformer_mt.experiments.demo`` adds them); a job in
    ``reused`` takes :data:`REUSED_SECONDS`."""
    tune_scale, test_scale = decode_scales(o, timing)
    guided_scale = test_scale * (1.0 if o.knn else 0.25)
    jobs = []

    def seconds(name: str, expected: float) -> float:
        return REUSED_SECONDS if name in reused else expected
    for family in sorted(o.families, key=lambda f: "+" not in f):
        jobs.append(Job(f"train {family}", None, (), 0, seconds(f"train {family}", train_seconds(o, family, timing)),
                        {"kind": "train", "family": family}))
    for family in sorted(o.families, key=lambda f: "+" not in f):
        trained = (f"train {family}",)
        if tunes(o):
            jobs.append(Job(f"tune {family}", None, trained, 1,
                            seconds(f"tune {family}", tune_scale * _per_family(timing["job_seconds"]["tune"], family)),
                            {"kind": "tune", "family": family}))
        if tunes(o) or o.pieces_weight:
            after = (f"tune {family}",) if tunes(o) else trained
            jobs.append(Job(f"guided modes {family}", None, after, 2,
                            guided_scale * _per_family(timing["job_seconds"]["guided"], family),
                            {"kind": "guided", "family": family}))
        jobs.append(Job(f"plain modes {family}", None, trained, 3,
                        test_scale * _per_family(timing["job_seconds"]["plain"], family), {"kind": "plain", "family": family}))
    jobs.append(Job("reluformer-translate", None, (f"train {o.families[0]}",), 4, timing["stage_seconds"]["chapter"],
                    {"kind": "chapter", "family": o.families[0]}))
    return jobs


def workers(o) -> int:
    """Jobs at once: ``--jobs`` on a CPU (one thread each), at most one per family; one on a GPU."""
    return max(1, min(o.jobs, len(o.families))) if o.device == "cpu" else 1


def stage_plan(o, timing: Optional[dict] = None, reused: Optional[frozenset] = None) -> List[Tuple[str, float]]:
    """(stage kind, expected seconds) of every stage of ``run_demo`` with options ``o``, in order;
    ``reused``: the jobs whose results the run folder holds (default: :func:`reused_jobs`)."""
    timing = timing or load_timing()
    reused = reused_jobs(o) if reused is None else reused
    stages = timing["stage_seconds"]
    families = len(o.families)
    prepare = stages["prepare"] + (stages["memory_neighbours"] if any("+" in f for f in o.families) else 0.0)
    tail = [("evaluate", stages["evaluate_per_family"] * families), ("report", stages["report_per_family"] * families)]
    if workers(o) > 1:
        seconds, _ = simulate(family_jobs(o, timing, reused), workers(o))
        return [("prepare", prepare), ("train and decode", seconds + stages["train_and_decode_overhead"])] + tail
    jobs = family_jobs(o, timing, reused)
    trains = [("train", REUSED_SECONDS if j.name in reused else train_seconds(o, j.info["family"], timing, side_by_side=False))
              for j in jobs if j.info["kind"] == "train"]
    decode = sum(j.seconds for j in jobs if j.info["kind"] in ("tune", "guided", "plain")) / ALONE_SPEEDUP
    return ([("prepare", prepare)] + trains + [("decode", decode), tail[0], ("translate", stages["chapter"]), tail[1]])


# ------------------------------------------------------------------ a measured run -> the stored file

def timing_from_report(report: dict) -> dict:
    """The stored file's content from a finished run's ``report.json`` (a run of the merged stage:
    every family's ``job_seconds``)."""
    options, models, stages = report["options"], report["models"], report["stage_seconds"]
    missing = [f for f, m in models.items() if not m.get("job_seconds")]
    if missing:
        raise ValueError(f"report.json: no job_seconds for {missing} (a run with --jobs 2 on a CPU writes them)")

    def stage(prefix: str) -> float:
        return next(v for k, v in stages.items() if k.startswith(prefix))

    families, o = len(models), argparse.Namespace(**options)
    # a job whose results an earlier run left (make demo-full after make demo) timed no work: left
    # out of the tables (keep_unmeasured fills them) and scheduled at REUSED_SECONDS below
    reused = frozenset(f"{kind} {f}" for f, m in models.items() for kind in m.get("reused_jobs", []))
    rates = {}
    for family, m in models.items():
        if f"train {family}" not in reused:
            phases, updates = family_updates(o, family)
            rates[family] = round((m["job_seconds"]["train"] - phases * 10.0) / max(1, updates), 4)
    timing = {"measured": f"reluformer-demo {' '.join(report.get('command', '').split()[1:])}, commit "
                          f"{report.get('commit', '?')}, {report['versions']['cpus']} CPUs "
                          f"({report['versions']['cpu_model']}), total {report['total_seconds'] / 60:.1f} min",
              "train_phase_seconds": 10.0, "train_seconds_per_update": rates,
              "tune_chapters": min((c for c in (options["eval_chapters"], options["tune_chapters"]) if c),
                                   default=TEST_CHAPTERS),
              "job_seconds": {kind: {f: m["job_seconds"].get(kind, 0.0) for f, m in models.items()
                                     if f"{kind} {f}" not in reused}
                              for kind in ("tune", "guided", "plain")},
              "stage_seconds": {"prepare": stage("prepare"), "memory_neighbours": 0.0,
                                "evaluate_per_family": round(stage("evaluate") / families, 1),
                                "report_per_family": round(stage("write the report") / families, 1),
                                "chapter": report.get("translated_chapter", {}).get("seconds", 15.0)}}
    # what the stage took beyond its jobs' schedule: the workers' start, the scores' collection
    scheduled, _ = simulate(family_jobs(o, timing, reused), workers(o))
    timing["stage_seconds"]["train_and_decode_overhead"] = round(max(0.0, stage("train ") - scheduled), 1)
    return timing


def keep_unmeasured(timing: dict, previous: dict) -> dict:
    """``timing`` with the families (and the memory families' neighbour stage) that its run did not
    train taken from ``previous``, scaled by how much faster or slower the measured families ran
    this time (the median ratio of their training seconds per update), so that ``make demo-full``
    keeps an estimate for ReLA and softmax + tm after a ``make demo`` of two families is stored."""
    new, old = timing["train_seconds_per_update"], previous.get("train_seconds_per_update", {})
    ratios = sorted(new[f] / old[f] for f in new if old.get(f))
    if not ratios:
        return timing
    speed = ratios[len(ratios) // 2]
    merged = json.loads(json.dumps(timing))
    for family, value in old.items():
        merged["train_seconds_per_update"].setdefault(family, round(value * speed, 4))
    for kind, table in previous.get("job_seconds", {}).items():
        for family, value in table.items():
            merged["job_seconds"].setdefault(kind, {}).setdefault(family, round(value * speed, 1))
    if not merged["stage_seconds"].get("memory_neighbours"):
        merged["stage_seconds"]["memory_neighbours"] = round(
            previous.get("stage_seconds", {}).get("memory_neighbours", 0.0) * speed, 1)
    kept = sorted(set(old) - set(new))
    if kept:
        merged["measured"] += (f"; {', '.join(kept)} not in this run: the previous file's values x {speed:.2f} "
                               "(the measured families' speed against it)")
    return merged


def check_report(report) -> None:
    """A ValueError saying which field is not what a finished run's report.json holds: a JSON object
    with ``options``, ``stage_seconds``, ``versions`` and ``models`` objects, each model an object
    with a ``job_seconds`` object."""
    if not isinstance(report, dict):
        raise ValueError(f"a JSON object, got a {type(report).__name__}")
    for field in ("options", "models", "stage_seconds", "versions"):
        if not isinstance(report.get(field), dict):
            raise ValueError(f"{field}: an object, got {type(report.get(field)).__name__}")
    for family, model in report["models"].items():
        if not isinstance(model, dict) or not isinstance(model.get("job_seconds", {}), dict):
            raise ValueError(f"models.{family}: an object with a job_seconds object")


def main(argv=None) -> int:
    from reluformer_mt.data.textfiles import write_text_atomically

    p = argparse.ArgumentParser(prog="python -m reluformer_mt.experiments.demo_timing",
                                description="the demo's time model (demo_timing.json) from a finished run's report.json")
    p.add_argument("report", help="a finished run's report.json (runs/demo/report/report.json)")
    p.add_argument("--write", action="store_true", help=f"store it as {TIMING_FILE.name} (the demo's estimates)")
    args = p.parse_args(argv)
    try:
        folder = TIMING_FILE.parent
        if args.write and not (folder.is_dir() and os.access(folder, os.W_OK)):  # before any work
            raise OSError(f"--write: cannot write {TIMING_FILE}: {folder} is not a writable folder")
        report = json.loads(Path(args.report).read_text(encoding="utf-8"))
        check_report(report)
        timing = keep_unmeasured(timing_from_report(report), load_timing())
        text = json.dumps(timing, indent=1) + "\n"
        if args.write:
            write_text_atomically(TIMING_FILE, text)  # a killed write leaves the old file whole
    except (ValueError, KeyError, TypeError, AttributeError, StopIteration) as e:
        print(f"demo_timing: error: {args.report}: expected a finished demo run's report.json: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"demo_timing: error: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
