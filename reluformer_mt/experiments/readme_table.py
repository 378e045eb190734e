"""The README's demo table, generated from a demo run's ``summary.json`` (the one place its numbers
live: other docs link to the README instead of copying them).

    python -m reluformer_mt.experiments.readme_table runs/demo/report/summary.json

prints the table of a run (and changes no file);

    python -m reluformer_mt.experiments.readme_table runs/demo/report/summary.json --write

rewrites the block between ``<!-- demo-table:begin`` and ``<!-- demo-table:end -->`` in README.md
and keeps a copy of the summary as ``docs/benchmarks/demo_summary.json``; a test renders that copy
again and fails when the README's block differs from it.
"""
import argparse
import sys
from pathlib import Path

from reluformer_mt.data.outputs import check_distinct_files
from reluformer_mt.data.textfiles import replace_atomically, write_text_atomically
from reluformer_mt.evaluation.mode_table import mode_table
from reluformer_mt.experiments.summaries import SummaryError, read_summary

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SUMMARY_COPY = ROOT / "docs" / "benchmarks" / "demo_summary.json"
BEGIN, END = "<!-- demo-table:begin", "<!-- demo-table:end -->"


def render(summary: dict) -> str:
    """The Markdown table of a summary (:func:`reluformer_mt.evaluation.mode_table.mode_table`):
    every family in every decoding mode, the mode chosen on the validation chapters in bold with its
    d-BLEU, AER, sparsity, training cost; then the baselines."""
    header, rows = mode_table(summary, bold=lambda text: f"**{text}**")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def block(summary: dict) -> str:
    return f"{BEGIN} — generated from docs/benchmarks/demo_summary.json by readme_table.py -->\n{render(summary)}\n{END}"


def rewrite(readme: Path, summary: dict) -> None:
    text = readme.read_text(encoding="utf-8")
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{readme}: no demo table to rewrite; expected a block from '{BEGIN}' to '{END}'")
    write_text_atomically(readme, text[:start] + block(summary) + text[end + len(END):])


def readme_block(readme: Path = README) -> str:
    text = readme.read_text(encoding="utf-8")
    return text[text.index(BEGIN):text.index(END) + len(END)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m reluformer_mt.experiments.readme_table",
                                description="print the README's demo table of a demo run's summary.json "
                                            "(with --write: rewrite README.md's table from it)")
    p.add_argument("summary", help="a demo run's summary.json (runs/demo/report/summary.json)")
    p.add_argument("--write", action="store_true",
                   help="rewrite README.md's demo table and keep a copy of the summary in "
                        "docs/benchmarks/demo_summary.json (without it nothing is written)")
    args = p.parse_args(argv)
    source = Path(args.summary)
    try:
        check_distinct_files([("README.md", README)], [("summary", source)])
    except ValueError as e:
        print(f"readme_table: error: {e}", file=sys.stderr)
        return 2
    try:
        summary = read_summary(source)
    except SummaryError as e:
        print(f"readme_table: error: {e}", file=sys.stderr)
        return 2
    if not args.write:
        print(render(summary))
        return 0
    try:
        rewrite(README, summary)
        SUMMARY_COPY.parent.mkdir(parents=True, exist_ok=True)
        if source.resolve() != SUMMARY_COPY.resolve():
            replace_atomically(SUMMARY_COPY, lambda f: f.write(source.read_bytes()))
    except ValueError as e:  # a README without the table's markers
        print(f"readme_table: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a README or a docs folder that cannot be written (read-only, a full disk)
        print(f"readme_table: error: cannot write {e.filename or README} ({e.strerror or e})", file=sys.stderr)
        return 2
    print(f"README.md's demo table rewritten from {source}; copy kept in {SUMMARY_COPY.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
