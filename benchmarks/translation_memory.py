"""Benchmark of the translation memory (issue 20's cost targets), one run, ratios printed.

1. Retrieval on the bible memory (the demo's training verses, exact MIPS): build time, peak
   RAM, queries/s of the whole lookup (TF-IDF keys + faiss + fuzzy rerank) and of MIPS alone,
   on one core; recall@1 against the exact fuzzy best.
2. Synthetic memories of 10k / 100k / 1M entries (clustered 256-dim keys, like sentence keys
   that group by topic): build time and RAM of the exact and HNSW indexes, queries/s on one
   core, and HNSW's recall@10 against exact search.
3. Translation sentences/s of a memory checkpoint with its memory against the same checkpoint
   without matches (``memory="none"``), and against a twin trained without memory, interleaved
   ``--repeats`` times (median and spread), with the decoder steps each pass ran (a model that
   reads matches writes other translations, some to the length limit, and searches longer) and
   the output words per reference word (BLEU's length ratio: whether a longer search wrote text
   the other system left out). With ``--twin``, also the twin with translation pieces.
4. The cost of one decoding step with and without matches at equal work: the first batch the
   memory model translates, ``--step-count`` steps of beam search's incremental decoder (each row
   fed its own best token, fairseq's per-step reorders included), interleaved ``--repeats`` times.

    .venv/bin/python benchmarks/translation_memory.py --data runs/demo/data/doc128.v2000 \\
        --checkpoint runs/demo/checkpoints/softmax+tm/document/checkpoint_best.pt \\
        --twin runs/demo/checkpoints/softmax/document/checkpoint_best.pt --sizes 10000,100000,1000000

The memory-attention cost alone (issue 32): ``--sizes "" --no-retrieval --no-pieces --clock cpu``.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reluformer_mt.memory.mips import MipsIndex  # noqa: E402
from reluformer_mt.memory.tm import Retriever, read_prepared, recall_at_k  # noqa: E402


def one_core():
    import faiss
    import torch

    faiss.omp_set_num_threads(1)
    torch.set_num_threads(1)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def bible_retrieval(data_dir: Path, k: int) -> dict:
    memory = read_prepared(data_dir, "train")
    queries = read_prepared(data_dir, "test").sources
    before = rss_mb()
    start = time.perf_counter()
    retriever = Retriever(memory)
    retriever.search(queries[:1], k)  # the default score's sparse space is fitted at its first search
    build = time.perf_counter() - start
    ram = rss_mb() - before
    retriever.search(queries[:50], k)  # warm-up
    start = time.perf_counter()
    _, scores = retriever.search(queries, k)
    lookup_qps = len(queries) / (time.perf_counter() - start)
    keys = retriever.keys.encode(queries)
    start = time.perf_counter()
    for _ in range(20):
        retriever.index.search(keys, k)
    mips_qps = 20 * len(queries) / (time.perf_counter() - start)
    best = retriever.exact_best(queries)
    close = best >= 0.5  # the matches that matter to a translator
    return {"match_score": retriever.score, "entries": len(memory), "queries": len(queries),
            "ms_per_sentence": round(1000 / lookup_qps, 3), "build_s": round(build, 2), "ram_mb": round(ram, 1),
            "lookup_qps": round(lookup_qps), "mips_qps": round(mips_qps), **recall_at_k(scores, best, ks=(1,)),
            "queries_with_best_fuzzy>=0.5": int(close.sum()),
            "recall@1 (best fuzzy >= 0.5)": recall_at_k(scores[close], best[close], ks=(1,))["recall@1"] if close.any() else None,
            "mean_top1_fuzzy": round(float(scores[:, 0].mean()), 3)}


def clustered(n: int, d: int, seed: int) -> np.ndarray:
    """Unit keys around 4,096 topic centres (the same centres for every seed, so queries drawn with
    another seed come from the memory's distribution, as a sentence to translate does)."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(12345).standard_normal((4096, d), dtype=np.float32)
    x = centres[rng.integers(0, 4096, n)] + 0.5 * rng.standard_normal((n, d), dtype=np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def synthetic(size: int, dim: int, queries: int, k: int, ef_searches, ef_construction: int, hnsw_m: int) -> list:
    """Exact search, then one HNSW graph searched at each ``efSearch`` (recall against exact)."""
    keys, qs = clustered(size, dim, 0), clustered(queries, dim, 1)
    rows = []
    before = rss_mb()
    start = time.perf_counter()
    exact = MipsIndex("exact").build(keys)
    rows.append({"entries": size, "index": "exact", "build_s": round(time.perf_counter() - start, 1),
                 "ram_mb": round(rss_mb() - before), "qps": 0, f"recall@{k}": 1.0})
    exact.search(qs[:10], k)
    start = time.perf_counter()
    _, truth = exact.search(qs, k)
    rows[-1]["qps"] = round(len(qs) / (time.perf_counter() - start))
    print(json.dumps(rows[-1]), flush=True)
    del exact
    before = rss_mb()
    start = time.perf_counter()
    hnsw = MipsIndex("hnsw", hnsw_m=hnsw_m, ef_construction=ef_construction).build(keys)
    build, ram = time.perf_counter() - start, rss_mb() - before
    for ef in ef_searches:
        hnsw.ef_search = ef
        hnsw.search(qs[:10], k)
        start = time.perf_counter()
        _, ids = hnsw.search(qs, k)
        qps = len(qs) / (time.perf_counter() - start)
        rec = float(np.mean([len(set(a) & set(e)) / k for a, e in zip(ids, truth)]))
        rows.append({"entries": size, "index": f"hnsw M{hnsw_m} efC{ef_construction} efS{ef}", "build_s": round(build, 1),
                     "ram_mb": round(ram), "qps": round(qps), f"recall@{k}": round(rec, 3)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def translation_speed(checkpoint: str, twin: str, data_dir: Path, sentences: int, repeats: int, pieces: bool = True,
                      clock: str = "wall") -> dict:
    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.plugin import register

    register()
    prepared = read_prepared(data_dir, "test")
    test, references = prepared.sources[:sentences], prepared.targets[:sentences]
    documents = [test[i:i + 20] for i in range(0, len(test), 20)]
    systems = {"with memory": DocumentTranslator(checkpoint, data=data_dir, beam=4, quiet=True),
               "same model, no matches": DocumentTranslator(checkpoint, data=data_dir, beam=4, quiet=True, memory="none")}
    if twin:
        systems["twin without memory"] = DocumentTranslator(twin, data=data_dir, beam=4, quiet=True)
    if twin and pieces:
        # decoding guided by the memory's n-grams (the demo's default k and weight)
        systems["twin with translation pieces"] = DocumentTranslator(twin, data=data_dir, beam=4, quiet=True,
                                                                     pieces_weight=10.0, pieces_k=8)
    times = {name: [] for name in systems}
    outputs = {}
    steps = {name: count_steps(translator) for name, translator in systems.items()}
    timer = clock_of(clock)
    for _ in range(repeats):  # interleaved, so load changes hit every system alike
        for name, translator in systems.items():
            start = timer()
            outputs[name] = translator.translate(documents, progress=False)
            times[name].append(len(test) / (timer() - start))
    reference_words = sum(len(r.split()) for r in references)
    out = {name: {"sentences_per_s": round(statistics.median(v), 2), "spread": round(max(v) - min(v), 2)}
           for name, v in times.items()}
    ref = statistics.median(times["with memory"])
    for name, v in times.items():
        if name != "with memory":
            out[name].update(paired_ratio(times["with memory"], v, "memory_ratio"))
    out["with memory"]["sentences_per_s"] = round(ref, 2)
    for name, translator in systems.items():  # retranslated segments lengthen a system's work: say how many
        out[name]["fallbacks"] = sum(v for k, v in translator.stats.items() if k.startswith("fallbacks: "))
        out[name]["decoder_steps_per_pass"] = steps[name]["steps"] // repeats
        out[name]["beam_rows_per_pass"] = steps[name]["rows"] // repeats
        # what the steps produce: output words per reference word (BLEU's length ratio); a longer
        # search that brings a short output to the reference's length is work, not overhead
        words = sum(len(result.text.split()) for document in outputs[name] for result in document)
        out[name]["length_ratio"] = round(words / reference_words, 3)
    out["_times"] = times  # sentences/s of every repetition, for paired ratios
    out["_passes"] = repeats
    out["_translators"] = systems
    out["_documents"] = documents
    return out


def clock_of(clock: str):
    # cpu: this thread's CPU seconds (one torch thread), for a machine shared with other jobs
    return time.thread_time if clock == "cpu" else time.perf_counter


def paired_ratio(ours, theirs, name: str) -> dict:
    """Median and spread (max - min) of the repetitions' paired ratios ours / theirs."""
    ratios = [a / b for a, b in zip(ours, theirs)]
    return {name: round(statistics.median(ratios), 3), "ratio_spread": round(max(ratios) - min(ratios), 3)}


def count_steps(translator) -> dict:
    """Decoder steps and beam rows a translator runs from now on (its output projection runs once a step)."""
    counts = {"steps": 0, "rows": 0}

    def count(module, inputs, output):
        counts["steps"] += 1
        counts["rows"] += inputs[0].size(0)
    translator.model.decoder.output_projection.register_forward_hook(count)
    return counts


def first_batch(translator, documents) -> dict:
    """The first batch (fairseq sample, matches included) that ``translator`` decodes for ``documents``."""
    batches = []
    step = translator.task.inference_step

    def record(generator, models, sample, **kwargs):
        batches.append(sample)
        return step(generator, models, sample, **kwargs)
    translator.task.inference_step = record
    try:
        translator.translate(documents, progress=False)
    finally:
        del translator.task.inference_step  # the task's own method again
    return batches[0]


@torch.no_grad()
def decode_steps(model, sample, beam: int, steps: int, with_matches: bool, eos: int, timer) -> float:
    """Seconds of ``steps`` incremental decoding steps over ``sample`` in beam search's shape (each
    sentence's rows repeated ``beam`` times, every row fed its own best token), with fairseq's
    per-step reorders of the encoder output and the incremental state; the encoder is not timed."""
    net_input = sample["net_input"]
    memory = {"memory_tokens": net_input["memory_tokens"]} if with_matches else {}
    encoder_out = model.encoder(net_input["src_tokens"], net_input["src_lengths"], **memory)
    rows = net_input["src_tokens"].size(0) * beam
    order = torch.arange(rows) // beam
    # beam search's first reorder: the decoder then keeps one copy of the cached keys per sentence
    encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
    state: dict = {}
    tokens = torch.full((rows, 1), eos, dtype=torch.long)
    same = torch.arange(rows)
    start = timer()
    for step in range(steps):
        if step:
            model.decoder.reorder_incremental_state_scripting(state, same)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, same)
        out = model.decoder(tokens, encoder_out=encoder_out, incremental_state=state)
        lprobs = model.get_normalized_probs((out[0][:, -1:], out[1]), log_probs=True)
        tokens = torch.cat([tokens, lprobs[:, -1].argmax(-1, keepdim=True)], dim=1)
    return timer() - start


def step_cost(translator, documents, steps: int, repeats: int, clock: str) -> dict:
    """ms per decoding step with / without matches at equal work (:func:`decode_steps`), interleaved."""
    sample = first_batch(translator, documents)
    model, timer = translator.model, clock_of(clock)
    beam, eos = translator.generator.beam_size, translator.tgt_dict.eos()
    times = {True: [], False: []}
    decode_steps(model, sample, beam, 2, True, eos, timer)  # warm-up
    for _ in range(repeats):
        for with_matches in (True, False):
            times[with_matches].append(decode_steps(model, sample, beam, steps, with_matches, eos, timer))
    ms = {k: [1000 * t / steps for t in v] for k, v in times.items()}
    return {"rows": int(sample["net_input"]["src_tokens"].size(0) * beam), "steps": steps,
            "memory_slots": int(sample["net_input"]["memory_tokens"].size(1)),
            "ms_per_step_with": round(statistics.median(ms[True]), 3), "ms_per_step_without": round(statistics.median(ms[False]), 3),
            # speed with / without = time without / time with
            **paired_ratio(times[False], times[True], "step_ratio")}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a prepared directory (the bible memory: its training split)")
    p.add_argument("--checkpoint", help="a checkpoint trained with --tm-fusion (translation speed)")
    p.add_argument("--twin", help="the same family trained without memory (translation speed)")
    p.add_argument("--sizes", default="10000,100000,1000000", help="synthetic memory sizes ('' = none)")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--ef-search", default="64,128,256,512", help="HNSW efSearch values, comma-separated (one graph)")
    p.add_argument("--ef-construction", type=int, default=200, help="HNSW efConstruction")
    p.add_argument("--hnsw-m", type=int, default=32, help="HNSW links per node")
    p.add_argument("--sentences", type=int, default=120)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-retrieval", action="store_true", help="skip the bible retrieval rows (translation only)")
    p.add_argument("--no-pieces", action="store_true", help="skip the twin with translation pieces")
    p.add_argument("--step-count", type=int, default=60, help="decoding steps of the equal-work step cost (0: skip it)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="translation rows: elapsed or this thread's CPU seconds (a shared machine)")
    p.add_argument("--json", help="write every number here")
    args = p.parse_args(argv)
    one_core()
    report = {}
    if not args.no_retrieval:
        report["bible"] = bible_retrieval(Path(args.data), args.k)
        print("bible memory:", json.dumps(report["bible"]), flush=True)
    report["synthetic"] = [row for size in args.sizes.split(",") if size
                           for row in synthetic(int(size), args.dim, args.queries, args.k,
                                           [int(e) for e in args.ef_search.split(",") if e], args.ef_construction,
                                           args.hnsw_m)]
    if args.checkpoint:
        report["translation"] = translation_speed(args.checkpoint, args.twin, Path(args.data), args.sentences, args.repeats,
                                                  pieces=not args.no_pieces, clock=args.clock)
        translators, documents = report["translation"].pop("_translators"), report["translation"].pop("_documents")
        print("translation:", json.dumps(report["translation"]), flush=True)
        if args.step_count:
            report["decoding_step"] = step_cost(translators["with memory"], documents, args.step_count, args.repeats,
                                                args.clock)
            print("decoding step:", json.dumps(report["decoding_step"]), flush=True)
    report["peak_rss_mb"] = round(peak_rss_mb())
    parts = []
    b = report.get("bible")
    if b:
        parts += [f"bible lookup ({b['match_score']}) {b['ms_per_sentence']:.2f} ms a sentence, {b['lookup_qps']} q/s "
                  f"(MIPS alone {b['mips_qps']}) {'✓' if b['ms_per_sentence'] <= 2.0 else '✗'} <= 2 ms",
                  f"recall@1 {b['recall@1']:.2f} (where the best match has fuzzy >= 0.5: {b['recall@1 (best fuzzy >= 0.5)']})"]
    for row in report["synthetic"]:
        if row["index"].startswith("hnsw"):
            ok = row["qps"] >= 1000 and row[f"recall@{args.k}"] >= 0.9
            parts.append(f"{row['entries']:,} {row['index']} {row['qps']} q/s recall@{args.k} {row[f'recall@{args.k}']:.3f} "
                         f"build {row['build_s']} s {row['ram_mb']} MB {'✓' if ok else '✗'}")
    if "translation" in report:
        r, m = report["translation"]["same model, no matches"], report["translation"]["with memory"]
        parts.append(f"translation with/without matches {r['memory_ratio']:.2f}±{r['ratio_spread']:.2f} "
                     f"{'✓' if r['memory_ratio'] >= 0.8 else '✗'} >=0.8 ({m['sentences_per_s']} / {r['sentences_per_s']} "
                     f"sentences/s; fallbacks {m['fallbacks']} / {r['fallbacks']} in {report['translation']['_passes']} passes; "
                     f"decoder steps a pass "
                     f"{m['decoder_steps_per_pass']} / {r['decoder_steps_per_pass']}; output/reference words "
                     f"{m['length_ratio']} / {r['length_ratio']})")
        t = report["translation"]
        if "twin with translation pieces" in t:
            guided, plain = t["twin with translation pieces"], t["twin without memory"]
            # time with / without pieces (issue 32: <= 1.3), and how much of it is the longer search
            # (beam rows) and how much each row costs more (the bonus, the lookup, the tables)
            slower = [b / a for a, b in zip(t["_times"]["twin with translation pieces"], t["_times"]["twin without memory"])]
            rows = guided["beam_rows_per_pass"] / plain["beam_rows_per_pass"]
            median = statistics.median(slower)
            parts.append(f"translation time with/without translation pieces x{median:.2f}±{max(slower) - min(slower):.2f} "
                         f"{'✓' if median <= 1.3 else '✗'} <=1.3 (beam rows x{rows:.2f}, time per beam row x{median / rows:.2f}; "
                         f"decoder steps a pass {guided['decoder_steps_per_pass']} / {plain['decoder_steps_per_pass']}; "
                         f"output/reference words {guided['length_ratio']} / {plain['length_ratio']})")
    d = report.get("decoding_step")
    if d:
        parts.append(f"decoding step with/without matches at equal work {d['step_ratio']:.2f}±{d['ratio_spread']:.2f} "
                     f"{'✓' if d['step_ratio'] >= 0.8 else '✗'} >=0.8 ({d['ms_per_step_with']} / {d['ms_per_step_without']} ms, "
                     f"{d['rows']} rows, {d['memory_slots']} memory slots, {d['steps']} steps)")
    print("SUMMARY " + "; ".join(parts))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
