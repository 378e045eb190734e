"""The length study: does the gap between ReLU and softmax attention move from single verses to
whole chapters? (``reluformer-study --lengths``, docs/FAMILIES.md)

ReLUFormer (Shen et al. 2023) reports ReLU attention with its variance-reduction factor on par with
softmax on sentences and better on long documents, where softmax attention spreads thin; ReLA
(Zhang, Titov & Sennrich 2021) reports parity and sparser, better-aligned attention. Here each
family, at its tuned settings (:mod:`.tune`; ``--untuned``: the quick preset's shared ones), trains
with several seeds on verses, and then, from that same sentence model (same seed, same settings,
so sharing it is honest), on document segments of 128 and 512 subword tokens and on whole chapters
(:data:`CHAPTER_TOKENS`). Every cell is scored on the test chapters:

- s-BLEU and d-BLEU of the document translator at the cell's segment length, and of verse-by-verse
  decoding of the same checkpoint (the sentence cell: verse by verse only);
- AER of the cross-attention against the manual gold links (best head and head average, best
  layer, normal or shifted), beside the diagonal alignment's;
- CXMI with the previous verses as context (Fernandes et al., ACL 2021): how much the model's
  probability of a verse's reference rises when it sees the verses before it;
- the share of exact zeros in the cross-attention.

Resumable: a finished cell is kept (``cell.json``, with the seconds its training took); an
interrupted training resumes from its last checkpoint, so rerunning the same command continues where
it stopped. The ``cell.json`` files alone carry a study to another machine: copied into an empty
OUT, their cells are not trained again (docs/families/lengths/ keeps them between sessions).
"""
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

LENGTHS = ("sentence", "128", "512", "chapter")
CHAPTER_TOKENS = 4096  # a segment bound above the longest chapter of the corpus: every chapter is one segment
CONTEXT_VERSES = 2  # CXMI's context: the two verses before each verse


def segment_tokens(length: str) -> str:
    return str(CHAPTER_TOKENS) if length == "chapter" else length


@dataclass
class LengthOptions:
    out: Path
    families: Sequence[str] = ("reluformer", "rela", "softmax")
    seeds: int = 3
    lengths: Sequence[str] = LENGTHS
    jobs: int = 2
    untuned: bool = False
    bible_root: Optional[str] = None
    eval_chapters: int = 0  # the first K test chapters only (0: all 13)
    device: str = "cpu"
    base: Optional[object] = None  # DemoOptions to start from (tests: a smaller model); None: the quick preset
    report_only: bool = False  # summarise the cells finished so far; train nothing


def base_options(t: LengthOptions):
    """The demo's quick-preset options with each family's tuned settings (unless ``untuned``)."""
    from reluformer_mt.experiments.demo import DemoOptions
    from reluformer_mt.experiments.tune import TUNED_PRESETS

    base = t.base or DemoOptions(out=t.out, families=list(t.families), bible_root=t.bible_root, device=t.device,
                                 eval_chapters=t.eval_chapters, knn=False, pieces_weight=0.0)
    if not t.untuned and not base.family_settings and TUNED_PRESETS.exists():
        base = replace(base, family_settings=json.loads(TUNED_PRESETS.read_text(encoding="utf-8"))["families"])
    return base


def prepare_lengths(t: LengthOptions, base) -> Dict[str, Path]:
    """The corpus at every length with one SentencePiece model: {"sentence": dir, "128": dir, ...}."""
    from reluformer_mt.data.prepare import PrepareConfig
    from reluformer_mt.memory.neighbours import prepare_with_memory as prepare

    common = dict(fmt="bible", src="grc", tgt="en", vocab_size=base.vocab_size, joined_dictionary=True,
                  bible_root=t.bible_root, workers=2, memory_k=0)
    sentence = t.out / "data" / f"sentence.v{base.vocab_size}"
    prepare(PrepareConfig(out=str(sentence), segment_tokens=0, **common))
    dirs = {"sentence": sentence}
    for length in t.lengths:
        if length != "sentence":
            dirs[length] = t.out / "data" / f"doc{length}.v{base.vocab_size}"
            prepare(PrepareConfig(out=str(dirs[length]), segment_tokens=segment_tokens(length),
                                  spm_models=[str(sentence / "spm.model")], **common))
    return dirs


# ------------------------------------------------------------------------------------ one family and seed
def run_family_seed(base, family: str, seed: int, lengths: Sequence[str], dirs: Dict[str, Path], root: Path) -> dict:
    """Train the sentence model once, then each length's document phase from it; score every cell."""
    from reluformer_mt.data.prepared import Prepared
    from reluformer_mt.experiments.demo import family_options, family_run, train_phase
    from reluformer_mt.experiments.run import train_args

    o = replace(family_options(replace(base, seed=seed), family), out=root, families=[family])
    run = family_run(o, family)
    sentence_phase, document_phase = run.phases
    positions = max(Prepared.load(d).positions for d in dirs.values())  # one budget: every length fine-tunes it
    sentence_dir = root / "sentence"
    cell_dirs = {length: sentence_dir if length == "sentence" else root / f"doc{length}" for length in lengths}
    cells = {length: read_cell(d / "cell.json") for length, d in cell_dirs.items() if (d / "cell.json").exists()}
    if len(cells) == len(lengths):  # finished before (or restored from a saved copy): no checkpoint needed
        return cells
    sentence_dir.mkdir(parents=True, exist_ok=True)
    train_phase(o, train_args(run, sentence_phase, dirs["sentence"], sentence_dir, sentence_dir / "train.log",
                              positions), sentence_dir, sentence_dir / "train.log")
    sentence_checkpoint = sentence_dir / "checkpoint_last.pt"
    for length in lengths:
        if length in cells:
            continue
        if length == "sentence":
            cells[length] = score_cell(o, sentence_checkpoint, dirs["128"] if "128" in dirs else dirs["sentence"],
                                       length, sentence_dir)
            continue
        cell_dir = cell_dirs[length]
        cell_dir.mkdir(parents=True, exist_ok=True)
        train_phase(o, train_args(run, document_phase, dirs[length], cell_dir, cell_dir / "train.log", positions,
                                  init_from=sentence_checkpoint), cell_dir, cell_dir / "train.log")
        cells[length] = score_cell(o, cell_dir / "checkpoint_last.pt", dirs[length], length, cell_dir)
    return cells


def training_seconds(cell_dir: Path) -> dict:
    """The wall and CPU seconds :func:`train_phase` wrote for the checkpoint of ``cell_dir``."""
    return {key: float((cell_dir / name).read_text()) for key, name in
            (("train_seconds", "train_seconds.txt"), ("train_cpu_seconds", "train_cpu_seconds.txt"))
            if (cell_dir / name).exists()}


def score_cell(o, checkpoint: Path, data_dir: Path, length: str, cell_dir: Path) -> dict:
    """Every measure of one (family, seed, length) on the test chapters; ``cell.json`` keeps it."""
    done = cell_dir / "cell.json"
    if done.exists():
        return read_cell(done)
    from reluformer_mt.evaluation.align import run_align
    from reluformer_mt.evaluation.attn_stats import run_attn_stats
    from reluformer_mt.evaluation.cxmi import run_cxmi
    from reluformer_mt.experiments.demo import best_aer, bleu_of_model
    from reluformer_mt.experiments.demo import process_cpu_seconds

    started = process_cpu_seconds()
    verse = bleu_of_model(o, checkpoint, data_dir, segment_tokens=0)
    cell = {"length": length, "checkpoint": str(checkpoint), "verse_s_bleu": verse["s_bleu"], "verse_d_bleu": verse["d_bleu"]}
    if length != "sentence":
        document = bleu_of_model(o, checkpoint, data_dir)
        cell.update(s_bleu=document["s_bleu"], d_bleu=document["d_bleu"], fallbacks=document["fallbacks"],
                    segments=document["segments"])
    text = dict(src=str(data_dir / "test.words.grc"), tgt=str(data_dir / "test.words.en"))
    aer = run_align([str(checkpoint)], names=["m"], data=str(data_dir), gold=str(data_dir / "test.gold.align"),
                    gold_base=0, layer="all", device=o.device, **text)["models"]["m"]["aer_per_layer"]
    cell.update(zip(("aer_best_head", "aer_head_average"), best_aer(aer)))
    stats = run_attn_stats([str(checkpoint)], names=["m"], data=str(data_dir), split=None, kinds=("cross",),
                           device=o.device, **text)["models"]["m"]["stats"]["cross"]["all"]
    cell["cross_sparsity"] = stats["sparsity"]
    cxmi = run_cxmi(str(checkpoint), data=str(data_dir), split="test", context_sentences=CONTEXT_VERSES,
                    limit_docs=o.eval_chapters or None, device=o.device, progress=False)
    cell["cxmi"] = cxmi_value(cxmi)
    cell["cpu_seconds_scoring"] = round(process_cpu_seconds() - started, 1)
    cell.update(training_seconds(cell_dir))  # a saved cell.json carries what its run cost
    done.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(done, json.dumps(cell, indent=1) + "\n")
    return cell


def _write_atomic(path: Path, text: str) -> None:
    from reluformer_mt.data.textfiles import write_text_atomically

    write_text_atomically(path, text)


def cxmi_value(report: dict) -> float:
    """The per-token CXMI of a ``run_cxmi`` report (nats per token)."""
    return float(report["per_token"]["cxmi"])


# ------------------------------------------------------------------------------------ the study
def run_lengths(t: LengthOptions, report: Callable[[str], None] = None) -> dict:
    """Every (family, seed), ``t.jobs`` at a time, one thread each; writes ``OUT/lengths.json``."""
    from concurrent.futures import as_completed

    from reluformer_mt.experiments.workers import run_in_worker, spawn_pool

    report = report or (lambda line: print(line, file=sys.stderr, flush=True))
    unknown = [length for length in t.lengths if length not in LENGTHS]
    if unknown:
        raise ValueError(f"--lengths: unknown {', '.join(unknown)}; expected some of {', '.join(LENGTHS)}")
    base = base_options(t)
    jobs = [(family, seed) for seed in range(1, t.seeds + 1) for family in t.families]
    if t.report_only:
        summary = summarise(finished_cells(t), t, base, report_baselines(t, base))
        _write_atomic(t.out / "lengths.json", json.dumps(summary, indent=1) + "\n")
        report(f"lengths: {summary['cells_finished']} of {summary['cells_planned']} cells finished; "
               f"wrote {t.out / 'lengths.json'}")
        return summary
    dirs = prepare_lengths(t, base)
    report(f"lengths: {len(jobs)} runs ({', '.join(t.families)} x {t.seeds} seeds), lengths {', '.join(t.lengths)}, "
           f"{t.jobs} at a time; " + ("shared preset" if not base.family_settings else "each family's tuned settings"))
    started, results = time.time(), {}
    with spawn_pool(t.jobs) as pool:
        futures = {}
        for family, seed in jobs:
            root = t.out / family / f"seed-{seed}"
            futures[pool.submit(run_in_worker, root / "run.log", run_family_seed, base, family, seed, list(t.lengths), dirs, root)] = (family, seed)
        for future in as_completed(futures):
            family, seed = futures[future]
            results.setdefault(family, {})[seed] = future.result()
            report(f"lengths: {family} seed {seed} done ({sum(map(len, results.values()))}/{len(jobs)}), "
                   f"{(time.time() - started) / 60:.1f} min elapsed")
    summary = summarise(results, t, base, trivial_baselines(base, dirs["sentence"]))
    _write_atomic(t.out / "lengths.json", json.dumps(summary, indent=1) + "\n")
    return summary


def report_baselines(t: LengthOptions, base) -> dict:
    """:func:`trivial_baselines` from the study's corpus, or, where OUT holds only the saved cells
    (docs/families/lengths/), from the corpus prepared again in a temporary folder (seconds)."""
    import tempfile

    sentence_dir = t.out / "data" / f"sentence.v{base.vocab_size}"
    if (sentence_dir / "test.words.grc").exists():
        return trivial_baselines(base, sentence_dir)
    with tempfile.TemporaryDirectory() as tmp:
        dirs = prepare_lengths(replace(t, out=Path(tmp), lengths=("sentence",)), base)
        return trivial_baselines(base, dirs["sentence"])


def trivial_baselines(base, data_dir: Path) -> dict:
    """What no learning gets on the same test chapters, whatever the length: copying the nearest
    training verse (s-BLEU, d-BLEU), the diagonal alignment (AER); CXMI's is 0 (context ignored)."""
    from reluformer_mt.experiments.demo import baselines

    found = baselines(base, data_dir)
    return {"s_bleu": found["nearest_verse"]["s_bleu"], "d_bleu": found["nearest_verse"]["d_bleu"],
            "aer": found["diagonal"]["aer"], "cxmi": 0.0}


def finished_cells(t: LengthOptions) -> Dict[str, Dict[int, dict]]:
    """{family: {seed: {length: cell}}} of every ``cell.json`` under OUT (a study under way)."""
    results: Dict[str, Dict[int, dict]] = {}
    for family in t.families:
        for seed in range(1, t.seeds + 1):
            root = t.out / family / f"seed-{seed}"
            for length in t.lengths:
                done = root / ("sentence" if length == "sentence" else f"doc{length}") / "cell.json"
                if done.exists():
                    results.setdefault(family, {}).setdefault(seed, {})[length] = read_cell(done)
    return results


def read_cell(path: Path) -> dict:
    """A finished cell's ``cell.json``, checked: a JSON object whose measures are numbers (or null);
    a ValueError naming the file otherwise (truncated, not UTF-8, edited), before any summary."""
    try:
        cell = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not readable JSON ({e}); delete it to score the cell again") from None
    if not isinstance(cell, dict):
        raise ValueError(f"{path}: expected a JSON object (a finished cell), got a {type(cell).__name__}; "
                         "delete it to score the cell again")
    for key in [k for k, _, _ in MEASURES] + ["train_seconds", "train_cpu_seconds", "cpu_seconds_scoring"]:
        value = cell.get(key)
        if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)):
            raise ValueError(f"{path}: {key} {json.dumps(value)}: expected a number; delete it to score the cell again")
    return cell


MEASURES = (("s_bleu", "s-BLEU (document translator)", True), ("d_bleu", "d-BLEU (document translator)", True),
            ("verse_s_bleu", "s-BLEU (verse by verse)", True), ("verse_d_bleu", "d-BLEU (verse by verse)", True),
            ("aer_best_head", "AER best head", False), ("aer_head_average", "AER head average", False),
            ("cxmi", "CXMI (nats/token)", True), ("cross_sparsity", "exact zeros in cross-attention", None))


def summarise(results: Dict[str, Dict[int, dict]], t: LengthOptions, base, trivial: Optional[dict] = None) -> dict:
    """mean ± std per (family, length, measure), and each family minus softmax with the verdict."""
    from reluformer_mt.experiments.seeds import spread

    table: Dict[str, Dict[str, dict]] = {}
    for family, seeds in results.items():
        for length in t.lengths:
            cells = [seeds[s][length] for s in sorted(seeds) if length in seeds[s]]
            if cells:
                table.setdefault(family, {})[length] = {
                    key: spread([c[key] for c in cells]) for key, _, _ in MEASURES
                    if all(c.get(key) is not None for c in cells)}
    gaps = {family: {length: {key: gap(table[family][length].get(key), table["softmax"].get(length, {}).get(key), higher)
                              for key, _, higher in MEASURES if key in table[family][length]}
                     for length in table[family]}
            for family in table if family != "softmax" and "softmax" in table}
    every = [c for seeds in results.values() for cells in seeds.values() for c in cells.values()]
    cpu_minutes = {family: round(sum(c.get("train_cpu_seconds", 0) + c.get("cpu_seconds_scoring", 0)
                                     for cells in seeds.values() for c in cells.values()) / 60, 1)
                   for family, seeds in results.items()}
    return {"lengths": list(t.lengths), "seeds": t.seeds, "families": table, "minus_softmax": gaps,
            "cells_finished": len(every), "cells_planned": len(t.families) * t.seeds * len(t.lengths),
            "cpu_minutes": cpu_minutes,  # training (the sentence phase counted once) and scoring, per family
            "train_wall_minutes": {family: round(sum(c.get("train_seconds", 0) for cells in seeds.values()
                                                     for c in cells.values()) / 60, 1)
                                   for family, seeds in results.items()},
            "baselines": trivial,  # trivial_baselines: the lines to beat
            "settings": {f: base.family_settings.get(f, "the quick preset's") for f in t.families},
            "command": f"reluformer-study --lengths {','.join(t.lengths)} --tune-families {','.join(t.families)} "
                       f"--seeds {t.seeds}" + (" --untuned" if t.untuned else "")}


def gap(a: Optional[dict], b: Optional[dict], higher_better: Optional[bool]) -> Optional[dict]:
    """Difference of the means, and whether every seed of one lies beyond every seed of the other."""
    if a is None or b is None:
        return None
    above, below = a["min"] > b["max"], a["max"] < b["min"]
    if not (above or below):
        verdict = "within the seed spread"
    elif higher_better is None:
        verdict = "higher" if above else "lower"
    else:
        verdict = "better" if above == higher_better else "worse"
    return {"difference": a["mean"] - b["mean"], "verdict": verdict}


__all__ = ["CHAPTER_TOKENS", "LENGTHS", "LengthOptions", "MEASURES", "run_lengths", "summarise"]
