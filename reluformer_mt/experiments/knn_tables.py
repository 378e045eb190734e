"""The decoding-mode tables of docs/history/KNN_MT.md, rendered from a demo run's ``report.json``:

    python -m reluformer_mt.experiments.knn_tables runs/demo/report/report.json

prints four Markdown tables: s-BLEU of every family in every decoding mode (with the mode chosen on
validation), the same by fuzzy band of the verse's best memory match beside copying the match,
fallbacks and translation seconds per mode, and the values the tuner chose. Nothing is computed
here: every number is read from the report, so the doc's tables can be checked against the run.
"""
import argparse
import json
import sys
from pathlib import Path
from typing import List

MODES = ("constrained", "sentence", "pieces", "knn", "knn-memory", "knn+pieces")
HEADERS = ("document translator", "verse by verse", "+ pieces", "+ kNN-MT", "+ kNN-MT per-input", "+ kNN-MT + pieces")


def _table(header: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _bleu(value) -> str:
    return "" if value is None else f"{value:.2f}"


def modes_table(report: dict) -> str:
    rows = [[family] + [_bleu(m["modes"].get(mode, {}).get("s_bleu")) for mode in MODES] + [m.get("best_mode", "")]
            for family, m in report["models"].items()]
    base = report.get("baselines", {})
    for key, name in (("nearest_verse", "baseline: nearest training verse"),
                      ("tm_copy", "baseline: copy of the memory's best match")):
        if key in base:
            rows.append([name, _bleu(base[key]["s_bleu"])] + [""] * len(MODES))
    return _table(["model", *HEADERS, "chosen on validation"], rows)


def bands_table(report: dict) -> str:
    rows = []
    for family, m in report["models"].items():
        for band in m.get("bands", {}).get("bands", []):
            rows.append([f"{family}: {band['band']}", str(band["sentences"])]
                        + [_bleu(band.get(mode)) for mode in MODES] + [_bleu(band.get("copy of the match"))])
    return _table(["model: band", "verses", *HEADERS, "copy of the match"], rows)


def cost_table(report: dict) -> str:
    rows = []
    for family, m in report["models"].items():
        cells = []
        for mode in MODES:
            r = m["modes"].get(mode)
            cells.append("" if r is None else f"{r['fallbacks']}/{r['segments']}, {r['translate_seconds']:.1f} s")
        rows.append([family] + cells)
    return _table(["model", *HEADERS], rows)


def _knn_setting(chosen: dict) -> str:
    o = chosen["options"]
    scale = f"T {o['temperature']:.3g}" if o["readout"] == "softmax" else f"radius {o['radius']:.3g}"
    if o.get("adaptive"):
        return f"adaptive ({o['readout']}, k <= 16, {scale})"
    return f"{o['readout']}, {o['k']}, {o['lam']:g}, {scale}"


def tuner_table(report: dict) -> str:
    rows = []
    for family, m in report["models"].items():
        chosen = m.get("tuned", {}).get("chosen", {})
        pieces = chosen.get("pieces")
        context = "verse by verse" if m["modes"].get("pieces", {}).get("segments") == m.get("verses") else "segments"
        cap = (pieces or {}).get("pieces_length_cap")
        row = [family, "" if not pieces else f"{pieces['pieces_weight']:g} / {pieces['pieces_floor']:g} / {context} / "
                                             + (f"{cap:g}x" if cap else "none")]
        for store in ("full", "per_input"):
            c = chosen.get(store)
            if not c:
                row += ["", ""]
                continue
            scores = [c["by_readout"].get("softmax"), c["by_readout"].get("relu")]
            if store == "full":
                scores.append(c.get("adaptive_s_bleu"))
            row += [_knn_setting(c), " / ".join(_bleu(s) for s in scores)]
        rows.append(row)
    return _table(["model", "pieces (weight / floor / context / length cap)", "kNN full: read-out, k, lambda, T or radius",
                   "valid s-BLEU softmax / relu read-out / adaptive", "kNN per-input: read-out, k, lambda, T or radius",
                   "valid s-BLEU softmax / relu read-out"], rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m reluformer_mt.experiments.knn_tables",
                                description="docs/history/KNN_MT.md's decoding-mode tables from a demo run's report.json")
    p.add_argument("report", help="a demo run's report.json (runs/demo/report/report.json)")
    args = p.parse_args(argv)
    path = Path(args.report)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        p.error(f"{path}: {e}")
    if not isinstance(report, dict) or not isinstance(report.get("models"), dict):
        p.error(f"{path}: expected a demo report with 'models'")
    for title, render in (("s-BLEU by decoding mode", modes_table), ("s-BLEU by fuzzy band", bands_table),
                          ("fallbacks / segments and seconds", cost_table), ("chosen on validation", tuner_table)):
        print(f"### {title}\n\n{render(report)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
