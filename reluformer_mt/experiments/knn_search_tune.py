"""The approximate search of kNN-MT, chosen on validation after k, lambda and the read-out
(``reluformer-memory tune``, stage 2).

Searching the datastore at every step is what makes kNN-MT slower than the model alone. Three
approximations trade recall for speed: fewer IVF lists probed per step (``--knn-probe``), the
index searched only every few steps with the neighbours' successors followed in between
(``--knn-search-every``; chunk-based kNN-MT and caching, Martins, Marinho & Martins, EMNLP 2022
and "Efficient Machine Translation Domain Adaptation", 2022), and, for per-input datastores, one
batched product per sentence (``--knn-batched-search``). Each setting decodes the same
validation documents as the search it approximates (timed in the same run, one after another);
the fastest setting whose validation s-BLEU is at most ``tolerance`` points below the exact
search's is chosen (the exact search itself when none is, and on a tie in speed).
"""
from typing import Callable, List, Optional, Tuple

SEARCH_TOLERANCE = 0.5          # s-BLEU points an approximate search may lose against the exact one
PROBE_DIVISORS = (2, 4)         # the index's own probe divided by these (IVF lists; HNSW efSearch)
GRID_SEARCH_EVERY = (2, 4)      # the index searched every N steps

Decode = Callable[[str, dict], Tuple[float, float]]  # (decode name, translator keywords) -> (s-BLEU, seconds)


def exact_search(mode: str, store) -> dict:
    """Translator keywords of the search as built: every step with the index's own probe (a corpus
    datastore, ``mode`` "full"), one product per beam row (per-input datastores)."""
    if mode == "full":
        return {"knn_probe": store.own_probe(), "knn_search_every": 1}
    return {"knn_batched_search": False}


def probes(store) -> List[int]:
    """The fewer probes tried for a corpus datastore's index, most first (none for an exact index)."""
    own = store.own_probe()
    if own is None:
        return []
    return sorted({max(1, own // d) for d in PROBE_DIVISORS} - {own}, reverse=True)


def describe(search: dict) -> str:
    """A search setting in words, as the table prints it."""
    if "knn_batched_search" in search:
        return "batched per sentence" if search["knn_batched_search"] else "per beam row"
    probe = search.get("knn_probe")
    every = search.get("knn_search_every", 1)
    return (f"probe {probe if probe is not None else 'exact index'}, "
            + ("every step" if every == 1 else f"every {every} steps"))


def tune_search(decode: Decode, mode: str, store, sentences: int, tolerance: float = SEARCH_TOLERANCE,
                prefix: str = "knn", progress=print) -> dict:
    """Decode the exact search and its approximations (``decode``), and choose the fastest within
    ``tolerance`` s-BLEU of the exact one. A corpus datastore tries each of :func:`probes`, each of
    :data:`GRID_SEARCH_EVERY` at the index's own probe, then the fastest acceptable of each together;
    per-input datastores the batched search. Returns the choice (``chosen``: translator keywords)
    and the table of every setting decoded."""
    rows: List[dict] = []

    def row(search: dict) -> dict:
        name = f"{prefix} search: {describe(search)}"
        s, seconds = decode(name, search)
        rows.append({"search": describe(search), "options": search, "decode": name, "s_bleu": s,
                     "seconds": seconds, "sentences_per_s": sentences / max(seconds, 1e-9)})
        return rows[-1]

    exact = row(exact_search(mode, store))

    def fastest(candidates) -> Optional[dict]:
        kept = [r for r in candidates if r["s_bleu"] >= exact["s_bleu"] - tolerance]
        return max(kept, key=lambda r: r["sentences_per_s"], default=None)

    if mode == "full":
        fewer = fastest([row({"knn_probe": p, "knn_search_every": 1}) for p in probes(store)])
        own = exact["options"]["knn_probe"]
        sparser = fastest([row({"knn_probe": own, "knn_search_every": n}) for n in GRID_SEARCH_EVERY])
        if fewer is not None and sparser is not None:
            row({"knn_probe": fewer["options"]["knn_probe"], "knn_search_every": sparser["options"]["knn_search_every"]})
    else:
        row({"knn_batched_search": True})
    chosen = fastest(rows)  # the exact search first: it wins a tie in speed
    for r in rows:
        r["exact"], r["within_tolerance"] = r is exact, r["s_bleu"] >= exact["s_bleu"] - tolerance
        r["speed_vs_exact"] = r["sentences_per_s"] / exact["sentences_per_s"]
    result = {"tolerance": tolerance, "chosen": chosen["options"], "search": chosen["search"], "exact": chosen is exact,
              "decode": chosen["decode"], "s_bleu": chosen["s_bleu"], "sentences_per_s": chosen["sentences_per_s"],
              "exact_s_bleu": exact["s_bleu"], "exact_sentences_per_s": exact["sentences_per_s"], "table": rows}
    for line in format_search(mode, result):
        progress(f"tune: {line.strip()}")
    return result


def datastore_values(search: dict, store) -> dict:
    """The choice as ``datastore.json``'s ``tuned.full`` records it, where the translator reads it
    (probe null: the index's own)."""
    probe = search["chosen"].get("knn_probe")
    return {"probe": None if probe == store.own_probe() else probe,
            "search_every": search["chosen"].get("knn_search_every", 1)}


def format_search(mode: str, search: dict) -> List[str]:
    """The table of one mode's search settings (s-BLEU against the exact search, sentences/s) and
    the choice."""
    lines = [f"  search {mode}: validation s-BLEU and speed of each setting (tolerance {search['tolerance']:g} "
             "s-BLEU below the exact search)"]
    for r in search["table"]:
        mark = "exact" if r["exact"] else ("ok" if r["within_tolerance"] else "lost")
        lines.append(f"    {r['search']:32s} s-BLEU {r['s_bleu']:6.2f} ({r['s_bleu'] - search['exact_s_bleu']:+.2f})  "
                     f"{r['sentences_per_s']:8.1f} sentences/s ({r['speed_vs_exact']:.2f}x)  {mark}")
    lines.append(f"    chosen: {search['search']}" + (" (the exact search)" if search["exact"] else ""))
    return lines


__all__ = ["SEARCH_TOLERANCE", "datastore_values", "exact_search", "format_search", "probes", "tune_search"]
