"""The demo's console: one line per stage with its time, the time so far and an estimate of what
is left; everything a stage prints or logs (fairseq's training logs and model printouts, hydra's
deprecation warnings, progress bars) goes to a log file in the run folder instead.

The estimate starts from the expected seconds of each stage, from the stored measurement of a
whole run (:mod:`reluformer_mt.experiments.demo_timing`, scaled to the run's options), and rescales
them by how much slower or faster the finished stages ran here, so a GPU, a larger model or a busy
machine correct it after the first stages.
"""
import contextlib
import logging
import re
import sys
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from reluformer_mt.console import line_seconds
from reluformer_mt.experiments.demo_timing import stage_plan

SKIPPED_SHARE = 0.2  # a stage far faster than expected was skipped (already done): no evidence of speed


def demo_plan(o) -> List[Tuple[str, float]]:
    """(stage kind, expected seconds) of every stage of ``run_demo`` with options ``o``, in order,
    from the stored measured run (:func:`reluformer_mt.experiments.demo_timing.stage_plan`).
    A stage added to ``run_demo`` needs its row there (a test counts them)."""
    return stage_plan(o)


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def remaining_estimate(expected: Sequence[float], actual: Sequence[float]) -> float:
    """Seconds left: the expected seconds of the stages not done (``expected[len(actual):]``),
    scaled by actual / expected over the finished stages that really ran."""
    ran = [(e, a) for e, a in zip(expected, actual) if a >= SKIPPED_SHARE * e]
    scale = sum(a for _, a in ran) / sum(e for e, _ in ran) if ran and sum(e for e, _ in ran) > 0 else 1.0
    return scale * sum(expected[len(actual):])


@contextlib.contextmanager
def _console_to(stream):
    """Send sys.stdout, sys.stderr and the root logger's console handlers to ``stream``."""
    consoles = [h for h in logging.getLogger().handlers
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
                and getattr(h, "stream", None) in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)]
    old_streams = [h.setStream(stream) for h in consoles]
    try:
        with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
            yield
    finally:
        for handler, old in zip(consoles, old_streams):
            handler.setStream(old)


class Stages:
    """Numbered stages: ``with stages.stage(name):`` prints one line when the stage ends, e.g.
    ``[demo 2/6] train reluformer: 8.2 min (total 8.4 min, about 15.9 min left)``, and keeps the
    seconds of each stage in ``times``. With a ``log_file``, what the stage prints goes there."""

    def __init__(self, total: Optional[int] = None, plan: Optional[Sequence[Tuple[str, float]]] = None,
                 log_file: Optional[Path] = None, console=None):
        self.expected = [seconds for _, seconds in plan] if plan else []
        self.total = len(self.expected) if plan else total
        self.done, self.times, self.started = 0, {}, time.time()
        self.log_file, self.console = log_file, console or sys.stdout
        self._actual: List[float] = []
        self._open = False  # a stage's line printed without its end yet
        self._lock = threading.Lock()  # notes come from progress threads

    def announce(self) -> None:
        """The opening line: where the logs go and the expected duration."""
        expected = f"; expected about {minutes(sum(self.expected))} on 2 CPU cores" if self.expected else ""
        where = f"; fairseq's logs: {self.log_file}" if self.log_file else ""
        print(f"[demo] {self.total} stages{expected}{where}", file=self.console, flush=True)

    def left(self) -> str:
        if not self.expected or len(self._actual) >= len(self.expected):
            return ""
        return f", about {minutes(remaining_estimate(self.expected, self._actual))} left"

    def note(self, text: str) -> None:
        """A line within the running stage (its progress), indented under the stage's line."""
        with self._lock:
            if self._open:  # the stage's line waits for its time: end it first
                print(file=self.console)
                self._open = False
            print(f"  {text}", file=self.console, flush=True)

    def _close(self, number: str, name: str, text: str) -> None:
        """The end of a stage's line, or a line of its own when notes came between."""
        with self._lock:
            print(f" {text}" if self._open else f"{number} {name}: {text}", file=self.console, flush=True)
            self._open = False

    @contextlib.contextmanager
    def stage(self, name: str, planned: bool = True):
        """A numbered stage of the plan; ``planned=False``: a short step after them (the report), with
        the same line and log but no number and no part in the estimate."""
        if planned:
            self.done += 1
            self.total = max(self.total or 0, self.done)  # an unplanned stage still gets a sensible counter
        number = f"[demo {self.done}/{self.total}]" if planned else "[demo]"
        with self._lock:
            print(f"{number} {name} ...", end="", file=self.console, flush=True)
            self._open = True
        start = time.time()
        log = None
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            log = open(self.log_file, "a", encoding="utf-8")
            print(f"\n===== [demo {self.done}/{self.total}] {name}", file=log, flush=True)
        try:
            with _console_to(log) if log else contextlib.nullcontext():
                yield
        except BaseException:
            self._close(number, name, f"failed after {minutes(time.time() - start)}"
                        + (f" (log: {self.log_file})" if self.log_file else ""))
            raise
        finally:
            if log:
                log.close()
        seconds = time.time() - start
        self.times[name] = round(seconds, 1)
        if planned:
            self._actual.append(seconds)
        self._close(number, name, f"{minutes(seconds)} (total {minutes(time.time() - self.started)}{self.left()})")



# ---------------------------------------------------------------- progress within a long stage (issue 33)

_UPDATES = re.compile(r"""num_updates["'=:\s]+"?(\d+)""")  # fairseq's simple, tqdm and json log formats


def last_updates(text: str) -> Optional[int]:
    """The last ``num_updates`` a fairseq training log reports (None before the first log line)."""
    found = _UPDATES.findall(text)
    return int(found[-1]) if found else None


def updates_in_file(path) -> Callable[[], Optional[int]]:
    """A reader of the updates done so far from a fairseq ``--log-file`` (its last 64 KiB)."""
    def read() -> Optional[int]:
        try:
            with open(path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 65536))
                return last_updates(f.read().decode("utf-8", "replace"))
        except OSError:  # not created yet
            return None
    return read


def progress_line(desc: str, done: int, total: Optional[int], seconds: float, rate: Optional[float]) -> str:
    """``train: 1,250 of 2,500 updates (50 %) in 4.1 min, 5.1 updates/s, about 4.1 min left``."""
    of = f" of {total:,}" if total else ""
    share = f" ({100 * done / total:.0f} %)" if total else ""
    speed = f", {rate:.2f} updates/s" if rate else ""
    left = f", about {minutes((total - done) / rate)} left" if rate and total and done < total else ""
    return f"{desc}: {done:,}{of} updates{share} in {minutes(seconds)}{speed}{left}"


class TrainingProgress:
    """Progress of a training stage that runs elsewhere (a child process, or fairseq in this
    process with its output sent to a log): updates done of ``total``, the rate and the time left.
    ``updates``: a callable giving the updates done so far (:func:`updates_in_file`), polled every
    ``interval`` seconds (fairseq logs every --log-interval updates, so the count moves at that pace).

    On a terminal console a tqdm bar; on any other console (a pipe, a log file) a plain line every
    ``line_interval`` seconds (RELUFORMER_PROGRESS_SECONDS, else 30) and one at the end, through ``say`` (default: a line on the console;
    the demo's ``Stages.note``), as fairseq's own log lines; nothing when ``enabled`` is False
    (``--no-progress``)::

        with TrainingProgress(updates_in_file(log), total=2500, desc="train reluformer", console=stages.console):
            run_fairseq("train", argv)
    """

    def __init__(self, updates: Callable[[], Optional[int]], total: Optional[int], desc: str = "train",
                 console=None, enabled: Optional[bool] = None, interval: float = 5.0,
                 line_interval: Optional[float] = None, say: Optional[Callable[[str], None]] = None):
        self.updates, self.total, self.desc, self.interval = updates, total, desc, interval
        self.console = console or sys.stderr
        isatty = getattr(self.console, "isatty", lambda: False)
        self.enabled = enabled is not False
        self.mode = None if not self.enabled else "bar" if isatty() else "lines"
        self.line_interval = line_seconds() if line_interval is None else line_interval
        self.say = say or (lambda text: print(text, file=self.console, flush=True))
        self._stop = threading.Event()
        self._thread = None
        self.bar = None
        self._started = self._last_line = 0.0
        self._first: Optional[Tuple[float, int]] = None  # (time, updates) of the first count seen
        self._shown: Optional[int] = None

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            self._refresh()

    def _refresh(self, final: bool = False) -> None:
        done = self.updates()
        if done is None:
            return
        if self.bar is not None:
            if done != self.bar.n:
                self.bar.n = min(done, self.bar.total) if self.bar.total else done
                self.bar.refresh()
            return
        now = time.time()
        if self._first is None:
            self._first = (now, done)
        if done != self._shown and (final or now - self._last_line >= self.line_interval):
            self._last_line, self._shown = now, done
            self.say(progress_line(self.desc, done, self.total, now - self._started, self._rate(now, done)))

    def _rate(self, now: float, done: int) -> Optional[float]:
        """Updates per second since the first count seen (start-up excluded)."""
        then, first = self._first
        return (done - first) / (now - then) if now > then and done > first else None

    def __enter__(self):
        self._started = self._last_line = time.time()
        if self.mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=self.total or None, desc=self.desc, unit="upd", file=self.console,
                            dynamic_ncols=True, leave=False, mininterval=0)
        if self.mode is not None:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._refresh(final=True)  # the final count
        if self.bar is not None:
            self.bar.close()
        return False
