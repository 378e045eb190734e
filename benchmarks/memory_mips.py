"""Benchmark of the top-k MIPS memory (docs/METHODS.md section 2; EMAT reports ~1000 queries/s).

1. Index: queries/s and recall@k of approximate faiss indexes (HNSW, IVF; inner-product
   metric) against exact search (IndexFlatIP) over ``--slots`` keys of size ``--dim``.
2. Training step (forward + backward + SGD step) of a memory sublayer on ``--tokens`` query rows:
   the top-k memory at ``--slots`` slots against a dense memory (softmax(Q K^T) V over every slot)
   at the largest size whose score matrices fit ``--dense-budget-gb``.

    .venv/bin/python benchmarks/memory_mips.py --slots 1000000 --dim 64 --k 32 --json out.json

Keys are drawn clustered (``--keys clustered``: 4096 Gaussian centres plus noise, like trained
keys that group by topic) or isotropic Gaussian (``--keys gaussian``, the hardest case for an
approximate index); queries come from the same distribution.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reluformer_mt.memory.mips import MipsIndex, TopKMemory  # noqa: E402


def make_keys(n, d, kind, seed):
    rng = np.random.default_rng(seed)
    if kind == "gaussian":
        return rng.standard_normal((n, d), dtype=np.float32)
    centres = rng.standard_normal((4096, d), dtype=np.float32)
    return (centres[rng.integers(0, 4096, n)] + 0.5 * rng.standard_normal((n, d), dtype=np.float32)).astype(np.float32)


def timed_search(index, queries, k, repeats=1):
    start = time.perf_counter()
    for _ in range(repeats):
        _, ids = index.search(queries, k)
    return ids, repeats * len(queries) / (time.perf_counter() - start)


def recall(approx, exact):
    return float(np.mean([len(set(a) & set(e)) / len(e) for a, e in zip(approx, exact)]))


def bench_indexes(args):
    keys = make_keys(args.slots, args.dim, args.keys, 0)
    queries = make_keys(args.queries, args.dim, args.keys, 1)
    rows = []
    t = time.perf_counter()
    exact = MipsIndex("exact").build(keys)
    build = time.perf_counter() - t
    truth, qps = timed_search(exact, queries, args.k)
    rows.append({"index": "exact (IndexFlatIP)", "build_s": build, "queries_per_s": qps, f"recall@{args.k}": 1.0})
    print(rows[-1], flush=True)
    built = {"exact": exact}
    hnsw = dict(hnsw_m=args.hnsw_m, ef_construction=args.ef_construction)
    configs = [("hnsw", "hnsw (inner product)", dict(hnsw, hnsw_l2=False), args.ef_search),
               ("hnsw-l2", "hnsw (MIPS->L2)", dict(hnsw, hnsw_l2=True), args.ef_search),
               ("ivf", "ivf", dict(nprobe=args.nprobe[0]), args.nprobe)]
    for name, title, build_kw, search_values in configs:
        if name not in args.indexes:
            continue
        t = time.perf_counter()
        index = MipsIndex(name.split("-")[0], **build_kw).build(keys)
        build = time.perf_counter() - t
        built[name] = index
        for value in search_values:
            if name.startswith("hnsw"):
                index.ef_search = value
            else:
                index.index.nprobe = value
            ids, qps = timed_search(index, queries, args.k)
            label = f"{title}, M={args.hnsw_m}, efSearch={value}" if name.startswith("hnsw") else \
                f"ivf (inner product), nlist={index.index.nlist}, nprobe={value}"
            rows.append({"index": label, "build_s": build, "queries_per_s": qps, f"recall@{args.k}": recall(ids, truth)})
            print(rows[-1], flush=True)
    return rows, built, keys


def step_time(fn, params, repeats):
    opt = torch.optim.SGD(params, lr=0.1)
    fn().backward()  # warm-up (and, for the MIPS memory, the first index build)
    opt.step()
    opt.zero_grad(set_to_none=True)
    start = time.perf_counter()
    for _ in range(repeats):
        fn().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) / repeats


def bench_training(args, built=None, keys=None):
    """Steps of the top-k memory (reusing indexes built over ``keys``) and of dense memories."""
    built = {} if built is None else built
    torch.manual_seed(0)
    x = torch.randn(args.tokens, args.model_dim)
    proj = torch.nn.Linear(args.model_dim, args.dim)
    rows = []
    for index in args.step_indexes:
        for sparse in (True, False):
            torch.manual_seed(0)
            mem = TopKMemory(args.slots, args.dim, args.model_dim, topk=args.k, activation="softmax", index=index,
                             refresh_updates=10 ** 9, sparse=sparse)
            if keys is not None:
                with torch.no_grad():
                    mem.keys.weight.copy_(torch.from_numpy(keys))
            if index in built:  # the index benchmark already built it over these keys
                mem.index, mem._stale, build = built[index], False, float("nan")
            else:
                t = time.perf_counter()
                mem.refresh()
                build, built[index] = time.perf_counter() - t, mem.index
            params = list(proj.parameters()) + list(mem.parameters())
            sec = step_time(lambda: mem(proj(x)).pow(2).mean(), params, args.repeats)
            rows.append({"memory": f"top-{args.k} MIPS ({index}, {'sparse' if sparse else 'dense'} grads)", "slots": args.slots,
                         "step_ms": 1000 * sec, "index_build_s": build})
            print(rows[-1], flush=True)
            del mem, params
    # dense: scores, weights and their grads (4 N x S float32 matrices) must fit the budget
    largest = None
    slots = 1024
    while 4 * 4 * args.tokens * slots <= args.dense_budget_gb * 2 ** 30 and slots <= args.slots:
        largest = slots
        slots *= 2
    for s in sorted({min(args.slots, 1024 * 16), largest} - {None}):
        keys = torch.nn.Parameter(torch.randn(s, args.dim) * args.dim ** -0.5)
        values = torch.nn.Parameter(torch.randn(s, args.model_dim) * args.model_dim ** -0.5)
        sec = step_time(lambda: (F.softmax(proj(x) @ keys.T, -1) @ values).pow(2).mean(),
                        list(proj.parameters()) + [keys, values], args.repeats)
        rows.append({"memory": "dense softmax(Q K^T) V" + (" (largest in budget)" if s == largest else ""),
                     "slots": s, "step_ms": 1000 * sec, "index_build_s": 0.0})
        print(rows[-1], flush=True)
    return rows


def markdown(rows):
    cols = list(rows[0].keys())
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] +
                     ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slots", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=64, help="key size")
    p.add_argument("--model-dim", type=int, default=256, help="value size (model width) in the training step")
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--keys", default="clustered", choices=["clustered", "gaussian"])
    p.add_argument("--indexes", default="hnsw,hnsw-l2,ivf", help="approximate indexes: hnsw (inner product), hnsw-l2 (MIPS->L2), ivf")
    p.add_argument("--hnsw-m", type=int, default=16)
    p.add_argument("--ef-construction", type=int, default=40)
    p.add_argument("--ef-search", default="64,256")
    p.add_argument("--nprobe", default="8,32")
    p.add_argument("--tokens", type=int, default=2048, help="query rows per training step (~ tokens per batch)")
    p.add_argument("--step-indexes", default="exact,hnsw", help="indexes timed in the training step ('' to skip)")
    p.add_argument("--dense-budget-gb", type=float, default=2.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch/faiss threads (0: library default)")
    p.add_argument("--skip-index", action="store_true")
    p.add_argument("--json", help="write the results as JSON")
    args = p.parse_args(argv)
    args.indexes = args.indexes.split(",")
    args.ef_search = [int(v) for v in args.ef_search.split(",")]
    args.nprobe = [int(v) for v in args.nprobe.split(",")]
    args.step_indexes = [v for v in args.step_indexes.split(",") if v]
    if args.threads:
        import faiss
        torch.set_num_threads(args.threads)
        faiss.omp_set_num_threads(args.threads)
    built, keys = {}, None
    result = {"settings": {k: v for k, v in vars(args).items() if k != "json"}, "torch_threads": torch.get_num_threads()}
    if not args.skip_index:
        result["index"], built, keys = bench_indexes(args)
        print(f"\n## MIPS index: {args.slots} {args.keys} keys of size {args.dim}, {args.queries} queries, k = {args.k}\n")
        print(markdown(result["index"]))
    if args.step_indexes or args.dense_budget_gb > 0:
        result["training_step"] = bench_training(args, built, keys)
        print(f"\n## training step: {args.tokens} query rows, key size {args.dim}, value size {args.model_dim}\n")
        print(markdown(result["training_step"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
