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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

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


@dataclass(frozen=True)
class TuneSettings:
    """What :func:`tune` reads and how much it decodes.

    ``datastore``: the full datastore's folder (None: per-input datastores only; neither with
    ``knn=False``); ``match_score``: the memory's (None: the one the data directory was prepared
    with); ``documents``: decode only the split's first N documents in stage 2 (0: all);
    ``pieces_floors``: the fuzzy floors of the pieces' grid (each decoded with every weight of
    ``GRID_PIECES_WEIGHT``); ``search_tolerance``: the s-BLEU points an approximate search may lose
    against the exact one and still be chosen (0: only one that scores as well)."""
    data: Optional[str] = None
    datastore: Optional[str] = None
    split: str = "valid"
    device: str = "cpu"
    beam: int = 4
    memory_k: int = 8
    pieces_k: int = 8
    decode: bool = True
    max_tokens: int = 8000
    documents: int = 0
    adaptive_k: int = 16
    knn: bool = True
    match_score: Optional[str] = None
    pieces_floors: Sequence[float] = GRID_PIECES_FLOOR
    search_tolerance: float = SEARCH_TOLERANCE

    def check(self) -> None:
        """Refuse bad values before the minutes of force-decoding and training they would waste."""
        if not 1 <= self.adaptive_k <= max(GRID_K):
            raise TuneError(f"--adaptive-k: expected 1 to {max(GRID_K)} (the neighbours searched per token), "
                            f"got {self.adaptive_k}")
        if self.split == "test":
            raise TuneError("--split test: the tuner never reads the test split (tune on valid, report on test)")
        if not self.pieces_floors or not all(0 <= f <= 1 for f in self.pieces_floors):
            raise TuneError(f"pieces floors: expected fuzzy scores from 0 to 1, got {list(self.pieces_floors)}")
        if not 0 <= self.search_tolerance < float("inf"):
            raise TuneError(f"--search-tolerance: expected s-BLEU points >= 0, got {self.search_tolerance}")
        for option, value in (("--pieces-k", self.pieces_k), ("--knn-memory-k", self.memory_k), ("--beam", self.beam)):
            if value < 1:  # checked by the translators only after the grid and the adaptive network's training
                raise TuneError(f"{option}: expected a positive integer, got {value}")


@dataclass
class Tuning:
    """What every stage reads: the settings, the model, its data directory, the full datastore (None
    without one) and the force-decoded split."""
    checkpoint: object
    settings: TuneSettings
    model: object
    task: object
    data_dir: Path
    store: Optional[Datastore]
    forced: ForcedSplit
    started: float
    progress: Callable[[str], None]

    def say(self, line: str) -> None:
        """A progress line with the seconds since the tuning started."""
        self.progress(f"tune: {line} ({time.time() - self.started:.0f} s)")


def tune(checkpoint, settings: TuneSettings = TuneSettings(), progress=print) -> dict:
    """Tune kNN-MT, translation pieces and the TM-first threshold on ``settings.split``; returns the
    report (grid, decodes, chosen values)."""
    from reluformer_mt.checkpoints import pick_device

    settings = replace(settings, device=pick_device(settings.device))
    settings.check()
    t, report = open_tuning(checkpoint, settings, progress)
    report["tokens"] = len(t.forced)
    report["model_nll"] = float(-t.forced.lp_ref.double().mean())
    grids, full = score_grids(t, report)
    t.say(f"{sum(len(g) for g in grids.values()):,} settings scored by validation NLL")
    report["grid"] = grids
    chosen = {mode: {r: best_options(rows, r).as_dict() for r in TUNE_READOUTS} for mode, rows in grids.items()}
    report["best_by_nll"] = chosen
    adaptive = None
    if t.store is not None:  # adaptive kNN-MT: a Meta-k network per read-out, the better one kept
        adaptive = adaptive_stage(t, report, chosen["full"], full)
    if settings.decode:
        decode_stage(t, report, chosen, adaptive)
    report["seconds"] = round(time.time() - t.started, 1)
    return report


def open_tuning(checkpoint, settings: TuneSettings, progress) -> Tuple[Tuning, dict]:
    """The model (on --data of its vocabulary), the full datastore, checked against the model and
    for leakage of the split, and the split force-decoded; the report's first fields."""
    from reluformer_mt.checkpoints import load_model

    started = time.time()
    loaded = load_model(checkpoint, settings.data, device=settings.device, check_data=True)
    model, task, data_dir = loaded.model, loaded.task, Path(loaded.data_dir)
    report = {"checkpoint": str(checkpoint), "data": str(data_dir), "split": settings.split,
              "fingerprint": model_fingerprint(model), "tuner_version": TUNER_VERSION}
    store = None
    if settings.datastore is not None and settings.knn:
        store = Datastore.load(settings.datastore, fingerprint=report["fingerprint"], checkpoint=str(checkpoint))
        store.check_model(len(task.target_dictionary), model.decoder.output_projection.weight.shape[1])
        report["leakage"] = check_leakage(store, data_dir, settings.split)
    forced = ForcedSplit(model, task, settings.split, max_tokens=settings.max_tokens, device=settings.device)
    t = Tuning(checkpoint, settings, model, task, data_dir, store, forced, started, progress)
    t.say(f"{len(forced):,} {settings.split} tokens force-decoded")
    return t, report


def score_grids(t: Tuning, report: dict) -> Tuple[Dict[str, List[dict]], Optional[Tuple[torch.Tensor, torch.Tensor]]]:
    """Stage 1: the grid's validation NLL for the full datastore and the per-input ones; also the full
    datastore's (distances, values) of every token, which the adaptive network trains on."""
    grids, full = {}, None
    if t.store is not None:
        d, v = t.store.search(t.forced.states.numpy(), max(GRID_K))
        full = torch.from_numpy(d), torch.from_numpy(v.astype(np.int64))
        grids["full"], report["full_scale"] = grid_scores(t.forced, *full)
    if t.settings.knn:
        d, v, trust = per_input_grid_neighbours(t)
        grids["per_input"], report["per_input_scale"] = grid_scores(t.forced, d, v, trust)
    return grids, full


def per_input_grid_neighbours(t: Tuning):
    """Every token's neighbours in its sentence's per-input datastore, from the memory the translator
    reads (the data directory's training split)."""
    from reluformer_mt.guidance.knn import KnnMixture
    from reluformer_mt.inference.translator import DocumentTranslator

    s = t.settings
    probe = DocumentTranslator(t.checkpoint, data=s.data, device=s.device, beam=s.beam, knn_memory=True,
                               knn_memory_k=s.memory_k, match_score=s.match_score)
    lookup = probe.memory
    memory_ids, memory_scores = lookup.lookup(read_split_sentences(t.data_dir, s.split), max(s.memory_k, lookup.k))
    lookup.entry_source = probe.part(KnnMixture).entry_source
    return per_input_neighbours(t.forced, t.model, t.task, memory_ids, memory_scores, lookup, s.memory_k,
                                probe.reads_memory, lookup.k, s.max_tokens, s.device)


def adaptive_stage(t: Tuning, report: dict, best_fixed: Dict[str, dict], full):
    """The Meta-k networks trained on the full datastore's neighbours; returns the kept one's config."""
    report["adaptive"], adaptive = train_adaptive(t.forced, *full, best_fixed, report["full_scale"], t.store,
                                                  t.settings.adaptive_k)
    kept = report["adaptive"]["kept"]
    t.progress(f"tune: adaptive kNN-MT: held-out NLL {kept['held_out_nll']:.3f} ({kept['config']['readout']} read-out) "
               f"against {kept['held_out_fixed_nll']:.3f} for the best fixed setting and "
               f"{kept['held_out_model_nll']:.3f} for the model alone")
    return adaptive


class ValidationDecodes:
    """Stage 2's translations of the validation documents, each decode's s-BLEU, speed and outputs
    kept in the order decoded."""

    def __init__(self, t: Tuning):
        s = t.settings
        self.t = t
        self.sources, self.references, _ = split_documents(t.data_dir, s.split)
        if s.documents:
            self.sources, self.references = self.sources[:s.documents], self.references[:s.documents]
        self.n_sentences = sum(len(doc) for doc in self.sources)
        self.common = dict(data=s.data, device=s.device, beam=s.beam, match_score=s.match_score)
        self.decodes: List[dict] = []
        self.outputs: Dict[str, List[str]] = {}
        self.seconds_of: Dict[str, float] = {}

    @property
    def last(self) -> dict:
        return self.decodes[-1]

    def run(self, name: str, knn: Optional[KnnOptions] = None, search: Optional[dict] = None, **kwargs) -> float:
        """Decode the validation documents with translator keywords ``kwargs`` (``knn``: the kNN
        options, with the full datastore when ``kwargs`` has no ``knn_memory``; ``search``: its
        search keywords, by default the exact search, not one a former tuning left in the datastore)."""
        from reluformer_mt.inference.translator import DocumentTranslator

        options = dict(kwargs)
        if knn is not None:
            options.update(knn.translator_options())
            if not options.get("knn_memory"):
                options["knn"] = self.t.settings.datastore
            options.update(search or exact_search("per_input" if options.get("knn_memory") else "full", self.t.store))
        self.outputs[name] = []
        s, seconds = validation_bleu(lambda: DocumentTranslator(self.t.checkpoint, **self.common, **options),
                                     self.sources, self.references, self.outputs[name])
        self.seconds_of[name] = seconds
        self.decodes.append({"name": name, "s_bleu": round(s, 2), "seconds": round(seconds, 1),
                             "sentences_per_s": round(self.n_sentences / max(seconds, 1e-9), 2), **kwargs,
                             **({"knn_options": knn.as_dict()} if knn is not None else {}),
                             **({"search": search} if search else {})})
        self.t.progress(f"tune: {name}: {self.t.settings.split} s-BLEU {s:.2f} ({seconds:.0f} s)")
        return s


def decode_stage(t: Tuning, report: dict, chosen: Dict[str, Dict[str, dict]], adaptive) -> None:
    """Stage 2 and 3: the decodes that choose the pieces, each mode's kNN-MT and its search, and the
    TM-first threshold over them; the full datastore's choice saved beside it."""
    decoder = ValidationDecodes(t)
    report["decoded_documents"] = len(decoder.sources)
    report["decoded_sentences"] = decoder.n_sentences
    decoder.run("plain")
    chosen_pieces, pieces = tune_pieces(decoder)
    best = {"pieces": {**chosen_pieces, "s_bleu": pieces["s_bleu"], "decode": pieces["name"]}}
    for mode in chosen:
        best[mode] = tune_knn_mode(decoder, mode, chosen[mode], adaptive if mode == "full" else None, chosen_pieces)
    for mode in chosen:  # TM-first over what a mode translates with: of its search settings only the chosen one
        for row in best[mode]["search"]["table"]:
            if row["decode"] != best[mode]["search"]["decode"]:
                decoder.outputs.pop(row["decode"])
    best["tm_first"] = tune_tm_first(t.checkpoint, decoder.common, decoder.sources, decoder.references, decoder.outputs)
    tm_first = best["tm_first"]
    t.progress(f"tune: TM-first over {tm_first['over']}: threshold {tm_first['threshold']} "
               f"({tm_first['match_score']}), {t.settings.split} s-BLEU {tm_first['s_bleu']:.2f}")
    report["decodes"], report["chosen"] = decoder.decodes, best
    if t.store is not None:
        t.store.set_tuned("full", {**best["full"]["options"], **datastore_values(best["full"]["search"], t.store),
                                   "tuned_on": f"{t.data_dir} ({t.settings.split})"})


def tune_pieces(decoder: ValidationDecodes) -> Tuple[dict, dict]:
    """The pieces' (weight, floor) of the best s-BLEU, decoded sentence by sentence too when the
    documents have context, then with a length cap: (the chosen keywords, the chosen decode)."""
    pieces_k = decoder.t.settings.pieces_k
    for weight in GRID_PIECES_WEIGHT:
        for floor in decoder.t.settings.pieces_floors:
            decoder.run(f"pieces w={weight:g} floor={floor:g}", pieces_weight=weight, pieces_k=pieces_k, pieces_floor=floor)
    pieces = max((d for d in decoder.decodes if d["name"].startswith("pieces")), key=lambda d: d["s_bleu"])
    chosen_pieces = {"pieces_weight": pieces["pieces_weight"], "pieces_floor": pieces["pieces_floor"]}
    # with document context or verse by verse: guided beam search may do better on single sentences
    # (a segment's hypothesis that follows a match can drift past its sentence); the better one is kept
    if any(info.n_sentences > 1 for info in decoder.t.forced.infos):
        single = decoder.run(f"pieces w={pieces['pieces_weight']:g} floor={pieces['pieces_floor']:g} sentence by sentence",
                             pieces_k=pieces_k, segment_tokens=0, **chosen_pieces)
        if single > pieces["s_bleu"]:
            chosen_pieces["segment_tokens"], pieces = 0, decoder.last
    return cap_pieces_length(decoder, chosen_pieces, pieces)


def cap_pieces_length(decoder: ValidationDecodes, chosen_pieces: dict, uncapped: dict) -> Tuple[dict, dict]:
    """A length control: sentences ended at F x their expected length (hypotheses that follow pieces
    to the length limit cost a whole decode and a retranslation as halves); the fastest cap within
    the search tolerance of the pieces without one is kept."""
    capped = []
    for cap in GRID_PIECES_LENGTH_CAP:
        decoder.run(f"{uncapped['name']} length cap {cap:g}", pieces_k=decoder.t.settings.pieces_k,
                    pieces_length_cap=cap, **chosen_pieces)
        capped.append(decoder.last)
    tolerance = decoder.t.settings.search_tolerance
    fastest = max((d for d in capped if d["s_bleu"] >= uncapped["s_bleu"] - tolerance),
                  key=lambda d: d["sentences_per_s"], default=None)
    if fastest is not None and fastest["sentences_per_s"] > uncapped["sentences_per_s"]:
        chosen_pieces["pieces_length_cap"] = fastest["pieces_length_cap"]
        return chosen_pieces, fastest
    return chosen_pieces, uncapped


def tune_knn_mode(decoder: ValidationDecodes, mode: str, by_nll: Dict[str, dict], adaptive,
                  chosen_pieces: dict) -> dict:
    """A kNN-MT mode's choice: its options by decoding, then their search, then whether pieces help."""
    t, kw = decoder.t, mode_keywords(decoder, mode)
    options, scores, adaptive_s_bleu = knn_options_by_decoding(decoder, mode, by_nll, adaptive)
    name = f"knn {mode} {options.readout}{' adaptive' if options.adaptive else ''}"
    search = tune_search(lambda label, keywords: (decoder.run(label, knn=options, search=keywords, **kw),
                                                  decoder.seconds_of[label]),
                         mode, t.store, decoder.n_sentences, t.settings.search_tolerance, name, t.progress,
                         restrict=t.store is not None and restrictable(t.store, t.data_dir))
    s_best, decode = search["s_bleu"], search["decode"]  # what the chosen search decodes (the exact one's on a tie)
    with_pieces = decoder.run(f"{name} + pieces", knn=options, search=search["chosen"], pieces_k=t.settings.pieces_k,
                              **chosen_pieces, **kw)
    return {"options": options.as_dict(), "s_bleu": s_best, "decode": decode, "search": search,
            "pieces": with_pieces > s_best, "s_bleu_with_pieces": with_pieces,
            "decode_with_pieces": decoder.last["name"], "by_readout": scores,
            **({"adaptive_s_bleu": adaptive_s_bleu} if adaptive is not None else {})}


def mode_keywords(decoder: ValidationDecodes, mode: str) -> dict:
    """The translator keywords of a kNN-MT mode: none for the full datastore (it is given as --knn)."""
    return {} if mode == "full" else {"knn_memory": True, "knn_memory_k": decoder.t.settings.memory_k}


def knn_options_by_decoding(decoder: ValidationDecodes, mode: str, by_nll: Dict[str, dict], adaptive):
    """The kNN options of the best s-BLEU: each read-out's best by NLL, the better read-out with larger
    lambdas, and the Meta-k network (``adaptive``, the full datastore's). Returns (options, s-BLEU by
    read-out, the adaptive network's s-BLEU or None)."""
    kw = mode_keywords(decoder, mode)
    scores = {}
    for readout in TUNE_READOUTS:
        options = KnnOptions(**by_nll[readout])
        scores[readout] = (decoder.run(f"knn {mode} {readout}", knn=options, **kw), options)
    readout = max(scores, key=lambda r: scores[r][0])
    s_best, options = scores[readout]
    # the NLL's lambda is the best mixture of distributions; beam search may gain from trusting
    # the neighbours more (copying a match whole): larger lambdas are decoded too
    for lam in BLEU_LAMBDAS:
        if lam > options.lam:
            candidate = KnnOptions(**{**options.as_dict(), "lam": lam})
            s = decoder.run(f"knn {mode} {readout} lambda {lam:g}", knn=candidate, **kw)
            if s > s_best:
                s_best, options = s, candidate
    adaptive_s_bleu = None
    if adaptive is not None:  # the Meta-k network against the best fixed setting
        candidate = KnnOptions(**{**options.as_dict(), "readout": adaptive.readout, "temperature": adaptive.temperature,
                                  "radius": adaptive.radius, "adaptive": True})
        adaptive_s_bleu = decoder.run(f"knn full adaptive ({adaptive.readout})", knn=candidate)
        if adaptive_s_bleu > s_best:
            options = candidate
    return options, {r: s for r, (s, _) in scores.items()}, adaptive_s_bleu


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


__all__ = ["TuneError", "TuneSettings", "best_threshold", "check_leakage", "format_report", "split_documents", "tune"]
