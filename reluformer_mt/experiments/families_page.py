"""docs/FAMILIES.md from the saved outputs of the family tuner and the length study: the tuning
table (budget, search space, best settings per family), the length table (mean ± std over seeds,
each family minus softmax with the seed verdict), a plot of the gap against length, and each
paper claim as confirmed, not confirmed or contradicted here.

    python -m reluformer_mt.experiments.families_page --tuning runs/tune/tuning.json \\
        --lengths runs/lengths/lengths.json --out docs/FAMILIES.md

Either input may be missing (a study not run yet): its section then says so and how to run it.
"""
import argparse
import json
import logging
import sys
from pathlib import Path
from typing import List, Optional

from reluformer_mt.experiments.lengths import MEASURES

LENGTH_LABELS = {"sentence": "verses", "128": "128 tokens", "512": "512 tokens", "chapter": "whole chapters"}


def read_json(path: Optional[Path], what: str) -> Optional[dict]:
    if path is None or not Path(path).exists():
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e}); expected the {what}") from None
    if not isinstance(data, dict) or "families" not in data:
        raise ValueError(f"{path}: expected the {what} (an object with 'families')")
    return data


def cell(s: Optional[dict], places: int = 2, seeds: int = 0) -> str:
    if s is None:
        return ""
    fewer = f" ({s['n']} of {seeds} seeds)" if seeds and s.get("n", seeds) < seeds else ""
    if s.get("n") == 1:  # one run has no spread
        return f"{s['mean']:.{places}f}{fewer}"
    return f"{s['mean']:.{places}f} ± {s['std']:.{places}f}{fewer}"


def length_table(lengths: dict) -> List[str]:
    lines = []
    for key, label, _ in MEASURES:
        rows = [f for f in lengths["families"] if any(key in lengths["families"][f].get(n, {}) for n in lengths["lengths"])]
        if not rows:
            continue
        lines += [f"**{label}** (mean ± std over {lengths['seeds']} seeds; minus softmax: difference, verdict: better "
                  "or worse when every seed of one lies beyond every seed of the other)", "",
                  "| family | " + " | ".join(LENGTH_LABELS.get(n, n) for n in lengths["lengths"]) + " |",
                  "|---|" + "---|" * len(lengths["lengths"])]
        for family in rows:
            cells = lengths["families"][family]
            lines.append(f"| {family} | " + " | ".join(cell(cells.get(n, {}).get(key), seeds=lengths["seeds"])
                                                       for n in lengths["lengths"]) + " |")
        for family, gaps in lengths.get("minus_softmax", {}).items():
            row = []
            for n in lengths["lengths"]:
                g = gaps.get(n, {}).get(key)
                row.append("" if g is None else f"{g['difference']:+.2f} ({g['verdict']})")
            lines.append(f"| {family} − softmax | " + " | ".join(row) + " |")
        lines += ["", baseline_line(key, lengths.get("baselines")), ""]
    return lines


def baseline_line(key: str, trivial: Optional[dict]) -> str:
    """What no learning gets for the measure ``key``, under its table."""
    if key == "cross_sparsity":
        return "Softmax attention has no exact zeros by construction (its row is 0 %)."
    if key == "cxmi":
        return "0 is a model that ignores its context; below 0, the context makes the reference less likely."
    if not trivial:
        return "(the trivial baselines are written once the study's corpus is prepared)"
    if key.startswith("aer"):
        return f"Baseline, the diagonal alignment: AER {trivial['aer']:.2f} (lower is better)."
    which = "d_bleu" if key.endswith("d_bleu") else "s_bleu"
    return f"Baseline, copying the nearest training verse: {trivial[which]:.2f} (the same at every length)."


# A length where every family's mean s-BLEU is under this share of the nearest-verse copy is a floor:
# none translates there at the study's budget, so "within the seed spread" there settles nothing
FLOOR_SHARE = 0.1

# Each claim the papers make, as (paper, family, claim, measure, lengths, expected verdict):
# ReLUFormer (Shen et al. 2023): on par at sentences and 128-256-token segments, better from 512
# tokens on; ReLA (Zhang et al. 2021): cross-attention aligns words better (a sentence-level claim)
PAPER_CLAIMS = [
    ("ReLUFormer paper", "reluformer", "on par with softmax on sentences", "verse_s_bleu", ["sentence"], "on par"),
    ("ReLUFormer paper", "reluformer", "on par with softmax at 128-token segments", "s_bleu", ["128"], "on par"),
    ("ReLUFormer paper", "reluformer", "better than softmax on long documents", "s_bleu", ["512", "chapter"], "better"),
    ("ReLA paper", "rela", "on par with softmax on sentences", "verse_s_bleu", ["sentence"], "on par"),
    ("ReLA paper", "rela", "aligns words better than softmax", "aer_head_average",
     ["sentence", "128"], "better"),
]


def floor_lengths(lengths: dict) -> List[str]:
    """Lengths at which no family translates: every mean s-BLEU under FLOOR_SHARE of the copy baseline."""
    copy = (lengths.get("baselines") or {}).get("s_bleu")
    if not copy:
        return []
    floors = []
    for n in lengths["lengths"]:
        means = [cells.get(n, {}).get("s_bleu", {}).get("mean") for cells in lengths["families"].values()]
        if means and all(m is not None and m < FLOOR_SHARE * copy for m in means):
            floors.append(n)
    return floors


def claim_outcome(verdict: Optional[str], expected: str) -> str:
    if verdict is None:
        return "not measured"
    if expected == "on par":
        return {"within the seed spread": "confirmed (within the seed spread)", "better": "confirmed (better)",
                "worse": "contradicted (worse over every seed)"}[verdict]
    return {"better": "confirmed (better over every seed)", "within the seed spread": "not confirmed (within the seed spread)",
            "worse": "contradicted (worse over every seed)"}[verdict]


def context_outcome(cxmi: dict) -> str:
    """CXMI (Fernandes et al. 2021) over the seeds: above 0 for every seed, below 0 for every seed, or either."""
    if cxmi["min"] > 0:
        return "confirmed"
    if cxmi["max"] < 0:
        return "contradicted (below 0 over every seed)"
    return "not confirmed (either sign over the seeds)"


def claims(lengths: dict) -> List[str]:
    """Each paper claim at the lengths it is made for: confirmed / not confirmed / contradicted, and
    whether that length is a floor where no family translates."""
    gaps, floors = lengths.get("minus_softmax", {}), floor_lengths(lengths)
    lines = []
    for paper, family, claim, key, at, expected in PAPER_CLAIMS:
        if family not in gaps:
            continue
        outcomes = []
        for n in [n for n in at if n in lengths["lengths"]]:  # the lengths of this study
            g = gaps[family].get(n, {}).get(key)
            text = claim_outcome(None if g is None else g["verdict"], expected)
            if g is not None:
                text += f", {g['difference']:+.2f}"
            if n in floors and key.endswith("bleu"):
                text += "; a floor: no family translates here"
            outcomes.append(f"{LENGTH_LABELS.get(n, n)}: {text}")
        label = next(label for k, label, _ in MEASURES if k == key)
        if outcomes:
            lines.append(f"- {paper}, {family} {claim} ({label}): " + "; ".join(outcomes))
    documents = [n for n in lengths["lengths"] if n != "sentence"]
    for family, cells in lengths["families"].items():
        outcomes = [f"{LENGTH_LABELS.get(n, n)}: {context_outcome(c)} ({cell(c, 2)})"
                    for n in documents for c in [cells.get(n, {}).get("cxmi")] if c is not None]
        if outcomes:
            lines.append(f"- {family} uses its context (CXMI > 0 nats/token over every seed): " + "; ".join(outcomes))
    if floors:
        lines.append(f"- Floor: at {', '.join(LENGTH_LABELS.get(n, n) for n in floors)} every family's mean s-BLEU is "
                     f"under {FLOOR_SHARE:.0%} of copying the nearest training verse, so the long-document claims "
                     "cannot be tested at the study's training budget.")
    return lines


def plot_gap(lengths: dict, path: Path) -> None:
    """Each family minus softmax (s-BLEU of the document translator; verses: verse by verse) against length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = list(range(len(lengths["lengths"])))
    for family in lengths.get("minus_softmax", {}):
        ys, lo, hi = [], [], []
        for n in lengths["lengths"]:
            key = "verse_s_bleu" if n == "sentence" else "s_bleu"
            a = lengths["families"][family].get(n, {}).get(key)
            b = lengths["families"]["softmax"].get(n, {}).get(key)
            if a is None or b is None:  # a study under way: the cell is not finished yet
                ys.append(float("nan")), lo.append(float("nan")), hi.append(float("nan"))
                continue
            ys.append(a["mean"] - b["mean"])
            lo.append(a["min"] - b["max"])
            hi.append(a["max"] - b["min"])
        ax.plot(xs, ys, marker="o", label=family)
        ax.fill_between(xs, lo, hi, alpha=0.15)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(xs, [LENGTH_LABELS.get(n, n) for n in lengths["lengths"]])
    ax.set_ylabel("s-BLEU minus softmax")
    ax.set_title("The family gap against training length (band: seed min–max)")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render(tuning: Optional[dict], lengths: Optional[dict], plot_name: Optional[str]) -> str:
    from reluformer_mt.experiments.demo import PAPER_POINTS
    from reluformer_mt.experiments.tune import render as render_tuning

    lines = ["# Each family at its best: ReLU against softmax attention, from verses to chapters", "",
             "Generated by `python -m reluformer_mt.experiments.families_page` from the saved outputs of the runs "
             "below; do not edit by hand.", "", "## Tuning: the same budget for every family", ""]
    if tuning is None:
        lines += ["Not run yet: `reluformer-study --tune reluformer,rela,softmax --trials 8` "
                  "(about 24 trials of 10-13 CPU minutes each; resumable).", ""]
    else:
        unfinished = [f for f, s in tuning["families"].items() if not s["finished"]]
        if unfinished:
            lines += [f"**Under way**: {', '.join(unfinished)} have not finished their trials; the best settings "
                      "below are provisional and the demo does not use them yet.", ""]
        lines += render_tuning(tuning).splitlines() + [""]
        lines += ["The trials' journals are kept in `docs/families/journals/`: to continue the search on a fresh "
                  "machine, copy `FAMILY.log` to `OUT/FAMILY/journal.log` and rerun the command (finished trials "
                  "are kept; an interrupted one trains again from its start when its checkpoints are not there).", ""]
    lines += ["## The length study", ""]
    if lengths is None:
        lines += ["Not run yet: `reluformer-study --lengths sentence,128,512,chapter --seeds 3` "
                  "(after the tuning; about 3 hours on 2 cores; resumable).", ""]
    else:
        finished, planned = lengths.get("cells_finished"), lengths.get("cells_planned")
        if finished is not None and finished < planned:
            lines += [f"**Under way**: {finished} of {planned} cells finished (`--report-only` summarised them); "
                      "the claims wait for every seed.", ""]
        lines += [f"Command: `{lengths['command']}`; scored on the 13 test chapters. The papers' points of "
                  "comparison: " + "; ".join(PAPER_POINTS) + ".", ""] + length_table(lengths)
        if lengths.get("cpu_minutes"):
            lines += ["Cost on 2 cores, CPU minutes per family (training, the sentence phase once per seed, and "
                      "scoring): " + ", ".join(f"{f} {m:.0f}" for f, m in lengths["cpu_minutes"].items()) + ".", ""]
        if lengths.get("train_wall_minutes"):
            lines += ["Wall minutes of training per family (two runs side by side, one thread each): "
                      + ", ".join(f"{f} {m:.0f}" for f, m in lengths["train_wall_minutes"].items()) + ".", ""]
        lines += ["Every finished cell's measures are kept in `docs/families/lengths/FAMILY/seed-S/LENGTH/cell.json`; "
                  f"`{lengths['command']} --out docs/families/lengths --report-only` summarises them into "
                  "`lengths.json` there, and this page is made from it. To continue the study on a fresh machine, "
                  "copy those folders into the study's `--out` and rerun its command: the saved cells are not "
                  "trained again.", ""]
        if plot_name:
            lines += [f"![the gap against length]({plot_name})", ""]
        if finished is None or finished >= planned:
            lines += ["## The papers' claims, here", ""] + claims(lengths) + [""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m reluformer_mt.experiments.families_page", description=__doc__.split("\n\n")[0])
    p.add_argument("--tuning", type=Path, default=None, help="the tuner's tuning.json")
    p.add_argument("--lengths", type=Path, default=None, help="the length study's lengths.json")
    p.add_argument("--out", type=Path, default=None, help="the page to write (default: print it)")
    args = p.parse_args(argv)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's import leaves the root logger at DEBUG
    try:
        tuning = read_json(args.tuning, "tuner's tuning.json (reluformer-study --tune)")
        lengths = read_json(args.lengths, "length study's lengths.json (reluformer-study --lengths)")
    except ValueError as e:
        print(f"families_page: error: {e}", file=sys.stderr)
        return 2
    plot_name = None
    if lengths is not None and args.out is not None and lengths.get("minus_softmax"):
        plot_name = args.out.stem.lower() + "_gap.png"
        plot_gap(lengths, args.out.parent / plot_name)
    page = render(tuning, lengths, plot_name)
    if args.out is None:
        print(page)
    else:
        args.out.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
