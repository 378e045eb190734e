#!/usr/bin/env python
"""Training tokens/s of the models users train: the demo's and ``*_iwslt_de_en``, 1 and 2 threads.

    python benchmarks/training_speed.py --configs demo,iwslt_de_en --threads 1,2 --reps 5
    python benchmarks/training_speed.py --configs demo --settings sentence --threads 1 --counts

``benchmarks/run.py`` measures its own model sizes; this measures the configurations the
project's commands train (issue 22), with run.py's builders and its paired method:

- ``demo``: ``make demo``'s model (reluformer_mt/experiments/demo.py, preset ``quick``): 64-dim
  2+2 layers, 4 heads, FFN 128, a 2,000-piece shared vocabulary (``--share-all-embeddings``),
  dropout 0.1, batches of ~4,096 tokens; 30-token sentences (the sentence phase), 128-token
  segments (its document phase) and 512-token segments (the ``long`` preset), 1,024-token segments (issue 64);
- ``iwslt_de_en``: ``<family>_iwslt_de_en`` (fairseq's transformer_iwslt_de_en: 512/1024, 4
  heads, 6+6 layers) on a 10,000-piece shared vocabulary, batches of ~512 tokens (small enough
  for a shared 2-core machine; the ratios are per token), 30-token sentences, 512- and 1,024-token segments.

Batches are padded as fairseq batches real data (lengths 3/4 to 1 of the setting's, left-padded
sources, right-padded targets); one update is forward + backward + gradient clipping (norm 1) +
Adam, each model with its criterion (our families: ``reluformer_cross_entropy`` with the
regularisers and statistics on, as the demo trains them). The variants of a row group are
fairseq's ``transformer`` (the reference), our ``softmax`` family, an identical copy of it (the
noise check: it should measure 1.00 against ``softmax``), ``reluformer`` and ``rela``, timed
round-robin with a rotating start (``run.round_robin``). Ratios are tokens/s over the
reference's and over ``softmax``'s, the median of per-repetition paired ratios ± half the
inter-quartile range (``run.paired_ratio``). Each thread count runs every configuration before
the next count starts (``--threads 1,2``: the 2-thread rows last). Clock (``--clock auto``): CPU time of this process
with one thread (robust on a shared machine), wall time with more; ``--clock cpu`` takes CPU time
for every thread count (the work of both threads, their OpenMP waiting included: on a busy
machine, where another process takes the second core, wall time says nothing).
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import profile_training  # noqa: E402  (the step counts of issue 64)
import run  # noqa: E402  (the benchmark's builders and paired method)

# name -> model options, vocabulary, target tokens per batch, settings (name, length)
CONFIGS = {
    "demo": dict(arch="{}_tiny", reference="transformer", vocab=2000, tokens=4096,
                 dims=["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "64",
                       "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
                       "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--dropout", "0.1",
                       "--share-all-embeddings"],
                 settings=[("sentence", 30), ("segment128", 128), ("segment512", 512), ("segment1024", 1024)]),
    "iwslt_de_en": dict(arch="{}_iwslt_de_en", reference="transformer_iwslt_de_en", vocab=10000, tokens=512,
                        dims=["--share-all-embeddings"], settings=[("sentence", 30), ("segment512", 512),
                                                                 ("segment1024", 1024)]),
}
FAMILIES = ("softmax", "reluformer", "rela")
REFERENCE, SOFTMAX, SOFTMAX_COPY = "transformer", "softmax", "softmax_copy"
CLIP_NORM = 1.0
COUNTS = False  # --counts: also count each variant's step (profile_training.step_counts)


def update_step(model, criterion, sample):
    """One update as the demo's fairseq-train does it: loss, backward, clipping, Adam."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))

    def step():
        loss, _, _ = criterion(model, sample)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def build_variants(config, max_len, copy=True):
    """label -> (model, criterion, dictionary); the softmax copy (with ``copy``) has the softmax model's weights."""
    built = {REFERENCE: run.build_model(config["reference"], config["dims"], config["vocab"], max_len)}
    for family in FAMILIES:
        built[family] = run.build_model(config["arch"].format(family), config["dims"], config["vocab"], max_len)
    if copy:
        built[SOFTMAX_COPY] = run.build_model(config["arch"].format("softmax"), config["dims"], config["vocab"], max_len)
    for model, _, _ in built.values():
        model.train()
    return built


def measure(configs, threads_list, reps, clock="auto"):
    """Rows of every configuration, setting and thread count; the thread counts in the order
    given, each over every configuration (so the 2-thread rows of ``--threads 1,2`` run last)."""
    built = {name: build_variants(config, max(length for _, length in config["settings"]))
             for name, config in configs.items()}
    rows = []
    for threads in threads_list:
        torch.set_num_threads(threads)
        used = clock if clock != "auto" else ("cpu" if threads == 1 else "wall")
        run.CLOCK = time.process_time if used == "cpu" else time.perf_counter
        for name, config in configs.items():
            for setting, length in config["settings"]:
                rows += measure_setting(name, config, built[name], threads, used, setting, length, reps)
    return rows


def measure_setting(name, config, built, threads, clock, setting, length, reps):
    batch = max(1, config["tokens"] // length)
    variants, tokens = {}, None
    for label, (model, criterion, dictionary) in built.items():
        sample = run.make_sample(dictionary, batch, length, padded=True)
        tokens = sample["ntokens"]
        variants[label] = update_step(model, criterion, sample)
    times = run.round_robin(variants, reps)
    rows = []
    for label, seconds in times.items():
        row = dict(config=name, threads=threads, clock=clock, setting=setting, length=length, batch=batch,
                   model=label, tokens_per_s=tokens / statistics.median(seconds), times_s=seconds)
        if COUNTS:  # what the step does (issue 64), beside its speed; after the timing, never during it
            model = built[label][0]
            heads = next(m.num_heads for m in model.modules() if hasattr(m, "num_heads"))
            row["counts"] = profile_training.step_counts(model, variants[label], batch * heads * length * length, 1)
            print(f"    {label}: " + ", ".join(f"{k} {v}" for k, v in row["counts"].items()), flush=True)
        if label != REFERENCE:  # tokens/s ratio = other time / this time, paired per repetition
            row["ratio"] = run.paired_ratio(times[REFERENCE], seconds)
        if label not in (REFERENCE, SOFTMAX):
            row["vs_softmax"] = run.paired_ratio(times[SOFTMAX], seconds)
        rows.append(row)
    print(f"  {name} {setting} threads={threads} (tokens/s, vs transformer, vs softmax): " + ", ".join(
        f"{r['model']} {r['tokens_per_s']:.0f} {run.fmt_ratio(r['ratio']) if 'ratio' in r else 'ref'} "
        f"{run.fmt_ratio(r['vs_softmax']) if 'vs_softmax' in r else '-'}" for r in rows), flush=True)
    return rows


def summary(rows, target=0.95):
    """Targets of issue 22: reluformer and rela >= 0.95x softmax's tokens/s in every row."""
    cells, met = [], 0
    checks = [r for r in rows if r["model"] in ("reluformer", "rela")]
    for r in checks:
        ok = round(r["vs_softmax"]["median"], 2) >= target
        met += ok
        cells.append(f"{r['config']} {r['setting']} t{r['threads']} {r['model']} {run.fmt_ratio(r['vs_softmax'])} "
                     f"{'✓' if ok else '✗'}")
    copies = [r["vs_softmax"]["median"] for r in rows if r["model"] == SOFTMAX_COPY]
    worst = max(copies, key=lambda c: abs(c - 1)) if copies else None
    noise = (f"noise check: softmax copy {worst:.2f} (worst of {len(copies)}; "
             + ("noisy)" if abs(worst - 1) > run.NOISE_TOLERANCE else f"ok, within {run.NOISE_TOLERANCE:.0%})")
             if copies else "noise check: not run")
    return f"SUMMARY {met}/{len(checks)} rows >= {target:.2f}x softmax; " + " | ".join(cells) + "; " + noise


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="demo,iwslt_de_en", help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts, run in this order")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per row group (>= 2 for a spread)")
    parser.add_argument("--settings", help="only these settings (e.g. sentence,segment512)")
    parser.add_argument("--clock", choices=["auto", "cpu", "wall"], default="auto",
                        help="auto: CPU time with 1 thread, wall time with more; cpu: this process's CPU time "
                             "(all threads; the only usable clock on a busy shared machine)")
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--counts", action="store_true",
                        help="also count each step's operators, host syncs, attention-map-sized tensors and bytes "
                             "(benchmarks/profile_training.py --counts; issue 64), printed beside the tokens/s")
    args = parser.parse_args(argv)
    global COUNTS
    COUNTS = args.counts
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        parser.error(f"--configs: unknown {', '.join(unknown)}; expected names from {', '.join(CONFIGS)}")
    threads = [int(t) for t in args.threads.split(",")]
    only = set(args.settings.split(",")) if args.settings else None
    git = run.git_state()
    print(f"reps={args.reps} load={os.getloadavg()[0]:.1f} cpus={os.cpu_count()} commit={git.get('commit')} "
          f"dirty={git.get('dirty')}", flush=True)
    configs = {}
    for name in names:
        config = dict(CONFIGS[name])
        if only:
            config["settings"] = [s for s in config["settings"] if s[0] in only]
        if config["settings"]:
            configs[name] = config
    rows = measure(configs, threads, args.reps, args.clock)
    print(run.table(rows, ["config", "threads", "clock", "setting", "batch", "model", "tokens_per_s", "ratio",
                           "vs_softmax"],
                    "\n## Training tokens/s; ratio = tokens/s / fairseq transformer's, vs_softmax = / our softmax "
                    "family's; median±half-IQR of per-repetition paired ratios"))
    line = summary(rows)
    print("\n" + line, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(dict(rows=rows, summary=line, git=git, reps=args.reps,
                                                  load_average=os.getloadavg()), indent=1), encoding="utf-8")
    return rows


if __name__ == "__main__":
    main()
