"""The quality study: how much translation quality and alignment a configuration buys per CPU minute.

Each run trains one configuration on the bible corpus (Greek -> English, chapters as documents,
the same held-out chapters as the demo) for a wall-clock budget, validating every
``validate_every`` updates with greedy s-BLEU / d-BLEU (the ``document_translation`` task's
``--eval-bleu``) and keeping a checkpoint at each validation, whose cross-attention is then
scored against the manual gold alignments of the validation chapters (AER, best layer, best of
normal / shifted, best head and head average). The result is a learning curve per run against
updates and minutes, a table, and a plot; ``reluformer-study`` is the command, and
docs/QUALITY_STUDY.md holds the measured study from which the demo's defaults were chosen.

Minutes are wall-clock minutes of one training process with ``threads`` threads; on a shared
machine they are noisy, so the table also gives updates.
"""
if __name__ == "__main__":  # the old command line, said before the imports (fairseq's notices)
    from reluformer_mt.experiments.moved import say_moved

    raise SystemExit(say_moved("reluformer_mt.experiments.study", "reluformer-study"))

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

from reluformer_mt.data.prepared import Prepared
from reluformer_mt.data.prepare import PrepareConfig, prepare
from reluformer_mt.data.textfiles import write_text_atomically
from reluformer_mt.evaluation import aer as aer_lib
from reluformer_mt.evaluation.baselines import diagonal_aer as diagonal
from reluformer_mt.evaluation.reports import format_table, write_json
from reluformer_mt.experiments.curves import read_learning_curve
from reluformer_mt.experiments.run import Phase, TrainingRun, train_args


# What every run of the study shares: the tiny architecture resized, seed 1, and a validation
# (greedy BLEU) with a checkpoint every 150 updates, all kept: the AER curve scores each of them
STUDY_TRAINING = TrainingRun(embed_dim=64, ffn_dim=128, layers=2, heads=4, lr=3e-3, warmup_updates=100,
                             validate_every=150, log_interval=25, progress_bar=False)


@dataclass(frozen=True)
class StudyRun:
    """One configuration: the corpus (``level``: "sentence" or a segment length in subword tokens;
    ``vocab``: SentencePiece pieces) and the training run (its budget comes from :func:`run_study`)."""

    name: str
    level: str = "sentence"
    vocab: int = 4000
    training: TrainingRun = STUDY_TRAINING

    def describe(self) -> str:
        t = self.training
        return (f"{t.family} {t.embed_dim}d/{t.ffn_dim} {t.layers}+{t.layers} {t.heads}h, "
                f"{'sentences' if self.level == 'sentence' else self.level + '-token segments'}, "
                f"vocab {self.vocab}, lr {t.lr:g}, warmup {t.warmup_updates}, {t.max_tokens} tok/batch, "
                f"dropout {t.dropout:g}" + (f", {' '.join(t.extra)}" if t.extra else ""))


def study_run(name: str, level: str = "sentence", vocab: int = 4000, family: str = "softmax", **training) -> StudyRun:
    """A configuration: ``training`` changes :data:`STUDY_TRAINING` (fields of :class:`TrainingRun`)."""
    return StudyRun(name, level, vocab, replace(STUDY_TRAINING, arch=f"{family}_tiny", **training))


# The configurations of the study in docs/QUALITY_STUDY.md ("demo" = the demo's defaults before it).
RUNS: Dict[str, StudyRun] = {run.name: run for run in [
    study_run("demo-old", level="128", vocab=4000, embed_dim=64, ffn_dim=128, layers=2, lr=3e-3, warmup_updates=100),
    study_run("tiny-sent-v2k", vocab=2000, embed_dim=64, ffn_dim=128, layers=2, lr=3e-3, warmup_updates=100),
    study_run("small-sent-v2k", vocab=2000, embed_dim=128, ffn_dim=512, layers=3, lr=2e-3, warmup_updates=200,
              dropout=0.2),
    study_run("small-sent-v4k", vocab=4000, embed_dim=128, ffn_dim=512, layers=3, lr=2e-3, warmup_updates=200,
              dropout=0.2),
    study_run("small-doc128-v2k", level="128", vocab=2000, embed_dim=128, ffn_dim=512, layers=3, lr=2e-3,
              warmup_updates=200, dropout=0.2),
    study_run("tiny-sent-v1k", vocab=1000, embed_dim=64, ffn_dim=128, layers=2, lr=3e-3, warmup_updates=100),
    study_run("tiny-sent-v2k-lr5", vocab=2000, embed_dim=64, ffn_dim=128, layers=2, lr=5e-3, warmup_updates=200),
    study_run("base256-sent-v2k", vocab=2000, embed_dim=256, ffn_dim=1024, layers=3, lr=1e-3, warmup_updates=400,
              dropout=0.3),
]}


def prepare_bible(work: Path, level: str, vocab: int, bible_root: Optional[str] = None) -> Path:
    """The bible corpus at ``level`` with a joint SentencePiece model of ``vocab`` pieces (shared by
    every level of the same vocabulary, so sentence- and document-level runs compare)."""
    sentence_dir = work / "data" / f"sentence.v{vocab}"
    common = dict(fmt="bible", src="grc", tgt="en", vocab_size=vocab, joined_dictionary=True,
                  bible_root=bible_root, workers=2)
    if not Prepared.exists(sentence_dir):
        prepare(PrepareConfig(out=str(sentence_dir), segment_tokens=0, **common))
    if level == "sentence":
        return sentence_dir
    doc_dir = work / "data" / f"doc{level}.v{vocab}"
    if not Prepared.exists(doc_dir):
        prepare(PrepareConfig(out=str(doc_dir), segment_tokens=level, spm_models=[str(sentence_dir / "spm.model")],
                              **common))
    return doc_dir


def training_run(run: StudyRun, budget_minutes: float, threads: int, max_update: int = 0,
                 device: str = "cpu") -> TrainingRun:
    """The run's training with the study's budget: ``budget_minutes`` of wall clock (and at most
    ``max_update`` updates when > 0) with ``threads`` threads."""
    return replace(run.training, phases=(Phase(run.name, run.level, max_update),), budget_minutes=budget_minutes,
                   threads=threads, device=device)


def train(run: StudyRun, data_dir: Path, run_dir: Path, budget_minutes: float, threads: int,
          max_update: int = 0, device: str = "cpu", progress: Optional[bool] = None) -> Path:
    """fairseq-train in a child process with ``threads`` threads (so minutes are comparable);
    resumes from the run's last checkpoint if there is one."""
    training = training_run(run, budget_minutes, threads, max_update, device)
    save_dir, log_file = run_dir / "checkpoints", run_dir / "train.log"
    save_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(training.threads), MKL_NUM_THREADS=str(training.threads))
    command = [str(Path(sys.executable).parent / "fairseq-train"),
               *train_args(training, training.phases[0], data_dir, save_dir, log_file, Prepared.load(data_dir).positions)]
    (run_dir / "command.txt").write_text(" ".join(command) + "\n", encoding="utf-8")
    from reluformer_mt.experiments.progress import TrainingProgress, updates_in_file

    # the child's log says how far it is: a bar on a terminal (--max-update: updates of the total)
    with open(run_dir / "stdout.txt", "a", encoding="utf-8") as out, \
            TrainingProgress(updates_in_file(log_file), max_update or None, f"train {run.name}", enabled=progress):
        result = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise RuntimeError(f"training {run.name} failed (exit {result.returncode}); see {run_dir / 'stdout.txt'}")
    return log_file


def alignment_curve(run_dir: Path, data_dir: Path, device: str = "cpu") -> List[dict]:
    """AER of every kept checkpoint's cross-attention on the validation chapters' gold links."""
    from reluformer_mt.evaluation.align import run_align  # torch: imported here, so the study's --help is instant

    points = []
    checkpoints = sorted((run_dir / "checkpoints").glob("checkpoint_*_*.pt"),
                         key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    for checkpoint in checkpoints:
        update = int(checkpoint.stem.rsplit("_", 1)[1])
        report = run_align([str(checkpoint)], names=["m"], data=str(data_dir), gold=str(data_dir / "valid.gold.align"),
                           gold_base=0, layer="all", src=str(data_dir / "valid.words.grc"),
                           tgt=str(data_dir / "valid.words.en"), device=device)
        per_layer = report["models"]["m"]["aer_per_layer"]
        best = {kind: min(min(per_layer[mode][kind]) for mode in ("normal", "shifted"))
                for kind in ("best_head", "head_average")}
        points.append({"update": update, "aer_best_head": best["best_head"], "aer_head_average": best["head_average"]})
    return points


def diagonal_aer(data_dir: Path, split: str = "valid") -> float:
    """AER of the trivial diagonal alignment on the same gold links: the line to beat."""
    src = (data_dir / f"{split}.words.grc").read_text(encoding="utf-8").splitlines()
    tgt = (data_dir / f"{split}.words.en").read_text(encoding="utf-8").splitlines()
    lengths = [(len(s.split()), len(t.split())) for s, t in zip(src, tgt)]
    return diagonal(lengths, aer_lib.read_gold(data_dir / f"{split}.gold.align", base=0)).aer


def summarise(run: StudyRun, run_dir: Path, threads: int) -> dict:
    curve = read_learning_curve(run_dir / "train.log")
    aer_points = json.loads((run_dir / "aer.json").read_text()) if (run_dir / "aer.json").exists() else []
    by_update = {p["update"]: p for p in aer_points}
    for point in curve["valid"]:
        point.update({k: v for k, v in by_update.get(point["update"], {}).items() if k != "update"})
    valid = curve["valid"]
    best = max(valid, key=lambda p: p["s_bleu"] or 0.0) if valid else {}
    last = valid[-1] if valid else {}
    return {"run": run.name, "config": dataclasses.asdict(run), "description": run.describe(), "threads": threads,
            "updates": max([p["update"] for p in curve["train"] + curve["valid"]], default=0),
            "minutes": round((curve["train"][-1]["wall"] or 0) / 60, 1) if curve["train"] else 0,
            "best_s_bleu": best.get("s_bleu"), "best_s_bleu_update": best.get("update"),
            "best_s_bleu_minutes": round((best.get("wall") or 0) / 60, 1) if best else None,
            "last_valid_loss": last.get("loss"), "last_d_bleu": last.get("d_bleu"),
            "best_aer": min((p.get("aer_best_head", 1.0) for p in valid), default=None),
            "best_aer_head_average": min((p.get("aer_head_average", 1.0) for p in valid), default=None),
            "curve": curve}


TABLE_HEADERS = ["run", "updates", "minutes", "valid loss", "best s-BLEU (greedy)", "at min", "d-BLEU (last)",
                 "AER best head", "AER head avg", "configuration"]


def table_rows(summaries: Sequence[dict]) -> List[list]:
    return [[s["run"], s["updates"], s["minutes"], s["last_valid_loss"], s["best_s_bleu"], s["best_s_bleu_minutes"],
             s["last_d_bleu"], s["best_aer"], s["best_aer_head_average"], s["description"]] for s in summaries]


def plot_study(summaries: Sequence[dict], diagonal: float, path: Path) -> Path:
    """s-BLEU and AER against minutes, one line per run, the diagonal baseline dashed."""
    import logging

    import matplotlib

    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq leaves the root logger at DEBUG
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for i, s in enumerate(summaries):
        points = [p for p in s["curve"]["valid"] if p["wall"] is not None]
        minutes = [p["wall"] / 60 for p in points]
        left.plot(minutes, [p["s_bleu"] or 0 for p in points], marker="o", color=f"C{i}", label=s["run"])
        aer = [(p["wall"] / 60, p["aer_best_head"]) for p in points if "aer_best_head" in p]
        if aer:
            right.plot(*zip(*aer), marker="o", color=f"C{i}", label=s["run"])
    left.set(xlabel=f"minutes ({summaries[0]['threads'] if summaries else 1} thread(s))", ylabel="valid s-BLEU (greedy)",
             title="Translation quality per CPU minute")
    right.axhline(diagonal, color="grey", linestyle="--", label=f"diagonal baseline {diagonal:.2f}")
    right.set(xlabel="minutes", ylabel="AER (best layer, best head)", title="Alignment per CPU minute")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def seeded_runs(runs: Sequence[StudyRun], seeds: int) -> List[StudyRun]:
    """Each run with seeds 1..``seeds``: seed 1 keeps its name (and folder), seed S is NAME-seedS."""
    return [run if seed == 1 else StudyRun(f"{run.name}-seed{seed}", run.level, run.vocab,
                                           replace(run.training, seed=seed))
            for run in runs for seed in range(1, seeds + 1)]


SEED_COLUMNS = (("best_s_bleu", "best s-BLEU (greedy)", 2), ("last_d_bleu", "d-BLEU (last)", 2),
                ("best_aer", "AER best head", 3), ("best_aer_head_average", "AER head avg", 3))


def seed_table(summaries: Sequence[dict], seeds: int) -> str:
    """Mean ± standard deviation (min–max) of each quality column over a configuration's seeds."""
    from reluformer_mt.experiments.seeds import cell, spread

    groups: Dict[str, List[dict]] = {}
    for s in summaries:
        base = s["run"].rsplit("-seed", 1)[0] if s["config"]["training"]["seed"] != 1 else s["run"]
        groups.setdefault(base, []).append(s)
    rows = []
    for name, group in groups.items():
        cells = []
        for key, _, places in SEED_COLUMNS:
            values = [g[key] for g in group if g.get(key) is not None]
            cells.append(cell(spread(values), places) if values else "n/a")
        rows.append([name, len(group)] + cells)
    return (f"Spread over {seeds} training seeds: mean ± standard deviation (min–max)\n"
            + format_table(["run", "seeds"] + [label for _, label, _ in SEED_COLUMNS], rows))


def run_study(out: Path, names: Sequence[Union[str, StudyRun]], budget_minutes: float, threads: int = 1, max_update: int = 0,
              device: str = "cpu", bible_root: Optional[str] = None, skip_alignment: bool = False,
              report: bool = True, progress: Optional[bool] = None, seeds: int = 1) -> dict:
    """Train every named run not trained yet (each with seeds 1..``seeds``), score its checkpoints,
    and (``report``) write study.json / study.md / study.png over the named runs, with the spread
    over seeds when ``seeds`` > 1. Several processes may train different runs of one ``out`` at
    once (``report=False``); a last call with every name writes the report."""
    out.mkdir(parents=True, exist_ok=True)
    summaries = []
    runs = seeded_runs([RUNS[n] if isinstance(n, str) else n for n in names], seeds)
    for run in runs:
        name = run.name
        run_dir = out / "runs" / name
        run_dir.mkdir(parents=True, exist_ok=True)
        data_dir = prepare_bible(out, run.level, run.vocab, bible_root)
        start = time.time()
        print(f"[study] {name}: {run.describe()} ({budget_minutes:g} min, {threads} thread(s))", flush=True)
        if not (run_dir / "done").exists():
            train(run, data_dir, run_dir, budget_minutes, threads, max_update, device, progress)
            (run_dir / "done").write_text(f"{time.time() - start:.0f} s\n")
        if not skip_alignment and not (run_dir / "aer.json").exists():
            write_text_atomically(run_dir / "aer.json", json.dumps(alignment_curve(run_dir, data_dir, device)))
        summaries.append(summarise(run, run_dir, threads))
        print(f"[study] {name}: best valid s-BLEU {summaries[-1]['best_s_bleu']} after "
              f"{summaries[-1]['best_s_bleu_minutes']} min; AER {summaries[-1]['best_aer']}", flush=True)
    if not report:
        return {"runs": summaries}
    diagonal = diagonal_aer(prepare_bible(out, "sentence", runs[0].vocab, bible_root))
    table = format_table(TABLE_HEADERS, table_rows(summaries))
    result = {"budget_minutes": budget_minutes, "threads": threads, "diagonal_aer_valid": diagonal,
              "runs": summaries, "table": table}
    if seeds > 1:
        result["seed_table"] = table = table + "\n\n" + seed_table(summaries, seeds)
    write_json(out / "study.json", result, command=" ".join(sys.argv))
    write_text_atomically(out / "study.md", table + f"\n\ndiagonal-baseline AER on the same gold links: {diagonal:.3f}\n")
    plot_study(summaries, diagonal, out / "study.png")
    print(table)
    print(f"diagonal-baseline AER (valid chapters): {diagonal:.3f}")
    return result


__all__ = ["RUNS", "STUDY_TRAINING", "StudyRun", "study_run", "training_run", "prepare_bible", "run_study", "read_learning_curve"]
