"""Benchmark of kNN-MT (issue 31's cost targets), one run, ratios printed.

1. Build: the full datastore of a checkpoint over its training split (the bible: every target
   token of the 234 training chapters), seconds and size on disk.
2. Decoding: sentences/s of the test chapters translated plain, with the full datastore and with
   per-input datastores (SK-MT), the three interleaved ``--repeats`` times on one thread; the
   ratio to plain decoding of each repetition, median and spread (min-max). An identical plain
   translator ("plain again") shows the noise.
3. Search at scale: a datastore of ``--entries`` entries made of the real keys (tiled, with noise
   of the keys' own spread, so the distribution stays the model's) searched by the real
   validation states: queries/s of HNSW on one core, and recall@8 against exact search.

    .venv/bin/python benchmarks/knn_mt.py --checkpoint runs/demo/checkpoints/softmax/document/checkpoint_best.pt \\
        --data runs/demo/data/doc128.v2000 --out runs/knn_bench --entries 1000000
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def one_core():
    import faiss
    import torch

    faiss.omp_set_num_threads(1)
    torch.set_num_threads(1)


def decode_rates(checkpoint, data, store, repeats, chapters, beam):
    from reluformer_mt.experiments.demo import limit_chapters, read_split_documents
    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.knn.search import KnnOptions

    sources = list(limit_chapters(read_split_documents(Path(data), "test", "grc"), chapters).values())
    verses = sum(map(len, sources))
    options = KnnOptions(k=16, lam=0.5, temperature=10.0)
    variants = {"plain": {}, "plain again": {}, "knn (full datastore)": {"knn": store, **options.translator_options()},
                "knn (per-input)": {"knn_memory": True, **options.translator_options()}}
    translators = {name: DocumentTranslator(checkpoint, data=data, beam=beam, **kw) for name, kw in variants.items()}
    seconds = {name: [] for name in variants}
    names = list(variants)
    for rep in range(repeats):
        for name in names[rep % len(names):] + names[:rep % len(names)]:  # a different one first each time
            start = time.perf_counter()
            translators[name].translate(sources, progress=False)
            seconds[name].append(time.perf_counter() - start)
    rows = {}
    for name in names:
        ratios = [p / s for p, s in zip(seconds["plain"], seconds[name])]  # rate / plain rate
        rows[name] = {"sentences_per_second": verses / statistics.median(seconds[name]),
                      "ratio_to_plain": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                      "seconds": seconds[name]}
    return verses, rows


def search_at_scale(store, checkpoint, data, entries, queries, out_dir, seed=1):
    """Exact (faiss flat L2) against the datastore's approximate indexes on ``entries`` entries."""
    import faiss

    from reluformer_mt.checkpoints import load_model
    from reluformer_mt.knn.datastore import Datastore, build_index
    from reluformer_mt.experiments.knn_tune import ForcedSplit

    loaded = load_model(checkpoint, data)
    states = ForcedSplit(loaded.model, loaded.task, "valid").states.numpy()
    rng = np.random.default_rng(seed)
    q = np.ascontiguousarray(states[rng.choice(len(states), min(queries, len(states)), replace=False)], dtype=np.float32)
    keys = np.asarray(store.keys, dtype=np.float32)
    spread = keys.std(axis=0, keepdims=True) * 0.05
    tiles = [keys]
    while sum(len(t) for t in tiles) < entries:
        tiles.append(keys + rng.standard_normal(keys.shape, dtype=np.float32) * spread)
    big = np.ascontiguousarray(np.concatenate(tiles)[:entries])
    out = {"entries": len(big), "dim": big.shape[1], "queries": len(q)}
    exact = faiss.IndexFlatL2(big.shape[1])
    exact.add(big)
    start = time.perf_counter()
    _, exact_ids = exact.search(q, 8)
    out["exact_queries_per_second"] = len(q) / (time.perf_counter() - start)
    values = np.zeros(len(big), dtype=np.int32)
    for kind in ("ivf", "hnsw"):
        directory = Path(out_dir) / f"scale_{kind}"
        directory.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        meta = build_index(kind, big, directory / "index.faiss")
        build = time.perf_counter() - start
        scaled = Datastore(directory, {"index": meta}, big, values)
        efs = (64, 128, 256) if kind == "hnsw" else (None,)
        for ef in efs:
            if ef is not None:
                scaled.meta["index"]["ef_search"] = ef
                scaled._index = None
            scaled.index()
            start = time.perf_counter()
            _, _ = scaled.search(q, 8)
            rate = len(q) / (time.perf_counter() - start)
            index = scaled.index()
            ids = (index.search(q, 8)[1] if kind == "hnsw" else
                   index.search(np.hstack([q, np.ones((len(q), 1), np.float32)]), 8)[1])
            recall = float(np.mean([len(set(a) & set(e)) / 8 for a, e in zip(ids, exact_ids)]))
            name = kind if ef is None else f"{kind}_ef{ef}"
            out[name] = {"build_seconds": build, "queries_per_second": rate, "recall_at_8": recall}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", default="runs/knn_bench")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chapters", type=int, default=0, help="test chapters decoded (0: all)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--entries", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--json", help="write the numbers here")
    p.add_argument("--stages", default="build,decode,search",
                   help="comma-separated stages to run; without build, the datastore of a previous run in --out is used")
    args = p.parse_args(argv)
    stages = set(args.stages.split(","))
    if not stages <= {"build", "decode", "search"}:
        p.error(f"--stages: expected some of build, decode, search; got {args.stages!r}")
    from reluformer_mt.plugin import register

    register()
    one_core()
    from reluformer_mt.knn.datastore import Datastore, build_datastore

    report = {}
    if "build" in stages:
        start = time.perf_counter()
        store = build_datastore(args.checkpoint, Path(args.out) / "datastore", data=args.data, progress=False, force=True)
        report["build"] = {"seconds": time.perf_counter() - start, "entries": store.size,
                           "mib_on_disk": store.meta["bytes"] / 2 ** 20}
        print(f"build: {store.size:,} entries in {report['build']['seconds']:.1f} s on one core "
              f"(target <= 60 s on 2 cores), {report['build']['mib_on_disk']:.1f} MiB on disk", flush=True)
    else:
        store = Datastore.load(Path(args.out) / "datastore")
    if "decode" in stages:
        verses, rows = decode_rates(args.checkpoint, args.data, str(store.directory), args.repeats, args.chapters, args.beam)
        report["decode"] = {"verses": verses, "rows": rows}
        targets = {"knn (full datastore)": 0.5, "knn (per-input)": 0.8}
        for name, r in rows.items():
            target = f"  (target >= {targets[name]}x)" if name in targets else ""
            print(f"decode {name:22s} {r['sentences_per_second']:6.1f} sentences/s  {r['ratio_to_plain']:.2f}x plain "
                  f"[{r['ratio_min']:.2f}-{r['ratio_max']:.2f}]{target}", flush=True)
    if "search" in stages:
        report["search"] = search_at_scale(store, args.checkpoint, args.data, args.entries, args.queries, args.out)
        s = report["search"]
        print(f"search: {s['entries']:,} entries of dim {s['dim']}; exact {s['exact_queries_per_second']:.0f} queries/s", flush=True)
        for name in [k for k in s if k.startswith(("ivf", "hnsw"))]:
            h = s[name]
            print(f"search: {name}: built in {h['build_seconds']:.0f} s, {h['queries_per_second']:.0f} queries/s, "
                  f"recall@8 {h['recall_at_8']:.3f} (target >= 1,000 queries/s at recall@8 >= 0.9)", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
