"""The demo's translations of the held-out chapters: every decoding mode of one family.

Each mode translates the test chapters with the document translator and is scored (s-BLEU over
verses, d-BLEU over chapters); the report writes its hypotheses as plain text, one verse a line,
to ``report/test_FAMILY.MODE.txt`` (:func:`hypothesis_file`), so every number of the tables can be
recomputed with sacreBLEU from the files (``report.json`` names the file behind each number).

- ``constrained``: the document translator's default (separator-constrained beam search);
- ``free``: plain beam search (how often the model keeps the verse separators by itself);
- ``sentence``: the same checkpoint verse by verse, without document context;
- ``without-memory``: a memory-attention family with its matches withheld;
- ``pieces``: beam search guided by translation pieces (weight and fuzzy floor tuned);
- ``knn``: kNN-MT over the family's full datastore of the training chapters (tuned);
- ``knn-memory``: kNN-MT over per-input datastores of each verse's memory matches (SK-MT; tuned);
- ``knn+pieces``: the full datastore and the pieces together;
- ``tm-first``: the best mode (by validation) with ``--tm-first T``: a verse whose best match scores
  >= T is the match's target (T tuned on the validation chapters over that mode's decode). Made
  from the best mode's outputs and matches by the rule the translator applies
  (:func:`reluformer_mt.memory.tm.memory_first`), so no chapter is translated again.

The search values come from ``reluformer-memory tune`` on the validation chapters
(:func:`tune_family`), never from the test chapters; the demo's "best" row of a family is the
mode with the best *validation* s-BLEU.
"""
import json
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from reluformer_mt.data.textfiles import write_text_atomically

MODES = ("constrained", "free", "sentence", "without-memory", "pieces", "knn", "knn-memory", "knn+pieces",
         "tm-first")
# the modes that need no tuning (the demo decodes them while the family's tuning runs beside), the
# guided ones, and tm-first, which decodes nothing: it rewrites the best guided mode's outputs
PLAIN_MODES = ("constrained", "free", "sentence", "without-memory")
GUIDED_MODES = tuple(m for m in MODES if m not in PLAIN_MODES and m != "tm-first")
LABELS = {"constrained": "document translator", "free": "free separators", "sentence": "verse by verse",
          "without-memory": "without its matches", "pieces": "+ translation pieces", "knn": "+ kNN-MT",
          "knn-memory": "+ kNN-MT (per-input)", "knn+pieces": "+ kNN-MT + pieces", "tm-first": "TM-first (best mode)"}


def hypothesis_file(family: str, mode: str) -> str:
    """The report's file of a family's mode (written by ``report_page.write_plain_files``)."""
    return f"test_{family}.{mode}.txt"


# the pieces' fuzzy floors the demo's tuner decodes: 0.3 lost to 0 on the validation chapters for every
# family of the measured runs (docs/history/KNN_MT.md's tuned values: floor 0 chosen 4 of 4, and 1-2 s-BLEU
# lower with 0.3 on the ReLUFormer checkpoint; most verses' best match is below 50 %, so the floor
# removes their pieces), so the demo skips its two decodes; ``reluformer-memory tune`` still tries both
DEMO_PIECES_FLOORS = (0.0,)


def datastore_dir(out: Path, family: str) -> Path:
    return out / "knn" / family


def tune_family(o, family: str, checkpoint: Path, data_dir: Path) -> dict:
    """The family's full datastore (built once per checkpoint) and the tuner's choices on the
    validation chapters (``report/tune_FAMILY.json``, rerun when missing or written by an older tuner)."""
    from reluformer_mt.knn.datastore import Datastore, DatastoreError, build_datastore, model_fingerprint
    from reluformer_mt.experiments.knn_tune import TUNER_VERSION, TuneSettings, tune

    store_dir = datastore_dir(o.out, family)
    report_path = o.out / "report" / f"tune_{family.replace('+', '_')}.json"
    started = time.time()
    from reluformer_mt.checkpoints import load_model

    store = None
    if o.knn:  # --no-knn: no datastore, only the pieces are tuned
        try:
            store = Datastore.load(store_dir, fingerprint=model_fingerprint(load_model(checkpoint, data_dir).model))
        except DatastoreError:  # none yet, or another checkpoint's: build it, and tune again
            store = build_datastore(checkpoint, store_dir, data=data_dir, device=o.device, progress=False, force=True)
            report_path.unlink(missing_ok=True)
    report = json.loads(report_path.read_text(encoding="utf-8")) if report_path.is_file() and not o.force else {}
    if report.get("tuner_version") != TUNER_VERSION or ("full" in report.get("chosen", {})) != o.knn:
        # none yet, tuned by an older tuner, or with(out) kNN-MT where this run wants the other
        # the tuner decodes the first eval_chapters / tune_chapters validation chapters (the smaller given)
        documents = min((c for c in (o.eval_chapters, o.tune_chapters) if c), default=0)
        settings = TuneSettings(data=data_dir, datastore=store_dir if o.knn else None, split="valid", device=o.device,
                                beam=o.beam, memory_k=o.knn_memory_k, pieces_k=o.pieces_k, documents=documents,
                                knn=o.knn, pieces_floors=DEMO_PIECES_FLOORS)
        report = tune(checkpoint, settings, progress=lambda line: print(f"  {family}: {line}"))
        report.pop("grid")  # hundreds of rows the demo does not use (reluformer-memory tune --json keeps them)
        write_text_atomically(report_path, json.dumps(report, indent=1) + "\n")
    datastore = None if store is None else {"entries": store.meta["size"], "mib": round(store.meta["bytes"] / 2 ** 20, 1),
                                            "build_seconds": store.meta["build_seconds"], "index": store.meta["index"]["kind"]}
    return {"chosen": report["chosen"], "decodes": report["decodes"], "report": str(report_path),
            "datastore": datastore, "seconds": round(time.time() - started, 1)}


def mode_options(o, mode: str, tuned: Optional[dict], store_dir: Path) -> Optional[dict]:
    """DocumentTranslator keywords of a mode, None when the mode does not apply."""
    from reluformer_mt.knn.search import KnnOptions

    pieces = None
    if o.pieces_weight is not None:  # given on the command line: used as given
        pieces = {"pieces_weight": o.pieces_weight, "pieces_floor": o.pieces_floor} if o.pieces_weight else None
    elif tuned is not None:
        pieces = {k: v for k, v in tuned["chosen"]["pieces"].items() if k in ("pieces_weight", "pieces_floor", "segment_tokens", "pieces_length_cap")}
    if mode == "tm-first":  # not decoded: tm_first_mode rewrites the best mode's outputs
        return None
    if mode == "free":
        return {"separators": "free"}
    if mode == "sentence":
        return {"segment_tokens": 0}
    if mode == "pieces":
        return None if pieces is None else {**pieces, "pieces_k": o.pieces_k}
    if mode.startswith("knn"):
        if tuned is None or not o.knn:  # --no-knn
            return None
        # with the search the tuner chose: the exact one or the fastest approximation within its tolerance
        if mode == "knn-memory":
            per_input = tuned["chosen"]["per_input"]
            return {"knn_memory": True, "knn_memory_k": o.knn_memory_k,
                    **KnnOptions(**per_input["options"]).translator_options(), **per_input["search"]["chosen"]}
        full = tuned["chosen"]["full"]
        kw = {"knn": str(store_dir), **KnnOptions(**full["options"]).translator_options(), **full["search"]["chosen"]}
        if mode == "knn+pieces":
            return None if pieces is None else {**kw, **pieces, "pieces_k": o.pieces_k}
        return kw
    return {}


def translate_modes(o, family: str, checkpoint: Path, data_dir: Path, reads_memory: bool,
                    tuned: Optional[dict], bleu_of_model, modes: Sequence[str] = MODES) -> Dict[str, dict]:
    """Every applicable mode of one family among ``modes``: mode -> the scores of ``bleu_of_model``
    (the demo's :func:`reluformer_mt.experiments.demo.bleu_of_model`, passed in: this module is the
    demo's part and imports nothing of it) with ``hypotheses`` and ``matches``."""
    results = {}
    for mode in modes:
        if mode == "without-memory":
            kw = {"memory": "none"} if reads_memory else None
        else:
            kw = mode_options(o, mode, tuned, datastore_dir(o.out, family))
        if kw is None:
            continue
        results[mode] = bleu_of_model(o, checkpoint, data_dir, **kw)
    return results


def bands_of_modes(references: List[str], results: Dict[str, dict]) -> Optional[dict]:
    """s-BLEU of every mode by the best memory match's fuzzy band, beside copying the match (None
    when no mode consulted the memory)."""
    from reluformer_mt.memory.maintenance.bands import band_scores

    matches = next((r["matches"] for r in results.values() if r.get("matches")), None)
    if matches is None:
        return None
    systems = {mode: [v for doc in r["hypotheses"].values() for v in doc] for mode, r in results.items()}
    systems["copy of the match"] = [m["copy"] or "" for m in matches]
    return {"bands": band_scores(references, [m["fuzzy"] for m in matches], systems), "systems": list(systems)}


def best_validation_mode(tuned: Optional[dict], results: Dict[str, dict]) -> str:
    """The mode with the best validation s-BLEU among those translated (the tuner's decodes)."""
    if tuned is None:
        return "constrained"
    chosen = tuned["chosen"]
    valid = {"constrained": next((d["s_bleu"] for d in tuned["decodes"] if d["name"] == "plain"), None),
             "pieces": chosen["pieces"]["s_bleu"], "knn": chosen.get("full", {}).get("s_bleu"),
             "knn-memory": chosen.get("per_input", {}).get("s_bleu"),
             "knn+pieces": chosen.get("full", {}).get("s_bleu_with_pieces")}
    candidates = {m: s for m, s in valid.items() if m in results and s is not None}
    best = max(candidates, key=candidates.get) if candidates else "constrained"
    # TM-first over that mode, when its tuned threshold beat the mode on the validation chapters
    row = chosen.get("tm_first", {}).get("by_decode", {}).get(tuned_decode(tuned, best))
    if "tm-first" in results and row and max(row.values()) > row["off"]:
        return "tm-first"
    return best


def tuned_decode(tuned: dict, mode: str) -> Optional[str]:
    """The tuner's decode (its name in ``decodes``) that a demo mode translates with."""
    chosen = tuned["chosen"]
    return {"constrained": "plain", "pieces": chosen["pieces"].get("decode"),
            "knn": chosen.get("full", {}).get("decode"), "knn-memory": chosen.get("per_input", {}).get("decode"),
            "knn+pieces": chosen.get("full", {}).get("decode_with_pieces")}.get(mode)


def tm_first_mode(tuned: Optional[dict], results: Dict[str, dict], best_mode: str, references: Dict[str, list]
                  ) -> Optional[dict]:
    """The ``tm-first`` mode's scores: ``best_mode``'s test outputs with the matches >= the threshold
    tuned over that mode's validation decode copied; None without a tuned threshold or matches."""
    from reluformer_mt.evaluation.bleu import corpus_dbleu, corpus_sbleu
    from reluformer_mt.experiments.knn_tune import best_threshold
    from reluformer_mt.memory.tm import at_least, memory_first

    tm_first = (tuned or {}).get("chosen", {}).get("tm_first")
    row = tm_first and tm_first["by_decode"].get(tuned_decode(tuned, best_mode))
    matches = next((r["matches"] for r in results.values() if r.get("matches")), None)
    if not row or best_threshold(row) is None or matches is None or best_mode not in results:
        return None
    threshold, base = best_threshold(row), results[best_mode]
    docs, start = {}, 0
    for chapter, verses in base["hypotheses"].items():
        part = matches[start:start + len(verses)]
        docs[chapter] = memory_first(verses, [m["copy"] for m in part], [m["fuzzy"] for m in part], threshold)
        start += len(verses)
    refs = [references[c] for c in docs]
    copied = sum(1 for m in matches[:start] if m["copy"] is not None and at_least(m["fuzzy"], threshold))
    # the second reference's scores are the base mode's: not carried over to the copied outputs
    return {**{k: v for k, v in base.items() if k not in ("s_bleu", "d_bleu", "s_bleu_2ref", "d_bleu_2ref", "hypotheses")},
            "s_bleu": corpus_sbleu([v for d in docs.values() for v in d], [v for d in refs for v in d]).score,
            "d_bleu": corpus_dbleu(list(docs.values()), refs).score, "hypotheses": docs,
            "tm_first": {"threshold": threshold, "over": best_mode, "verses_copied": copied,
                         "match_score": tm_first["match_score"]}}


__all__ = ["GUIDED_MODES", "LABELS", "MODES", "PLAIN_MODES", "tm_first_mode", "tuned_decode", "bands_of_modes", "best_validation_mode", "hypothesis_file", "translate_modes",
           "tune_family"]
