"""The demo's table of every decoding mode, from a run's ``summary.json``: the README's table
(``reluformer_mt.experiments.readme_table`` writes it as Markdown) and the HTML report's (the
same columns, so the page carries what the README shows). Cells are strings; the mode chosen on
the validation chapters goes through ``bold``.
"""
from typing import Callable, List, Tuple

NAMES = {"reluformer": "ReLUFormer", "rela": "ReLA", "softmax": "softmax", "softmax+tm": "softmax + translation memory"}
MODE_COLUMNS = (("constrained", "s-BLEU"), ("sentence", "verse by verse"), ("pieces", "+ pieces"),
                ("knn", "+ kNN-MT"), ("knn-memory", "+ kNN-MT (per-input)"), ("knn+pieces", "+ kNN-MT + pieces"),
                ("tm-first", "TM-first (best mode)"))
TAIL = ["d-BLEU (chosen mode)", "AER (head average)", "exact zeros in cross-attention", "training CPU s/update"]


def family_name(family: str) -> str:
    name, _, memory = family.partition("+")
    return NAMES.get(family, NAMES.get(name, name) + (f" + {memory}" if memory else ""))


def number(value, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def mode_table(summary: dict, bold: Callable[[str], object] = lambda text: text) -> Tuple[List[str], List[list]]:
    """(header, rows): every family in every decoding mode the run has, the chosen mode through
    ``bold`` with its d-BLEU, AER, sparsity, training cost; then the baselines."""
    families = summary["families"]
    columns = [(m, label) for m, label in MODE_COLUMNS if any(m in f.get("modes", {}) for f in families.values())]
    header = ["model"] + [label for _, label in columns] + TAIL
    rows = [[family_name(family)] + _family_cells(f, columns, bold) for family, f in families.items()]
    return header, rows + _baseline_rows(summary.get("baselines", {}), len(columns))


def _family_cells(f: dict, columns, bold) -> list:
    modes, best = f.get("modes", {}), f.get("best_mode", "constrained")
    cells = []
    for mode, _ in columns:
        text = number(modes.get(mode, {}).get("s_bleu", f["s_bleu"] if mode == "constrained" else None))
        cells.append(bold(text) if mode == best and text else text)
    sparsity = f.get("cross_sparsity")
    return cells + [number(modes.get(best, {}).get("d_bleu", f["d_bleu"])), number(f["aer_head_average"]),
                    "" if sparsity is None else f"{sparsity:.0%}".replace("%", " %"),
                    number(f.get("cpu_seconds_per_update"), 3)]


def _baseline_rows(base: dict, n_columns: int) -> List[list]:
    blank = [""] * (n_columns - 1)
    rows = [[label, number(base[key]["s_bleu"])] + blank + [number(base[key]["d_bleu"]), "", "", ""]
            for key, label in (("nearest_verse", "baseline: copy the nearest training verse"),
                               ("tm_copy", "baseline: copy the memory's best match")) if key in base]
    if "diagonal" in base:
        rows.append(["baseline: diagonal alignment", ""] + blank + ["", number(base["diagonal"]["aer"]), "", ""])
    return rows
