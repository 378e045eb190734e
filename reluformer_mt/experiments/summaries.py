"""A demo run's ``summary.json`` read and checked once for the tools that read it (the seed spread,
the README's table): one line naming the file and the field for a summary that is not an object,
has no families, lacks a family's required scores, or holds a score that is not a number."""
import json
import math
from pathlib import Path
from typing import Sequence

# what the demo writes for every family (report tools read them without a fallback)
REQUIRED_SCORES = ("s_bleu", "d_bleu", "aer_head_average")
# scores that may be missing or null (a family without attention, a mode it was not decoded in)
OPTIONAL_SCORES = ("aer_best_head", "cross_sparsity", "cpu_seconds_per_update")
MODE_SCORES = ("s_bleu", "d_bleu")


class SummaryError(ValueError):
    """A summary.json the report tools cannot read: one line naming it."""


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_summary(path, summary, required: Sequence[str] = REQUIRED_SCORES) -> dict:
    """``summary`` (parsed from ``path``) if it is a demo summary: an object whose ``families`` is a
    non-empty object of families, each with the ``required`` scores as numbers (null allowed for
    the AER: a family without cross-attention has none) and any other score, per family and per
    decoding mode, a number or null."""
    def bad(field, expected, value):
        raise SummaryError(f"{path}: {field}: expected {expected}, got {json.dumps(value)[:80]} "
                           "(a reluformer-demo run's report/summary.json)")

    if not isinstance(summary, dict):
        bad("the whole file", "a JSON object", summary)
    families = summary.get("families")
    if not isinstance(families, dict) or not families:
        bad("families", "an object of the families' scores", families)
    for family, scores in families.items():
        if not isinstance(scores, dict):
            bad(f"families.{family}", "an object of scores", scores)
        for key in required:
            if key not in scores:
                raise SummaryError(f"{path}: families.{family}: no {key}; expected the scores "
                                   f"{', '.join(required)} of every family (a reluformer-demo run's report/summary.json)")
        for key in (*REQUIRED_SCORES, *OPTIONAL_SCORES):
            value = scores.get(key)
            nullable = key not in required or key.startswith("aer")  # a family without cross-attention has no AER
            if not (_number(value) or (value is None and nullable)):
                bad(f"families.{family}.{key}", "a number", value)
        modes = scores.get("modes", {})
        if not isinstance(modes, dict):
            bad(f"families.{family}.modes", "an object of decoding modes", modes)
        for mode, values in modes.items():
            if not isinstance(values, dict):
                bad(f"families.{family}.modes.{mode}", "an object of scores", values)
            for key in MODE_SCORES:
                if values.get(key) is not None and not _number(values[key]):
                    bad(f"families.{family}.modes.{mode}.{key}", "a number", values[key])
    baselines = summary.get("baselines", {})
    if not isinstance(baselines, dict) or not all(isinstance(v, dict) for v in baselines.values()):
        bad("baselines", "an object of the baselines' scores", baselines)
    for name, values in baselines.items():
        for key, value in values.items():
            if key in ("s_bleu", "d_bleu", "aer") and not _number(value):
                bad(f"baselines.{name}.{key}", "a number", value)
    return summary


def read_summary(path, required: Sequence[str] = REQUIRED_SCORES) -> dict:
    """``path`` parsed and checked (:func:`check_summary`)."""
    path = Path(path)
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SummaryError(f"{path}: no such file (a reluformer-demo run's report/summary.json)") from None
    except IsADirectoryError:
        raise SummaryError(f"{path}: a directory; expected a reluformer-demo run's report/summary.json") from None
    except (OSError, ValueError) as e:
        raise SummaryError(f"{path}: not readable JSON ({e})") from None
    return check_summary(path, summary, required)


__all__ = ["REQUIRED_SCORES", "SummaryError", "check_summary", "read_summary"]
