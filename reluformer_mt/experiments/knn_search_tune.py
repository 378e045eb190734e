"""The approximate search of kNN-MT, chosen on validation after k, lambda and the read-out
(``reluformer-memory tune``, stage 2).

Searching the datastore at every step is what makes kNN-MT slower than the model alone. Three
approximations trade recall for speed: fewer IVF lists probed per step (``--knn-probe``), the
index searched only every few steps with the neighbours' successors followed in between
(``--knn-search-every``; chunk-based kNN-MT and caching, Martins, Marinho & Martins, EMNLP 2022
and "Efficient Machine Translation Domain Adaptation", 2022), and, for per-input datastores, one
batched product per sentence (``--knn-batched-search``). A corpus datastore built from the
memory's own corpus can also be searched, per sentence, among the entries of its M best memory
matches only (``--knn-restrict M``; Fast kNN-MT's restriction to what can matter for this source,
Meng et al. 2022): a product with a few hundred keys instead of an index over the whole corpus;
the same entries can serve as the keys of per-input datastores instead of force-decoding the
matches at translation time (``--knn-memory-keys``). On top of the fastest of those, a beam row
whose model is confident can skip the search (``--knn-skip-confident P``: the rows whose best token
has a probability above P keep the model's distribution; retrieval skipping, Shi et al. 2023,
arXiv:2312.07419, and Gao et al. 2024, arXiv:2406.06073, who train a classifier where we use the
model's own confidence). Each setting decodes the same
validation documents as the search it approximates (timed in the same run, one after another);
the fastest setting whose validation s-BLEU is at most ``tolerance`` points below its reference is
chosen (the exact search itself when none is, and on a tie in speed). The reference is the exact
search's s-BLEU, and for a skipping setting the better of that and the setting it skips from: an
approximation that scores above the exact search must not give its gain away to skipping, so a
skipping setting is judged against what it would replace.
"""
from typing import Callable, List, Optional, Tuple

SEARCH_TOLERANCE = 0.5          # s-BLEU points an approximate search may lose against the exact one
PROBE_DIVISORS = (2, 4)         # the index's own probe divided by these (IVF lists; HNSW efSearch)
GRID_SEARCH_EVERY = (2, 4)      # the index searched every N steps
GRID_RESTRICT = (4, 8, 16)      # memory matches per sentence whose datastore entries are searched
GRID_SKIP = (0.9, 0.7, 0.5)     # a row whose best token is more probable than this skips the search

Decode = Callable[[str, dict], Tuple[float, float]]  # (decode name, translator keywords) -> (s-BLEU, seconds)


def exact_search(mode: str, store) -> dict:
    """Translator keywords of the search as built: every step with the index's own probe over the
    whole corpus (a corpus datastore, ``mode`` "full": not a restriction a former tuning left in
    it), one product per beam row (per-input datastores); every row searches."""
    if mode == "full":
        return {"knn_probe": store.own_probe(), "knn_search_every": 1, "knn_restrict": 0, "knn_skip_confident": 1.0}
    return {"knn_batched_search": False, "knn_skip_confident": 1.0}


def probes(store) -> List[int]:
    """The fewer probes tried for a corpus datastore's index, most first (none for an exact index)."""
    own = store.own_probe()
    if own is None:
        return []
    return sorted({max(1, own // d) for d in PROBE_DIVISORS} - {own}, reverse=True)


def restrictable(store, data_dir) -> bool:
    """Whether the tuner's translators (whose memory is ``data_dir``'s training split) can restrict a
    search to ``store``'s entries of their matches: the datastore was built from that split and
    records each entry's sentence (built before it did: not tried)."""
    from pathlib import Path

    source = store.meta["source"]
    return (Path(source["data"]).resolve() == Path(data_dir).resolve() and source["split"] == "train"
            and (store.directory / "sentences.npy").is_file())


def describe(search: dict) -> str:
    """A search setting in words, as the table prints it."""
    skip = search.get("knn_skip_confident", 1.0)
    if skip < 1:
        return describe({k: v for k, v in search.items() if k != "knn_skip_confident"}) + f", skip p > {skip:g}"
    if search.get("knn_memory_keys"):
        return "keys read from the datastore"
    if search.get("knn_restrict"):
        return f"the entries of {search['knn_restrict']} memory matches"
    if "knn_batched_search" in search:
        return "batched per sentence" if search["knn_batched_search"] else "per beam row"
    probe = search.get("knn_probe")
    every = search.get("knn_search_every", 1)
    return (f"probe {probe if probe is not None else 'exact index'}, "
            + ("every step" if every == 1 else f"every {every} steps"))


def tune_search(decode: Decode, mode: str, store, sentences: int, tolerance: float = SEARCH_TOLERANCE,
                prefix: str = "knn", progress=print, restrict: bool = False) -> dict:
    """Decode the exact search and its approximations (``decode``), and choose the fastest within
    ``tolerance`` s-BLEU of the exact one. A corpus datastore tries each of :func:`probes`, each of
    :data:`GRID_SEARCH_EVERY` at the index's own probe, then the fastest acceptable of each together,
    and, with ``restrict`` (:func:`restrictable`), each of :data:`GRID_RESTRICT`; per-input
    datastores the batched search and, with ``restrict``, their keys read from the corpus datastore
    ``store`` (``--knn-memory-keys``); then the fastest acceptable so far with each of
    :data:`GRID_SKIP` (unless it searches every N > 1 steps). Returns the choice (``chosen``: translator keywords)
    and the table of every setting decoded."""
    rows: List[dict] = []

    def row(search: dict, reference: Optional[float] = None) -> dict:
        """Decode one setting; ``reference``: the s-BLEU it must stay within ``tolerance`` of (the
        exact search's unless given)."""
        search = {"knn_skip_confident": 1.0, **search}  # not a skipping a former tuning left in the datastore
        name = f"{prefix} search: {describe(search)}"
        s, seconds = decode(name, search)
        if reference is None:
            reference = rows[0]["s_bleu"] if rows else s  # the first row decoded is the exact search
        rows.append({"search": describe(search), "options": search, "decode": name, "s_bleu": s,
                     "seconds": seconds, "sentences_per_s": sentences / max(seconds, 1e-9), "reference": reference})
        return rows[-1]

    exact = row(exact_search(mode, store))

    def fastest(candidates) -> Optional[dict]:
        kept = [r for r in candidates if r["s_bleu"] >= r["reference"] - tolerance]
        return max(kept, key=lambda r: r["sentences_per_s"], default=None)

    if mode == "full":
        fewer = fastest([row({"knn_probe": p, "knn_search_every": 1}) for p in probes(store)])
        own = exact["options"]["knn_probe"]
        sparser = fastest([row({"knn_probe": own, "knn_search_every": n}) for n in GRID_SEARCH_EVERY])
        if fewer is not None and sparser is not None:
            row({"knn_probe": fewer["options"]["knn_probe"], "knn_search_every": sparser["options"]["knn_search_every"]})
        for matches in GRID_RESTRICT if restrict else ():
            row({"knn_restrict": matches})
    else:
        row({"knn_batched_search": True})
        if restrict:  # the matches' keys read from the corpus datastore instead of force-decoded
            row({"knn_memory_keys": str(store.directory)})
    base = fastest(rows)  # the confident rows skip the search of the fastest acceptable setting so far
    if base["options"].get("knn_search_every", 1) == 1:  # (a search every N steps follows every row)
        for p in GRID_SKIP:  # judged against the better of the exact search and the setting it skips from
            row({**base["options"], "knn_skip_confident": p}, reference=max(exact["s_bleu"], base["s_bleu"]))
    chosen = fastest(rows)  # the exact search first: it wins a tie in speed
    for r in rows:
        r["exact"], r["within_tolerance"] = r is exact, r["s_bleu"] >= r["reference"] - tolerance
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
            "search_every": search["chosen"].get("knn_search_every", 1), "restrict": search["chosen"].get("knn_restrict", 0),
            "skip_confident": search["chosen"].get("knn_skip_confident", 1.0)}


def format_search(mode: str, search: dict) -> List[str]:
    """The table of one mode's search settings (s-BLEU against the exact search, sentences/s) and
    the choice."""
    lines = [f"  search {mode}: validation s-BLEU and speed of each setting (tolerance {search['tolerance']:g} "
             "s-BLEU below the exact search, or below the setting a skipping one skips from where that scores more)"]
    for r in search["table"]:
        reference = r.get("reference", search["exact_s_bleu"])  # (tables written before tuner version 7 have none)
        mark = "exact" if r["exact"] else ("ok" if r["within_tolerance"] else "lost")
        if mark == "lost" and reference != search["exact_s_bleu"]:
            mark = f"lost (vs {reference:.2f})"
        lines.append(f"    {r['search']:44s} s-BLEU {r['s_bleu']:6.2f} ({r['s_bleu'] - search['exact_s_bleu']:+.2f})  "
                     f"{r['sentences_per_s']:8.1f} sentences/s ({r['speed_vs_exact']:.2f}x)  {mark}")
    lines.append(f"    chosen: {search['search']}" + (" (the exact search)" if search["exact"] else ""))
    return lines


__all__ = ["GRID_RESTRICT", "GRID_SKIP", "SEARCH_TOLERANCE", "datastore_values", "exact_search", "format_search", "probes",
           "restrictable", "tune_search"]
