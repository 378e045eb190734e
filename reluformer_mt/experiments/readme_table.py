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
from reluformer_mt.experiments.summaries import SummaryError, read_summary

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SUMMARY_COPY = ROOT / "docs" / "benchmarks" / "demo_summary.json"
BEGIN, END = "<!-- demo-table:begin", "<!-- demo-table:end -->"
NAMES = {"reluformer": "ReLUFormer", "rela": "ReLA", "softmax": "softmax", "softmax+tm": "softmax + translation memory"}
MODE_COLUMNS = (("constrained", "s-BLEU"), ("sentence", "verse by verse"), ("pieces", "+ pieces"),
                ("knn", "+ kNN-MT"), ("knn-memory", "+ kNN-MT (per-input)"), ("knn+pieces", "+ kNN-MT + pieces"),
                ("tm-first", "TM-first (best mode)"))


def _name(family: str) -> str:
    family_name, _, memory = family.partition("+")
    return NAMES.get(family, NAMES.get(family_name, family_name) + (f" + {memory}" if memory else ""))


def render(summary: dict) -> str:
    """The Markdown table of a summary: every family in every decoding mode, the mode chosen on the
    validation chapters in bold with its d-BLEU, AER, sparsity, training cost; then the baselines."""
    families = summary["families"]
    columns = [(m, label) for m, label in MODE_COLUMNS if any(m in f.get("modes", {}) for f in families.values())]
    header = ["model"] + [label for _, label in columns] + ["d-BLEU (chosen mode)", "AER (head average)",
                                                            "exact zeros in cross-attention", "training CPU s/update"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def number(value, digits=2):
        return "" if value is None else f"{value:.{digits}f}"

    for family, f in families.items():
        modes, best = f.get("modes", {}), f.get("best_mode", "constrained")
        cells = []
        for mode, _ in columns:
            value = modes.get(mode, {}).get("s_bleu", f["s_bleu"] if mode == "constrained" else None)
            text = number(value)
            cells.append(f"**{text}**" if mode == best and text else text)
        chosen = modes.get(best, {}).get("d_bleu", f["d_bleu"])
        sparsity = f.get("cross_sparsity")
        cells += [number(chosen), number(f["aer_head_average"]), "" if sparsity is None else f"{sparsity:.0%}".replace("%", " %"),
                  number(f.get("cpu_seconds_per_update"), 3)]
        lines.append("| " + " | ".join([_name(family)] + cells) + " |")
    base = summary.get("baselines", {})
    blank = [""] * (len(columns) - 1)
    for key, label in (("nearest_verse", "baseline: copy the nearest training verse"),
                       ("tm_copy", "baseline: copy the memory's best match")):
        if key in base:
            lines.append("| " + " | ".join([label, number(base[key]["s_bleu"])] + blank
                                           + [number(base[key]["d_bleu"]), "", "", ""]) + " |")
    if "diagonal" in base:
        lines.append("| " + " | ".join(["baseline: diagonal alignment", ""] + blank
                                       + ["", number(base["diagonal"]["aer"]), "", ""]) + " |")
    return "\n".join(lines)


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
