"""Spread over training seeds: is a family's difference to softmax larger than what reseeding moves?

The demo's paired bootstrap (``metrics.json``) resamples the test verses of *one* training run: it
says how sure the number is for that checkpoint, not whether another seed of the same recipe would
land elsewhere. This module reads the ``report/summary.json`` of several demo runs that differ only
in ``--seed`` and reports, per family and quality column, mean ± sample standard deviation and the
min–max range, and for each family against the baseline family (softmax) whether the two families'
seed ranges are separated (every seed of one above every seed of the other). With 3 seeds each, two
families drawn from the same distribution are separated that way with probability 2/20 = 0.1, so
"separated" is a weak test, and "within the seed spread" says the comparison is not settled.

    reluformer-demo --seeds 3            # seeds 1..3: OUT/ and OUT/seeds/seed-2, OUT/seeds/seed-3
    python -m reluformer_mt.experiments.seeds runs/demo runs/demo/seeds/seed-2 runs/demo/seeds/seed-3

write ``seeds.json`` and ``seeds.md`` into the first run's report folder, add the verdicts to its
``table.md`` and rebuild its ``index.html``. Families and columns missing from a run are left out
of the aggregate (and listed), so extra seeds may train fewer families or skip kNN-MT.
"""
import argparse
import dataclasses
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from reluformer_mt.data.outputs import check_distinct_files
from reluformer_mt.data.textfiles import write_text_atomically
from reluformer_mt.evaluation.reports import markdown_table, write_json
from reluformer_mt.experiments.summaries import read_summary

BASELINE_FAMILY = "softmax"
# (column key, label, higher is better); "mode:X" reads summary["families"][f]["modes"][X]["s_bleu"]
COLUMNS = (("s_bleu", "s-BLEU (document translator)", True), ("d_bleu", "d-BLEU (document translator)", True),
           ("mode:free", "s-BLEU (free)", True), ("mode:sentence", "s-BLEU (verse by verse)", True),
           ("mode:pieces", "s-BLEU (+ pieces, tuned)", True), ("mode:without-memory", "s-BLEU (without memory)", True),
           ("mode:knn", "s-BLEU (+ kNN-MT)", True), ("mode:knn+pieces", "s-BLEU (+ kNN-MT + pieces)", True),
           ("aer_best_head", "AER best head", False), ("aer_head_average", "AER head average", False),
           ("cross_sparsity", "exact zeros in cross-attention", None))
SECTION_TITLE = "## Spread over training seeds"
READ_NAMES = ("summary.json", "report.json", "metrics.json")  # what each run's report/ gives
REPORT_NAMES = ("seeds.json", "seeds.md", "table.md", "index.html")  # what the report folder gets


def column_value(family: dict, key: str) -> Optional[float]:
    if key.startswith("mode:"):
        return (family.get("modes", {}).get(key[5:]) or {}).get("s_bleu")
    return family.get(key)


def spread(values: Sequence[float]) -> dict:
    """Mean, sample standard deviation (0 for one value), min, max and the values themselves."""
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "n": len(values), "values": list(values)}


def read_summaries(run_dirs: Sequence[Path]) -> List[dict]:
    """Each run's ``report/summary.json`` and its seed (``report/report.json``'s options)."""
    runs = []
    for run_dir in map(Path, run_dirs):
        summary_path, report_path = run_dir / "report" / "summary.json", run_dir / "report" / "report.json"
        for path in (summary_path, report_path):
            if not path.is_file():
                raise ValueError(f"{path}: no such file (is {run_dir} a finished reluformer-demo run?)")
        summary = read_summary(summary_path)
        seed = _seed_of(report_path)
        runs.append({"dir": str(run_dir), "seed": seed, "summary": summary})
    seeds = [r["seed"] for r in runs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"the runs repeat a seed ({seeds}): {', '.join(r['dir'] for r in runs)}")
    return runs


def _seed_of(report_path: Path):
    """The --seed a run's ``report.json`` records (None when it records none)."""
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{report_path}: not readable JSON ({e})") from None
    options = report.get("options", {}) if isinstance(report, dict) else None
    if not isinstance(options, dict):
        raise ValueError(f"{report_path}: expected a JSON object with the run's options (a reluformer-demo report)")
    return options.get("seed")


def aggregate(runs: Sequence[dict], exclude: Sequence[str] = ()) -> dict:
    """Per family present in every run, per column present in every run of it (and not in
    ``exclude``): :func:`spread`."""
    families = [f for f in runs[0]["summary"]["families"] if all(f in r["summary"]["families"] for r in runs)]
    left_out = sorted({f for r in runs for f in r["summary"]["families"]} - set(families))
    table = {}
    for family in families:
        columns = {}
        for key, _, _ in COLUMNS:
            if key in exclude:
                continue
            values = [column_value(r["summary"]["families"][family], key) for r in runs]
            if all(v is not None for v in values):
                columns[key] = spread(values)
        table[family] = columns
    return {"families": table, "left_out_families": left_out}


def compare(families: Dict[str, dict], baseline: str = BASELINE_FAMILY) -> Dict[str, dict]:
    """Each family against ``baseline`` per shared column: difference of the means and whether the
    seed ranges are separated ("better", "worse": every seed beyond every baseline seed)."""
    if baseline not in families:
        return {}
    out = {}
    for family, columns in families.items():
        if family == baseline:
            continue
        rows = {}
        for key, _, higher_better in COLUMNS:
            a, b = columns.get(key), families[baseline].get(key)
            if a is None or b is None:
                continue
            above, below = a["min"] > b["max"], a["max"] < b["min"]
            if higher_better is None or not (above or below):
                verdict = "within the seed spread" if not (above or below) else ("higher" if above else "lower")
            else:
                verdict = "better" if above == higher_better else "worse"
            rows[key] = {"difference": a["mean"] - b["mean"], "separated": above or below, "verdict": verdict}
        out[family] = rows
    return out


def bootstrap_verdicts(report_dir: Path, families: Sequence[str]) -> Dict[str, str]:
    """The first run's paired bootstrap over test verses (``metrics.json``), document translator's BLEU."""
    path = report_dir / "metrics.json"
    if not path.is_file():
        return {}
    boot = json.loads(path.read_text(encoding="utf-8")).get("bootstrap", {})
    out = {}
    for family in families:
        row = (boot.get("systems", {}).get(f"{family} (constrained)") or {}).get("BLEU") or {}
        if row.get("p_value") is not None:
            out[family] = f"p = {row['p_value']:.3f}" + (" (significant)" if row.get("significant") else "")
    return out


def digits(key: str) -> int:
    return 3 if key.startswith(("aer", "cross")) else 2


def cell(s: dict, places: int = 2) -> str:
    return f"{s['mean']:.{places}f} ± {s['std']:.{places}f} ({s['min']:.{places}f}–{s['max']:.{places}f})"


def render(result: dict) -> str:
    """The Markdown section: the spread table, then each family against the baseline."""
    families, labels = result["families"], {key: label for key, label, _ in COLUMNS}
    keys = [key for key, _, _ in COLUMNS if any(key in c for c in families.values())]
    rows = [[family] + [cell(c[key], digits(key)) if key in c else "" for key in keys]
            for family, c in families.items()]
    lines = [SECTION_TITLE, "",
             f"Seeds {', '.join(str(s) for s in result['seeds'])} (one demo run each: "
             f"{', '.join(result['runs'])}); mean ± standard deviation (min–max) of the test chapters.", "",
             markdown_table(["family"] + [labels[k] for k in keys], rows)]
    base = result.get("baselines", {})
    if base:
        lines += ["", "Baselines (the same in every seed): " + "; ".join(
            f"{name.replace('_', ' ')} {', '.join(f'{k} {v}' for k, v in b.items())}" for name, b in base.items()) + "."]
    if result["comparison"]:
        rows = []
        for family, columns in result["comparison"].items():
            for key, c in columns.items():
                rows.append([family, labels[key], f"{c['difference']:+.2f}", c["verdict"],
                             result["bootstrap"].get(family, "") if key == "s_bleu" else ""])
        lines += ["", f"Against {result['baseline']}: difference of the means, and whether the seed ranges are "
                  "separated (with 3 seeds each, chance separates two equal families 1 time in 10); beside it, "
                  f"the paired bootstrap over the test verses of seed {result['seeds'][0]}'s run only.", "",
                  markdown_table(["family", "column", f"Δ vs {result['baseline']}", "over seeds",
                                  "bootstrap over verses (one run)"], rows)]
    if not result["comparison"] and result["baseline"] not in families:
        lines += ["", f"No comparison between families: {result['baseline']}, the baseline, is not in every run."]
    if len(result.get("commits", [])) > 1:
        lines += ["", f"The runs come from different commits ({', '.join(result['commits'])}): columns whose "
                  "method changed between them do not measure the seed alone."]
    if result.get("excluded"):
        lines += ["", f"Columns left out on request (--exclude): {', '.join(result['excluded'])}."]
    if result["left_out_families"]:
        lines += ["", f"Not in every run, left out: {', '.join(result['left_out_families'])}."]
    return "\n".join(lines) + "\n"


def replace_section(table_md: Path, section: str) -> None:
    """table.md with this section at its end (a rerun replaces it instead of adding another)."""
    text = table_md.read_text(encoding="utf-8") if table_md.exists() else ""
    text = text.split("\n" + SECTION_TITLE)[0].rstrip("\n") + "\n"
    write_text_atomically(table_md, text + "\n" + section)


def check_baseline(baseline: str, result: dict) -> None:
    """A baseline family asked for by name must be one the comparison can use: in every run."""
    if baseline not in result["families"]:
        partly = baseline in result["left_out_families"]
        raise ValueError(f"--baseline {baseline}: {'not in every run' if partly else 'unknown family'}; the families "
                         f"of every run: {', '.join(result['families']) or 'none'}")


def write_seed_report(run_dirs: Sequence[Path], baseline: Optional[str] = None,
                      report_dir: Optional[Path] = None, exclude: Sequence[str] = ()) -> dict:
    """Aggregate the runs, write seeds.json / seeds.md into ``report_dir`` (default: the first run's
    report folder), put the section into its table.md and rebuild its index.html. ``baseline``: the
    family the others are compared with, an error when the runs lack it (default: softmax, when
    every run has it; else the section says that nothing is compared)."""
    from reluformer_mt.evaluation.html_report import write_html_report

    if len(run_dirs) < 2:
        raise ValueError(f"a seed spread needs two runs or more, got {len(run_dirs)}")
    runs = read_summaries(run_dirs)
    report_dir = Path(report_dir) if report_dir else Path(run_dirs[0]) / "report"
    check_distinct_files([("--report-dir", report_dir / name) for name in REPORT_NAMES],
                         [("runs", Path(run) / "report" / name) for run in run_dirs for name in READ_NAMES])
    unknown = sorted(set(exclude) - {key for key, _, _ in COLUMNS})
    if unknown:
        raise ValueError(f"--exclude: unknown column(s) {', '.join(unknown)}; expected some of "
                         f"{', '.join(key for key, _, _ in COLUMNS)}")
    result = aggregate(runs, exclude)
    if baseline is not None:
        check_baseline(baseline, result)
    baseline = baseline or BASELINE_FAMILY
    result.update(commits=sorted({str(r["summary"].get("commit")) for r in runs}), excluded=list(exclude),seeds=[r["seed"] for r in runs], runs=[r["dir"] for r in runs], baseline=baseline,
                  labels={key: label for key, label, _ in COLUMNS}, digits={key: digits(key) for key, _, _ in COLUMNS},
                  baselines=runs[0]["summary"].get("baselines", {}),
                  comparison=compare(result["families"], baseline),
                  bootstrap=bootstrap_verdicts(Path(run_dirs[0]) / "report", list(result["families"])))
    write_json(report_dir / "seeds.json", result, command=" ".join(sys.argv))
    section = render(result)
    write_text_atomically(report_dir / "seeds.md", section)
    if (report_dir / "table.md").exists():
        replace_section(report_dir / "table.md", section)
    write_html_report(report_dir)
    return result


def seed_folders(first: Path, seed: int, n: int) -> List[tuple]:
    """(seed, run folder) of ``n`` seeds from ``seed``: the first in ``first``, the others beside it in
    ``first/seeds/seed-S`` (its data, checkpoints and report of their own)."""
    return [(seed + i, first if i == 0 else first / "seeds" / f"seed-{seed + i}") for i in range(n)]


def run_demo_seeds(options, n: int, run_demo: Callable) -> dict:
    """``run_demo`` once per seed (the same options otherwise), then :func:`write_seed_report`. The
    prepared corpus does not depend on the seed: later seeds start from a copy of the first's."""
    folders = seed_folders(Path(options.out), options.seed, n)
    for seed, out in folders:
        if out != options.out and (Path(options.out) / "data").is_dir() and not (out / "data").exists():
            out.mkdir(parents=True, exist_ok=True)
            shutil.copytree(Path(options.out) / "data", out / "data")
        print(f"[seeds] seed {seed} of {', '.join(str(s) for s, _ in folders)}: {out}", flush=True)
        run_demo(dataclasses.replace(options, seed=seed, out=out))
    return write_seed_report([out for _, out in folders])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reluformer_mt.experiments.seeds", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="folders of finished reluformer-demo runs that differ in --seed")
    parser.add_argument("--baseline", help=f"family the others are compared with (default: {BASELINE_FAMILY}, "
                                           "when every run has it)")
    parser.add_argument("--report-dir", help="where seeds.json / seeds.md go (default: the first run's report/)")
    parser.add_argument("--exclude", default="", help="comma-separated columns left out (e.g. mode:knn when the "
                        "runs decoded kNN-MT differently): " + ", ".join(key for key, _, _ in COLUMNS))
    args = parser.parse_args(argv)
    try:
        result = write_seed_report([Path(r) for r in args.runs], args.baseline,
                                   Path(args.report_dir) if args.report_dir else None,
                                   [c for c in args.exclude.split(",") if c])
    except ValueError as e:
        print(f"seeds: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a report folder that cannot be written (read-only, a full disk, under a file)
        where = f"--report-dir {args.report_dir}" if args.report_dir else f"{Path(args.runs[0]) / 'report'}"
        print(f"seeds: error: {where}: cannot write {e.filename or 'the report'} ({e.strerror or e})", file=sys.stderr)
        return 2
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
