#!/usr/bin/env python
"""Which tile shape and launch options make the Triton ReLU attention kernel fastest on this GPU.

    python benchmarks/triton_tiles.py [--lengths 1024,4096] [--out DIR]

For each (queries, keys, warps, stages) choice, times the kernel (bf16, 8 heads of 64, 16384 tokens
per call, ReLUFormer's row factor, the row statistics on: what a training step with
``reluformer_cross_entropy`` runs) forward and forward + backward, causal and not, with CUDA events
(median of ``--reps``), beside PyTorch's SDPA measured in the same run. Every choice is first
checked against the default tiles on the same inputs (outputs and gradients within 2 % of their
largest value in bf16), so a fast but wrong choice is reported as wrong. Prints a table and writes
``report.md`` / ``report.json`` into ``--out``. Needs CUDA (exit 2 without it).
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from gpu_check import cuda_time_ms as time_ms  # noqa: E402  (median of CUDA-event timings)

CHOICES = [(64, 64, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3), (64, 128, 4, 3), (128, 128, 8, 3),
           (64, 64, 4, 2), (128, 32, 4, 3), (32, 64, 4, 3)]
HEADS, HEAD_DIM, TOKENS = 8, 64, 16384


def inputs(L: int, causal: bool):
    from reluformer_mt.attention.visibility import Visibility
    torch.manual_seed(0)
    batch = max(1, TOKENS // L)
    leaves = [torch.randn(batch, HEADS, L, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
              for _ in range(3)]
    vis = Visibility(L, L, causal_offset=0 if causal else None)
    n = vis.n_visible(leaves[0].device)
    return leaves, vis, n, 1.0 / torch.sqrt(n.float().clamp(min=1) / 2)


def run_choice(leaves, vis, n, factor, tiles):
    """Forward + backward of the kernel with statistics; returns (output, grads)."""
    from reluformer_mt.attention.triton_kernel import triton_tiled_attention
    out, rows, _ = triton_tiled_attention(*leaves, vis, activation="relu", scaling=HEAD_DIM ** -0.5,
                                          row_factor=factor, n_visible=n, want_rows=True, tiles=tiles)
    loss = out.float().sum() + rows[0].sum() + rows[1].sum()
    return out, loss


def measure(L: int, causal: bool, reps: int) -> list:
    leaves, vis, n, factor = inputs(L, causal)

    def grads_of(tiles):
        out, loss = run_choice(leaves, vis, n, factor, tiles)
        loss.backward()
        result = [out.detach().float()] + [t.grad.detach().float().clone() for t in leaves]
        for t in leaves:
            t.grad = None
        return result

    reference = grads_of(CHOICES[0])
    rows = []

    def sdpa_fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(*leaves, is_causal=causal)

    def sdpa_fb():
        F.scaled_dot_product_attention(*leaves, is_causal=causal).float().sum().backward()
        for t in leaves:
            t.grad = None
    base = dict(L=L, causal=causal, tiles="sdpa", fwd_ms=time_ms(sdpa_fwd, reps), fwd_bwd_ms=time_ms(sdpa_fb, reps))
    rows.append(base)
    for tiles in CHOICES:
        row = dict(L=L, causal=causal, tiles="x".join(map(str, tiles)))
        try:
            got = grads_of(tiles)
            row["max_rel_error"] = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
                                       for a, b in zip(got, reference))

            def fwd():
                with torch.no_grad():
                    run_choice(leaves, vis, n, factor, tiles)

            def fwd_bwd():
                run_choice(leaves, vis, n, factor, tiles)[1].backward()
                for t in leaves:
                    t.grad = None
            row["fwd_ms"], row["fwd_bwd_ms"] = time_ms(fwd, reps), time_ms(fwd_bwd, reps)
            row["fwd_vs_sdpa"] = row["fwd_ms"] / base["fwd_ms"]
            row["fwd_bwd_vs_sdpa"] = row["fwd_bwd_ms"] / base["fwd_bwd_ms"]
        except Exception as error:  # a choice that does not compile or fit: reported, the others go on
            row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
        rows.append(row)
        print(f"  L={L} causal={causal} {row['tiles']}: " + (row.get("error") or
              f"fwd {row['fwd_vs_sdpa']:.2f}x, fwd+bwd {row['fwd_bwd_vs_sdpa']:.2f}x SDPA, "
              f"error {row['max_rel_error']:.1e}"), flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="1024,4096", help="comma-separated sequence lengths")
    parser.add_argument("--reps", type=int, default=10, help="timed repetitions per choice")
    parser.add_argument("--out", default=str(REPO / "runs" / "triton_tiles"), help="folder for the report")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("triton_tiles: needs a CUDA device", file=sys.stderr)
        return 2
    started = time.monotonic()
    rows = []
    for causal in (False, True):
        for L in (int(x) for x in args.lengths.split(",")):
            rows += measure(L, causal, args.reps)
    lines = [f"# Triton kernel tiles on {torch.cuda.get_device_name(0)} (bf16, {HEADS} heads x {HEAD_DIM}, "
             f"{TOKENS} tokens per call, statistics on; queries x keys x warps x stages)", "",
             "| L | causal | tiles | fwd ms | fwd / SDPA | fwd+bwd ms | fwd+bwd / SDPA | max rel. error vs 64x64x4x3 |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['L']} | {r['causal']} | {r['tiles']} | {r['error']} | | | | |")
            continue
        lines.append(f"| {r['L']} | {r['causal']} | {r['tiles']} | {r['fwd_ms']:.3f} | {r.get('fwd_vs_sdpa', 1):.2f} "
                     f"| {r['fwd_bwd_ms']:.3f} | {r.get('fwd_bwd_vs_sdpa', 1):.2f} | {r.get('max_rel_error', 0):.1e} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "report.json").write_text(json.dumps({"rows": rows, "seconds": time.monotonic() - started}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
