#!/usr/bin/env python
"""Speed and memory of reluformer-mt against fairseq's own transformer, in one run on one machine.

    python benchmarks/run.py --quick --threads 1 --clock cpu   # smaller sizes; a busy shared machine
    python benchmarks/run.py --out results/ --reps 5 --threads 8

Prints tables and a final SUMMARY line, and writes ``benchmark.json``, ``benchmark.txt`` and
``benchmark.png`` into ``--out``:

1. the machine's float32 matmul rate (GFLOP/s), measured first;
2. the attention kernel alone (batch 1, 8 heads, head size 64, no mask; torch SDPA softmax vs
   ReLU dense / blocked / fused C++), forward and forward+backward, L = 128..16384 (..4096 with
   --quick): time, GFLOP/s, share of the matmul rate, time ratio to SDPA; ``auto`` marks the path
   ReluformerAttention's default (``--attn-impl auto``) takes at that length;
3. the attention sublayer (self-attention, no mask, batch 1, embed 512, 8 heads; projections
   included): fairseq's MultiheadAttention (the reference), an identical copy of it (noise
   check), ReluformerAttention on the unfused reference / dense / blocked path, and ReLUFormer and
   ReLA with their default config (``--attn-impl auto``: the fused kernel from 512 keys on where
   it is built); time ratio to the reference and peak memory, training and inference;
4. training throughput (target tokens/s, forward + backward + Adam step, each model with its
   criterion) of fairseq's ``transformer`` (the reference), an identical copy of it and the six
   families, at sentence length and document segment lengths, as ratios to the reference;
5. beam-4 incremental decoding (sentences/s) of the same models at sentence and document lengths
   (``--decode-lengths``), as ratios to the reference;
6. SUMMARY: every ratio against its target, and the noise check.

How a ratio is measured: each repetition times every variant once, round-robin, starting at a
different variant each repetition (so no variant always runs first or last); the ratio is the
median over repetitions of the per-repetition ratio (variant and reference timed moments apart,
under the same load), printed as ``median±h`` with h half the inter-quartile range of the
per-repetition ratios (the JSON also has q1, q3, min, max and every repetition's time and
ratio). The reference's identical copy shows what the method cannot resolve: if its ratio is
off 1 by more than 3 %, the run is flagged "noisy: raise --reps". A variant whose T x S tensors
would exceed ``--memory-budget-gb`` is skipped with the reason, not run.
"""
import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
USER_DIR = str(REPO / "reluformer_mt")

FAMILIES = ["softmax", "reluformer", "rela", "pointwise", "sparsemax", "entmax15"]
REFERENCE_MODEL, COPY_MODEL = "fairseq_transformer", "fairseq_transformer_copy"
REFERENCE_MHA, COPY_MHA = "fairseq_softmax", "fairseq_softmax_copy"
NOISE_TOLERANCE = 0.03  # the reference's copy must time within 3 % of the reference
DECODE_TOKENS = 480  # source tokens per decoding batch: 16 sentences of 30, one segment of 512


# ---------------------------------------------------------------------------------- timing
CLOCK = time.perf_counter  # --clock cpu: time.process_time (robust on a shared machine with --threads 1)


def round_robin(variants, reps, warmup=1):
    """{name: [seconds of each repetition]} of zero-argument callables.

    Each repetition times every variant once; repetition r starts at variant r (a rotation), so
    that a position in the round (first after a pause, last before one) biases no variant.
    """
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    times = {name: [] for name in names}
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            start = CLOCK()
            variants[name]()
            times[name].append(CLOCK() - start)
    return times


def paired_ratio(numerator, denominator):
    """Median of the per-repetition ratios numerator[r] / denominator[r] and their spread.

    Pairing by repetition cancels load that hits both alike (both were timed in the same round).
    The spread is the inter-quartile range q1..q3 of the per-repetition ratios (inclusive
    quartiles: the range itself for 2 repetitions), printed as median±half_iqr; one slow
    repetition moves min/max (also kept) but hardly the quartiles.
    """
    ratios = [n / d for n, d in zip(numerator, denominator)]
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return dict(median=statistics.median(ratios), q1=q1, q3=q3, half_iqr=(q3 - q1) / 2,
                min=min(ratios), max=max(ratios), per_rep=ratios)


def fmt_ratio(ratio) -> str:
    return f"{ratio['median']:.2f}±{ratio['half_iqr']:.2f}"


def peak_memory_bytes(fn) -> int:
    """Peak of CPU tensor memory allocated during ``fn`` above what existed before (profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    current = peak = 0
    for event in memory:
        current += event["args"]["Bytes"]
        peak = max(peak, current)
    return peak


def held_t_by_s_gb(path, L, heads, training):
    """GB of (heads, L, L) float32 tensors an attention path holds at once (an estimate): the unfused
    reference several (logits, weights, their gradients), dense in training its kept weights and
    as much again (the old sublayer profile: 1120 MB at L = 4096 for 537 MB of weights), dense in
    inference and blocked / fused / SDPA none (tiles only)."""
    copies = {"reference": 4, "dense": 2 if training else 0, "direct": 2 if training else 0}.get(path, 0)
    return copies * heads * L * L * 4 / 1e9


# ---------------------------------------------------------------------------------- 1. matmul
def bench_matmul(reps):
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    seconds = statistics.median(round_robin({"mm": lambda: torch.mm(a, b)}, reps)["mm"])
    return 2 * n ** 3 / seconds / 1e9


# ---------------------------------------------------------------------------------- 2. kernel
def attention_flops(L, heads, head_dim, backward):
    forward = 4 * heads * L * L * head_dim  # q k^T and a v
    return 3 * forward if backward else forward  # backward: four more matmuls


def bench_kernel(lengths, reps, budget_gb, heads=8, head_dim=64, block=512):
    from reluformer_mt.attention import AttentionConfig, ReluformerAttention
    from reluformer_mt.attention.blocked import tiled_attention
    from reluformer_mt.attention.fused import available as fused_available
    from reluformer_mt.attention.visibility import Visibility

    # each --attn-impl's route as the module's chooser picks it (asked, not re-implemented here)
    modules = {impl: ReluformerAttention(heads * head_dim, heads, AttentionConfig(fn="relu", impl=impl), self_attention=True)
               for impl in ("auto", "dense", "blocked", "fused")}
    rows = []
    for L in lengths:
        q, k, v = (torch.randn(1, heads, L, head_dim, requires_grad=True) for _ in range(3))
        keep = Visibility(L, L)  # every key visible, as key ranges: no T x S mask (SDPA gets none either)
        n_visible = keep.n_visible(q.device)
        route = {impl: m.route(q, L, keep, None, False, False) for impl, m in modules.items()}
        # ReLUFormer's row factor 1 / (gamma sqrt(n_i / 2)), gamma = 1
        factor = modules["auto"].function.row_factor(n_visible, modules["auto"]._params(), torch.float32)

        def sdpa():
            return F.scaled_dot_product_attention(q, k, v)  # flash attention on CPU: nothing T x S kept

        def relu(impl):
            return lambda: tiled_attention(q, k, v, keep, route=route[impl], activation="relu",
                                           scaling=head_dim ** -0.5, row_factor=factor, n_visible=n_visible,
                                           block_q=block, block_k=block)[0]

        variants = {"sdpa": sdpa, "relu_dense": relu("dense"), "relu_blocked": relu("blocked")}
        if fused_available():  # the C++ kernel (reluformer_mt/attention/fused.py), if it could be built
            variants["relu_fused"] = relu("fused")
        auto_impl = next((name for name in variants if name != "sdpa" and route[name[5:]] == route["auto"]), None)
        for backward in (False, True):
            pass_ = "fwd+bwd" if backward else "fwd"
            skipped = {}
            dense_gb = held_t_by_s_gb("dense", L, heads, backward)
            if dense_gb > budget_gb:
                skipped["relu_dense"] = f"dense path holds ~{dense_gb:.0f} GB > --memory-budget-gb {budget_gb:g}"
                print(f"  kernel L={L} {pass_}: relu_dense skipped ({skipped['relu_dense']})", flush=True)

            def run(fn):
                def go():
                    with torch.set_grad_enabled(backward):
                        out = fn()
                        if backward:
                            out.sum().backward()
                return go
            times = round_robin({n: run(f) for n, f in variants.items() if n not in skipped}, reps,
                                warmup=1 if L <= 4096 else 0)  # long calls need no warming up
            flops = attention_flops(L, heads, head_dim, backward)
            for name in variants:
                row = dict(L=L, pass_=pass_, impl=name, auto=name == auto_impl)
                if name in skipped:
                    row["skipped"] = skipped[name]
                else:
                    seconds = statistics.median(times[name])
                    row.update(ms=seconds * 1e3, gflops=flops / seconds / 1e9, times_s=times[name])
                    if name != "sdpa":
                        row["ratio"] = paired_ratio(times[name], times["sdpa"])  # time / SDPA's
                rows.append(row)
    return rows


# ---------------------------------------------------------------------------------- 3. sublayer
def bench_sublayer(train_lengths, infer_lengths, reps, budget_gb, embed=512, heads=8, memory=True):
    from fairseq.modules.multihead_attention import MultiheadAttention

    from reluformer_mt.attention import AttentionConfig, ReluformerAttention
    from reluformer_mt.attention.visibility import Visibility

    def fairseq_mha():
        torch.manual_seed(0)  # same seed: the copy has the reference's weights
        return MultiheadAttention(embed, heads, self_attention=True)

    def ours(fn, impl="auto"):
        torch.manual_seed(0)
        return ReluformerAttention(embed, heads, AttentionConfig(fn=fn, impl=impl), self_attention=True)

    modules = {
        REFERENCE_MHA: fairseq_mha(),
        COPY_MHA: fairseq_mha(),  # noise check: should time as the reference
        "relu_reference": ours("relu", "reference"),  # the unfused functions.py path, for comparison
        "relu_dense": ours("relu", "dense"),
        "relu_blocked": ours("relu", "blocked"),
        "reluformer_default": ours("relu"),  # what a reluformer model runs (--attn-impl auto)
        "rela_default": ours("rela"),
    }

    def path_of(module, L, training):
        if not isinstance(module, ReluformerAttention):
            return "sdpa"  # fairseq's MultiheadAttention calls torch's fused attention
        module.train(training)
        q = torch.empty(1, heads, L, embed // heads, requires_grad=training)
        return module.route(q, L, Visibility(L, L), None, False, False)

    rows = []
    for training, lengths in ((True, train_lengths), (False, infer_lengths)):
        mode = "train" if training else "infer"
        for L in lengths:
            x = torch.randn(L, 1, embed, requires_grad=training)

            def step(module):
                def go():
                    module.train(training)
                    with torch.set_grad_enabled(training):
                        out, _ = module(x, x, x, need_weights=False)
                        if training:
                            out.sum().backward()
                return go

            paths = {name: path_of(module, L, training) for name, module in modules.items()}
            skipped = {}
            for name, path in paths.items():
                gb = held_t_by_s_gb(path, L, heads, training)
                if gb > budget_gb:
                    skipped[name] = f"{path} path holds ~{gb:.0f} GB > --memory-budget-gb {budget_gb:g}"
                    print(f"  sublayer L={L} {mode}: {name} skipped ({skipped[name]})", flush=True)
            times = round_robin({n: step(m) for n, m in modules.items() if n not in skipped}, reps,
                                warmup=1 if L <= 4096 else 0)
            for name in modules:
                row = dict(L=L, mode=mode, impl=name, path=paths[name])
                if name in skipped:
                    row["skipped"] = skipped[name]
                    rows.append(row)
                    continue
                row.update(ms=statistics.median(times[name]) * 1e3, times_s=times[name])
                if name != REFERENCE_MHA:
                    row["ratio"] = paired_ratio(times[name], times[REFERENCE_MHA])  # time / fairseq's
                if "relu_dense" in times:
                    row["time_vs_dense"] = paired_ratio(times[name], times["relu_dense"])["median"]
                if memory and name != COPY_MHA:  # the copy's memory is the reference's
                    row["peak_mb"] = peak_memory_bytes(step(modules[name])) / 2 ** 20
                rows.append(row)
            dense_mb = next((r.get("peak_mb") for r in rows[-len(modules):] if r["impl"] == "relu_dense"), None)
            for r in rows[-len(modules):]:
                if dense_mb and r.get("peak_mb"):
                    r["memory_vs_dense"] = r["peak_mb"] / dense_mb
    return rows


# ---------------------------------------------------------------------------------- 4./5. models
def build_model(arch, dims, vocab, max_len, extra=()):
    """A fairseq model + criterion + task from command-line style options, as fairseq-train would;
    ``extra``: further options (e.g. the demo's ``--share-all-embeddings``)."""
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.tasks.translation import TranslationTask

    from reluformer_mt.plugin import register

    register()  # --user-dir is skipped once the package was imported (by the kernel part): register explicitly
    # fairseq's own transformers (``transformer``, ``transformer_iwslt_de_en``) train with fairseq's criterion
    criterion = "label_smoothed_cross_entropy" if arch.startswith("transformer") else "reluformer_cross_entropy"
    argv = ["/nonexistent", "--user-dir", USER_DIR, "--arch", arch, "--task", "translation",
            "--criterion", criterion, "--label-smoothing", "0.1", "--source-lang", "src", "--target-lang", "tgt",
            "--max-source-positions", str(max_len + 8), "--max-target-positions", str(max_len + 8), *dims, *extra]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, argv)
    dictionary = Dictionary()
    for i in range(vocab):
        dictionary.add_symbol(f"w{i}")
    task = TranslationTask(args, dictionary, dictionary)
    torch.manual_seed(1)  # same seed: the reference's copy gets identical weights
    model = task.build_model(args)
    return model, task.build_criterion(args), dictionary


def make_sample(dictionary, batch, length, seed=0, padded=False):
    """``batch`` random sentence pairs of ``length`` tokens; with ``padded``, as fairseq batches
    real data: lengths from 3/4 of ``length`` to ``length``, sources left-padded and targets
    right-padded (so the padding code paths run as in training)."""
    g = torch.Generator().manual_seed(seed)
    low = dictionary.nspecial
    src = torch.randint(low, len(dictionary), (batch, length), generator=g)
    tgt = torch.randint(low, len(dictionary), (batch, length), generator=g)
    if padded:
        shortest = max(1, (3 * length) // 4)
        src_len = torch.randint(shortest, length + 1, (batch,), generator=g)
        tgt_len = torch.randint(shortest, length + 1, (batch,), generator=g)
        src_len[0] = tgt_len[0] = length  # the longest sentence fixes the batch's width
        positions = torch.arange(length).view(1, -1)
        src = src.masked_fill(positions < (length - src_len).view(-1, 1), dictionary.pad())  # left padding
        tgt_pad = positions >= tgt_len.view(-1, 1)
        tgt = tgt.masked_fill(tgt_pad, dictionary.pad())  # right padding
        prev = torch.cat([torch.full((batch, 1), dictionary.eos()), tgt[:, :-1]], 1).masked_fill(tgt_pad, dictionary.pad())
        return {"id": torch.arange(batch), "nsentences": batch, "ntokens": int(tgt_len.sum()), "target": tgt,
                "net_input": {"src_tokens": src, "src_lengths": src_len, "prev_output_tokens": prev}}
    prev = torch.cat([torch.full((batch, 1), dictionary.eos()), tgt[:, :-1]], 1)
    return {"id": torch.arange(batch), "nsentences": batch, "ntokens": batch * length, "target": tgt,
            "net_input": {"src_tokens": src, "src_lengths": torch.full((batch,), length), "prev_output_tokens": prev}}


def bench_training(settings, models, dims, reps, vocab):
    """settings: [(name, length, batch)]; target tokens/s of one update (fwd + bwd + Adam)."""
    rows = []
    for setting, length, batch in settings:
        variants, tokens = {}, batch * length
        for label, arch in models.items():
            model, criterion, dictionary = build_model(arch, dims, vocab, length)
            model.train()
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
            sample = make_sample(dictionary, batch, length)

            def step(model=model, criterion=criterion, optimizer=optimizer, sample=sample):
                loss, _, _ = criterion(model, sample)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            variants[label] = step
        times = round_robin(variants, reps)
        for label, seconds in times.items():
            row = dict(setting=setting, length=length, batch=batch, model=label,
                       tokens_per_s=tokens / statistics.median(seconds), times_s=seconds)
            if label != REFERENCE_MODEL:  # tokens/s ratio = reference time / this time
                row["ratio"] = paired_ratio(times[REFERENCE_MODEL], seconds)
            if label in ("sparsemax", "entmax15"):
                row["vs_softmax"] = paired_ratio(times["softmax"], seconds)
            rows.append(row)
        print(f"  training {setting}: " + ", ".join(f"{r['model']} {fmt_ratio(r['ratio'])}"
                                                     for r in rows[-len(times):] if "ratio" in r), flush=True)
    return rows


def bench_decoding(lengths, models, dims, reps, vocab, beam=4):
    """Beam search over sources of each length; as many sentences as make ~DECODE_TOKENS tokens."""
    from fairseq.sequence_generator import SequenceGenerator

    rows = []
    for length in lengths:
        sentences = max(1, DECODE_TOKENS // length)
        variants = {}
        for label, arch in models.items():
            model, _, dictionary = build_model(arch, dims, vocab, length)
            model.eval()
            # min_len = max_len: every model decodes exactly `length` steps (random weights would stop anywhere)
            generator = SequenceGenerator([model], dictionary, beam_size=beam, max_len_a=0, max_len_b=length,
                                          min_len=length)
            sample = make_sample(dictionary, sentences, length)

            def decode(model=model, generator=generator, sample=sample):
                with torch.no_grad():
                    generator.generate([model], sample)
            variants[label] = decode
        times = round_robin(variants, reps)
        for label, seconds in times.items():
            row = dict(length=length, sentences=sentences, model=label,
                       sentences_per_s=sentences / statistics.median(seconds), times_s=seconds)
            if label != REFERENCE_MODEL:
                row["ratio"] = paired_ratio(times[REFERENCE_MODEL], seconds)
            rows.append(row)
        print(f"  decoding {length}: " + ", ".join(f"{r['model']} {fmt_ratio(r['ratio'])}"
                                                   for r in rows[-len(times):] if "ratio" in r), flush=True)
    return rows


# ---------------------------------------------------------------------------------- summary
def summarize(results):
    """The SUMMARY line (every ratio against its target, then the noise check) and its checks."""
    parts, checks = [], []

    def group(title, target, at_most, items):
        cells = []
        for label, ratio in items:
            shown = round(ratio["median"], 2)  # judged as printed: no "1.00 ✗" for 0.997
            ok = shown <= target if at_most else shown >= target
            checks.append(dict(group=title, item=label, target=target, at_most=at_most, ok=ok,
                               **{k: ratio[k] for k in ("median", "q1", "q3", "min", "max")}))
            cells.append(f"{label} {fmt_ratio(ratio)} {'✓' if ok else '✗'}")
        if cells:
            parts.append(f"{title} {'≤' if at_most else '≥'}{target:.2f}: " + " | ".join(cells))

    kernel = results.get("kernel", [])
    for pass_ in ("fwd", "fwd+bwd"):  # the path the default config takes, vs SDPA
        group(f"kernel {pass_}", 1.0, True, [(f"{r['L']} {r['impl'][5:]}", r["ratio"]) for r in kernel
                                             if r["pass_"] == pass_ and r["auto"] and "ratio" in r])
    sublayer = results.get("sublayer", [])
    for mode in ("train", "infer"):  # the default config vs fairseq's MultiheadAttention
        group(f"sublayer {mode}", 1.0, True,
              [(f"{r['impl'].replace('_default', '')} {r['L']} {r['path']}", r["ratio"]) for r in sublayer
               if r["mode"] == mode and r["impl"].endswith("_default") and "ratio" in r])
    training = results.get("training", [])
    group("training tok/s", 1.0, False, [(f"{r['model']} {r['setting']}", r["ratio"]) for r in training
                                         if r["model"] in ("reluformer", "rela")])
    group("decoding", 1.0, False, [(f"{r['model']} {r['length']}", r["ratio"]) for r in results.get("decoding", [])
                                   if r["model"] in ("reluformer", "rela")])
    group("sparsemax/entmax15 tok/s of softmax", 0.8, False,
          [(f"{r['model']} {r['setting']}", r["vs_softmax"]) for r in training if "vs_softmax" in r])

    copies = [r["ratio"]["median"] for table in ("sublayer", "training", "decoding") for r in results.get(table, [])
              if r.get("impl", r.get("model")) in (COPY_MHA, COPY_MODEL) and "ratio" in r]
    noisy = any(abs(c - 1) > NOISE_TOLERANCE for c in copies)
    if copies:
        worst = max(copies, key=lambda c: abs(c - 1))
        parts.append(f"noise check: reference copy {worst:.2f} (worst of {len(copies)}; "
                     + ("noisy: raise --reps)" if noisy else f"ok, within {NOISE_TOLERANCE:.0%})"))
    else:
        parts.append("noise check: not run")
    met = sum(c["ok"] for c in checks)
    line = f"SUMMARY {met}/{len(checks)} targets met; " + "; ".join(parts)
    return dict(line=line, checks=checks, reference_copy_ratios=copies, noisy=noisy)


# ---------------------------------------------------------------------------------- report
def table(rows, columns, title):
    """Plain-text table; a ratio cell shows median±half-IQR, the reference's own row 'ref'."""
    def cell(row, column):
        if column == "ratio" and "ratio" not in row and "skipped" not in row:
            return "ref"  # only the reference's own rows have no ratio
        value = row.get(column)
        if isinstance(value, dict):
            return fmt_ratio(value)
        if value is True:
            return "*"
        if value is None or value is False:
            return "-" if value is None else ""
        if isinstance(value, float):
            return f"{value:.2f}" if abs(value) < 1000 else f"{value:.0f}"
        return str(value)

    widths = [max(len(c), *(len(cell(r, c)) for r in rows)) for c in columns]
    lines = [title, "  ".join(c.ljust(w) for c, w in zip(columns, widths)), "  ".join("-" * w for w in widths)]
    for r in rows:
        lines.append("  ".join(cell(r, c).ljust(w) for c, w in zip(columns, widths)))
    return "\n".join(lines)


def plot(results, path):
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq leaves the root logger at DEBUG
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, pass_ in zip(axes[:2], ("fwd", "fwd+bwd")):
        for impl in ("sdpa", "relu_dense", "relu_blocked", "relu_fused"):  # kernel
            pts = [(r["L"], r["ms"]) for r in results["kernel"] if r["pass_"] == pass_ and r["impl"] == impl and "ms" in r]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=impl)
        ax.set(xscale="log", yscale="log", xlabel="sequence length", ylabel="ms", title=f"attention kernel, {pass_}")
        ax.legend()
    ax = axes[2]
    for impl in (REFERENCE_MHA, "relu_reference", "relu_dense", "relu_blocked", "reluformer_default", "rela_default"):
        for mode, style in (("train", "-"), ("infer", "--")):
            pts = [(r["L"], r["peak_mb"]) for r in results["sublayer"]
                   if r["impl"] == impl and r["mode"] == mode and "peak_mb" in r]
            if pts:
                ax.plot(*zip(*pts), style, marker="o", label=f"{impl} {mode}")
    ax.set(xscale="log", yscale="log", xlabel="sequence length", ylabel="peak MB", title="attention sublayer memory")
    if ax.lines:  # none with --no-memory
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def git_state():
    """The checkout's commit and whether tracked files differ from it (read-only: no index locks)."""
    def git(*args):
        return subprocess.run(["git", "--no-optional-locks", "-C", str(REPO), *args],
                              capture_output=True, text=True, timeout=60)
    try:
        head, status = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return dict(commit=None, dirty=None)
    if head.returncode != 0 or status.returncode != 0:
        return dict(commit=None, dirty=None)
    changed = [line[3:] for line in status.stdout.splitlines()]
    return dict(commit=head.stdout.strip(), dirty=bool(changed), changed_files=changed)


def int_list(text):
    return [int(x) for x in text.split(",")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and 3 repetitions")
    parser.add_argument("--reps", type=int, help="repetitions per measurement (>= 2 for a spread); default 3 quick / 5")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall time, or this process's CPU time (use with --threads 1 on a busy machine)")
    parser.add_argument("--vocab", type=int, help="vocabulary size of the model benchmarks (default 4000 quick / 32000)")
    parser.add_argument("--model-size", type=int_list, metavar="LAYERS,EMBED,FFN,HEADS",
                        help="model of the training/decoding parts (default 2,256,1024,4 quick / 6,512,1024,4)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="directory for JSON and plot")
    parser.add_argument("--kernel-lengths", type=int_list)
    parser.add_argument("--train-lengths", type=int_list, help="sublayer lengths in training mode")
    parser.add_argument("--infer-lengths", type=int_list, help="sublayer lengths in inference mode")
    parser.add_argument("--segment-lengths", type=int_list, default=[512, 1024], help="training, besides 30-token sentences")
    parser.add_argument("--decode-lengths", type=int_list, help="source lengths of the decoding part")
    parser.add_argument("--tokens-per-batch", type=int, help="target tokens per training batch")
    parser.add_argument("--memory-budget-gb", type=float, default=8.0,
                        help="skip a variant whose T x S tensors would exceed this (default 8)")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: kernel,sublayer,training,decoding")
    parser.add_argument("--no-memory", action="store_true", help="skip the (profiler-based) peak memory runs")
    args = parser.parse_args(argv)

    global CLOCK
    if args.threads:
        torch.set_num_threads(args.threads)
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    quick = args.quick
    vocab = args.vocab or (4000 if quick else 32000)
    reps = args.reps or (3 if quick else 5)
    kernel_lengths = args.kernel_lengths or ([128, 512, 1024, 2048, 4096] if quick
                                             else [128, 256, 512, 1024, 2048, 4096, 8192, 16384])
    train_lengths = args.train_lengths or ([128, 1024, 4096] if quick else [128, 256, 512, 1024, 2048, 4096])
    infer_lengths = args.infer_lengths or ([4096, 16384] if quick else [1024, 4096, 8192, 16384])
    decode_lengths = args.decode_lengths or ([30, 512] if quick else [30, 128, 512, 1024])
    tokens = args.tokens_per_batch or (1024 if quick else 4096)
    layers, embed, ffn, heads = args.model_size or ((2, 256, 1024, 4) if quick else (6, 512, 1024, 4))  # the latter: transformer_iwslt_de_en
    dims = ["--encoder-layers", str(layers), "--decoder-layers", str(layers), "--encoder-embed-dim", str(embed),
            "--decoder-embed-dim", str(embed), "--encoder-ffn-embed-dim", str(ffn), "--decoder-ffn-embed-dim", str(ffn),
            "--encoder-attention-heads", str(heads), "--decoder-attention-heads", str(heads)]
    skip = set(filter(None, args.skip.split(",")))
    # the copy of the reference is built with the same seed: its ratio measures the method's noise
    models = {REFERENCE_MODEL: "transformer", COPY_MODEL: "transformer", **{f: f"{f}_tiny" for f in FAMILIES}}
    settings = [("sentence", 30, max(1, tokens // 30))] + [(f"segment{L}", L, max(1, tokens // L))
                                                           for L in args.segment_lengths]
    budget = args.memory_budget_gb

    results = {"machine": dict(platform=platform.platform(), processor=platform.processor(),
                               threads=torch.get_num_threads(), torch=torch.__version__, cpus=os.cpu_count(),
                               load_average=os.getloadavg()),
               "git": git_state(), "argv": sys.argv[1:] if argv is None else list(argv),
               "reps": reps, "quick": quick, "model_dims": dims, "clock": args.clock, "vocab": vocab,
               "ratio_method": "median over repetitions of per-repetition paired ratios (round-robin, rotated "
                               "order); spread: inter-quartile range q1..q3 (half_iqr = (q3 - q1) / 2) and "
                               "min..max of those ratios; per_rep: all of them"}
    print(f"threads={torch.get_num_threads()} reps={reps} clock={args.clock} load={os.getloadavg()[0]:.1f} "
          f"commit={results['git'].get('commit')} dirty={results['git'].get('dirty')}", flush=True)
    results["matmul_gflops"] = bench_matmul(reps)
    print(f"matmul (float32, 2048^3): {results['matmul_gflops']:.1f} GFLOP/s", flush=True)
    out = []
    if "kernel" not in skip:
        results["kernel"] = bench_kernel(kernel_lengths, reps, budget)
        for r in results["kernel"]:
            if "gflops" in r:
                r["share_of_matmul"] = r["gflops"] / results["matmul_gflops"]
        out.append(table(results["kernel"], ["L", "pass_", "impl", "auto", "ms", "gflops", "share_of_matmul", "ratio",
                                             "skipped"],
                         "\n## Attention kernel (batch 1, 8 heads, head size 64, no mask); ratio = time / SDPA's, "
                         "median±half-IQR of per-repetition ratios; auto = path of the default config"))
        print(out[-1], flush=True)
    if "sublayer" not in skip:
        results["sublayer"] = bench_sublayer(train_lengths, infer_lengths, reps, budget, memory=not args.no_memory)
        out.append(table(results["sublayer"], ["L", "mode", "impl", "path", "ms", "ratio", "time_vs_dense", "peak_mb",
                                               "memory_vs_dense", "skipped"],
                         "\n## Attention sublayer: self-attention, no mask (embed 512, 8 heads, batch 1; projections "
                         "included); ratio = time / fairseq MultiheadAttention's, median±half-IQR"))
        print(out[-1], flush=True)
    if "training" not in skip:
        results["training"] = bench_training(settings, models, dims, reps, vocab)
        out.append(table(results["training"], ["setting", "length", "batch", "model", "tokens_per_s", "ratio",
                                               "vs_softmax"],
                         "\n## Training throughput (target tokens/s); ratio = tokens/s / fairseq transformer's, "
                         "median±half-IQR; vs_softmax: same against our softmax family"))
        print(out[-1], flush=True)
    if "decoding" not in skip:
        results["decoding"] = bench_decoding(decode_lengths, models, dims, reps, vocab)
        out.append(table(results["decoding"], ["length", "sentences", "model", "sentences_per_s", "ratio"],
                         f"\n## Beam-4 incremental decoding, ~{DECODE_TOKENS} source tokens per batch; "
                         "ratio = sentences/s / fairseq transformer's, median±half-IQR"))
        print(out[-1], flush=True)

    summary = summarize(results)
    results["summary"] = summary
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "benchmark.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    (out_dir / "benchmark.txt").write_text("\n".join(out + ["", summary["line"]]) + "\n", encoding="utf-8")
    if "kernel" in results and "sublayer" in results:
        plot(results, out_dir / "benchmark.png")
    print(f"\nwrote {out_dir / 'benchmark.json'}, benchmark.txt"
          + (", benchmark.png" if "kernel" in results and "sublayer" in results else ""))
    if summary["noisy"]:
        hint = "" if args.clock == "cpu" else " (on a busy machine also --threads 1 --clock cpu)"
        print(f"noisy: the reference's copy differs from the reference by more than {NOISE_TOLERANCE:.0%}; "
              f"raise --reps{hint}")
    print(summary["line"], flush=True)
    return results


if __name__ == "__main__":
    main()
