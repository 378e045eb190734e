"""The demo's stages as library functions (``reluformer-demo`` parses options and calls :func:`run_demo`).

The corpus is the ``bible-alignments`` package from PyPI: the Greek New Testament (SBLGNT) with
the English Berean Standard Bible, chapters as documents, and a manual word alignment of every
verse. The demo

1. prepares document-level segments and the sentence-level twin with one SentencePiece model,
   train/valid/test split by held-out chapters;
2. trains each family with the same budget, optionally first on sentences and then fine-tuned on
   document segments (G-Transformer's recipe, Bao et al. 2021), validating with greedy s-BLEU;
3. evaluates each: s-BLEU and d-BLEU of the held-out chapters translated with the document
   translator, AER of cross-attention against the manual gold alignments (every layer, best head
   and head average, normal and shifted), attention sparsity / null rate — beside the trivial
   baselines (copying the nearest training verse; the diagonal alignment);
4. translates one held-out chapter with ``reluformer-translate``;
5. writes the report: one table, the JSON of every number, the chapter beside its reference,
   learning curves against updates and minutes, word-level attention of one verse with the gold
   links, and ``index.html`` with all of it (``report_page``, docs/REPORT.md).

Presets (``PRESETS``) bundle the settings: ``quick`` is ``make demo`` (its measured duration: the
README; chosen from the quality study in docs/QUALITY_STUDY.md) and ``long`` the reference run
(docs/REFERENCE_RUN.md). On a CPU the families train side by side, one thread each, and each
family's datastore, tuning and decoding modes start as soon as it is trained (:mod:`.demo_schedule`),
so no core idles while the last family trains; the console's estimates come from :mod:`.demo_timing`. Seeds are fixed: a second run with the same options gives the same numbers.
"""
if __name__ == "__main__":  # the old command line, said before the imports (fairseq's notices)
    from reluformer_mt.experiments.moved import say_moved

    raise SystemExit(say_moved("reluformer_mt.experiments.demo", "reluformer-demo"))

import contextlib
import json
import logging
import os
import platform
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional

import fairseq
import sacrebleu
import torch

import reluformer_mt
from reluformer_mt.checkpoints import checkpoint_info
from reluformer_mt.fairseq_runner import run_fairseq
from reluformer_mt.data.prepare import PrepareConfig
from reluformer_mt.memory.neighbours import prepare_with_memory as prepare
from reluformer_mt.data.prepared import Prepared
from reluformer_mt.evaluation import aer as aer_lib
from reluformer_mt.evaluation import extract
from reluformer_mt.evaluation.align import run_align
from reluformer_mt.evaluation.attn_stats import run_attn_stats
from reluformer_mt.evaluation.baselines import diagonal_aer, nearest_verse_translations
from reluformer_mt.evaluation.bleu import corpus_dbleu, corpus_sbleu
from reluformer_mt.evaluation.plots import plot_curves_against_minutes, plot_word_alignment
from reluformer_mt.evaluation.reports import format_table, write_json, write_table_files
from reluformer_mt.evaluation.stats import shift_rows, word_attention
from reluformer_mt.experiments.curves import read_learning_curve
from reluformer_mt.experiments.demo_schedule import Job
from reluformer_mt.experiments.demo_timing import workers
from reluformer_mt.experiments.workers import spawn_pool
from reluformer_mt.experiments.progress import Stages, demo_plan, minutes
from reluformer_mt.experiments.report_page import write_page_files
from reluformer_mt.experiments.run import PACKAGE_DIR, Phase, TrainingRun, train_args
from reluformer_mt.inference.translator import DocumentTranslator
from reluformer_mt.plugin import register

from reluformer_mt.experiments.demo_options import (DEFAULT_FAMILIES, MEMORY_SUFFIXES,  # noqa: F401
                                                   NEIGHBOURS_K, PRESETS, DemoOptions, split_family, uses_memory)


def versions() -> Dict[str, str]:
    """What a run's numbers depend on besides the code: the libraries, the CPU and the math
    libraries (BLAS, oneDNN), so two runs that differ can be told apart."""
    import numpy

    return {"reluformer_mt": reluformer_mt.__version__, "fairseq": fairseq.__version__, "torch": torch.__version__,
            "sacrebleu": sacrebleu.__version__, "numpy": numpy.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpus": str(os.cpu_count()), "cpu_model": cpu_model(),
            "math_libraries": math_libraries()}


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def math_libraries() -> str:
    """torch's BLAS / LAPACK / oneDNN builds and CPU capability, and numpy's BLAS, in one line."""
    parts = [f"torch cpu capability {torch.backends.cpu.get_cpu_capability()}"]
    for line in torch.__config__.show().splitlines():
        line = line.strip(" -")
        if line.startswith(("Intel(R) oneAPI Math Kernel Library", "Intel(R) MKL-DNN", "OpenMP", "LAPACK is enabled")):
            parts.append(line)
        for key in ("BLAS_INFO=", "LAPACK_INFO="):
            if key in line:
                parts.append(key + line.split(key, 1)[1].split(",")[0])
    try:
        import numpy

        blas = numpy.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
        parts.append(f"numpy blas {blas.get('name', '?')} {blas.get('version', '')}".strip())
    except (TypeError, AttributeError):  # numpy < 1.26 has no mode="dicts"
        pass
    for name in ("OPENBLAS_CORETYPE", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # they change kernels and threads
        if os.environ.get(name):
            parts.append(f"{name}={os.environ[name]}")
    return "; ".join(parts)


# ------------------------------------------------------------------------------------ data
def prepare_corpus(o: DemoOptions) -> Dict[str, Path]:
    """Document-level and sentence-level directories sharing one SentencePiece model."""
    recipe = (".web" if o.extra_target == "web" else ".extra" if o.extra_target else "") + (
        ".lengths-" + "-".join(o.train_lengths) if o.train_lengths else "")
    doc_dir = o.out / f"data/doc{o.segment_tokens}.v{o.vocab_size}{recipe}"
    sent_dir = o.out / f"data/sentence.v{o.vocab_size}{recipe.split('.lengths')[0]}"
    common = dict(fmt="bible", src="grc", tgt="en", vocab_size=o.vocab_size, joined_dictionary=True,
                  bible_root=o.bible_root, force=o.force, workers=2, memory_k=NEIGHBOURS_K if uses_memory(o) else 0,
                  extra_target=o.extra_target)
    prepare(PrepareConfig(out=str(doc_dir), segment_tokens=o.segment_tokens, train_lengths=list(o.train_lengths),
                          **common))
    prepare(PrepareConfig(out=str(sent_dir), segment_tokens=0, spm_models=[str(doc_dir / "spm.model")], **common))
    return {"doc": doc_dir, "sentence": sent_dir}


def read_split_documents(data_dir: Path, split: str, lang: str, kind: str = "words") -> Dict[str, List[str]]:
    """Verses of a split grouped by chapter (document id), in order, from the prepared word files
    (``kind="extra"``: the second reference, reluformer-prepare --extra-target)."""
    words = (data_dir / f"{split}.{kind}.{lang}").read_text(encoding="utf-8").splitlines()
    chapters = [line.split("\t")[1] for line in (data_dir / f"{split}.verses.tsv").read_text(encoding="utf-8").splitlines()]
    if len(words) != len(chapters):
        raise ValueError(f"{data_dir}: {split}.{kind}.{lang} has {len(words)} lines, {split}.verses.tsv {len(chapters)}")
    docs: Dict[str, List[str]] = {}
    for chapter, verse in zip(chapters, words):
        docs.setdefault(chapter, []).append(verse)
    return docs


def limit_chapters(docs: Dict[str, List[str]], k: int) -> Dict[str, List[str]]:
    return dict(list(docs.items())[:k]) if k else docs


def multi_reference_bleu(o: DemoOptions, data_dir: Path, split: str, hyp_docs: List[List[str]]) -> dict:
    """s-BLEU and d-BLEU against both references (the BSB and the second translation), where the
    data was prepared with ``--extra-target``; {} otherwise. The single-reference scores stay the
    BSB's, so they compare with runs without a second reference."""
    if not (data_dir / f"{split}.extra.en").is_file():
        return {}
    refs = list(limit_chapters(read_split_documents(data_dir, split, "en"), o.eval_chapters).values())
    extra = list(limit_chapters(read_split_documents(data_dir, split, "en", "extra"), o.eval_chapters).values())
    s_bleu = corpus_sbleu([s for d in hyp_docs for s in d], [s for d in refs for s in d], more_refs=[[s for d in extra for s in d]])
    return {"s_bleu_2ref": s_bleu.score, "d_bleu_2ref": corpus_dbleu(hyp_docs, refs, more_refs=[extra]).score}


def positions(dirs: Dict[str, Path]) -> int:
    """One position budget for both phases, so a sentence-level model fine-tunes on segments."""
    return max(Prepared.load(d).positions for d in dirs.values())


# ------------------------------------------------------------------------------------ training
def document_phase_lr(o: DemoOptions) -> float:
    """Peak lr of the document phase: ``document_lr``, else ``lr`` (fresh optimizer and schedule)."""
    return o.document_lr or o.lr


def family_options(o: DemoOptions, family: str) -> DemoOptions:
    """The options one family trains with: the demo's, with the family's tuned settings over them
    (``o.family_settings``; a memory family such as ``softmax+tm`` trains with its base family's).
    The tuned fairseq options come before ``o.train_args``, so the command line's still win."""
    settings = o.family_settings.get(split_family(family)[0])
    if not settings:
        return o
    values = {k: v for k, v in settings.items() if k in TUNED_FIELDS}
    return replace(o, **values, train_args=list(settings.get("train_args", ())) + list(o.train_args),
                   family_settings={})


# the recipe's size fields too (experiments/recipe.py: a --space recipe search tunes them)
TUNED_FIELDS = ("lr", "warmup_updates", "dropout", "sentence_updates", "max_update", "embed_dim", "ffn_dim", "layers",
                "heads", "max_tokens")


def family_run(o: DemoOptions, family: str) -> TrainingRun:
    """The training run of one family (``softmax``, ``softmax+tm``, ...) with the demo's options
    and its tuned settings (:func:`family_options`): sentences first when ``sentence_updates``
    (not with a time budget), then document segments."""
    o = family_options(o, family)
    arch_family, fusion = split_family(family, o.tm_fusion)
    document = Phase("document", o.segment_tokens, 0 if o.budget_minutes else o.max_update)
    phases = (document,)
    if o.sentence_updates > 0 and not o.budget_minutes:  # the document phase restarts at document_lr
        phases = (Phase("sentence", "sentence", o.sentence_updates), replace(document, lr=o.document_lr))
    dimensions = {} if o.size else dict(embed_dim=o.embed_dim, ffn_dim=o.ffn_dim, layers=o.layers, heads=o.heads)
    # validate (greedy s-BLEU costs seconds) and save only every few updates, not also at every
    # epoch end as fairseq does by default (a sentence-level epoch here is ~116 updates)
    return TrainingRun(arch=f"{arch_family}_{o.size or 'tiny'}", **dimensions, phases=phases, lr=o.lr,
                       warmup_updates=o.warmup_updates, max_tokens=o.max_tokens, dropout=o.dropout,
                       budget_minutes=o.budget_minutes, seed=o.seed, device=o.device,
                       validate_every=200 if o.budget_minutes else None, validations=o.validations,
                       only_at_intervals=True, tm_fusion=fusion, tm_k=o.tm_k, extra=tuple(o.train_args))


def train_phase(o: DemoOptions, argv: List[str], save_dir: Path, log_file: Path) -> None:
    """fairseq-train in this process, unless the phase finished before (then skipped, unless
    ``force``); writes its wall and CPU seconds, and resumes the time of an interrupted start."""
    checkpoint, finished = save_dir / "checkpoint_last.pt", save_dir / "train_seconds.txt"
    if not o.force and finished.exists():
        print(f"  {checkpoint} is finished: skipped (use --force to retrain)")
        return
    resumed = save_dir / "seconds_before_resume.txt"
    if o.force or not checkpoint.exists():  # a fresh start; otherwise fairseq resumes checkpoint_last.pt
        for stale in (log_file, resumed):
            stale.unlink(missing_ok=True)
    before = float(resumed.read_text()) if resumed.exists() else 0.0
    start, cpu_start = time.time(), process_cpu_seconds()
    try:
        run_fairseq("train", argv)
    except BaseException:  # interrupted: remember the time spent, resume on the next call
        save_dir.mkdir(parents=True, exist_ok=True)
        resumed.write_text(f"{before + time.time() - start:.1f}\n")
        raise
    finished.write_text(f"{before + time.time() - start:.1f}\n")
    # CPU seconds of this process (training runs in-process): unlike wall minutes, they do not
    # depend on which family trained beside it or on other jobs of the machine
    (save_dir / "train_cpu_seconds.txt").write_text(f"{process_cpu_seconds() - cpu_start:.1f}\n")


def phase_files(o: DemoOptions, family: str, run: TrainingRun) -> List[tuple]:
    """(phase, checkpoint folder, fairseq log) of each phase of a family's run: one folder and log
    per phase when there are two (``checkpoints/FAMILY/sentence``, ``logs/FAMILY.sentence.log``)."""
    root, several = o.out / "checkpoints" / family, len(run.phases) > 1
    return [(phase, root / phase.name if several else root,
             o.out / "logs" / (f"{family}.{phase.name}.log" if several else f"{family}.log")) for phase in run.phases]


def train_family(o: DemoOptions, family: str, dirs: Dict[str, Path]) -> dict:
    """Train (or reuse) one family: optional sentence-level phase, then document segments.
    Returns the checkpoint, training seconds and the learning curve (minutes across both phases)."""
    run = family_run(o, family)
    (o.out / "logs").mkdir(parents=True, exist_ok=True)
    max_positions = positions(dirs)
    init_from, curve, seconds, cpu, total_updates = None, {"train": [], "valid": []}, 0.0, 0.0, 0
    for phase, save_dir, log_file in phase_files(o, family, run):
        data_dir = dirs["sentence" if phase.level == "sentence" else "doc"]
        phase = batch_fitting(phase, run, data_dir)
        train_phase(o, train_args(run, phase, data_dir, save_dir, log_file, max_positions, init_from), save_dir, log_file)
        add_phase_curve(curve, phase.name, read_learning_curve(log_file), offset=seconds)
        seconds += float((save_dir / "train_seconds.txt").read_text())
        cpu_file = save_dir / "train_cpu_seconds.txt"
        cpu = None if cpu is None or not cpu_file.exists() else cpu + float(cpu_file.read_text())
        total_updates += phase.updates
        init_from = save_dir / "checkpoint_last.pt"
    return {"checkpoint": init_from, "train_seconds": round(seconds, 1), "learning_curve": curve,
            "train_cpu_seconds": None if cpu is None else round(cpu, 1),
            "cpu_seconds_per_update": None if cpu is None or o.budget_minutes else round(cpu / max(1, total_updates), 3)}


def batch_fitting(phase: Phase, run: TrainingRun, data_dir: Path) -> Phase:
    """``phase`` with enough tokens per batch for its longest example (whole chapters of
    ``--train-lengths ...,document`` outgrow a small ``--max-tokens``; fairseq would refuse them)."""
    longest = positions({"phase": data_dir})
    return replace(phase, max_tokens=longest) if longest > run.max_tokens else phase


def add_phase_curve(curve: dict, phase: str, phase_curve: dict, offset: float) -> None:
    """A phase's points into the run's curve, its wall times after the phases before (``offset`` s)."""
    curve.setdefault("phase_starts", {})[phase] = offset  # seconds; the plot marks where each phase begins
    for part in ("train", "valid"):
        for point in phase_curve[part]:
            curve[part].append({**point, "phase": phase, "wall": None if point["wall"] is None else point["wall"] + offset})


def process_cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def training_progress(o: "DemoOptions", families: List[str], stages: Optional[Stages] = None):
    """Progress on the console (not in the log) of a training stage: the updates the families'
    fairseq logs report so far, summed, of all they will do: a bar on a terminal, else a line
    under the stage's every 30 s; off with --no-progress
    (:class:`reluformer_mt.experiments.progress.TrainingProgress`)."""
    from reluformer_mt.experiments.progress import TrainingProgress, updates_in_file

    phases = [entry for f in families for entry in phase_files(o, f, family_run(o, f))]
    readers = [updates_in_file(log_file) for _, _, log_file in phases]

    def done():
        return sum(r() or 0 for r in readers)

    total = None if o.budget_minutes else sum(phase.updates for phase, _, _ in phases)
    return TrainingProgress(done, total, desc="train", console=sys.__stderr__, enabled=False if o.no_progress else None,
                            say=stages.note if stages is not None else None)


def training_jobs(o: "DemoOptions") -> int:
    """Families trained at once: on a CPU, small models gain little from a second thread, so two
    one-thread trainings side by side finish about twice as fast as one after the other."""
    return workers(o)


def _in_worker(log_file: Path, level: int, fn, *args):
    """``fn(*args)`` in a worker process: one thread, its console output and logs into the demo's log."""
    torch.set_num_threads(1)
    register()
    with open(log_file, "a", encoding="utf-8") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        logging.basicConfig(stream=log, level=level, force=True,
                            format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
        return fn(*args)


def family_job_call(o: "DemoOptions", job: Job, dirs: Dict[str, Path], done: Dict[str, object]) -> tuple:
    """``(fn, *args)`` of one job of :func:`reluformer_mt.experiments.demo_timing.family_jobs`;
    ``done``: the results of the jobs it waits for (the checkpoint, the tuned values)."""
    from reluformer_mt.experiments.demo_translate import GUIDED_MODES, PLAIN_MODES, translate_modes, tune_family

    kind, family = job.info["kind"], job.info["family"]
    if kind == "train":
        return (train_family, o, family, dirs)
    checkpoint = done[f"train {family}"]["checkpoint"]
    if kind == "tune":
        return (tune_family, o, family, checkpoint, dirs["doc"])
    if kind == "chapter":
        return (translate_one_chapter, o, checkpoint, dirs["doc"], o.out / "report", 1)
    modes, tuned = (GUIDED_MODES, done.get(f"tune {family}")) if kind == "guided" else (PLAIN_MODES, None)
    return (translate_modes, o, family, checkpoint, dirs["doc"], split_family(family)[1] is not None, tuned,
            bleu_of_model, modes)


def train_and_translate_in_parallel(o: "DemoOptions", dirs: Dict[str, Path], stages: Stages) -> tuple:
    """Every family trained, ``training_jobs(o)`` jobs at a time (one thread each), and each one's
    datastore, tuning and decoding modes started as soon as it is trained, so that no core idles
    while the last family trains (:mod:`.demo_schedule`). Returns (trained, translated, chapter):
    ``train_family``'s result and ``{"tuned", "modes"}`` per family, ``translate_one_chapter``'s."""
    from reluformer_mt.experiments.demo_schedule import run_jobs
    from reluformer_mt.experiments.demo_timing import family_jobs, load_timing, reused_jobs
    from reluformer_mt.experiments.demo_translate import MODES

    reused = reused_jobs(o)
    jobs = family_jobs(o, load_timing(), reused)
    for job in jobs:
        job.call = lambda done, job=job: family_job_call(o, job, dirs, done)
    seconds: Dict[str, float] = {}
    log_file = o.out / "logs" / "demo.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)

    def done(job: Job, result, took: float) -> None:
        seconds[job.name] = round(took, 1)
        stages.note(f"{job.name}: done in {minutes(took)} ({len(seconds)} of {len(jobs)} jobs)")

    with spawn_pool(training_jobs(o)) as pool:
        def submit(job: Job, fn, *args):  # fairseq-train's INFO lines into the log, the decoders' warnings
            return pool.submit(_in_worker, log_file, logging.INFO if job.info["kind"] == "train" else logging.WARNING,
                               fn, *args)

        results = run_jobs(training_jobs(o), jobs, submit, done)
    # the jobs whose results an earlier run left are recorded as such: their seconds time nothing
    trained = {f: {**results[f"train {f}"], "job_seconds": {"train": seconds[f"train {f}"]},
                   "reused_jobs": sorted(kind for kind in ("train", "tune") if f"{kind} {f}" in reused)}
               for f in o.families}
    translated = {}
    for f in o.families:  # the modes in their order (the tables' columns)
        modes = {**results.get(f"plain modes {f}", {}), **results.get(f"guided modes {f}", {})}
        translated[f] = {"tuned": results.get(f"tune {f}"), "modes": {m: modes[m] for m in MODES if m in modes}}
        trained[f]["job_seconds"].update({kind: seconds[f"{name} {f}"] for kind, name in
                                          (("tune", "tune"), ("guided", "guided modes"), ("plain", "plain modes"))
                                          if f"{name} {f}" in seconds})
    return trained, translated, results["reluformer-translate"]


# ------------------------------------------------------------------------------------ evaluation
def tune_and_translate_family(o: "DemoOptions", family: str, checkpoint: Path, data_dir: Path) -> dict:
    """Every translation of the held-out chapters one family needs (:mod:`.demo_translate`): the
    datastore and tuning on the validation chapters first (kNN-MT, pieces), then every mode."""
    from reluformer_mt.experiments.demo_translate import tune_family, translate_modes

    tuned = tune_family(o, family, checkpoint, data_dir) if needs_tuning(o) else None
    modes = translate_modes(o, family, checkpoint, data_dir, split_family(family)[1] is not None, tuned, bleu_of_model)
    return {"tuned": tuned, "modes": modes}


def needs_tuning(o: "DemoOptions") -> bool:
    return o.knn or o.pieces_weight is None


def translate_families(o: "DemoOptions", checkpoints: Dict[str, Path], data_dir: Path) -> Dict[str, dict]:
    """:func:`tune_and_translate_family` of every family, one after the other (with one job at a
    time; side by side, :func:`train_and_translate_in_parallel` translates them)."""
    return {family: tune_and_translate_family(o, family, checkpoint, data_dir) for family, checkpoint in checkpoints.items()}


def bleu_of_model(o: DemoOptions, checkpoint: Path, data_dir: Path, split: str = "test", **translator_options) -> dict:
    """Translate every held-out chapter of ``split`` with the document translator; s-BLEU and d-BLEU.

    ``translator_options``: further :class:`DocumentTranslator` keywords, e.g. ``separators="free"``
    (how often the model keeps the verse separators by itself), ``memory="none"`` (a memory model
    without its matches), translation pieces or kNN-MT (:mod:`.demo_translate`). The family tuner
    (:mod:`.tune`) scores its trials with ``split="valid"``."""
    sources = limit_chapters(read_split_documents(data_dir, split, "grc"), o.eval_chapters)
    references = limit_chapters(read_split_documents(data_dir, split, "en"), o.eval_chapters)
    translator = DocumentTranslator(checkpoint, data=data_dir, device=o.device, beam=o.beam, **translator_options)
    start = time.time()
    results = translator.translate(list(sources.values()), progress=True)
    seconds = time.time() - start
    hyp_docs = [[r.text for r in doc] for doc in results]
    ref_docs = list(references.values())
    s_bleu = corpus_sbleu([s for d in hyp_docs for s in d], [s for d in ref_docs for s in d])
    d_bleu = corpus_dbleu(hyp_docs, ref_docs)
    stats = translator.stats
    # every retranslation starts by halving a whole segment: that count over the segments is the
    # share of segments whose output did not split into the right number of verses
    fallbacks = stats["fallbacks: segment retranslated as halves"]
    return {"s_bleu": s_bleu.score, "d_bleu": d_bleu.score, "s_bleu_signature": s_bleu.signature,
            "d_bleu_signature": d_bleu.signature, "chapters": len(hyp_docs), "verses": sum(map(len, hyp_docs)),
            "segments": stats["segments"], "fallbacks": fallbacks, "separators": translator.separators,
            "fallback_rate": fallbacks / max(1, stats["segments"]),
            **multi_reference_bleu(o, data_dir, split, hyp_docs),
            "translate_seconds": round(seconds, 1), "hypotheses": dict(zip(sources, hyp_docs)),
            "knn_steps_changed": stats["knn: beam steps whose best token the neighbours changed"],
            "knn_steps": stats["knn: beam steps"],
            "matches": None if translator.memory is None else [
                {"fuzzy": r.match[1], "entry": r.match[0], "copy": translator.memory.target(r.match[0])}
                for doc in results for r in doc]}


def baselines(o: DemoOptions, data_dir: Path) -> dict:
    """What no learning gets: copying the nearest training verse (BLEU), the diagonal (AER)."""
    train_src = (data_dir / "train.words.grc").read_text(encoding="utf-8").splitlines()
    train_tgt = (data_dir / "train.words.en").read_text(encoding="utf-8").splitlines()
    sources = limit_chapters(read_split_documents(data_dir, "test", "grc"), o.eval_chapters)
    references = limit_chapters(read_split_documents(data_dir, "test", "en"), o.eval_chapters)
    copies = nearest_verse_translations(train_src, train_tgt, [s for d in sources.values() for s in d])
    hyp_docs, k = [], 0
    for doc in sources.values():
        hyp_docs.append(copies[k:k + len(doc)])
        k += len(doc)
    ref_docs = list(references.values())
    test_src = (data_dir / "test.words.grc").read_text(encoding="utf-8").splitlines()
    test_tgt = (data_dir / "test.words.en").read_text(encoding="utf-8").splitlines()
    lengths = [(len(s.split()), len(t.split())) for s, t in zip(test_src, test_tgt)]
    gold = aer_lib.read_gold(data_dir / "test.gold.align", base=0)
    return {"nearest_verse": {"s_bleu": corpus_sbleu(copies, [s for d in ref_docs for s in d]).score,
                              "d_bleu": corpus_dbleu(hyp_docs, ref_docs).score,
                              **multi_reference_bleu(o, data_dir, "test", hyp_docs)},
            "diagonal": {"aer": diagonal_aer(lengths, gold).aer}}


def alignment_and_stats(o: DemoOptions, checkpoints: Dict[str, Path], data_dir: Path, report_dir: Path) -> dict:
    """AER per layer against the gold verse alignments, and attention statistics, all models at once."""
    names, paths = list(checkpoints), [str(p) for p in checkpoints.values()]
    text = dict(src=str(data_dir / "test.words.grc"), tgt=str(data_dir / "test.words.en"))
    aer = run_align(paths, names=names, data=str(data_dir), gold=str(data_dir / "test.gold.align"), gold_base=0,
                    layer="all", plot=str(report_dir / "aer_per_layer.png"), device=o.device, **text)
    stats = run_attn_stats(paths, names=names, data=str(data_dir), split=None, kinds=("encoder_self", "decoder_self", "cross"),
                           plot=str(report_dir / "sparsity_per_layer.png"), device=o.device, **text)
    return {"aer": aer, "attn_stats": stats}


def best_layer(aer_per_layer: dict) -> tuple:
    """(mode, layer index, AER) of the head average with the lowest AER, normal or shifted."""
    return min(((mode, i, value) for mode in ("normal", "shifted")
                for i, value in enumerate(aer_per_layer[mode]["head_average"])), key=lambda item: item[2])


def plot_verse_alignment(o: DemoOptions, checkpoints: Dict[str, Path], aer: Dict[str, dict], data_dir: Path,
                         path: Path) -> Path:
    """Word-level cross-attention (best layer's head average) of one short held-out verse per model,
    with the verse's gold links drawn over it."""
    sources = (data_dir / "test.words.grc").read_text(encoding="utf-8").splitlines()
    targets = (data_dir / "test.words.en").read_text(encoding="utf-8").splitlines()
    gold = aer_lib.read_gold(data_dir / "test.gold.align", base=0)
    verse = next((i for i, (s, t) in enumerate(zip(sources, targets))
                  if 6 <= len(s.split()) <= 12 and 6 <= len(t.split()) <= 14 and gold[i][0]), 0)
    src, tgt = sources[verse].split(), targets[verse].split()
    words, subtitles = {}, {}
    for name, ckpt in checkpoints.items():
        mode, layer, value = best_layer(aer[name])
        loaded = extract.load_checkpoint(str(ckpt), str(data_dir), device=o.device)
        pair = extract.encode_pairs(loaded, [src], [tgt])[0]
        cross = extract.attention_of_pairs(loaded, [pair])[0]["cross"][layer].mean(0)  # head average
        if mode == "shifted":
            cross = shift_rows(cross)
        words[name] = word_attention(cross, pair.src_word_ids, pair.tgt_word_ids)
        subtitles[name] = f"layer {layer + 1}, {mode}, head average (test AER {value:.2f})"
    sure, possible = gold[verse]
    return plot_word_alignment(words, src, tgt, sorted(sure), path, gold_possible=sorted(possible - sure),
                               subtitles=subtitles,
                               title=f"held-out verse {verse + 1}: cross-attention over words; squares = gold links")


def side_by_side(chapter: str, sources: List[str], references: List[str], hypotheses: Dict[str, List[str]],
                 path: Path) -> Path:
    """The chapter as a Markdown table: verse, source, reference, each model's translation."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    names = list(hypotheses)
    lines = [f"# Chapter {chapter}: source, reference and translations", "",
             "| verse | source (Greek) | reference (BSB) | " + " | ".join(names) + " |",
             "|---" * (3 + len(names)) + "|"]
    for k, (src, ref) in enumerate(zip(sources, references)):
        lines.append(f"| {k + 1} | {cell(src)} | {cell(ref)} | "
                     + " | ".join(cell(hypotheses[n][k]) for n in names) + " |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def translate_one_chapter(o: DemoOptions, checkpoint: Path, data_dir: Path, report_dir: Path,
                          threads: Optional[int] = None) -> dict:
    """The user's path: ``reluformer-translate`` on one raw held-out chapter (one verse per line);
    ``threads``: its ``--threads`` (one, as a job beside the others)."""
    chapter, verses = next(iter(read_split_documents(data_dir, "test", "grc").items()))
    source = report_dir / f"chapter_{chapter}.grc.txt"
    target = report_dir / f"chapter_{chapter}.en.txt"
    source.write_text("\n".join(verses) + "\n", encoding="utf-8")
    command = [str(Path(sys.executable).parent / "reluformer-translate"), "--checkpoint", str(checkpoint),
               "--data", str(data_dir), "--beam", str(o.beam), "--device", o.device, "--format", "lines",
               "--input", str(source), "--output", str(target)] + (["--threads", str(threads)] if threads else [])
    start = time.time()
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"reluformer-translate failed: {result.stderr.strip().splitlines()[-1:]}")
    return {"chapter": chapter, "verses": len(verses), "seconds": round(time.time() - start, 1),
            "command": " ".join(command), "source": str(source), "translation": str(target),
            "summary": result.stderr.strip().splitlines()[-3:]}


# ------------------------------------------------------------------------------------ report
TABLE_HEADERS = ["model", "params", "updates", "train min", "valid loss", "s-BLEU", "d-BLEU", "AER best layer",
                 "(head avg)", "cross sparsity", "cross null", "fallbacks", "free: s-BLEU", "free: d-BLEU",
                 "free: fallbacks"]


# The reference run's numbers (``--preset long``, docs/REFERENCE_RUN.md), in the format of
# OUT/report/summary.json, committed here so that every demo table shows where it stands. The
# committed copy holds its sentence-phase models (its document phase made them worse).
REFERENCE_SUMMARY = PACKAGE_DIR / "experiments" / "reference_run.json"


def best_aer(aer_per_layer: dict) -> tuple:
    """(best head, head average): each the lowest AER over layers and over normal / shifted."""
    return tuple(min(min(aer_per_layer[mode][kind]) for mode in ("normal", "shifted"))
                 for kind in ("best_head", "head_average"))


def updates_label(r: dict) -> str:
    """'sentence+document' updates of a two-phase model, else its updates."""
    return f"{r['sentence_updates']}+{r['updates']}" if r.get("sentence_updates") else str(r["updates"])


def summary(results: Dict[str, dict], o: DemoOptions, total_seconds: float, base: Optional[dict] = None) -> dict:
    """The table's numbers per family, small enough to commit (``REFERENCE_SUMMARY``)."""
    families = {}
    for family, r in results.items():
        best_head, head_avg = best_aer(r["aer"])
        families[family] = {
            "updates": updates_label(r),
            "train_minutes": round(r["train_seconds"] / 60, 1), "s_bleu": round(r["s_bleu"], 2),
            "d_bleu": round(r["d_bleu"], 2),
            "aer_best_head": round(best_head, 3), "aer_head_average": round(head_avg, 3),
            "fallbacks": f"{r['fallbacks']}/{r['segments']}",
            "cross_sparsity": round(r["cross_sparsity"], 3) if "cross_sparsity" in r else None,
            "cpu_seconds_per_update": r.get("cpu_seconds_per_update"),
            "best_mode": r.get("best_mode", "constrained"),
            "modes": {mode: {"s_bleu": round(m["s_bleu"], 2), "d_bleu": round(m["d_bleu"], 2),
                             **{k: round(m[k], 2) for k in ("s_bleu_2ref", "d_bleu_2ref") if k in m},
                             "fallbacks": f"{m['fallbacks']}/{m['segments']}", "file": m.get("hypothesis_file")}
                      for mode, m in r.get("modes", {}).items()},
            **({"knn": {**{mode: r["tuned"]["chosen"][mode]["options"] for mode in ("full", "per_input")
                           if mode in r["tuned"]["chosen"]},  # none with --no-knn
                        "pieces": {k: v for k, v in r["tuned"]["chosen"]["pieces"].items() if k not in ("s_bleu", "decode")}}}
               if r.get("tuned") else {})}
    baselines = {name: {k: round(v, 2) for k, v in b.items()} for name, b in (base or {}).items()
                 if name in ("nearest_verse", "tm_copy", "diagonal")}
    return {"preset": o.preset, "train_args": list(o.train_args), "total_minutes": round(total_seconds / 60, 1),
            "commit": git_commit(), "families": families, "baselines": baselines}


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=PACKAGE_DIR, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def reference_rows(reference: Optional[dict]) -> List[list]:
    """Rows of the committed reference run, for a table of a shorter run."""
    if not reference or not reference.get("families"):
        return []
    return [[f"reference run ({reference['preset']}): {family}", "", r["updates"], r["train_minutes"], "", r["s_bleu"],
             r["d_bleu"], r["aer_best_head"], r["aer_head_average"], "", "", r["fallbacks"], "", "", ""]
            for family, r in reference["families"].items()]


def comparison_rows(results: Dict[str, dict], base: dict, reference: Optional[dict] = None) -> List[list]:
    rows = []
    for family, r in results.items():
        best_head, head_avg = best_aer(r["aer"])
        updates = updates_label(r)
        rows.append([family, r["params"], updates, round(r["train_seconds"] / 60, 1), r["valid_loss"],
                     r["s_bleu"], r["d_bleu"], best_head, head_avg, r["cross_sparsity"], r["cross_null"],
                     f"{r['fallbacks']}/{r['segments']}"]
                    + ([free["s_bleu"], free["d_bleu"], f"{free['fallbacks']}/{free['segments']}"]
                       if (free := r.get("modes", {}).get("free")) else ["", "", ""]))
    nan = float("nan")
    rows.append(["baseline: nearest training verse", "", "", "", "", base["nearest_verse"]["s_bleu"],
                 base["nearest_verse"]["d_bleu"], nan, nan, "", "", "", "", "", ""])
    if "tm_copy" in base:
        rows.append(["baseline: copy of the memory's match", "", "", "", "", base["tm_copy"]["s_bleu"],
                     base["tm_copy"]["d_bleu"], nan, nan, "", "", "", "", "", ""])
    rows.append(["baseline: diagonal alignment", "", "", "", "", nan, nan, base["diagonal"]["aer"],
                 base["diagonal"]["aer"], "", "", "", "", "", ""])
    return rows + reference_rows(reference)


DEFINITIONS = {
    "s_bleu": "sacreBLEU (13a) over verses of the held-out chapters, on tokenised text: the reference is the BSB "
              "tokenised as the gold alignment's words ('vineyard .'), and so are the outputs; BLEU on Moses-"
              "detokenised text, comparable with other work, is in metrics.json and index.html",
    "d_bleu": "sacreBLEU over whole chapters (documents)",
    "aer": "Och & Ney AER of cross-attention links vs the manual verse alignments, the minimum over layers and over "
           "normal/shifted; best head chosen on the same gold set, head average needs no choice",
    "cross_sparsity": "share of exact zeros among visible cross-attention weights",
    "fallbacks": "segments retranslated (as halves or verse by verse) because the output did not split into the "
                 "right number of verses / all segments; with the default separator-constrained decoding only an "
                 "output cut at the length limit can fail to split",
    "free": "the same translation with --separators free (plain beam search): how often the model keeps the verse "
            "separators by itself, and its BLEU with the fallbacks",
    "baselines": "nearest training verse: the BSB verse whose Greek is most similar (TF-IDF cosine) to the test "
                 "verse, copied; diagonal alignment: links j -> round(j * n / m)",
}


def modes_table(results: Dict[str, dict], base: dict, metric: str = "s_bleu") -> str:
    """Every family in every decoding mode (``metric``: s_bleu or d_bleu), the mode chosen on the
    validation chapters marked with *, beside the copy baselines ('' when a mode was not run)."""
    from reluformer_mt.experiments.demo_translate import LABELS, MODES

    modes = [m for m in MODES if any(m in r.get("modes", {}) for r in results.values())]
    rows = []
    for family, r in results.items():
        cells = []
        for m in modes:
            value = r.get("modes", {}).get(m, {}).get(metric)
            cells.append("" if value is None else f"{value:.2f}" + ("*" if m == r.get("best_mode") else ""))
        rows.append([family] + cells)
    names = {"nearest_verse": "baseline: nearest training verse", "tm_copy": "baseline: copy of the memory's match"}
    for key, name in names.items():
        if key in base:
            value = base[key].get(metric)
            rows.append([name, "" if value is None else f"{value:.2f}"] + [""] * (len(modes) - 1))
    return format_table(["model"] + [LABELS[m] for m in modes], rows)


def band_table(results: Dict[str, dict]) -> str:
    """s-BLEU of every mode by the best memory match's fuzzy band, beside copying the match."""
    from reluformer_mt.experiments.demo_translate import LABELS

    rows, systems = [], None
    for family, r in results.items():
        bands = r.get("bands")
        if not bands:
            continue
        systems = systems or bands["systems"]
        for b in bands["bands"]:
            rows.append([f"{family}: {b['band']}", b["sentences"]]
                        + [float("nan") if b.get(s) is None else b[s] for s in systems])
    if not rows:
        return ""
    return format_table(["model: band (fuzzy %)", "verses"] + [LABELS.get(s, s) for s in systems], rows)


def knn_table(results: Dict[str, dict]) -> str:
    """The values the tuner chose on the validation chapters, and the validation s-BLEU of each
    read-out (softmax vs ReLU), per family."""
    rows = []
    for family, r in results.items():
        t = r.get("tuned")
        if not t:
            continue
        for mode in ("full", "per_input"):
            if mode not in t["chosen"]:  # --no-knn: only the pieces were tuned
                continue
            c = t["chosen"][mode]
            o = c["options"]
            spread = f"radius {o['radius']:.3g}" if o["readout"] == "relu" else f"T {o['temperature']:.3g}"
            adaptive = c.get("adaptive_s_bleu")
            rows.append([f"{family} ({'full datastore' if mode == 'full' else 'per-input'})",
                         o["readout"] + (" (adaptive)" if o.get("adaptive") else ""),
                         "Meta-k" if o.get("adaptive") else o["k"], "Meta-k" if o.get("adaptive") else o["lam"], spread,
                         c["by_readout"]["softmax"], c["by_readout"]["relu"], "" if adaptive is None else adaptive,
                         c["s_bleu_with_pieces"], search_choice(c.get("search"))])
    if not rows:
        return ""
    return format_table(["model (datastore)", "read-out", "k", "lambda", "T / radius", "valid: softmax read-out",
                         "valid: relu read-out", "valid: adaptive", "valid: + pieces", "search (against exact)"], rows)


def search_choice(search: Optional[dict]) -> str:
    """The search the tuner chose, with its validation s-BLEU and speed against the exact search."""
    if not search:
        return ""
    if search["exact"]:
        return f"{search['search']} (exact)"
    return (f"{search['search']} ({search['s_bleu'] - search['exact_s_bleu']:+.2f} s-BLEU, "
            f"{search['sentences_per_s'] / search['exact_sentences_per_s']:.2f}x sentences/s)")


# Published points of comparison (other corpora and model sizes: for orientation, not for a match).
PAPER_POINTS = [
    "ReLA paper (Zhang et al. 2021, WMT En-De, 6+6 layers): best-head AER about 0.41 (normal) / 0.31 (shifted), "
    "ReLA-g lowest of all functions",
    "ReLUFormer paper (Shen et al. 2023, Europarl7 En-De documents): equal to softmax at 128-256-token "
    "segments, better from 512 on (+1.15 BLEU at 1024)",
]


def collect_translations(o: DemoOptions, results: Dict[str, dict], translated: Dict[str, dict], base: dict,
                         data_dir: Path) -> Dict[str, Dict[str, dict]]:
    """Each family's modes into ``results`` (the table's s-BLEU/d-BLEU are the constrained
    decoding's), the bands of every mode, the copy-of-the-match baseline; prints a line per mode.
    Returns the hypotheses as ``{mode: {family: {chapter: verses}}}``."""
    from reluformer_mt.experiments.demo_translate import (bands_of_modes, best_validation_mode, hypothesis_file,
                                                          tm_first_mode)

    references = limit_chapters(read_split_documents(data_dir, "test", "en"), o.eval_chapters)
    refs = [v for doc in references.values() for v in doc]
    hypotheses: Dict[str, Dict[str, dict]] = {}
    for family, t in translated.items():
        modes = t["modes"]
        for mode, b in modes.items():
            hypotheses.setdefault(mode, {})[family] = b.pop("hypotheses")
            b["hypothesis_file"] = hypothesis_file(family, mode)
            print(f"  {family} ({mode}): s-BLEU {b['s_bleu']:.2f}  d-BLEU {b['d_bleu']:.2f}  "
                  f"({b['chapters']} chapters, {b['verses']} verses, {b['fallbacks']}/{b['segments']} segments "
                  f"retranslated, {b['translate_seconds']} s)", flush=True)
        tm_first = tm_first_mode(t["tuned"], {m: {**b, "hypotheses": hypotheses[m][family]} for m, b in modes.items()},
                                 best_validation_mode(t["tuned"], modes), references)
        if tm_first is not None:  # the best mode with its matches above the tuned threshold copied
            hypotheses.setdefault("tm-first", {})[family] = tm_first.pop("hypotheses")
            modes["tm-first"] = {**tm_first, "hypothesis_file": hypothesis_file(family, "tm-first")}
        bands = bands_of_modes(refs, {m: {**b, "hypotheses": hypotheses[m][family]} for m, b in modes.items()})
        matches = next((b["matches"] for b in modes.values() if b.get("matches")), None)
        if matches is not None and "tm_copy" not in base:
            copies = [m["copy"] or "" for m in matches]
            copy_docs, k = [], 0
            for doc in references.values():
                copy_docs.append(copies[k:k + len(doc)])
                k += len(doc)
            base["tm_copy"] = {"s_bleu": corpus_sbleu(copies, refs).score,
                               "d_bleu": corpus_dbleu(copy_docs, list(references.values())).score}
        for b in modes.values():
            b.pop("matches", None)
        constrained = modes["constrained"]
        results[family].update({k: v for k, v in constrained.items()})
        results[family]["modes"] = modes
        results[family]["bands"] = bands
        results[family]["tuned"] = t["tuned"]
        results[family]["best_mode"] = best_validation_mode(t["tuned"], modes)
    return hypotheses


def train_stage(o: DemoOptions, stages: Stages, dirs: Dict[str, Path]) -> tuple:
    """Every family trained: one stage with the families side by side (one thread each), where each
    family's datastore, tuning and decoding modes start as soon as it is trained; or a stage per
    family. Returns the checkpoints, each family's first results (time, curve), and with the
    families side by side also the baselines with the hypotheses (:func:`translate_stage`'s) and the
    chapter of ``reluformer-translate`` (:func:`chapter_stage`'s), else None for both."""
    budget = f"{o.budget_minutes:g} min" if o.budget_minutes else (
        (f"{o.sentence_updates} sentence-level + " if o.sentence_updates else "") + f"{o.max_update} updates")
    if o.family_settings and not o.budget_minutes:  # the same total, each family's tuned split
        budget = f"{o.sentence_updates + o.max_update} updates, each family's tuned split"
    if training_jobs(o) == 1:
        trained = {}
        for family in o.families:
            with stages.stage(f"train {family} ({budget})"), training_progress(o, [family], stages):
                trained[family] = train_family(o, family, dirs)
        return (*first_results(o, trained), None, None)
    what = ("datastore, tuning and " if needs_tuning(o) else "") + "decoding modes"
    with stages.stage(f"train {', '.join(o.families)} ({budget} each, {training_jobs(o)} at a time), each family's "
                      f"{what} as soon as it is trained"), training_progress(o, o.families, stages):
        trained, translated, chapter = train_and_translate_in_parallel(o, dirs, stages)
        checkpoints, results = first_results(o, trained)
        base = baselines(o, dirs["doc"])
        hypotheses = collect_translations(o, results, translated, base, dirs["doc"])
        print(f"  chapter {chapter['chapter']}: {chapter['verses']} verses in {chapter['seconds']} s -> "
              f"{chapter['translation']}")
    return checkpoints, results, (base, hypotheses), chapter


def first_results(o: DemoOptions, trained: Dict[str, dict]) -> tuple:
    """(checkpoints, results) of the trained families: training time, learning curve, valid loss and
    the seconds of each of the family's jobs (``job_seconds``: the demo's time model, :mod:`.demo_timing`)."""
    results = {}
    for family in o.families:
        t = trained[family]
        document_valid = [p for p in t["learning_curve"]["valid"] if p["phase"] == "document"]
        results[family] = {"train_seconds": t["train_seconds"], "train_cpu_seconds": t.get("train_cpu_seconds"),
                           "cpu_seconds_per_update": t.get("cpu_seconds_per_update"),
                           "valid_loss": document_valid[-1]["loss"] if document_valid else float("nan"),
                           "learning_curve": t["learning_curve"], "job_seconds": t.get("job_seconds"),
                           "reused_jobs": t.get("reused_jobs", [])}
    return {family: trained[family]["checkpoint"] for family in o.families}, results


def translate_stage(o: DemoOptions, checkpoints: Dict[str, Path], results: Dict[str, dict], data_dir: Path) -> tuple:
    """The baselines, then every family in every decoding mode (into ``results``); returns the
    baselines and the hypotheses (``{mode: {family: {chapter: verses}}}``)."""
    base = baselines(o, data_dir)
    translated = translate_families(o, checkpoints, data_dir)
    return base, collect_translations(o, results, translated, base, data_dir)


def evaluate_stage(o: DemoOptions, checkpoints: Dict[str, Path], results: Dict[str, dict],
                   hypotheses: Dict[str, Dict[str, dict]], data_dir: Path, report_dir: Path) -> None:
    """Sizes, AER against the gold alignments and attention statistics into ``results``; the
    learning curves, the attention of one verse and one chapter beside its reference."""
    for family, checkpoint in checkpoints.items():
        info = checkpoint_info(checkpoint)
        results[family]["params"], results[family]["updates"] = info.parameters, info.updates
        # the document phase counts its own updates (fresh optimizer); the sentence phase's come first
        results[family]["sentence_updates"] = family_options(o, family).sentence_updates if not o.budget_minutes else 0
    evaluation = alignment_and_stats(o, checkpoints, data_dir, report_dir)
    for family in o.families:
        results[family]["aer"] = evaluation["aer"]["models"][family]["aer_per_layer"]
        cross = evaluation["attn_stats"]["models"][family]["stats"]["cross"]["all"]
        results[family]["cross_sparsity"] = cross["sparsity"]
        results[family]["cross_null"] = cross["null_rate"]
        results[family]["attention_statistics"] = evaluation["attn_stats"]["models"][family]["stats"]
    plot_curves_against_minutes({f: results[f]["learning_curve"] for f in o.families}, report_dir / "learning_curves.png",
                                title=f"{o.preset} preset, {', '.join(o.families)}")
    plot_verse_alignment(o, checkpoints, {f: results[f]["aer"] for f in o.families}, data_dir,
                         report_dir / "attention_heatmaps.png")
    chapter = next(iter(hypotheses["constrained"][o.families[0]]))
    side_by_side(chapter, read_split_documents(data_dir, "test", "grc")[chapter],
                 read_split_documents(data_dir, "test", "en")[chapter],
                 {f: hypotheses["constrained"][f][chapter] for f in o.families},
                 report_dir / f"chapter_{chapter}.side_by_side.md")


def chapter_stage(o: DemoOptions, checkpoint: Path, data_dir: Path, report_dir: Path) -> dict:
    """One held-out chapter translated with ``reluformer-translate``, as a user would."""
    translated = translate_one_chapter(o, checkpoint, data_dir, report_dir)
    print(f"  chapter {translated['chapter']}: {translated['verses']} verses in {translated['seconds']} s -> "
          f"{translated['translation']}")
    return translated


def demo_table(results: Dict[str, dict], base: dict, reference: Optional[dict]) -> str:
    """The console's and report.json's table: the comparison (beside the reference run's rows),
    every decoding mode, the tuned values and the fuzzy bands."""
    table = format_table(TABLE_HEADERS, comparison_rows(results, base, reference))
    table += ("\n\ns-BLEU of every decoding mode of the test chapters (* = the mode chosen on the validation "
              "chapters):\n" + modes_table(results, base, "s_bleu"))
    table += "\n\nd-BLEU of every decoding mode:\n" + modes_table(results, base, "d_bleu")
    if "s_bleu_2ref" in base.get("nearest_verse", {}):  # the data has a second reference (--extra-target)
        for metric, name in (("s_bleu_2ref", "s-BLEU"), ("d_bleu_2ref", "d-BLEU")):
            table += (f"\n\n{name} against both references (the BSB and the second translation):\n"
                      + modes_table(results, base, metric))
    for title, part in (("kNN-MT and translation pieces: the values tuned on the validation chapters "
                         "(reluformer-memory tune):", knn_table(results)),
                        ("s-BLEU by the best memory match's fuzzy-match band:", band_table(results))):
        if part:
            table += f"\n\n{title}\n{part}"
    return table


def report_stage(o: DemoOptions, results: Dict[str, dict], base: dict, hypotheses: Dict[str, Dict[str, dict]],
                 checkpoints: Dict[str, Path], translated: dict, dirs: Dict[str, Path], stages: Stages,
                 started: float) -> dict:
    """summary.json, report.json, table.md, the hypothesis files and index.html (a step with its
    own console line: its bootstrap intervals and alignments log to the log file); prints the table."""
    with stages.stage("write the report: summary, tables, bootstrap intervals, index.html"):
        report = write_report(o, results, base, hypotheses, checkpoints, translated, dirs,
                              dict(stages.times), time.time() - started)
    total = time.time() - started
    # the report's own seconds and the whole run's, measured once the report is written: again into
    # report.json and summary.json (what demo_timing and the README's duration read)
    report.update(stage_seconds=dict(stages.times), total_seconds=round(total, 1))
    write_json(o.out / "report" / "report.json", report, command=" ".join(sys.argv))
    write_json(o.out / "report" / "summary.json", summary(results, o, total, base))
    from reluformer_mt.evaluation.html_report import write_html_report

    page = write_html_report(o.out / "report")  # rendered last: the page shows the total, known only now
    print(f"\nHTML report (opens from the file system): {page}")
    print("\n" + report["table"])
    print("published points of comparison:\n" + "\n".join(f"- {point}" for point in PAPER_POINTS))
    print(f"\nreport: {o.out / 'report'}/ (report.json, table.md, learning_curves.png, attention_heatmaps.png, "
          f"aer_per_layer.png, sparsity_per_layer.png, chapter_{translated['chapter']}.side_by_side.md, "
          f"{Path(translated['translation']).name}); total {total / 60:.1f} min")
    return report


def write_report(o: DemoOptions, results: Dict[str, dict], base: dict, hypotheses: Dict[str, Dict[str, dict]],
                 checkpoints: Dict[str, Path], translated: dict, dirs: Dict[str, Path], stage_seconds,
                 total: float):
    """The report and the files of :func:`report_stage` but ``index.html`` (rendered after it)."""
    report_dir = o.out / "report"
    shows_reference = REFERENCE_SUMMARY.exists() and o.preset not in ("long", "reference")  # not beside itself
    reference = json.loads(REFERENCE_SUMMARY.read_text()) if shows_reference else None
    table = demo_table(results, base, reference)
    write_json(report_dir / "summary.json", summary(results, o, total, base))
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(o).items()}
    options["document_phase_lr"] = document_phase_lr(o)  # the value used, also when document_lr is unset
    report = {"options": options, "versions": versions(), "commit": git_commit(), "stage_seconds": stage_seconds,
              "total_seconds": round(total, 1), "data": {k: str(v) for k, v in dirs.items()},
              "definitions": DEFINITIONS, "baselines": base, "models": results, "translated_chapter": translated,
              "table": table}
    write_json(report_dir / "report.json", report, command=" ".join(sys.argv))
    # the readable report: table.md (Markdown and fixed width), plain hypothesis files, index.html
    write_table_files(report_dir, TABLE_HEADERS, comparison_rows(results, base, reference), PAPER_POINTS,
                      title=f"reluformer-demo, {o.preset} preset")
    write_page_files(report_dir, dirs["doc"], checkpoints, hypotheses,
                     {f: results[f]["aer"] for f in o.families}, device=o.device)
    return report


def run_demo(o: DemoOptions) -> dict:
    """Every stage; returns the report (also written to ``OUT/report/``)."""
    register()  # the models, criteria and task, and the fairseq fixes
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq leaves the root logger at DEBUG
    report_dir = o.out / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    stages = Stages(plan=demo_plan(o), log_file=o.out / "logs" / "demo.log")  # one console line per stage
    stages.announce()
    started = time.time()
    with stages.stage("prepare the bible corpus (Greek -> English, chapters as documents)"):
        dirs = prepare_corpus(o)
    checkpoints, results, translations, translated = train_stage(o, stages, dirs)
    if translations is None:  # one family at a time: the translations are a stage of their own
        what = ("kNN-MT datastores, tuning on the validation chapters, " if needs_tuning(o) else "") + "every decoding mode"
        with stages.stage(f"translate the held-out chapters ({what})"):
            translations = translate_stage(o, checkpoints, results, dirs["doc"])
    base, hypotheses = translations
    with stages.stage("evaluate: AER vs gold, attention statistics, the report's plots"):
        evaluate_stage(o, checkpoints, results, hypotheses, dirs["doc"], report_dir)
    if translated is None:
        with stages.stage(f"translate one held-out chapter with reluformer-translate ({o.families[0]})"):
            translated = chapter_stage(o, checkpoints[o.families[0]], dirs["doc"], report_dir)
    return report_stage(o, results, base, hypotheses, checkpoints, translated, dirs, stages, started)


__all__ = ["DemoOptions", "PRESETS", "run_demo"]
