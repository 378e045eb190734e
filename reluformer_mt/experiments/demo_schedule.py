"""The demo's jobs on a few one-thread worker processes, each started as soon as what it needs is done.

A family's datastore, tuning and decoding need only its own checkpoint, so they run while the
other families still train: on 2 cores, the core that the last training leaves free is used instead
of idling until every family is trained. :func:`run_jobs` runs the jobs, :func:`simulate` predicts
their duration with the same rule (the demo's time estimate, :mod:`.demo_timing`): whenever a
worker is free it takes the ready job (all its ``after`` jobs done) of the lowest ``rank``, ties in
the order the jobs were given.
"""
import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple


@dataclass
class Job:
    """One call in a worker: ``call(results)`` gives ``(fn, *args)`` once the jobs named in
    ``after`` are done (``results`` holds their return values by name); a lower ``rank`` goes
    first (the demo: every training before any decoding); ``seconds`` is its expected duration
    (for :func:`simulate`)."""

    name: str
    call: Callable[[Dict[str, object]], tuple]
    after: Tuple[str, ...] = ()
    rank: int = 0
    seconds: float = 0.0
    info: dict = field(default_factory=dict)


def _next_ready(jobs: Sequence[Job], done: set, started: set) -> Optional[Job]:
    ready = [j for j in jobs if j.name not in started and all(a in done for a in j.after)]
    return min(ready, key=lambda j: j.rank) if ready else None  # min keeps the first of equal ranks


def _jobs_to_start(jobs: Sequence[Job], done: set, started: set, free: int) -> List[Job]:
    """The next jobs to start on ``free`` idle workers, in order, each marked started: the one rule
    that :func:`run_jobs` runs by and :func:`simulate` plans with."""
    starting = []
    while len(starting) < free:
        job = _next_ready(jobs, done, started)
        if job is None:
            break
        started.add(job.name)
        starting.append(job)
    return starting


def check_jobs(jobs: Sequence[Job]) -> None:
    """Every ``after`` names an earlier job (so the jobs cannot wait on each other forever)."""
    seen = set()
    for job in jobs:
        missing = [a for a in job.after if a not in seen]
        if missing:
            raise ValueError(f"job {job.name!r} waits for {missing}, which are not jobs given before it")
        seen.add(job.name)


def run_jobs(workers: int, jobs: Sequence[Job], submit: Callable,
             on_done: Callable[[Job, object, float], None] = lambda job, result, seconds: None) -> Dict[str, object]:
    """Every job, ``workers`` at a time, through ``submit(job, fn, *args)`` (which returns a future,
    e.g. of a process pool), each as soon as it is ready; ``on_done(job, result, seconds)`` in this
    process when one ends (``seconds``: from its start). Returns ``{name: result}``; the first job
    that fails raises here once the running ones ended."""
    check_jobs(jobs)
    results: Dict[str, object] = {}
    running: Dict[object, Tuple[Job, float]] = {}
    started: set = set()
    while len(results) < len(jobs):
        for job in _jobs_to_start(jobs, set(results), started, workers - len(running)):
            running[submit(job, *job.call(results))] = (job, time.time())
        finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
        for future in finished:
            job, start = running.pop(future)
            if future.exception() is not None:
                wait(list(running))
                raise future.exception()
            results[job.name] = future.result()
            on_done(job, results[job.name], time.time() - start)
    return results


def simulate(jobs: Sequence[Job], workers: int) -> Tuple[float, Dict[str, float]]:
    """(seconds until every job is done, each job's end) when every job takes its ``seconds`` and
    ``workers`` run at once, by the rule of :func:`run_jobs`."""
    check_jobs(jobs)
    now, ends, running, started = 0.0, {}, [], set()  # running: (end, name)
    while len(ends) < len(jobs):
        running += [(now + job.seconds, job.name) for job in _jobs_to_start(jobs, set(ends), started, workers - len(running))]
        running.sort()
        now, name = running.pop(0)
        ends[name] = now
    return now, ends


__all__ = ["Job", "check_jobs", "run_jobs", "simulate"]
