"""The demo's jobs and their time model: the scheduler starts each job once what it needs is done,
the simulation predicts the same order, and a measured run's report gives back its own durations."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reluformer_mt.experiments.demo_schedule import Job, run_jobs, simulate


def toy_jobs(scale: float = 1.0):
    """Two long trainings and one short one on 2 workers; each decoding waits for its training and
    comes after every training (rank 1)."""
    return [Job("train a", None, (), 0, 4 * scale), Job("train b", None, (), 0, 2 * scale),
            Job("train c", None, (), 0, 3.5 * scale),
            Job("decode a", None, ("train a",), 1, 1 * scale), Job("decode b", None, ("train b",), 1, 1 * scale),
            Job("decode c", None, ("train c",), 1, 1 * scale)]


def test_simulation_fills_the_core_the_last_training_leaves_free():
    total, ends = simulate(toy_jobs(), 2)
    # a and b start; b ends at 2, c (a training, before any decoding) takes its worker until 5.5;
    # at 4 the free worker decodes a (the first given of the ready ones) and b while c trains
    assert ends == {"train b": 2, "train a": 4, "decode a": 5, "train c": 5.5, "decode b": 6, "decode c": 6.5}
    assert total == 6.5


def test_jobs_run_in_the_simulated_order_with_the_results_they_wait_for():
    # a unit of 0.4 s: the closest ends are half a unit apart, which a loaded machine's thread
    # scheduling (the full suite beside a training run) overran at 0.1 s a unit
    scale = 0.4
    jobs, order, lock = toy_jobs(scale), [], threading.Lock()

    def work(name, seconds, needed):
        time.sleep(seconds)
        with lock:
            order.append(name)
        return {"name": name, "needed": needed}

    for job in jobs:
        job.call = lambda done, job=job: (work, job.name, job.seconds, [done[a]["name"] for a in job.after])
    seen = []
    with ThreadPoolExecutor(2) as pool:
        results = run_jobs(2, jobs, lambda job, fn, *args: pool.submit(fn, *args),
                           lambda job, result, seconds: seen.append((job.name, seconds)))
    assert results["decode a"]["needed"] == ["train a"] and results["train a"]["needed"] == []
    _, ends = simulate(toy_jobs(), 2)
    assert order == sorted(ends, key=ends.get)  # the order the simulation predicts
    assert [name for name, _ in seen] == order and all(s > 0.9 * scale for _, s in seen)


def test_a_job_that_waits_for_a_later_one_is_refused():
    with pytest.raises(ValueError, match="waits for"):
        simulate([Job("decode", None, ("train",), 1, 1.0), Job("train", None, (), 0, 1.0)], 2)


def test_a_failing_job_raises_in_the_caller():
    def boom():
        raise RuntimeError("broken job")

    with ThreadPoolExecutor(2) as pool, pytest.raises(RuntimeError, match="broken job"):
        run_jobs(2, [Job("x", lambda done: (boom,))], lambda job, fn, *args: pool.submit(fn, *args))


def measured_report(options, job_seconds, stage_seconds):
    return {"command": "reluformer-demo --out runs/demo", "options": options, "total_seconds": 1800.0,
            "versions": {"cpus": "2", "cpu_model": "test CPU"}, "stage_seconds": stage_seconds,
            "translated_chapter": {"seconds": 9.0},
            "models": {f: {"job_seconds": s} for f, s in job_seconds.items()}}


def test_a_measured_runs_report_gives_back_its_own_stage_times():
    """The stored model made from a run (demo_timing --write) predicts that run's stages: each
    job's seconds as measured, hence the merged stage as its schedule, and the stages around it."""
    from dataclasses import asdict

    from reluformer_mt.experiments.demo import DemoOptions
    from reluformer_mt.experiments.demo_timing import family_jobs, stage_plan, timing_from_report

    o = DemoOptions(out=Path("x"), families=["reluformer", "softmax", "softmax+tm"])
    options = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(o).items()}
    seconds = {"reluformer": {"train": 900.0, "tune": 200.0, "guided": 80.0, "plain": 20.0},
               "softmax": {"train": 800.0, "tune": 120.0, "guided": 40.0, "plain": 15.0},
               "softmax+tm": {"train": 1500.0, "tune": 150.0, "guided": 50.0, "plain": 25.0}}
    stages = {"prepare the bible corpus": 30.0, "train ...": 2100.0, "evaluate: AER": 60.0,
              "write the report: summary": 90.0}
    timing = timing_from_report(measured_report(options, seconds, stages))
    jobs = {j.name: j.seconds for j in family_jobs(o, timing)}
    for family, by_kind in seconds.items():
        assert jobs[f"train {family}"] == pytest.approx(by_kind["train"], abs=0.5)
        assert jobs[f"tune {family}"] == by_kind["tune"] and jobs[f"plain modes {family}"] == by_kind["plain"]
    plan = dict(stage_plan(o, timing))
    assert plan["prepare"] == 30.0 and plan["evaluate"] == pytest.approx(60.0) and plan["report"] == pytest.approx(90.0)
    # the stage took 2100 s: what its jobs' schedule leaves is its overhead, so the plan gives it back
    assert plan["train and decode"] == pytest.approx(2100.0, abs=0.1)
    work = sum(jobs.values())
    assert work / 2 <= plan["train and decode"] - timing["stage_seconds"]["train_and_decode_overhead"] <= work
    with pytest.raises(ValueError, match="job_seconds"):
        timing_from_report(measured_report(options, {"softmax": {}}, stages))


def test_the_stored_model_says_which_run_it_comes_from():
    from reluformer_mt.experiments.demo_timing import load_timing

    timing = load_timing()
    assert "min" in timing["measured"] and set(timing["job_seconds"]) == {"tune", "guided", "plain"}
    assert all(0 < v < 5 for v in timing["train_seconds_per_update"].values())


def test_a_stored_run_of_two_families_keeps_the_others_scaled_to_its_speed():
    """make demo trains two families; storing its run must not drop ReLA and softmax + tm from the
    model make demo-full estimates with: their previous values, scaled by how much faster the
    measured families ran this time."""
    from reluformer_mt.experiments.demo_timing import keep_unmeasured

    previous = {"train_seconds_per_update": {"reluformer": 0.4, "softmax": 0.4, "rela": 0.5, "softmax+tm": 0.6},
                "job_seconds": {"tune": {"reluformer": 100.0, "rela": 200.0}},
                "stage_seconds": {"memory_neighbours": 20.0}}
    measured = {"measured": "a run", "train_seconds_per_update": {"reluformer": 0.2, "softmax": 0.2},
                "job_seconds": {"tune": {"reluformer": 60.0}}, "stage_seconds": {"memory_neighbours": 0.0}}
    merged = keep_unmeasured(measured, previous)
    assert merged["train_seconds_per_update"] == {"reluformer": 0.2, "softmax": 0.2, "rela": 0.25, "softmax+tm": 0.3}
    assert merged["job_seconds"]["tune"] == {"reluformer": 60.0, "rela": 100.0}  # measured values stay as measured
    assert merged["stage_seconds"]["memory_neighbours"] == 10.0 and "rela, softmax+tm" in merged["measured"]
    assert measured["train_seconds_per_update"] == {"reluformer": 0.2, "softmax": 0.2}  # the input is not changed


def test_families_a_run_folder_already_holds_are_not_expected_to_train_again(tmp_path):
    """make demo-full after make demo reuses the trained and tuned families: its estimate counts
    only the new ones' training and tuning (and every family's decoding, which runs again)."""
    from reluformer_mt.experiments.demo_options import DemoOptions
    from reluformer_mt.experiments.demo_timing import REUSED_SECONDS, family_jobs, load_timing, reused_jobs, stage_plan

    o = DemoOptions(out=tmp_path, families=["reluformer", "rela", "softmax", "softmax+tm"])
    fresh = dict(stage_plan(o))["train and decode"]
    for family in ("reluformer", "softmax"):
        (tmp_path / "checkpoints" / family / "document").mkdir(parents=True)
        (tmp_path / "checkpoints" / family / "document" / "train_seconds.txt").write_text("600\n")
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "tune_softmax.json").write_text("{}")
    assert reused_jobs(o) == {"train reluformer", "train softmax", "tune softmax"}
    jobs = {j.name: j.seconds for j in family_jobs(o, load_timing(), reused_jobs(o))}
    assert jobs["train softmax"] == jobs["tune softmax"] == REUSED_SECONDS and jobs["train rela"] > 60
    assert jobs["tune reluformer"] > 60 and jobs["plain modes softmax"] > REUSED_SECONDS
    assert dict(stage_plan(o))["train and decode"] < fresh
    assert reused_jobs(DemoOptions(out=tmp_path, families=o.families, force=True)) == frozenset()


def test_a_run_that_reused_families_stores_only_what_it_timed():
    """make demo-full after make demo: the reused families' training and tuning took seconds of
    loading, not of work. Stored as measured they would make every later estimate of them near 0;
    they are left out, and keep_unmeasured takes them from the previous file."""
    from dataclasses import asdict

    from reluformer_mt.experiments.demo_options import DemoOptions
    from reluformer_mt.experiments.demo_timing import keep_unmeasured, timing_from_report

    o = DemoOptions(out=Path("x"), families=["reluformer", "rela"])
    options = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(o).items()}
    seconds = {"reluformer": {"train": 4.0, "tune": 0.5, "guided": 50.0, "plain": 17.0},
               "rela": {"train": 700.0, "tune": 200.0, "guided": 47.0, "plain": 20.0}}
    stages = {"prepare the bible corpus": 15.0, "train ...": 1000.0, "evaluate: AER": 10.0,
              "write the report: summary": 60.0}
    report = measured_report(options, seconds, stages)
    report["models"]["reluformer"]["reused_jobs"] = ["train", "tune"]
    timing = timing_from_report(report)
    assert set(timing["train_seconds_per_update"]) == {"rela"} and set(timing["job_seconds"]["tune"]) == {"rela"}
    assert timing["job_seconds"]["guided"] == {"reluformer": 50.0, "rela": 47.0}  # decoding ran again: timed
    previous = {"train_seconds_per_update": {"reluformer": 0.3, "rela": 0.3}, "job_seconds": {"tune": {"reluformer": 90.0}}}
    merged = keep_unmeasured(timing, previous)
    assert merged["train_seconds_per_update"]["reluformer"] > 0.1 and merged["job_seconds"]["tune"]["reluformer"] > 60
