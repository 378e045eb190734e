#!/usr/bin/env python
"""Speed and memory of reluformer-mt against fairseq's own transformer, in one run on one machine.

    python benchmarks/run.py --quick            # a few minutes on 2 CPU cores
    python benchmarks/run.py --out results/ --reps 5 --threads 8

Prints tables and writes ``benchmark.json`` and ``benchmark.png`` into ``--out``:

1. the machine's float32 matmul rate (GFLOP/s), measured first;
2. the attention kernel alone (torch SDPA softmax vs ReLU dense / blocked / fused C++), forward and
   forward+backward: time, achieved GFLOP/s and its share of the matmul rate;
3. the attention sublayer (projections + attention; fairseq's MultiheadAttention vs
   ReluformerAttention dense / blocked): time and peak memory, L = 128..4096 training and up
   to 16384 inference (dense skipped where its T x S tensors would not fit);
4. training throughput (target tokens/s, forward + backward + Adam step, each model with its
   criterion) of fairseq's ``transformer`` (the reference) and the six families, at sentence
   length and document segment lengths, as ratios to the reference;
5. beam-4 incremental decoding speed (sentences/s) of the same models, as ratios.

Every number is the median over ``--reps`` repetitions; variants are timed round-robin within
each repetition so that load from other processes hits them alike (prefer the ratios).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import logging

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
USER_DIR = str(REPO / "reluformer_mt")

FAMILIES = ["softmax", "reluformer", "rela", "pointwise", "sparsemax", "entmax15"]


# ---------------------------------------------------------------------------------- timing
CLOCK = time.perf_counter  # --clock cpu: time.process_time (robust on a shared machine with --threads 1)


def round_robin(variants, reps, warmup=1):
    """{name: median seconds} of each zero-argument callable, timed in turn each repetition."""
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    times = {name: [] for name in variants}
    for _ in range(reps):
        for name, fn in variants.items():
            start = CLOCK()
            fn()
            times[name].append(CLOCK() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


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


# ---------------------------------------------------------------------------------- 1. matmul
def bench_matmul(reps):
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    seconds = round_robin({"mm": lambda: torch.mm(a, b)}, reps)["mm"]
    return 2 * n ** 3 / seconds / 1e9


# ---------------------------------------------------------------------------------- 2. kernel
def attention_flops(L, heads, head_dim, backward):
    forward = 4 * heads * L * L * head_dim  # q k^T and a v
    return 3 * forward if backward else forward  # backward: four more matmuls


def bench_kernel(lengths, reps, heads=8, head_dim=64, block=512):
    from reluformer_mt.attention.blocked import relu_family_attention
    from reluformer_mt.attention.fused import available as fused_available

    rows = []
    for L in lengths:
        q, k, v = (torch.randn(1, heads, L, head_dim, requires_grad=True) for _ in range(3))
        keep = torch.ones(1, 1, L, L, dtype=torch.bool)

        def sdpa():
            return F.scaled_dot_product_attention(q, k, v)

        def relu(blocked, fused=False):
            return lambda: relu_family_attention(q, k, v, keep, fn="relu", scaling=head_dim ** -0.5,
                                                 gamma=torch.tensor(1.0), blocked=blocked,
                                                 block_q=block, block_k=block, fused=fused)[0]

        variants = {"sdpa": sdpa, "relu_dense": relu(False), "relu_blocked": relu(True)}
        if fused_available():  # the C++ kernel (reluformer_mt/attention/fused.py), if it could be built
            variants["relu_fused"] = relu(True, fused=True)
        for backward in (False, True):
            def run(fn):
                def go():
                    with torch.set_grad_enabled(backward):
                        out = fn()
                        if backward:
                            out.sum().backward()
                return go
            times = round_robin({n: run(f) for n, f in variants.items()}, reps)
            flops = attention_flops(L, heads, head_dim, backward)
            for name, seconds in times.items():
                rows.append(dict(L=L, pass_="fwd+bwd" if backward else "fwd", impl=name, ms=seconds * 1e3,
                                 gflops=flops / seconds / 1e9))
    return rows


# ---------------------------------------------------------------------------------- 3. sublayer
def dense_fits(L, heads, budget_gb):
    # the reference/dense paths hold a few (heads, L, L) float tensors at once
    return 4 * heads * L * L * 4 / 1e9 < budget_gb


def bench_sublayer(train_lengths, infer_lengths, reps, embed=512, heads=8, memory=True, dense_budget_gb=8.0):
    from fairseq.modules.multihead_attention import MultiheadAttention

    from reluformer_mt.attention import AttentionConfig, ReluformerAttention

    torch.manual_seed(0)
    reference = ReluformerAttention(embed, heads, AttentionConfig(fn="relu", impl="dense"), self_attention=True)
    reference._attention_path = lambda *args: "reference"  # the unfused functions.py path, for comparison
    modules = {
        "fairseq_softmax": MultiheadAttention(embed, heads, self_attention=True),
        "relu_reference": reference,
        "relu_dense": ReluformerAttention(embed, heads, AttentionConfig(fn="relu", impl="dense"), self_attention=True),
        "relu_blocked": ReluformerAttention(embed, heads, AttentionConfig(fn="relu", impl="blocked"), self_attention=True),
    }
    rows = []
    for training, lengths in ((True, train_lengths), (False, infer_lengths)):
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

            # fairseq's softmax (fused SDPA) and the blocked path never hold a T x S tensor
            chosen = {n: m for n, m in modules.items()
                      if n in ("fairseq_softmax", "relu_blocked") or dense_fits(L, heads, dense_budget_gb)}
            n_reps = reps if L <= 4096 else 1
            times = round_robin({n: step(m) for n, m in chosen.items()}, n_reps, warmup=1 if L <= 4096 else 0)
            for name in modules:
                row = dict(L=L, mode="train" if training else "infer", impl=name)
                if name in times:
                    row["ms"] = times[name] * 1e3
                    if memory:
                        row["peak_mb"] = peak_memory_bytes(step(modules[name])) / 2 ** 20
                else:
                    row["skipped"] = "dense T x S tensors would exceed %.0f GB" % dense_budget_gb
                rows.append(row)
    return rows


# ---------------------------------------------------------------------------------- 4./5. models
def build_model(arch, dims, vocab, max_len):
    """A fairseq model + criterion + task from command-line style options, as fairseq-train would."""
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.tasks.translation import TranslationTask

    criterion = "label_smoothed_cross_entropy" if arch == "transformer" else "reluformer_cross_entropy"
    argv = ["/nonexistent", "--user-dir", USER_DIR, "--arch", arch, "--task", "translation",
            "--criterion", criterion, "--label-smoothing", "0.1", "--source-lang", "src", "--target-lang", "tgt",
            "--max-source-positions", str(max_len + 8), "--max-target-positions", str(max_len + 8), *dims]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, argv)
    dictionary = Dictionary()
    for i in range(vocab):
        dictionary.add_symbol(f"w{i}")
    task = TranslationTask(args, dictionary, dictionary)
    torch.manual_seed(1)
    model = task.build_model(args)
    return model, task.build_criterion(args), dictionary


def make_sample(dictionary, batch, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    low = dictionary.nspecial
    src = torch.randint(low, len(dictionary), (batch, length), generator=g)
    tgt = torch.randint(low, len(dictionary), (batch, length), generator=g)
    prev = torch.cat([torch.full((batch, 1), dictionary.eos()), tgt[:, :-1]], 1)
    return {"id": torch.arange(batch), "nsentences": batch, "ntokens": batch * length, "target": tgt,
            "net_input": {"src_tokens": src, "src_lengths": torch.full((batch,), length), "prev_output_tokens": prev}}


def bench_training(settings, models, dims, reps, vocab=8000):
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
        ref = tokens / times["fairseq_transformer"]
        for label, seconds in times.items():
            rows.append(dict(setting=setting, length=length, batch=batch, model=label,
                             tokens_per_s=tokens / seconds, ratio=tokens / seconds / ref))
        print(f"  training {setting}: " + ", ".join(f"{r['model']} {r['ratio']:.2f}x" for r in rows[-len(times):]),
              flush=True)
    return rows


def bench_decoding(models, dims, reps, sentences=16, length=30, beam=4, vocab=8000):
    from fairseq.sequence_generator import SequenceGenerator

    variants = {}
    for label, arch in models.items():
        model, _, dictionary = build_model(arch, dims, vocab, length)
        model.eval()
        # min_len = max_len: every model decodes exactly `length` steps (random weights would stop anywhere)
        generator = SequenceGenerator([model], dictionary, beam_size=beam, max_len_a=0, max_len_b=length,
                                      min_len=length)
        sample = make_sample(dictionary, sentences, length)

        def decode(generator=generator, sample=sample):
            with torch.no_grad():
                generator.generate([model], sample)
        variants[label] = decode
    times = round_robin(variants, reps)
    ref = sentences / times["fairseq_transformer"]
    return [dict(model=label, sentences_per_s=sentences / s, ratio=sentences / s / ref) for label, s in times.items()]


# ---------------------------------------------------------------------------------- report
def table(rows, columns, title):
    widths = [max(len(c), *(len(fmt(r.get(c))) for r in rows)) for c in columns]
    lines = [title, "  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)))
    return "\n".join(lines)


def fmt(value):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def plot(results, path):
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq leaves the root logger at DEBUG
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, pass_ in zip(axes[:2], ("fwd", "fwd+bwd")):
        for impl in ("sdpa", "relu_dense", "relu_blocked", "relu_fused"):  # kernel
            pts = [(r["L"], r["ms"]) for r in results["kernel"] if r["pass_"] == pass_ and r["impl"] == impl]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=impl)
        ax.set(xscale="log", yscale="log", xlabel="sequence length", ylabel="ms", title=f"attention kernel, {pass_}")
        ax.legend()
    ax = axes[2]
    for impl in ("fairseq_softmax", "relu_reference", "relu_dense", "relu_blocked"):
        for mode, style in (("train", "-"), ("infer", "--")):
            pts = [(r["L"], r["peak_mb"]) for r in results["sublayer"]
                   if r["impl"] == impl and r["mode"] == mode and "peak_mb" in r]
            if pts:
                ax.plot(*zip(*pts), style, marker="o", label=f"{impl} {mode}")
    ax.set(xscale="log", yscale="log", xlabel="sequence length", ylabel="peak MB", title="attention sublayer memory")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and 3 repetitions (a few minutes)")
    parser.add_argument("--reps", type=int, help="repetitions per measurement (median); default 3 quick / 5")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall time, or this process's CPU time (use with --threads 1 on a busy machine)")
    parser.add_argument("--vocab", type=int, help="vocabulary size of the model benchmarks (default 4000 quick / 32000)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="directory for JSON and plot")
    parser.add_argument("--kernel-lengths", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--train-lengths", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--infer-lengths", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--segment-lengths", type=lambda s: [int(x) for x in s.split(",")], default=[512, 1024])
    parser.add_argument("--tokens-per-batch", type=int, help="target tokens per training batch")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: kernel,sublayer,training,decoding")
    parser.add_argument("--no-memory", action="store_true", help="skip the (profiler-based) peak memory runs")
    args = parser.parse_args(argv)

    global CLOCK
    if args.threads:
        torch.set_num_threads(args.threads)
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    vocab = args.vocab or (4000 if args.quick else 32000)
    reps = args.reps or (3 if args.quick else 5)
    quick = args.quick
    kernel_lengths = args.kernel_lengths or ([128, 512, 1024, 2048] if quick else [128, 256, 512, 1024, 2048, 4096])
    train_lengths = args.train_lengths or ([128, 1024, 4096] if quick else [128, 256, 512, 1024, 2048, 4096])
    infer_lengths = args.infer_lengths or ([4096, 16384] if quick else [1024, 4096, 8192, 16384])
    tokens = args.tokens_per_batch or (1024 if quick else 4096)
    if quick:  # small model: the point is the ratios
        dims = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "256",
                "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024",
                "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]
    else:  # transformer_iwslt_de_en sizes
        dims = ["--encoder-layers", "6", "--decoder-layers", "6", "--encoder-embed-dim", "512",
                "--decoder-embed-dim", "512", "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024",
                "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]
    skip = set(filter(None, args.skip.split(",")))
    models = {"fairseq_transformer": "transformer", **{f: f"{f}_tiny" for f in FAMILIES}}
    settings = [("sentence", 30, max(1, tokens // 30))] + [(f"segment{L}", L, max(1, tokens // L))
                                                           for L in args.segment_lengths]

    results = {"machine": dict(platform=platform.platform(), processor=platform.processor(),
                               threads=torch.get_num_threads(), torch=torch.__version__, cpus=os.cpu_count(),
                               load_average=os.getloadavg()),
               "reps": reps, "quick": quick, "model_dims": dims, "clock": args.clock, "vocab": vocab}
    print(f"threads={torch.get_num_threads()} reps={reps} load={os.getloadavg()[0]:.1f}", flush=True)
    results["matmul_gflops"] = bench_matmul(reps)
    print(f"matmul (float32, 2048^3): {results['matmul_gflops']:.1f} GFLOP/s", flush=True)
    out = []
    if "kernel" not in skip:
        results["kernel"] = bench_kernel(kernel_lengths, reps)
        for r in results["kernel"]:
            r["share_of_matmul"] = r["gflops"] / results["matmul_gflops"]
            sdpa = next(x for x in results["kernel"] if x["L"] == r["L"] and x["pass_"] == r["pass_"] and x["impl"] == "sdpa")
            r["time_vs_sdpa"] = r["ms"] / sdpa["ms"]
        out.append(table(results["kernel"], ["L", "pass_", "impl", "ms", "gflops", "share_of_matmul", "time_vs_sdpa"],
                         "\n## Attention kernel (batch 1, 8 heads, head size 64, no mask)"))
        print(out[-1], flush=True)
    if "sublayer" not in skip:
        results["sublayer"] = bench_sublayer(train_lengths, infer_lengths, reps, memory=not args.no_memory)
        for r in results["sublayer"]:
            dense = next((x for x in results["sublayer"] if x["L"] == r["L"] and x["mode"] == r["mode"]
                          and x["impl"] == "relu_dense" and "ms" in x), None)
            if dense and "ms" in r:
                r["time_vs_dense"] = r["ms"] / dense["ms"]
                if "peak_mb" in r and dense.get("peak_mb"):
                    r["memory_vs_dense"] = r["peak_mb"] / dense["peak_mb"]
        out.append(table(results["sublayer"], ["L", "mode", "impl", "ms", "peak_mb", "time_vs_dense", "memory_vs_dense",
                                               "skipped"],
                         "\n## Attention sublayer (embed 512, 8 heads, batch 1; projections included)"))
        print(out[-1], flush=True)
    if "training" not in skip:
        results["training"] = bench_training(settings, models, dims, reps, vocab=vocab)
        out.append(table(results["training"], ["setting", "length", "batch", "model", "tokens_per_s", "ratio"],
                         "\n## Training throughput (target tokens/s; ratio to fairseq transformer)"))
        print(out[-1], flush=True)
    if "decoding" not in skip:
        results["decoding"] = bench_decoding(models, dims, reps, vocab=vocab)
        out.append(table(results["decoding"], ["model", "sentences_per_s", "ratio"],
                         "\n## Beam-4 decoding, 16 sentences x 30 tokens (ratio to fairseq transformer)"))
        print(out[-1], flush=True)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "benchmark.json").write_text(json.dumps(results, indent=1))
    (out_dir / "benchmark.txt").write_text("\n".join(out) + "\n")
    if "kernel" in results and "sublayer" in results:
        plot(results, out_dir / "benchmark.png")
    print(f"\nwrote {out_dir / 'benchmark.json'}, benchmark.txt" + (", benchmark.png" if "kernel" in results else ""))
    summary = {"matmul_gflops": round(results["matmul_gflops"], 1), "clock": args.clock,
               "threads": torch.get_num_threads()}
    for r in results.get("training", []):
        summary[f"train_{r['setting']}_{r['model']}"] = round(r["ratio"], 3)
    for r in results.get("decoding", []):
        summary[f"decode_{r['model']}"] = round(r["ratio"], 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
