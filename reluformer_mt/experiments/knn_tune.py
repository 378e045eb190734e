"""``reluformer-memory tune``: choose the search values of kNN-MT and translation pieces on the
validation split, never on the test split.

Two stages, so that a grid of hundreds of settings costs seconds:

1. **Teacher forcing.** The validation split is force-decoded once; for every reference token we
   keep the model's probability of it and its nearest datastore entries (the full datastore, and
   the per-input datastore of its sentence's memory matches). Every (read-out, k, lambda, T or
   radius) of the grid is then scored by the validation tokens' mean negative log-likelihood under
   the mixture, as kNN-LM / kNN-MT tune lambda and T (Khandelwal et al. 2020, 2021). T and the
   radius are searched as multiples of the median distance to the nearest entry, so the grid
   follows the scale of the model's states.
2. **Decoding.** The best setting of each read-out, translation pieces (weight x fuzzy floor), and
   kNN with pieces, are used to translate the validation documents; the setting with the best
   s-BLEU wins; for the better read-out, larger lambdas (0.6, 0.9) are decoded too, since beam
   search can gain from trusting the neighbours more than the NLL's mixture does. The chosen pieces
   are decoded again with their sentences ended at 1, 1.5 and 2 times their expected length
   (``--pieces-length-cap``), and the fastest within ``search_tolerance`` s-BLEU of the pieces
   without a cap is kept (none when no cap is faster). This is what the demo uses for the test chapters.
   Then the approximate searches of the chosen setting (fewer probes, the index searched every
   few steps, per-input datastores searched in one batch) decode the same documents, and the
   fastest within ``search_tolerance`` s-BLEU of the exact search is chosen
   (:mod:`reluformer_mt.experiments.knn_search_tune`).
3. **TM-first.** Every decode's outputs with each sentence whose best memory match scores >= T
   replaced by the match's target (what ``--tm-first T`` translates: the model's outputs stay where
   the match is below T), for T on a grid; the best (decode, T) by validation s-BLEU is chosen
   (T = off when no threshold beats the decode alone). Seconds: no decode is repeated.

The choices go to a JSON report (``--json``) and, for the full datastore, into its
``datastore.json`` (``tuned.full``), where ``reluformer-translate --knn`` finds them.
"""
import logging
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from reluformer_mt.experiments.knn_search_tune import (SEARCH_TOLERANCE, datastore_values, exact_search, format_search,
                                                      restrictable, tune_search)
from reluformer_mt.knn.datastore import (Datastore, DatastoreError, model_fingerprint, overlap, pair_hashes,
                                         split_pairs)
from reluformer_mt.knn.readout import MODEL_SHARE, neighbour_weights
from reluformer_mt.knn.search import KnnOptions, PerInputDatastores, StateRecorder, per_input_states

logger = logging.getLogger(__name__)

# 2: adaptive kNN-MT; 3: pieces stop at the source's expected length; 4: the TM-first threshold;
# 5: the approximate search; 6: confident rows skip the search, the pieces' length cap; 7: a skipping
# search judged against the setting it skips from. A report of another version is stale (the demo
# tunes again).
TUNER_VERSION = 7
GRID_K = (4, 16, 64, 256)
GRID_LAMBDA = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
GRID_TEMPERATURE = (0.1, 0.3, 1.0, 3.0, 10.0)   # x the median nearest-entry distance
GRID_RADIUS = (0.5, 1.0, 2.0, 4.0, 8.0)         # x the median nearest-entry distance
GRID_PIECES_WEIGHT = (5.0, 10.0)
GRID_PIECES_FLOOR = (0.0, 0.3)
GRID_PIECES_LENGTH_CAP = (1.0, 1.5, 2.0)  # x a sentence's expected length (--pieces-length-cap)
GRID_TM_FIRST = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # match scores above which the match is the output
BLEU_LAMBDAS = (0.9, 1.0)  # stage 2 also decodes the best read-out with these, when above the NLL's lambda
TUNE_READOUTS = ("softmax", "relu")


class TuneError(ValueError):
    """A one-line problem with the tuner's input (the test split, a leaking datastore)."""


# ------------------------------------------------------------------ data

def split_documents(data_dir, split: str) -> Tuple[List[List[str]], List[List[str]], List[str]]:
    """(source documents, reference documents, document ids) of a prepared split. A corpus with
    word files (the bible: ``SPLIT.words.LANG`` and ``SPLIT.verses.tsv``) is read from them, as the
    demo scores it; otherwise the prepared text, decoded, grouped by the segments' document ids."""
    from reluformer_mt.data.prepared import Prepared
    from reluformer_mt.data.segments import metadata_path, read_segment_metadata
    from reluformer_mt.memory.tm import read_prepared

    data_dir = Path(data_dir)
    prepared = Prepared.load(data_dir)
    verses = data_dir / f"{split}.verses.tsv"
    words = [data_dir / f"{split}.words.{lang}" for lang in (prepared.src_lang, prepared.tgt_lang)]
    if verses.is_file() and all(w.is_file() for w in words):
        chapters = [line.split("\t")[1] for line in verses.read_text(encoding="utf-8").splitlines()]
        sides = [w.read_text(encoding="utf-8").splitlines() for w in words]
        pairs = list(zip(chapters, *sides))
    else:
        entries = read_prepared(data_dir, split)
        ids = [info.doc_id for info in read_segment_metadata(metadata_path(data_dir, split))
               for _ in range(info.n_sentences)]
        pairs = list(zip(ids, entries.sources, entries.targets))
    docs: Dict[str, Tuple[list, list]] = {}
    for doc, src, ref in pairs:
        docs.setdefault(doc, ([], []))
        docs[doc][0].append(src)
        docs[doc][1].append(ref)
    return [d[0] for d in docs.values()], [d[1] for d in docs.values()], list(docs)


def check_leakage(datastore: Datastore, data_dir, split: str) -> dict:
    """Refuse a datastore that holds more of ``split``'s sentence pairs than the training split
    itself does (the bible repeats verses, so some overlap is the corpus, not a leak)."""
    from reluformer_mt.data.prepared import Prepared

    prepared = Prepared.load(data_dir)
    evaluated = pair_hashes(*split_pairs(data_dir, split, prepared.src_lang, prepared.tgt_lang, prepared.separator))
    train = pair_hashes(*split_pairs(data_dir, "train", prepared.src_lang, prepared.tgt_lang, prepared.separator))
    held, natural = overlap(datastore.pairs(), evaluated), overlap(train, evaluated)
    if held > natural + 1e-9:
        raise DatastoreError(f"--knn {datastore.directory}: holds {held:.0%} of the {split} split's sentence pairs, the "
                             f"training split only {natural:.0%}: it was built from data containing the {split} split; "
                             "refused (build it from the training split)")
    return {"split": split, "datastore_overlap": held, "training_overlap": natural}


# ------------------------------------------------------------------ stage 1: teacher forcing

class ForcedSplit:
    """Every reference token of a split: the model's log-probability of it, the decoder state,
    and the example (segment) it belongs to."""

    def __init__(self, model, task, split: str, max_tokens: int = 8000, device: str = "cpu"):
        from fairseq.data import data_utils

        from reluformer_mt.knn.datastore import length_order

        task.load_dataset(split)
        dataset = task.dataset(split)
        recorder = StateRecorder(model.decoder)
        separator = task.tgt_dict.index(getattr(task.cfg, "separator", "<sep>"))
        states, refs, lps, examples, sentences = [], [], [], [], []
        try:
            with torch.no_grad():
                for batch in data_utils.batch_by_size(length_order(dataset), dataset.num_tokens, max_tokens=max_tokens):
                    sample = dataset.collater([dataset[int(i)] for i in batch])
                    if device != "cpu":
                        from fairseq import utils

                        sample = utils.move_to_cuda(sample, device=torch.device(device))
                    net_output = model(**sample["net_input"])
                    lprobs = model.get_normalized_probs(net_output, log_probs=True)
                    target = sample["target"]
                    real = target != task.tgt_dict.pad()
                    states.append(recorder.state[real].float().cpu())
                    refs.append(target[real].cpu())
                    lps.append(lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)[real].float().cpu())
                    examples.append(sample["id"].unsqueeze(1).expand_as(target)[real].cpu())
                    # the sentence of its segment each token belongs to (separators before it)
                    before = torch.cumsum((target == separator).long(), dim=1) - (target == separator).long()
                    sentences.append(before[real].cpu())
        finally:
            recorder.close()
        self.states, self.refs = torch.cat(states), torch.cat(refs)
        self.lp_ref, self.examples, self.sentences = torch.cat(lps), torch.cat(examples), torch.cat(sentences)
        self.infos = task.segment_infos[split]

    def __len__(self) -> int:
        return len(self.refs)


def fixed_mixture_nll(p_knn: torch.Tensor, mass: torch.Tensor, lam: float, p_ref: torch.Tensor):
    """(mean NLL of the references, each token's kNN share) under the fixed mixture, as the mixer
    computes it: share = lambda x mass, the model keeping at least MODEL_SHARE."""
    share = (lam * mass.double()).clamp(max=1 - MODEL_SHARE)
    return float(-torch.log(share * p_knn + (1 - share) * p_ref).clamp_min(-1e30).mean()), share


def grid_scores(forced: ForcedSplit, distances: torch.Tensor, values: torch.Tensor, trust=None, readouts=TUNE_READOUTS,
                ks=GRID_K, lambdas=GRID_LAMBDA) -> Tuple[List[dict], float]:
    """Validation NLL of every grid point (rows of dicts) and the distance scale used."""
    finite = distances[:, 0][torch.isfinite(distances[:, 0])]
    scale = float(finite.median()) if len(finite) else 1.0
    scale = scale if scale > 0 else 1.0
    p_ref = forced.lp_ref.double().exp()
    rows = []
    hits = (values == forced.refs.unsqueeze(1))
    for readout in readouts:
        spreads = GRID_RADIUS if readout == "relu" else GRID_TEMPERATURE
        for k in ks:
            if k > distances.size(1):
                continue
            for spread in spreads:
                value = spread * scale
                w, mass = neighbour_weights(distances[:, :k], readout, temperature=value, radius=value)
                if trust is not None:  # as the mixer does for per-input entries
                    mass = mass * (w * trust[:, :k]).sum(1)
                p_knn = (w * hits[:, :k]).sum(1).double()
                for lam in lambdas:
                    nll, share = fixed_mixture_nll(p_knn, mass, lam, p_ref)
                    rows.append({"readout": readout, "k": k, "lam": lam, "spread": spread,
                                 "temperature": value, "radius": value, "nll": nll,
                                 "knn_share": float(share.mean())})
    return rows, scale


def best_options(rows: Sequence[dict], readout: str) -> Optional[KnnOptions]:
    mine = [r for r in rows if r["readout"] == readout]
    if not mine:
        return None
    best = min(mine, key=lambda r: r["nll"])
    return KnnOptions(k=best["k"], lam=best["lam"], temperature=best["temperature"], radius=best["radius"],
                      readout=readout)


def per_input_neighbours(forced: ForcedSplit, model, task, memory_ids: np.ndarray, memory_scores: np.ndarray, lookup,
                         k: int, reads_memory: bool, tm_k: int, max_tokens: int, device: str):
    """Nearest entries (with their matches' fuzzy scores) of every validation token among its own
    sentence's matches: the per-input datastores as the translator builds them."""
    from reluformer_mt.memory.neighbours import sentence_rows

    rows = sentence_rows([info.n_sentences for info in forced.infos])

    def entries_of(sentence: int):
        memory = tuple(int(x) for x in memory_ids[sentence][:tm_k]) if reads_memory else ()
        return [((int(e), memory), float(f)) for e, f in zip(memory_ids[sentence][:k], memory_scores[sentence][:k])
                if e >= 0]

    eos = torch.tensor([task.src_dict.eos()])
    wanted = sorted({key for r in rows for s in r for key, _ in entries_of(s)})
    pairs = [(torch.cat([lookup.entry_source(e), eos]), lookup.tokens[e]) for e, _ in wanted]
    memories = [lookup.tokens_of([np.asarray(m)]) for _, m in wanted] if reads_memory else None
    states = dict(zip(wanted, per_input_states(model, task, pairs, memories, max_tokens=max_tokens, device=device)))
    units = []
    for r in rows:
        units.append([])
        for s in r:
            entries = entries_of(s)
            keys = [states[key][0] for key, _ in entries]
            values = [states[key][1] for key, _ in entries]
            trust = [torch.full((len(v),), f) for v, (_, f) in zip(values, entries)]
            units[-1].append((torch.cat(keys) if keys else torch.zeros(0, forced.states.size(1)),
                              torch.cat(values) if values else torch.zeros(0, dtype=torch.long),
                              torch.cat(trust) if trust else torch.zeros(0)))
    store = PerInputDatastores(units)
    return store.neighbours(forced.states, forced.examples, max(GRID_K), forced.sentences)


# ------------------------------------------------------------------ stage 2: decoding

def validation_bleu(translator_factory, sources, references, outputs: Optional[list] = None) -> Tuple[float, float]:
    """(s-BLEU, seconds) of a translator on the documents; its verse outputs appended to ``outputs``."""
    from reluformer_mt.evaluation.bleu import corpus_sbleu

    translator = translator_factory()
    start = time.time()
    results = translator.translate(sources, progress=False)
    hyps = [r.text for doc in results for r in doc]
    if outputs is not None:
        outputs.extend(hyps)
    s = corpus_sbleu(hyps, [r for d in references for r in d]).score
    return s, time.time() - start


def tune_tm_first(checkpoint, common: dict, sources, references, outputs: Dict[str, List[str]]) -> dict:
    """The TM-first threshold (stage 3): every decode's outputs with the matches >= T copied, for T
    in :data:`GRID_TM_FIRST`; the best decode and threshold by s-BLEU (threshold None: none helps)."""
    from reluformer_mt.evaluation.bleu import corpus_sbleu
    from reluformer_mt.inference.translator import DocumentTranslator
    from reluformer_mt.memory.tm import memory_first

    lookup = DocumentTranslator(checkpoint, **common, tm_first=1.0).memory  # the matches --tm-first copies
    ids, scores = lookup.lookup([s for doc in sources for s in doc], 1)
    copies, best = [lookup.target(int(i)) for i in ids[:, 0]], scores[:, 0].tolist()
    flat_refs = [r for d in references for r in d]
    by_decode = {}
    for name, hyps in outputs.items():
        by_decode[name] = {"off" if t is None else f"{t:g}": round(corpus_sbleu(memory_first(hyps, copies, best, t),
                                                                              flat_refs).score, 2)
                           for t in (None, *GRID_TM_FIRST)}
    name, row = max(by_decode.items(), key=lambda item: max(item[1].values()))
    return {"over": name, "threshold": best_threshold(row), "s_bleu": max(row.values()),
            "match_score": lookup.match_score, "by_decode": by_decode}


def best_threshold(row: Dict[str, float]) -> Optional[float]:
    """The threshold of the best s-BLEU of one decode's TM-first row ('off' first: a tie keeps it off)."""
    key = max(row, key=row.get)
    return None if key == "off" else float(key)


def fixed_nll(forced: ForcedSplit, distances: torch.Tensor, values: torch.Tensor, options: dict, rows: torch.Tensor) -> float:
    """Mean NLL of the tokens ``rows`` under a fixed (k, lambda, T/radius) mixture, as the mixer computes it."""
    k = options["k"]
    w, mass = neighbour_weights(distances[rows, :k], options["readout"], options["temperature"], options["radius"])
    p_knn = (w * (values[rows, :k] == forced.refs[rows].unsqueeze(1))).sum(1).double()
    return fixed_mixture_nll(p_knn, mass, options["lam"], forced.lp_ref[rows].double().exp())[0]


def train_adaptive(forced: ForcedSplit, distances: torch.Tensor, values: torch.Tensor, best_fixed: Dict[str, dict],
                   scale: float, store: Datastore, k_max: int):
    """A Meta-k network (:mod:`reluformer_mt.knn.adaptive`) for each read-out, with that read-out's
    best fixed T / radius; the one with the lower held-out NLL is saved beside the datastore.
    Returns (report, the kept network's config)."""
    from reluformer_mt.knn.adaptive import MetaKConfig, held_out, train_meta_k

    by_readout = {}
    nets = {}
    for readout, fixed in best_fixed.items():
        config = MetaKConfig(k_max=k_max, readout=readout, temperature=fixed["temperature"], radius=fixed["radius"],
                             scale=scale)
        net, result = train_meta_k(distances, values, forced.refs, forced.lp_ref, forced.examples, config)
        rows = held_out(forced.examples).nonzero().squeeze(1)
        result["held_out_fixed_nll"] = fixed_nll(forced, distances, values, fixed, rows)
        by_readout[readout], nets[readout] = result, net
    kept = min(by_readout, key=lambda r: by_readout[r]["held_out_nll"])
    nets[kept].save(store.directory, store.meta["fingerprint"], by_readout[kept])
    return {"by_readout": by_readout, "kept": by_readout[kept]}, nets[kept].config


def tune(checkpoint, data=None, datastore=None, split: str = "valid", device: str = "cpu", beam: int = 4,
         memory_k: int = 8, pieces_k: int = 8, decode: bool = True, max_tokens: int = 8000, documents: int = 0,
         adaptive_k: int = 16, knn: bool = True, match_score: Optional[str] = None, progress=print,
         pieces_floors: Sequence[float] = GRID_PIECES_FLOOR, search_tolerance: float = SEARCH_TOLERANCE) -> dict:
    """Tune kNN-MT (full datastore when ``datastore`` is given, per-input datastores of the memory;
    neither with ``knn=False``), translation pieces and the TM-first threshold on ``split``; returns
    the report (grid, decodes, chosen values). ``match_score``: the memory's (None: the one the data
    directory was prepared with).
    ``documents``: decode only the split's first N documents in stage 2 (0: all); ``pieces_floors``:
    the fuzzy floors of the pieces' grid (each decoded with every weight of ``GRID_PIECES_WEIGHT``);
    ``search_tolerance``: the s-BLEU points an approximate search may lose against the exact one
    and still be chosen (0: only one that scores as well)."""
    from reluformer_mt.checkpoints import load_model, pick_device
    from reluformer_mt.inference.translator import DocumentTranslator

    device = pick_device(device)
    if not 1 <= adaptive_k <= max(GRID_K):
        raise TuneError(f"--adaptive-k: expected 1 to {max(GRID_K)} (the neighbours searched per token), got {adaptive_k}")
    if split == "test":
        raise TuneError("--split test: the tuner never reads the test split (tune on valid, report on test)")
    if not pieces_floors or not all(0 <= f <= 1 for f in pieces_floors):
        raise TuneError(f"pieces floors: expected fuzzy scores from 0 to 1, got {list(pieces_floors)}")
    if not 0 <= search_tolerance < float("inf"):
        raise TuneError(f"--search-tolerance: expected s-BLEU points >= 0, got {search_tolerance}")
    for option, value in (("--pieces-k", pieces_k), ("--knn-memory-k", memory_k), ("--beam", beam)):
        if value < 1:  # checked by the translators only after the grid and the adaptive network's training
            raise TuneError(f"{option}: expected a positive integer, got {value}")
    started = time.time()
    loaded = load_model(checkpoint, data, device=device, check_data=True)  # --data of the model's vocabulary
    model, task, data_dir = loaded.model, loaded.task, Path(loaded.data_dir)
    report = {"checkpoint": str(checkpoint), "data": str(data_dir), "split": split, "fingerprint": model_fingerprint(model),
              "tuner_version": TUNER_VERSION}
    store = None
    if datastore is not None and knn:
        store = Datastore.load(datastore, fingerprint=report["fingerprint"], checkpoint=str(checkpoint))
        store.check_model(len(task.target_dictionary), model.decoder.output_projection.weight.shape[1])
        report["leakage"] = check_leakage(store, data_dir, split)
    forced = ForcedSplit(model, task, split, max_tokens=max_tokens, device=device)
    progress(f"tune: {len(forced):,} {split} tokens force-decoded ({time.time() - started:.0f} s)")
    report["tokens"] = len(forced)
    report["model_nll"] = float(-forced.lp_ref.double().mean())
    grids = {}
    adaptive = None
    if store is not None:
        d, v = store.search(forced.states.numpy(), max(GRID_K))
        full_d, full_v = torch.from_numpy(d), torch.from_numpy(v.astype(np.int64))
        grids["full"], report["full_scale"] = grid_scores(forced, full_d, full_v)
    if knn:  # per-input: the memory of the translator (the data directory's training split)
        probe = DocumentTranslator(checkpoint, data=data, device=device, beam=beam, knn_memory=True, knn_memory_k=memory_k,
                                   match_score=match_score)
        lookup = probe.memory
        sentence_sources = read_split_sentences(data_dir, split)
        memory_ids, memory_scores = lookup.lookup(sentence_sources, max(memory_k, lookup.k))
        from reluformer_mt.inference.guidance.knn import KnnMixture

        lookup.entry_source = probe.part(KnnMixture).entry_source
        d, v, trust = per_input_neighbours(forced, model, task, memory_ids, memory_scores, lookup, memory_k,
                                           probe.reads_memory, lookup.k, max_tokens, device)
        grids["per_input"], report["per_input_scale"] = grid_scores(forced, d, v, trust)
    progress(f"tune: {sum(len(g) for g in grids.values()):,} settings scored by validation NLL ({time.time() - started:.0f} s)")
    report["grid"] = grids
    chosen = {mode: {r: best_options(rows, r).as_dict() for r in TUNE_READOUTS} for mode, rows in grids.items()}
    report["best_by_nll"] = chosen
    if store is not None:  # adaptive kNN-MT: a Meta-k network per read-out, the better one kept
        report["adaptive"], adaptive = train_adaptive(forced, full_d, full_v, chosen["full"], report["full_scale"], store,
                                                      adaptive_k)
        progress(f"tune: adaptive kNN-MT: held-out NLL {report['adaptive']['kept']['held_out_nll']:.3f} "
                 f"({report['adaptive']['kept']['config']['readout']} read-out) against "
                 f"{report['adaptive']['kept']['held_out_fixed_nll']:.3f} for the best fixed setting and "
                 f"{report['adaptive']['kept']['held_out_model_nll']:.3f} for the model alone")
    if not decode:
        report["seconds"] = round(time.time() - started, 1)
        return report
    sources, references, _ = split_documents(data_dir, split)
    if documents:
        sources, references = sources[:documents], references[:documents]
    report["decoded_documents"] = len(sources)
    report["decoded_sentences"] = sum(len(doc) for doc in sources)
    common = dict(data=data, device=device, beam=beam, match_score=match_score)
    decodes, outputs, seconds_of = [], {}, {}
    n_sentences = report["decoded_sentences"]

    def run(name, knn: Optional[KnnOptions] = None, search: Optional[dict] = None, **kwargs):
        """Decode the validation documents with translator keywords ``kwargs`` (``knn``: the kNN
        options, with the full datastore when ``kwargs`` has no ``knn_memory``; ``search``: its
        search keywords, by default the exact search, not one a former tuning left in the datastore)."""
        options = dict(kwargs)
        if knn is not None:
            options.update(knn.translator_options())
            if not options.get("knn_memory"):
                options["knn"] = datastore
            options.update(search or exact_search("per_input" if options.get("knn_memory") else "full", store))
        outputs[name] = []
        s, seconds_of[name] = validation_bleu(lambda: DocumentTranslator(checkpoint, **common, **options), sources,
                                              references, outputs[name])
        decodes.append({"name": name, "s_bleu": round(s, 2), "seconds": round(seconds_of[name], 1),
                        "sentences_per_s": round(n_sentences / max(seconds_of[name], 1e-9), 2), **kwargs,
                        **({"knn_options": knn.as_dict()} if knn is not None else {}),
                        **({"search": search} if search else {})})
        progress(f"tune: {name}: {split} s-BLEU {s:.2f} ({seconds_of[name]:.0f} s)")
        return s

    run("plain")
    for weight in GRID_PIECES_WEIGHT:
        for floor in pieces_floors:
            run(f"pieces w={weight:g} floor={floor:g}", pieces_weight=weight, pieces_k=pieces_k, pieces_floor=floor)
    pieces = max((d for d in decodes if d["name"].startswith("pieces")), key=lambda d: d["s_bleu"])
    chosen_pieces = {"pieces_weight": pieces["pieces_weight"], "pieces_floor": pieces["pieces_floor"]}
    # with document context or verse by verse: guided beam search may do better on single sentences
    # (a segment's hypothesis that follows a match can drift past its sentence); the better one is kept
    if any(info.n_sentences > 1 for info in forced.infos):
        single = run(f"pieces w={pieces['pieces_weight']:g} floor={pieces['pieces_floor']:g} sentence by sentence",
                     pieces_k=pieces_k, segment_tokens=0, **chosen_pieces)
        if single > pieces["s_bleu"]:
            chosen_pieces["segment_tokens"], pieces = 0, decodes[-1]
    # a length control: sentences ended at F x their expected length (hypotheses that follow pieces to
    # the length limit cost a whole decode and a retranslation as halves); the fastest cap within the
    # search tolerance of the pieces without one is kept
    uncapped, capped = pieces, []
    for cap in GRID_PIECES_LENGTH_CAP:
        run(f"{uncapped['name']} length cap {cap:g}", pieces_k=pieces_k, pieces_length_cap=cap, **chosen_pieces)
        capped.append(decodes[-1])
    fastest = max((d for d in capped if d["s_bleu"] >= uncapped["s_bleu"] - search_tolerance),
                  key=lambda d: d["sentences_per_s"], default=None)
    if fastest is not None and fastest["sentences_per_s"] > uncapped["sentences_per_s"]:
        chosen_pieces["pieces_length_cap"], pieces = fastest["pieces_length_cap"], fastest
    best = {"pieces": {**chosen_pieces, "s_bleu": pieces["s_bleu"], "decode": pieces["name"]}}
    for mode in grids:
        kw = {} if mode == "full" else {"knn_memory": True, "knn_memory_k": memory_k}
        scores = {}
        for readout in TUNE_READOUTS:
            options = KnnOptions(**chosen[mode][readout])
            scores[readout] = (run(f"knn {mode} {readout}", knn=options, **kw), options, decodes[-1]["name"])
        readout = max(scores, key=lambda r: scores[r][0])
        s_best, options, decode = scores[readout]
        # the NLL's lambda is the best mixture of distributions; beam search may gain from trusting
        # the neighbours more (copying a match whole): larger lambdas are decoded too
        for lam in BLEU_LAMBDAS:
            if lam > options.lam:
                candidate = KnnOptions(**{**options.as_dict(), "lam": lam})
                s = run(f"knn {mode} {readout} lambda {lam:g}", knn=candidate, **kw)
                if s > s_best:
                    s_best, options, decode = s, candidate, decodes[-1]["name"]
        if mode == "full" and adaptive is not None:  # the Meta-k network against the best fixed setting
            candidate = KnnOptions(**{**options.as_dict(), "readout": adaptive.readout, "temperature": adaptive.temperature,
                                      "radius": adaptive.radius, "adaptive": True})
            s = adaptive_s_bleu = run(f"knn full adaptive ({adaptive.readout})", knn=candidate)
            if s > s_best:
                s_best, options, decode = s, candidate, decodes[-1]["name"]
        name = f"knn {mode} {options.readout}{' adaptive' if options.adaptive else ''}"
        search = tune_search(lambda label, keywords: (run(label, knn=options, search=keywords, **kw), seconds_of[label]),
                             mode, store, n_sentences, search_tolerance, name, progress,
                             restrict=store is not None and restrictable(store, data_dir))
        s_best, decode = search["s_bleu"], search["decode"]  # what the chosen search decodes (the exact one's on a tie)
        with_pieces = run(f"{name} + pieces", knn=options, search=search["chosen"], pieces_k=pieces_k, **chosen_pieces, **kw)
        best[mode] = {"options": options.as_dict(), "s_bleu": s_best, "decode": decode, "search": search,
                      "pieces": with_pieces > s_best, "s_bleu_with_pieces": with_pieces,
                      "decode_with_pieces": decodes[-1]["name"], "by_readout": {r: s for r, (s, _, _) in scores.items()},
                      **({"adaptive_s_bleu": adaptive_s_bleu} if mode == "full" and adaptive is not None else {})}
    for mode in grids:  # TM-first over what a mode translates with: of its search settings only the chosen one
        for row in best[mode]["search"]["table"]:
            if row["decode"] != best[mode]["search"]["decode"]:
                outputs.pop(row["decode"])
    best["tm_first"] = tune_tm_first(checkpoint, common, sources, references, outputs)
    progress(f"tune: TM-first over {best['tm_first']['over']}: threshold {best['tm_first']['threshold']} "
             f"({best['tm_first']['match_score']}), {split} s-BLEU {best['tm_first']['s_bleu']:.2f}")
    report["decodes"], report["chosen"] = decodes, best
    if store is not None:
        store.set_tuned("full", {**best["full"]["options"], **datastore_values(best["full"]["search"], store),
                                 "tuned_on": f"{data_dir} ({split})"})
    report["seconds"] = round(time.time() - started, 1)
    return report


def read_split_sentences(data_dir, split: str) -> List[str]:
    """The split's source sentences in order, as the memory lookup sees them at translation."""
    sources, _, _ = split_documents(data_dir, split)
    return [s for doc in sources for s in doc]


def format_report(report: dict) -> str:
    lines = [f"tuned on {report['data']} ({report['split']}, {report['tokens']:,} tokens); model NLL "
             f"{report['model_nll']:.3f}"]
    for mode, by_readout in report["best_by_nll"].items():
        for readout, o in by_readout.items():
            row = min((r for r in report["grid"][mode] if r["readout"] == readout), key=lambda r: r["nll"])
            lines.append(f"  {mode:9s} {readout:8s} best by NLL: k={o['k']} lambda={o['lam']:g} "
                         f"{'radius' if readout == 'relu' else 'T'}={row['spread']:g}x scale -> NLL {row['nll']:.3f}")
    # the read-out study: the best validation NLL of each read-out at each k (over lambda and T/radius)
    for mode, rows in report.get("grid", {}).items():
        ks = sorted({r["k"] for r in rows})
        for readout in sorted({r["readout"] for r in rows}):
            best = [min(r["nll"] for r in rows if r["readout"] == readout and r["k"] == k) for k in ks]
            lines.append(f"  {mode:9s} {readout:8s} NLL by k: " + ", ".join(f"k={k} {v:.3f}" for k, v in zip(ks, best)))
    for readout, a in report.get("adaptive", {}).get("by_readout", {}).items():
        lines.append(f"  adaptive  {readout:8s} Meta-k network (k <= {a['config']['k_max']}): held-out NLL "
                     f"{a['held_out_nll']:.3f}, best fixed {a['held_out_fixed_nll']:.3f}, model alone "
                     f"{a['held_out_model_nll']:.3f}; mean weight of k = "
                     + ", ".join(f"{k}: {w:.2f}" for k, w in zip(a["choices"], a["mean_weight_by_choice"])))
    for d in report.get("decodes", []):
        lines.append(f"  decode {d['name']:32s} s-BLEU {d['s_bleu']:6.2f}  ({d['seconds']} s)")
    pieces = report.get("chosen", {}).get("pieces")
    if pieces:
        cap = pieces.get("pieces_length_cap")
        lines.append(f"  pieces chosen: weight {pieces['pieces_weight']:g}, floor {pieces['pieces_floor']:g}"
                     + (", verse by verse" if pieces.get("segment_tokens") == 0 else "")
                     + (f", sentences ended at {cap:g}x their expected length" if cap else ", no length cap")
                     + f" (s-BLEU {pieces['s_bleu']:.2f})")
    for mode in ("full", "per_input"):
        if "search" in report.get("chosen", {}).get(mode, {}):
            lines += format_search(mode, report["chosen"][mode]["search"])
    tm_first = report.get("chosen", {}).get("tm_first")
    if tm_first:
        row = tm_first["by_decode"][tm_first["over"]]
        lines.append(f"  TM-first over {tm_first['over']} ({tm_first['match_score']}): chosen threshold "
                     f"{tm_first['threshold']}, s-BLEU {tm_first['s_bleu']:.2f}; by threshold: "
                     + ", ".join(f"{t} {s:.2f}" for t, s in row.items()))
    return "\n".join(lines)


__all__ = ["TuneError", "best_threshold", "check_leakage", "format_report", "split_documents", "tune"]
