"""Reports: readable tables for the terminal and JSON files (NaN written as null)."""
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from reluformer_mt.data.textfiles import write_text_atomically


def to_jsonable(obj: Any) -> Any:
    """Plain JSON types: dataclasses and objects with to_dict become dicts, tensors lists, NaN null."""
    if hasattr(obj, "to_dict"):
        return to_jsonable(obj.to_dict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if hasattr(obj, "tolist"):  # torch tensors, numpy arrays and scalars
        return to_jsonable(obj.tolist())
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_json(path, report: dict, command: str = "") -> None:
    """Write ``report`` with the command line and time it came from."""
    body = {"command": command or " ".join(sys.argv), "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            **to_jsonable(report)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    # whole or not at all: a killed run or a full disk leaves the previous report intact
    write_text_atomically(path, json.dumps(body, indent=1, ensure_ascii=False, allow_nan=False) + "\n")


def _cell(value: Any, digits: int) -> str:
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 2) -> str:
    """Left-aligned first column, right-aligned others; floats with ``digits`` decimals, NaN as n/a."""
    cells = [[str(h) for h in headers]] + [[_cell(v, digits) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, r in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 2) -> str:
    """A GitHub-flavoured Markdown table (numbers right-aligned); '|' in cells escaped."""
    def cell(value: Any) -> str:
        return _cell(value, digits).replace("|", "\\|")

    numeric = [i > 0 for i in range(len(headers))]
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |",
             "|" + "|".join("---:" if right else ":---" for right in numeric) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_table_files(report_dir, headers: Sequence[str], rows: Sequence[Sequence[Any]], notes: Sequence[str] = (),
                      title: str = "Results", digits: int = 2) -> str:
    """``table.md`` (a Markdown table, then the fixed-width one in a code block, then ``notes``) and
    ``table.json`` (headers, rows, notes: what the HTML report renders); returns the fixed-width table."""
    report_dir = Path(report_dir)
    fixed = format_table(headers, rows, digits)
    text = [f"# {title}", "", markdown_table(headers, rows, digits), "", "The same table in fixed width:", "",
            "```text", fixed, "```"]
    if notes:
        text += ["", "Published points of comparison:", ""] + [f"- {n}" for n in notes]
    write_text_atomically(report_dir / "table.md", "\n".join(text) + "\n")
    write_json(report_dir / "table.json", {"headers": list(headers), "rows": [list(r) for r in rows],
                                           "notes": list(notes)})
    return fixed
