"""Spawned worker processes of the long studies (the family tuner, the length study): each runs
one training-and-scoring job with one thread, its console output and logs into the job's own log,
so two jobs side by side on a 2-core machine neither oversubscribe the cores nor mix their lines."""
from pathlib import Path


def quiet_worker() -> None:
    """The pool's initializer: before a worker unpickles its first job (which imports fairseq),
    the root logger gets a handler, so fairseq's import-time logging set-up prints nothing (as
    reluformer_mt.cli.checks.quiet_logging does for the console scripts)."""
    import logging
    import sys

    logging.basicConfig(format="%(name)s: %(levelname)s: %(message)s", level=logging.WARNING, stream=sys.stderr)


def run_in_worker(log_file: Path, fn, *args):
    """``fn(*args)`` in this (spawned) worker: one thread, the plugin registered, output into ``log_file``."""
    import contextlib
    import logging

    import torch

    from reluformer_mt.plugin import register

    torch.set_num_threads(1)
    register()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a", encoding="utf-8") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        logging.basicConfig(stream=log, level=logging.INFO, force=True,
                            format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
        return fn(*args)


def spawn_pool(jobs: int):
    """A pool of ``jobs`` spawned (fresh fairseq state), quiet workers."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"), initializer=quiet_worker)
