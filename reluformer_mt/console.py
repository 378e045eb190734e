"""Progress of counted work on standard error: a tqdm bar on a terminal, and on anything else (a
pipe, a log file, where a bar's carriage returns would pile up) a plain line every ``every``
seconds (default: :func:`line_seconds`), as fairseq's own log lines, with the rate and an estimate of the time left; a last line
when the work ends if any line was printed. Imports neither torch nor fairseq.
"""
import os
import sys
import time
from typing import Optional


def line_seconds() -> float:
    """Seconds between two progress lines: RELUFORMER_PROGRESS_SECONDS, else 30."""
    try:
        return max(0.0, float(os.environ.get("RELUFORMER_PROGRESS_SECONDS", 30)))
    except ValueError:
        return 30.0


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


class Progress:
    """``update(n)`` as items are done, ``add(n)`` when more items join (retranslations),
    ``postfix`` for a short state shown after the count; off when ``enabled`` is False."""

    def __init__(self, total: int, desc: str, unit: str, enabled: bool = True, every: Optional[float] = None,
                 stream=None):
        self.total, self.desc, self.unit = total, desc, unit
        self.every = line_seconds() if every is None else every
        self.stream = stream or sys.stderr
        self.done, self.postfix, self.lines = 0, "", 0
        self._shown = None  # (done, total) of the last line printed
        self.started = self._last = time.time()
        self.bar = None
        self.enabled = enabled
        if enabled and getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=unit, leave=False, file=self.stream)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.enabled and time.time() - self._last >= self.every:
            self._line()

    def add(self, n: int) -> None:
        self.total += n
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.refresh()

    def set_postfix(self, text: str) -> None:
        self.postfix = text
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def line(self) -> str:
        """``translate: 120 of 297 segments (40 %) in 1.2 min, about 1.8 min left; 3 retranslated``."""
        seconds = time.time() - self.started
        share = f" ({100 * self.done / self.total:.0f} %)" if self.total else ""
        left = (f", about {_duration(seconds * (self.total - self.done) / self.done)} left"
                if 0 < self.done < self.total else "")
        return (f"{self.desc}: {self.done:,} of {self.total:,} {self.unit}{share} in {_duration(seconds)}{left}"
                + (f"; {self.postfix}" if self.postfix else ""))

    def _line(self) -> None:
        self._last, self._shown = time.time(), (self.done, self.total)
        self.lines += 1
        print(self.line(), file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.lines and self._shown != (self.done, self.total):  # the last count
            self._line()
