#!/usr/bin/env python
"""The one-shot GPU check of issue 24: correctness and speed of the CUDA path on one GPU, one report.

    benchmarks/gpu_check.sh                       # sets up a virtualenv with a CUDA torch, then runs this
    python benchmarks/gpu_check.py --out DIR      # in an environment that has the project and a CUDA torch

Sections (each within a share of ``--budget-s``; what does not fit is listed as skipped, and an
error in one section is reported and the next one runs):

1. the CUDA tests: ``tests/test_triton_kernel.py`` on the GPU (the compiled kernel against the
   float64 reference path), and the kernel against the blocked path at L = 1024;
2. the attention kernel alone (bf16, 8 heads of 64, as many sentences as make 16384 tokens):
   PyTorch's SDPA (FlashAttention) softmax against the Triton ReLU kernel with and without the
   row statistics, the blocked path (the CUDA route before the kernel) and FlexAttention, at
   L = 512 ... 16384, forward and forward + backward, causal and not; time (CUDA events, median)
   and peak memory per token;
3. the attention sublayer (bf16, embed 512, 4 heads as in transformer_iwslt_de_en): fairseq's
   MultiheadAttention against ReluformerAttention (ReLUFormer with its regularisers recorded, as
   in training; ReLA), forward + backward;
4. training tokens/s (forward + backward + Adam, bf16 weights as fairseq's --bf16) of
   ``reluformer_iwslt_de_en`` and ``rela_iwslt_de_en`` with their criterion against fairseq's
   ``transformer_iwslt_de_en`` (label-smoothed cross-entropy), at sentence length (128 x 32
   tokens) and in 1024-token segments (4 x 1024), with the attention paths each model took and
   peak memory;
5. beam-4 decoding (float32) of ``reluformer_iwslt_de_en`` and ``rela_iwslt_de_en`` with the encoder's
   keys shared by a sentence's beams (what every decoding does since issue 32) against one copy per
   beam: the same best scores (within 1e-3; identical best hypotheses counted), and sentences/s of each.

The targets (issue 24): forward + backward <= 1.0x SDPA at L >= 1024 with statistics on; training
tokens/s >= 0.95x fairseq's transformer; peak memory per token flat in L. The report says for
each whether it was met. Writes ``report.md`` and ``report.json`` into ``--out`` and prints the
report. Without CUDA it stops after the CPU preflight (imports, models built) with exit code 2.

``--smoke-cpu`` runs every section but the tests on the CPU, the kernel in Triton's interpreter, at
tiny sizes: it checks this script, not the GPU (its numbers mean nothing; no memory is measured).
"""
import argparse
import collections
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
USER_DIR = str(REPO / "reluformer_mt")
NO_CUDA_EXIT = 2

KERNEL_LENGTHS = [512, 1024, 2048, 4096, 8192, 16384]
KERNEL_TOKENS = 16384  # sentences per call = this / L: the same work per token at every length
BLOCKED_MAX_LEN = 4096  # the blocked path (a Python loop over tiles) beyond this takes too long
FLEX_LENGTHS = (4096,)  # FlexAttention compiles per shape (tens of seconds): one length only
SUBLAYER_LENGTHS = [512, 1024, 4096]
TRAINING_SETTINGS = [("sentences", 32, 128), ("segments_1024", 1024, 4)]
DECODING = dict(sentences=16, length=32, beam=4, models=("reluformer_iwslt_de_en", "rela_iwslt_de_en"))
MODELS = {
    "transformer_iwslt_de_en": ("transformer_iwslt_de_en", []),
    "reluformer_iwslt_de_en": ("reluformer_iwslt_de_en", []),
    "rela_iwslt_de_en": ("rela_iwslt_de_en", []),
    # the CUDA route before the kernel (dense at these lengths), for comparison
    "reluformer_iwslt_de_en --attn-impl dense": ("reluformer_iwslt_de_en", ["--attn-impl", "dense"]),
}
REFERENCE_MODEL = "transformer_iwslt_de_en"
DEVICE = "cuda"
SIZES = dict(heads=8, head_dim=64, embed=512, sublayer_heads=4, sublayer_tokens=8192, vocab=10000)


def smoke_sizes():
    """--smoke-cpu: tiny sizes on the CPU (the kernel interpreted)."""
    global DEVICE, KERNEL_LENGTHS, KERNEL_TOKENS, BLOCKED_MAX_LEN, FLEX_LENGTHS, SUBLAYER_LENGTHS, TRAINING_SETTINGS
    DEVICE = "cpu"
    KERNEL_LENGTHS, KERNEL_TOKENS, BLOCKED_MAX_LEN, FLEX_LENGTHS = [32, 64], 64, 64, ()
    SUBLAYER_LENGTHS, TRAINING_SETTINGS = [32], [("sentences", 8, 2), ("segments_1024", 32, 1)]
    DECODING.update(sentences=2, length=6)
    SIZES.update(heads=2, head_dim=16, embed=32, sublayer_heads=2, sublayer_tokens=64, vocab=100)


class Budget:
    """Wall-clock budget shared by the sections; each asks before starting a measurement."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def allows(self, seconds: float) -> bool:
        return self.left() > seconds


# ---------------------------------------------------------------------------------- timing
def cuda_time_ms(fn, reps: int, warmup: int = 2) -> float:
    """Median milliseconds of ``fn`` over ``reps`` runs, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    if DEVICE == "cpu":  # --smoke-cpu
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def peak_mb(fn) -> float:
    """Peak CUDA memory allocated during ``fn`` above what was allocated before, in MB."""
    if DEVICE == "cpu":  # --smoke-cpu: not measured
        fn()
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


# ---------------------------------------------------------------------------------- preflight
def preflight():
    """What runs without a GPU: imports, the kernel module, the three models built on the CPU."""
    from reluformer_mt.attention import triton_kernel

    facts = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
             "triton": None, "models_built": []}
    if not triton_kernel.available():
        raise SystemExit("gpu_check: triton is not importable in this environment (pip install triton)")
    import triton
    facts["triton"] = triton.__version__
    for label, (arch, extra) in MODELS.items():
        if label == REFERENCE_MODEL or not extra:
            build_model(arch, extra, vocab=1000, max_len=64, device="cpu")
            facts["models_built"].append(arch)
    return facts


def require_cuda(facts):
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device (torch {torch.__version__}, built with CUDA {torch.version.cuda}); "
              f"the preflight passed ({', '.join(facts['models_built'])} built, triton {facts['triton']}); "
              "the measurements need one GPU: stopping here.", file=sys.stderr)
        raise SystemExit(NO_CUDA_EXIT)
    facts["gpu"] = torch.cuda.get_device_name(0)
    facts["gpu_memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 2 ** 30, 1)


# ---------------------------------------------------------------------------------- 1. tests
def run_cuda_tests(budget: Budget):
    """The kernel's test file on the GPU (it runs on CUDA tensors when CUDA is there)."""
    # ~13 constant combinations x 3 kernels compile first (about a second each)
    timeout = max(60, min(200, budget.left() * 0.4))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/test_triton_kernel.py"], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)
        tail = (done.stdout + done.stderr).strip().splitlines()
        return {"returncode": done.returncode, "summary": tail[-1] if tail else "",
                "seconds": time.monotonic() - started,
                "output_tail": "\n".join(tail[-40:]) if done.returncode else ""}
    except subprocess.TimeoutExpired:
        return {"returncode": None, "summary": f"timed out after {timeout:.0f} s", "seconds": timeout}


def kernel_vs_blocked(L=1024):
    """Max relative differences between the Triton kernel and the blocked path on one call
    (float32, causal, ReLUFormer's row factor, statistics and gradients)."""
    from reluformer_mt.attention.blocked import tiled_attention
    from reluformer_mt.attention.triton_kernel import triton_tiled_attention
    from reluformer_mt.attention.visibility import Visibility

    if DEVICE == "cpu":
        L = 64
    heads, head_dim = SIZES["heads"], SIZES["head_dim"]
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, heads, L, head_dim, device=DEVICE) for _ in range(3))
    kpm = torch.zeros(2, L, dtype=torch.bool, device=DEVICE)
    kpm[1, L - L // 10:] = True
    vis = Visibility.from_padding(L, L, kpm, causal=True)
    n = vis.n_visible(q.device)
    factor = 1.0 / torch.sqrt(n.float().clamp(min=1) / 2)
    result = {}
    grads = {}
    for name, fn, extra in (("triton", triton_tiled_attention, {}),
                            ("blocked", tiled_attention, {"route": "blocked", "block_q": 256, "block_k": 256})):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out, rows, _ = fn(*leaves, vis, activation="relu", scaling=head_dim ** -0.5, row_factor=factor, n_visible=n,
                          want_rows=True, **extra)
        (out.square().sum() + rows[0].sum() + rows[1].sum()).backward()
        grads[name] = (out.detach(), rows[0], rows[1], rows[2].float(), *(t.grad for t in leaves))
    result["L"] = L
    for what, a, b in zip(["out", "mass", "xlogx", "nonzero", "dq", "dk", "dv"], grads["triton"], grads["blocked"]):
        a, b = a.detach(), b.detach()
        result[what] = float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
    return result


# ---------------------------------------------------------------------------------- 2. kernel
def kernel_variants(L, causal):
    """{name: (forward-only callable, forward+backward callable)} at length L, bf16."""
    from reluformer_mt.attention import flex as flex_kernel
    from reluformer_mt.attention.blocked import tiled_attention
    from reluformer_mt.attention.triton_kernel import triton_tiled_attention
    from reluformer_mt.attention.visibility import Visibility

    heads, head_dim = SIZES["heads"], SIZES["head_dim"]
    batch = max(1, KERNEL_TOKENS // L)
    shape = (batch, heads, L, head_dim)
    leaves = [torch.randn(shape, device=DEVICE, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    vis = Visibility(L, L, causal_offset=0 if causal else None)
    n = vis.n_visible(leaves[0].device)
    factor = 1.0 / torch.sqrt(n.float().clamp(min=1) / 2)  # ReLUFormer's row factor (gamma = 1)
    scale = head_dim ** -0.5

    def sdpa():
        return F.scaled_dot_product_attention(*leaves, is_causal=causal)

    def ours(fn, rows, **extra):
        def call():
            out, stats, _ = fn(*leaves, vis, activation="relu", scaling=scale, row_factor=factor, n_visible=n,
                               want_rows=rows, **extra)
            return out if stats is None else out.float().sum() + stats[0].sum() + stats[1].sum()
        return call

    calls = {"sdpa": sdpa,
             "triton": ours(triton_tiled_attention, False),
             "triton+stats": ours(triton_tiled_attention, True)}
    if L <= BLOCKED_MAX_LEN:
        calls["blocked+stats"] = ours(tiled_attention, True, route="blocked", block_q=512, block_k=512)
    if L in FLEX_LENGTHS and flex_kernel.supports(leaves[0]):
        visible = None if not causal else vis

        def flex():
            return flex_kernel.flex_relu_attention(leaves[0] * scale, leaves[1], leaves[2], visible)
        calls["flex"] = flex

    def forward_only(call):
        def go():
            with torch.no_grad():
                call()
        return go

    def forward_backward(call):
        def go():
            result = call()
            (result if result.dim() == 0 else result.float().sum()).backward()
            for t in leaves:
                t.grad = None
        return go

    return {name: (forward_only(call), forward_backward(call)) for name, call in calls.items()}, batch


def bench_kernel(budget: Budget, reps: int):
    rows, skipped = [], []
    for causal in (False, True):
        for L in KERNEL_LENGTHS:
            if not budget.allows(60):
                skipped.append(f"kernel L={L} causal={causal}: budget")
                continue
            variants, batch = kernel_variants(L, causal)
            times = {}
            for name, (fwd, fwd_bwd) in variants.items():
                row = dict(L=L, causal=causal, batch=batch, impl=name)
                try:
                    row["fwd_ms"] = cuda_time_ms(fwd, reps)
                    row["fwd_bwd_ms"] = cuda_time_ms(fwd_bwd, reps)
                    row["peak_mb"] = peak_mb(fwd_bwd)
                    row["peak_kb_per_token"] = row["peak_mb"] * 1024 / (batch * L)
                except Exception as error:  # report, keep measuring the others
                    row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
                times[name] = row
                rows.append(row)
            base = times["sdpa"]
            for row in times.values():
                if "fwd_ms" in row and "fwd_ms" in base:
                    row["fwd_vs_sdpa"] = row["fwd_ms"] / base["fwd_ms"]
                    row["fwd_bwd_vs_sdpa"] = row["fwd_bwd_ms"] / base["fwd_bwd_ms"]
            print("  kernel L=%d causal=%s: %s" % (L, causal, ", ".join(
                f"{r['impl']} {r.get('fwd_bwd_vs_sdpa', float('nan')):.2f}x" for r in times.values())), flush=True)
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    return rows, skipped


# ---------------------------------------------------------------------------------- 3. sublayer
def bench_sublayer(budget: Budget, reps: int):
    from fairseq.modules.multihead_attention import MultiheadAttention

    from reluformer_mt.attention import AttentionConfig, ReluformerAttention, record_attention

    embed, heads, batch_tokens = SIZES["embed"], SIZES["sublayer_heads"], SIZES["sublayer_tokens"]

    def ours(fn):
        torch.manual_seed(0)
        return ReluformerAttention(embed, heads, AttentionConfig(fn=fn), self_attention=True)

    torch.manual_seed(0)
    modules = {"fairseq_softmax": MultiheadAttention(embed, heads, self_attention=True),
               "reluformer+regularisers": ours("relu"), "rela+statistics": ours("rela")}
    recorded = {"reluformer+regularisers": True, "rela+statistics": False}
    for module in modules.values():
        module.to(DEVICE, torch.bfloat16).train()
    rows, skipped = [], []
    for L in SUBLAYER_LENGTHS:
        if not budget.allows(40):
            skipped.append(f"sublayer L={L}: budget")
            continue
        batch = max(1, batch_tokens // L)
        x = torch.randn(L, batch, embed, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
        mask = torch.triu(torch.full((L, L), float("-inf"), device=DEVICE, dtype=torch.bfloat16), 1)
        times = {}
        for name, module in modules.items():
            def step(module=module, name=name):
                if name in recorded:
                    with record_attention(module, regularise=recorded[name]) as record:
                        out, _ = module(x, x, x, attn_mask=mask, need_weights=False)
                    totals = record.totals()
                    extra = sum(v for k, v in totals.items() if k in ("norm_loss", "entropy_margin"))
                else:
                    out, _ = module(x, x, x, attn_mask=mask, need_weights=False)
                    extra = 0.0
                (out.float().sum() + extra).backward()
            row = dict(L=L, batch=batch, impl=name)
            try:
                if isinstance(module, ReluformerAttention):
                    row["path"] = ", ".join(paths_taken(module, step))
                row["fwd_bwd_ms"] = cuda_time_ms(step, reps)
                row["peak_mb"] = peak_mb(step)
            except Exception as error:
                row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            times[name] = row
            rows.append(row)
        for row in times.values():
            if "fwd_bwd_ms" in row and "fwd_bwd_ms" in times["fairseq_softmax"]:
                row["vs_fairseq"] = row["fwd_bwd_ms"] / times["fairseq_softmax"]["fwd_bwd_ms"]
        print("  sublayer L=%d: %s" % (L, ", ".join(f"{r['impl']} {r.get('vs_fairseq', float('nan')):.2f}x"
                                                    for r in times.values())), flush=True)
    return rows, skipped


# ---------------------------------------------------------------------------------- 4. training
def build_model(arch, extra, vocab, max_len, device=None):
    """A fairseq model and criterion from command-line style options, as fairseq-train builds them."""
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.tasks.translation import TranslationTask

    from reluformer_mt.plugin import register

    register()
    fairseq_own = arch.startswith("transformer")
    criterion = "label_smoothed_cross_entropy" if fairseq_own else "reluformer_cross_entropy"
    argv = ["/nonexistent", "--user-dir", USER_DIR, "--arch", arch, "--task", "translation", "--criterion", criterion,
            "--label-smoothing", "0.1", "--source-lang", "src", "--target-lang", "tgt", "--dropout", "0.1",
            "--max-source-positions", str(max_len + 8), "--max-target-positions", str(max_len + 8), *extra]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    dictionary = Dictionary()
    for i in range(vocab):
        dictionary.add_symbol(f"w{i}")
    task = TranslationTask(args, dictionary, dictionary)
    torch.manual_seed(1)
    model = task.build_model(args).to(device or DEVICE)
    return model, task.build_criterion(args), dictionary


def make_sample(dictionary, batch, length, device):
    g = torch.Generator().manual_seed(0)
    low = dictionary.nspecial
    src = torch.randint(low, len(dictionary), (batch, length), generator=g)
    tgt = torch.randint(low, len(dictionary), (batch, length), generator=g)
    prev = torch.cat([torch.full((batch, 1), dictionary.eos()), tgt[:, :-1]], 1)
    move = (lambda t: t.to(device))
    return {"id": torch.arange(batch), "nsentences": batch, "ntokens": batch * length, "target": move(tgt),
            "net_input": {"src_tokens": move(src), "src_lengths": move(torch.full((batch,), length)),
                          "prev_output_tokens": move(prev)}}


def paths_taken(model, step):
    """How many attention calls of one step took each route (ReluformerAttention.route, the chooser)."""
    from reluformer_mt.attention import ReluformerAttention

    counts = collections.Counter()
    original = ReluformerAttention.route

    def counting(self, *args, **kwargs):
        path = original(self, *args, **kwargs)
        counts[path] += 1
        return path
    ReluformerAttention.route = counting
    try:
        step()
    finally:
        ReluformerAttention.route = original
    return dict(counts) or {"fairseq": "own forward"}


def bench_training(budget: Budget, reps: int):
    rows, skipped = [], []
    vocab = SIZES["vocab"]
    for setting, length, batch in TRAINING_SETTINGS:
        results = {}
        for label, (arch, extra) in MODELS.items():
            if not budget.allows(45):
                skipped.append(f"training {setting} {label}: budget")
                continue
            row = dict(setting=setting, length=length, batch=batch, model=label)
            try:
                model, criterion, dictionary = build_model(arch, extra, vocab, length)
                model.bfloat16().train()  # fairseq --bf16: bf16 weights and activations
                optimizer = torch.optim.Adam(model.parameters(), lr=1e-5, eps=1e-4)
                sample = make_sample(dictionary, batch, length, DEVICE)

                def step(model=model, criterion=criterion, optimizer=optimizer, sample=sample):
                    loss, _, _ = criterion(model, sample)
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                row["paths"] = paths_taken(model, step)
                ms = cuda_time_ms(step, reps, warmup=2)
                row["tokens_per_s"] = batch * length / (ms / 1e3)
                row["peak_mb"] = peak_mb(step)
                del model, criterion, optimizer
            except Exception as error:
                row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
            results[label] = row
            rows.append(row)
        base = results.get(REFERENCE_MODEL, {}).get("tokens_per_s")
        for row in results.values():
            if base and "tokens_per_s" in row:
                row["vs_transformer"] = row["tokens_per_s"] / base
        print(f"  training {setting}: " + ", ".join(f"{r['model']} {r.get('vs_transformer', float('nan')):.2f}x"
                                                   for r in results.values()), flush=True)
    return rows, skipped


def bench_decoding(budget: Budget):
    """Beam search with the encoder's keys shared by each sentence's beams (the decoder's default)
    against one copy per beam (``share_keys_across_beams = False``): the same best score per
    sentence (within 1e-3), how many best hypotheses are identical, and the speed of each. The
    shared step runs the attention routes with several query rows per sentence, which the CPU
    tests cover and only this covers on CUDA."""
    from fairseq.sequence_generator import SequenceGenerator

    rows, skipped = [], []
    batch, length, beam = DECODING["sentences"], DECODING["length"], DECODING["beam"]
    for arch in DECODING["models"]:
        if not budget.allows(30):
            skipped.append(f"decoding {arch}: budget")
            continue
        row = dict(model=arch, shape=f"{batch} x {length}", beam=beam)
        try:
            model, _, dictionary = build_model(arch, [], SIZES["vocab"], length)
            model.eval()
            sample = make_sample(dictionary, batch, length, DEVICE)
            generator = SequenceGenerator([model], dictionary, beam_size=beam, max_len_a=0, max_len_b=length)
            hypotheses, seconds, engaged = {}, {}, []
            for shared in (True, False, True, False):  # the second pair is timed, the first warms up
                model.decoder.share_keys_across_beams = shared
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                with torch.no_grad():
                    found = generator.generate([model], sample)
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                seconds[shared] = time.perf_counter() - start
                hypotheses[shared] = [[(h["tokens"].tolist(), float(h["score"])) for h in sentence] for sentence in found]
                engaged.append(getattr(model.decoder, "_beam_size", 1) == (beam if shared else 1))
            # a random model's near-ties may flip between the two summation orders: the best scores
            # must agree, and the share of identical best hypotheses is printed beside them
            best = [(x[0], y[0]) for x, y in zip(hypotheses[True], hypotheses[False])]
            same = all(abs(a[1] - b[1]) <= 1e-3 for a, b in best)
            row.update(same_hypotheses=("yes" if same else "NO") if all(engaged) else "NO: the keys were not shared",
                       identical_best=f"{sum(a[0] == b[0] for a, b in best)} / {len(best)}",
                       shared_sentences_per_s=batch / seconds[True],
                       per_beam_sentences_per_s=batch / seconds[False], shared_vs_per_beam=seconds[False] / seconds[True])
            del model
        except Exception as error:
            row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
        print(f"  decoding {arch}: best scores agree {row.get('same_hypotheses', '?')} "
              f"(identical {row.get('identical_best', '?')}), "
              f"shared / per beam {row.get('shared_vs_per_beam', float('nan')):.2f}x", flush=True)
    return rows, skipped


# ---------------------------------------------------------------------------------- report
def fmt(value, spec=".2f"):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def markdown_table(rows, columns):
    head = "| " + " | ".join(title for title, _, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    lines = [head, rule]
    for row in rows:
        lines.append("| " + " | ".join(row.get("error", "-") if key == "error" else fmt(row.get(key), spec)
                                       if spec else str(row.get(key, "-")) for _, key, spec in columns) + " |")
    return "\n".join(lines)


def targets(results):
    """Each issue-24 target: met, missed, or not measured."""
    lines = []
    kernel = [r for r in results.get("kernel", []) if r["impl"] == "triton+stats" and "fwd_bwd_vs_sdpa" in r]
    long_calls = [r for r in kernel if r["L"] >= 1024]
    if long_calls:
        worst = max(long_calls, key=lambda r: r["fwd_bwd_vs_sdpa"])
        met = worst["fwd_bwd_vs_sdpa"] <= 1.0
        lines.append(f"- fwd+bwd with statistics <= 1.0x SDPA at L >= 1024: {'met' if met else 'MISSED'} "
                     f"(worst {worst['fwd_bwd_vs_sdpa']:.2f}x at L={worst['L']}, causal={worst['causal']})")
    else:
        lines.append("- fwd+bwd with statistics <= 1.0x SDPA at L >= 1024: not measured")
    training = [r for r in results.get("training", []) if "vs_transformer" in r and r["model"] != REFERENCE_MODEL
                and "--attn-impl" not in r["model"]]
    if training:
        worst = min(training, key=lambda r: r["vs_transformer"])
        met = worst["vs_transformer"] >= 0.95
        lines.append(f"- training tokens/s >= 0.95x transformer_iwslt_de_en: {'met' if met else 'MISSED'} "
                     f"(worst {worst['vs_transformer']:.2f}x: {worst['model']}, {worst['setting']})")
    else:
        lines.append("- training tokens/s >= 0.95x transformer_iwslt_de_en: not measured")
    per_token = [r["peak_kb_per_token"] for r in kernel
                 if math.isfinite(r.get("peak_kb_per_token", math.nan)) and not r["causal"]]
    if len(per_token) >= 2:
        flat = max(per_token) <= 1.25 * min(per_token)
        lines.append(f"- peak memory per token flat in L (triton+stats, within 25 %): {'met' if flat else 'MISSED'} "
                     f"({min(per_token):.1f}..{max(per_token):.1f} KB per token)")
    else:
        lines.append("- peak memory per token flat in L: not measured")
    return lines


def report(results) -> str:
    facts = results["facts"]
    parts = ["# GPU check (issue 24)", "",
             f"{facts.get('gpu', '?')} ({facts.get('gpu_memory_gb', '?')} GB), torch {facts['torch']} "
             f"(CUDA {facts['torch_cuda']}), triton {facts['triton']}, Python {facts['python']}; "
             f"commit {facts.get('commit', '?')}; {facts.get('date', '')}; {results.get('seconds', 0):.0f} s", "",
             "## Targets", "", *targets(results), ""]
    tests = results.get("tests")
    if tests:
        parts += ["## CUDA tests", "", f"`pytest tests/test_triton_kernel.py` on the GPU: {tests['summary']} "
                  f"(exit {tests['returncode']}, {tests['seconds']:.0f} s)", ""]
        if tests.get("output_tail"):
            parts += ["```", tests["output_tail"], "```", ""]
    if results.get("kernel_vs_blocked"):
        errors = dict(results["kernel_vs_blocked"])
        parts += [f"Kernel vs blocked path, float32, L = {errors.pop('L')}, causal + padding, ReLUFormer factor, "
                  "statistics and gradients (max difference / max value): "
                  + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()), ""]
    if results.get("kernel"):
        parts += ["## Attention kernel (bf16, 8 heads x 64, 16384 tokens per call)", "",
                  markdown_table(results["kernel"], [
                      ("L", "L", None), ("causal", "causal", None), ("batch", "batch", None), ("impl", "impl", None),
                      ("fwd ms", "fwd_ms", ".3f"), ("fwd / SDPA", "fwd_vs_sdpa", ".2f"),
                      ("fwd+bwd ms", "fwd_bwd_ms", ".3f"), ("fwd+bwd / SDPA", "fwd_bwd_vs_sdpa", ".2f"),
                      ("peak MB", "peak_mb", ".1f"), ("peak KB/token", "peak_kb_per_token", ".2f"),
                      ("error", "error", None)]), ""]
    if results.get("sublayer"):
        parts += ["## Attention sublayer (bf16, embed 512, 4 heads, causal, 8192 tokens, fwd+bwd)", "",
                  markdown_table(results["sublayer"], [
                      ("L", "L", None), ("batch", "batch", None), ("impl", "impl", None), ("path", "path", None),
                      ("ms", "fwd_bwd_ms", ".3f"), ("/ fairseq", "vs_fairseq", ".2f"), ("peak MB", "peak_mb", ".1f"),
                      ("error", "error", None)]), ""]
    if results.get("training"):
        parts += ["## Training (bf16, forward + backward + Adam)", "",
                  markdown_table(results["training"], [
                      ("setting", "setting", None), ("model", "model", None), ("tokens/s", "tokens_per_s", ".0f"),
                      ("/ transformer", "vs_transformer", ".2f"), ("peak MB", "peak_mb", ".0f"),
                      ("attention paths per step", "paths", None), ("error", "error", None)]), ""]
    if results.get("decoding"):
        parts += ["## Beam-4 decoding, keys shared by a sentence's beams vs one copy per beam (float32)", "",
                  markdown_table(results["decoding"], [
                      ("model", "model", None), ("sentences x length", "shape", None),
                      ("best scores within 1e-3", "same_hypotheses", None), ("identical best", "identical_best", None),
                      ("shared sentences/s", "shared_sentences_per_s", ".1f"),
                      ("per beam sentences/s", "per_beam_sentences_per_s", ".1f"),
                      ("shared / per beam", "shared_vs_per_beam", ".2f"), ("error", "error", None)]), ""]
    if results.get("skipped"):
        parts += ["## Skipped (time budget)", "", *(f"- {s}" for s in results["skipped"]), ""]
    if results.get("errors"):
        parts += ["## Section errors", "", *(f"- {e}" for e in results["errors"]), ""]
    return "\n".join(parts)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True).stdout.strip() or "?"
    except OSError:
        return "?"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(REPO / "runs" / "gpu_check"), help="folder for report.md / report.json")
    parser.add_argument("--budget-s", type=float, default=330.0,
                        help="seconds for the measurements after setup (the whole check: at most 8 minutes)")
    parser.add_argument("--reps", type=int, default=10, help="timed repetitions per kernel / sublayer variant")
    parser.add_argument("--train-reps", type=int, default=5, help="timed training steps per model")
    parser.add_argument("--smoke-cpu", action="store_true",
                        help="check this script on the CPU: tiny sizes, the kernel interpreted, no tests; "
                             "its numbers mean nothing")
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.smoke_cpu:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("gpu_check --smoke-cpu: triton was imported before TRITON_INTERPRET=1 could be set")
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (by the preflight)
        smoke_sizes()
        args.reps = args.train_reps = 1
    facts = preflight()
    facts.update(commit=git_commit(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    if args.smoke_cpu:
        facts.update(gpu="none: --smoke-cpu (CPU, Triton interpreter; numbers mean nothing)", gpu_memory_gb=0)
    else:
        require_cuda(facts)
    budget = Budget(args.budget_s)
    results = {"facts": facts, "skipped": [], "errors": []}
    sections = [
        ("tests", lambda: None if args.smoke_cpu else run_cuda_tests(budget)),
        ("kernel_vs_blocked", kernel_vs_blocked),
        ("kernel", lambda: bench_kernel(budget, args.reps)),
        ("sublayer", lambda: bench_sublayer(budget, args.reps)),
        ("training", lambda: bench_training(budget, args.train_reps)),
        ("decoding", lambda: bench_decoding(budget)),
    ]
    for name, section in sections:
        print(f"gpu_check: {name} ({budget.left():.0f} s left)", flush=True)
        try:
            value = section()
        except Exception:  # one section's failure must not lose the others' numbers
            results["errors"].append(f"{name}: " + traceback.format_exc(limit=3).strip().splitlines()[-1])
            continue
        if isinstance(value, tuple):
            value, skipped = value
            results["skipped"] += skipped
        if value is not None:
            results[name] = value
    results["seconds"] = time.monotonic() - started
    text = report(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text + "\n", encoding="utf-8")
    (out / "report.json").write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")
    print(text)
    print(f"gpu_check: report written to {out / 'report.md'}")


if __name__ == "__main__":
    main()
