#!/usr/bin/env python
"""Decoding speed of ``reluformer-translate`` against the tools users pick (issue 32), one run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/decoding_speed.py --data runs/demo/data/doc128.v2000 \\
        --checkpoint runs/demo/checkpoints/softmax/checkpoint_best.pt --threads 1 --repeats 5

The same checkpoint (a document-level model of a prepared directory), the same beam, length limits,
batch size and threads translate the directory's test split (``--sentences``: its first N
sentences, whole segments):

- ``reluformer-translate``: :class:`~reluformer_mt.inference.DocumentTranslator` on the split's
  documents as text (SentencePiece, segments, the separator-constrained beam, fallbacks, splitting
  back), the whole ``translate`` call timed;
- ``fairseq-generate``: the same segments of the binarised test split (a linked copy of the
  directory holding them) with ``--task document_translation``; the time it reports itself ("Translated N sentences ... in Xs": its generation steps);
- ``fairseq-interactive``: the split's segments as SentencePiece lines (``--buffer-size`` =
  ``--batch-size``); the "translation time" it reports;
- ``reluformer-translate (copy)``: a second translator of the same checkpoint, the noise check
  (its ratio to the first says what the method cannot resolve).
- ``reluformer-translate --alignments``: the translator asked for alignments as well (beam search
  then carries the alignment layer's attention of every hypothesis: what a plain call saves).

All run in this process (fairseq's CLIs through ``run_fairseq``; loading and imports are not
timed). ``--clock cpu`` times this thread's CPU seconds instead of elapsed ones (one torch thread:
the decoding runs in it), for a machine shared with other jobs. Each repetition runs every system once, in an order rotated every repetition; a ratio is
the median of the per-repetition ratios, printed with half their inter-quartile range. Rates are
sentences (of the source documents) per second. The last line is a SUMMARY.
"""
import argparse
import contextlib
import io
import json
import logging
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
USER_DIR = str(REPO / "reluformer_mt")
OVERHEAD_TARGET = 0.9  # reluformer-translate at >= 0.9x fairseq-generate's rate (overhead <= 10 %)
NOISE_TOLERANCE = 0.03


class BenchmarkError(ValueError):
    """A one-line problem with the benchmark's input."""


def paired_ratio(numerator, denominator) -> dict:
    """Median and inter-quartile range of numerator[r] / denominator[r] over repetitions r."""
    ratios = [n / d for n, d in zip(numerator, denominator)]
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return {"median": round(statistics.median(ratios), 3), "half_iqr": round((q3 - q1) / 2, 3),
            "min": round(min(ratios), 3), "max": round(max(ratios), 3), "per_rep": [round(r, 3) for r in ratios]}


def fmt(ratio: dict) -> str:
    return f"{ratio['median']:.2f}±{ratio['half_iqr']:.2f}"


def test_documents(data_dir: Path, sentences: int):
    """(documents as lists of sentence strings, their segments as SentencePiece lines, sentence
    count): the prepared test split's first segments holding ``sentences`` sentences at most."""
    from reluformer_mt.memory.tm import read_prepared

    text = read_prepared(data_dir, "test").sources
    from reluformer_mt.data.prepared import Prepared

    src = Prepared.load(data_dir).src_lang
    lines = (data_dir / "text" / f"test.{src}").read_text(encoding="utf-8").splitlines()
    rows = [line.split("\t") for line in (data_dir / "test.segments.tsv").read_text().splitlines() if line.strip()]
    if len(rows) != len(lines):
        raise BenchmarkError(f"{data_dir}: test.segments.tsv has {len(rows)} segments, text/test.{src} {len(lines)}")
    documents, segments, used = {}, [], 0
    for (doc, count, _), line in zip(rows, lines):
        count = int(count)
        if used + count > sentences:
            break
        documents.setdefault(doc, []).extend(text[used:used + count])
        segments.append(line)
        used += count
    if not segments:
        raise BenchmarkError(f"--sentences {sentences}: the first test segment of {data_dir} has more sentences")
    return list(documents.values()), segments, used


def subset_directory(data_dir: Path, segments: int, out: Path) -> Path:
    """A copy of ``data_dir`` (links) whose binarised test split holds its first ``segments``
    segments, so fairseq-generate translates exactly the segments the other systems do."""
    from fairseq.data import Dictionary, data_utils, indexed_dataset

    from reluformer_mt.data.prepared import Prepared

    prepared = Prepared.load(data_dir)
    out.mkdir(parents=True, exist_ok=True)
    for item in data_dir.iterdir():
        if not item.name.startswith("test."):
            (out / item.name).symlink_to(item.resolve())
    pair = f"{prepared.src_lang}-{prepared.tgt_lang}"
    for lang in (prepared.src_lang, prepared.tgt_lang):
        prefix = f"test.{pair}.{lang}"
        dictionary = Dictionary.load(str(data_dir / f"dict.{lang}.txt"))
        dataset = data_utils.load_indexed_dataset(str(data_dir / prefix), dictionary)
        builder = indexed_dataset.make_builder(str(out / f"{prefix}.bin"), impl="mmap", vocab_size=len(dictionary))
        for i in range(segments):
            builder.add_item(dataset[i])
        builder.finalize(str(out / f"{prefix}.idx"))
    for item in data_dir.glob("test.*"):
        if item.suffix == ".tsv":  # the segment (and sentence) metadata: the segments' lines only
            lines = item.read_text(encoding="utf-8").splitlines(keepends=True)
            (out / item.name).write_text("".join(lines[:segments]) if item.name == "test.segments.tsv" else "".join(lines),
                                         encoding="utf-8")
        elif not item.name.startswith(f"test.{pair}."):
            (out / item.name).symlink_to(item.resolve())
    return out


def reported_seconds(pattern: str, output: str, tool: str) -> float:
    found = re.findall(pattern, output)
    if not found:
        raise BenchmarkError(f"{tool} did not report its time (looked for {pattern!r} in its log)")
    return float(found[-1])


def fairseq_runner(tool: str, argv, pattern: str, clock: str):
    """A zero-argument callable: run fairseq-<tool> in this process and return its seconds: with
    ``clock`` "wall" the time it reports itself, with "cpu" this thread's CPU time inside its
    ``task.inference_step`` calls (the same steps its own timer covers)."""
    from fairseq.tasks import FairseqTask

    from reluformer_mt.fairseq_runner import run_fairseq

    def run() -> float:
        log = io.StringIO()
        handler = logging.StreamHandler(log)
        logging.getLogger().addHandler(handler)
        spent = [0.0]
        original = FairseqTask.inference_step

        def timed(self, *a, **k):
            start = time.thread_time()
            try:
                return original(self, *a, **k)
            finally:
                spent[0] += time.thread_time() - start
        FairseqTask.inference_step = timed
        try:
            run_fairseq(tool, argv, capture=True)
        finally:
            FairseqTask.inference_step = original
            logging.getLogger().removeHandler(handler)
        reported = reported_seconds(pattern, log.getvalue(), f"fairseq-{tool}")
        return spent[0] if clock == "cpu" else reported
    return run


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, type=Path, help="the prepared directory the checkpoint was trained on")
    p.add_argument("--checkpoint", required=True, type=Path, help="a document-level checkpoint of that directory")
    p.add_argument("--sentences", type=int, default=0,
                   help="translate the test split's first N sentences (whole segments; 0: all)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32, help="sentences (segments) per batch, every system")
    p.add_argument("--max-len-a", type=float, default=1.2)
    p.add_argument("--max-len-b", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="torch threads of every system")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repetitions")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: elapsed seconds (fairseq's tools: the time they report); cpu: this thread's CPU "
                        "seconds (fairseq's tools: inside their inference steps), for a machine shared with other jobs")
    p.add_argument("--json", type=Path, help="write every number here")
    args = p.parse_args(argv)
    if args.sentences < 0:
        p.error(f"--sentences must be >= 0, got {args.sentences}")
    for name in ("beam", "batch_size", "threads", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.checkpoint.is_file():
        p.error(f"--checkpoint {args.checkpoint}: no such file")
    if not (args.data / "prepared.json").is_file():
        p.error(f"--data {args.data}: not a prepared directory (no prepared.json)")

    import torch

    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.plugin import register

    register()
    torch.set_num_threads(args.threads)
    documents, segments, n_sentences = test_documents(args.data, args.sentences or 10**9)
    decoding = dict(beam=args.beam, batch_size=args.batch_size, max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    translators = {name: DocumentTranslator(args.checkpoint, data=args.data, quiet=True, **decoding)
                   for name in ("reluformer-translate", "reluformer-translate (copy)", "reluformer-translate --alignments")}
    common = [args.data, "--user-dir", USER_DIR, "--task", "document_translation", "--path", args.checkpoint,
              "--beam", args.beam, "--batch-size", args.batch_size, "--max-len-a", args.max_len_a,
              "--max-len-b", args.max_len_b, "--cpu", "--num-workers", "0"]
    tmp = Path(tempfile.mkdtemp(prefix="decoding_speed_"))
    # the generate split: the same segments (a binarised prefix of the test split), as --gen-subset
    (tmp / "input.txt").write_text("\n".join(segments) + "\n", encoding="utf-8")
    subset = subset_directory(args.data, len(segments), tmp / "data")
    generate = [subset] + common[1:] + ["--gen-subset", "test", "--quiet"]
    interactive = common + ["--input", tmp / "input.txt", "--buffer-size", args.batch_size]

    def translate(name, alignments: bool = False):
        def run():
            clock = time.thread_time if args.clock == "cpu" else time.perf_counter
            start = clock()
            translators[name].translate(documents, progress=False, alignments=alignments)
            return clock() - start
        return run

    systems = {"reluformer-translate": translate("reluformer-translate"),
               "fairseq-generate": fairseq_runner("generate", generate, r"sentences \([\d,]+ tokens\) in ([\d.]+)s", args.clock),
               "fairseq-interactive": fairseq_runner("interactive", interactive, r"translation time: ([\d.]+)", args.clock),
               "reluformer-translate (copy)": translate("reluformer-translate (copy)"),
               "reluformer-translate --alignments": translate("reluformer-translate --alignments", alignments=True)}
    seconds = {name: [] for name in systems}
    names = list(systems)
    with contextlib.redirect_stderr(io.StringIO()):
        for run in systems.values():  # warm-up: one untimed call each
            run()
        for rep in range(args.repeats):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                seconds[name].append(systems[name]())
    rates = {name: [n_sentences / s for s in v] for name, v in seconds.items()}
    stats = translators["reluformer-translate"].stats
    rows = []
    for name, v in rates.items():
        row = {"system": name, "sentences_per_s": round(statistics.median(v), 2),
               "spread": round(max(v) - min(v), 2), "seconds": [round(s, 3) for s in seconds[name]]}
        if name != "reluformer-translate":
            row["translate_vs_this"] = paired_ratio(rates["reluformer-translate"], v)
        rows.append(row)
    print(f"{'system':34s} {'sentences/s':>12s} {'spread':>8s} {'translate / this':>18s}")
    for row in rows:
        ratio = fmt(row["translate_vs_this"]) if "translate_vs_this" in row else "ref"
        print(f"{row['system']:34s} {row['sentences_per_s']:12.2f} {row['spread']:8.2f} {ratio:>18s}")
    by_name = {row["system"]: row for row in rows}
    overhead = by_name["fairseq-generate"]["translate_vs_this"]
    noise = by_name["reluformer-translate (copy)"]["translate_vs_this"]
    fallbacks = sum(v for k, v in stats.items() if k.startswith("fallbacks: "))
    summary = (f"SUMMARY {n_sentences} sentences in {len(segments)} segments, beam {args.beam}, {args.threads} thread(s), "
               f"{args.repeats} interleaved repetitions, {args.clock} clock: reluformer-translate {by_name['reluformer-translate']['sentences_per_s']:.2f} "
               f"sentences/s; vs fairseq-generate {fmt(overhead)} {'✓' if overhead['median'] >= OVERHEAD_TARGET else '✗'} "
               f">={OVERHEAD_TARGET}; vs fairseq-interactive {fmt(by_name['fairseq-interactive']['translate_vs_this'])}; "
               f"noise check: copy {fmt(noise)}{'' if abs(noise['median'] - 1) <= NOISE_TOLERANCE else ' (noisy: raise --repeats)'}; "
               f"vs itself with --alignments {fmt(by_name['reluformer-translate --alignments']['translate_vs_this'])}; "
               f"translator fallbacks {fallbacks} in {args.repeats + 1} runs")
    report = {"rows": rows, "sentences": n_sentences, "segments": len(segments), "args": {k: str(v) for k, v in vars(args).items()},
              "translator_stats": dict(stats), "summary": summary}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(summary)
    return report


if __name__ == "__main__":
    try:
        main()
    except BenchmarkError as error:
        sys.exit(f"decoding_speed: {error}")
