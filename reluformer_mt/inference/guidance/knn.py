"""kNN-MT as a part of decoding guidance (``--knn``, ``--knn-memory``, ``--knn-*``; the task's
``--knn-datastore``): the neighbours of each step's decoder state mixed into the model's
distribution (:mod:`reluformer_mt.knn.search`), from a corpus datastore or, in reluformer-translate,
from per-input datastores of each sentence's memory matches (SK-MT)."""
from dataclasses import dataclass, field, fields
from typing import Optional

import numpy as np
import torch

from reluformer_mt.inference.guidance.base import (BeamStep, Guidance, GuidanceContext, SourceBatch, TranslationError,
                                                   register_guidance)

# the search values, each overriding the datastore's tuned one when given: field -> option
SEARCH_VALUES = {"k": "--knn-k", "lam": "--knn-lambda", "readout": "--knn-readout", "temperature": "--knn-temperature",
                 "radius": "--knn-radius", "adaptive": "--knn-adaptive"}


@dataclass
class KnnMtOptions:
    """Where the neighbours come from (a datastore directory, or per-input datastores of the
    memory's matches) and the search values given (None: the datastore's tuned value, else
    :class:`reluformer_mt.knn.search.KnnOptions`' default)."""
    datastore: Optional[str] = field(default=None, metadata={"flat": "knn"})
    memory: bool = field(default=False, metadata={"flat": "knn_memory"})
    memory_k: int = field(default=8, metadata={"flat": "knn_memory_k"})
    k: Optional[int] = field(default=None, metadata={"flat": "knn_k"})
    lam: Optional[float] = field(default=None, metadata={"flat": "knn_lambda"})
    readout: Optional[str] = field(default=None, metadata={"flat": "knn_readout"})
    temperature: Optional[float] = field(default=None, metadata={"flat": "knn_temperature"})
    radius: Optional[float] = field(default=None, metadata={"flat": "knn_radius"})
    adaptive: Optional[bool] = field(default=None, metadata={"flat": "knn_adaptive"})
    # per-input datastores: each step's distances as one batched product per unit read (a sentence's
    # beams together), not a copy of its keys per beam row; the same neighbours up to float rounding
    batched_search: bool = field(default=False, metadata={"flat": "knn_batched_search"})
    # a corpus datastore's IVF lists searched per step (HNSW: efSearch); None: as tuned, else the index's (16)
    probe: Optional[int] = field(default=None, metadata={"flat": "knn_probe"})
    # a corpus datastore's index searched every N steps, the neighbours' successors followed in
    # between (reluformer_mt.knn.continued); None: as tuned, else 1 (every step)
    search_every: Optional[int] = field(default=None, metadata={"flat": "knn_search_every"})
    # a corpus datastore searched as built, whatever the tuner chose: every step, the index's own probe
    exact_search: bool = field(default=False, metadata={"flat": "knn_exact_search"})
    # a corpus datastore searched, per sentence, among the entries of its M best memory matches only
    # (reluformer_mt.knn.search.RestrictedSearch); 0: the whole datastore; None: as tuned, else 0
    restrict: Optional[int] = field(default=None, metadata={"flat": "knn_restrict"})
    # per-input datastores whose keys are the matches' entries of this corpus datastore (built from the
    # memory's corpus by the same model), read instead of force-decoded (RestrictedSearch with trust)
    memory_keys: Optional[str] = field(default=None, metadata={"flat": "knn_memory_keys"})
    # a beam row whose model gives its best token a probability above P skips the search (the model
    # decides alone: retrieval skipping, Shi et al. 2023, Gao et al. 2024); 1: no row skips; None: as
    # tuned (a corpus datastore's tuned.full.skip_confident), else 1
    skip_confident: Optional[float] = field(default=None, metadata={"flat": "knn_skip_confident"})

    def __post_init__(self):
        self.memory, self.memory_k = bool(self.memory), int(self.memory_k)
        if self.datastore is not None:
            self.datastore = str(self.datastore)
        if self.memory and self.memory_k < 1:
            raise TranslationError(f"--knn-memory-k: expected >= 1 matches per sentence, got {self.memory_k}")
        if self.given() and self.datastore is None and not self.memory:
            raise TranslationError(f"{'/'.join(SEARCH_VALUES.values())} need --knn DATASTORE or --knn-memory")
        if self.adaptive and self.datastore is None:
            raise TranslationError("--knn-adaptive: the Meta-k network is trained for a corpus datastore; give --knn "
                                   "DATASTORE (per-input datastores of --knn-memory have none)")
        self.batched_search = bool(self.batched_search)
        if self.batched_search and not self.memory:
            raise TranslationError("--knn-batched-search: a search of per-input datastores; give --knn-memory")
        if self.probe is not None:
            self.probe = int(self.probe)
            if self.probe < 1 or self.datastore is None:
                raise TranslationError(f"--knn-probe {self.probe}: expected >= 1 lists of a --knn DATASTORE's index")
        if self.search_every is not None:
            self.search_every = int(self.search_every)
            if self.search_every < 1 or (self.search_every > 1 and self.datastore is None):
                raise TranslationError(f"--knn-search-every {self.search_every}: expected >= 1 steps, > 1 only with "
                                       "--knn DATASTORE")
        self.exact_search = bool(self.exact_search)
        if self.exact_search and (self.datastore is None or self.probe is not None or self.search_every is not None):
            raise TranslationError("--knn-exact-search: searches a --knn DATASTORE as it was built; give it without "
                                   "--knn-probe / --knn-search-every")
        if self.datastore is not None and self.memory:
            raise TranslationError("--knn DATASTORE and --knn-memory: give one of them")
        if self.memory_keys is not None:
            self.memory_keys = str(self.memory_keys)
            if not self.memory:
                raise TranslationError(f"--knn-memory-keys {self.memory_keys}: the keys of per-input datastores; give "
                                       "--knn-memory too")
        if self.skip_confident is not None:
            value = self.skip_confident
            self.skip_confident = float(value)
            if not 0 < self.skip_confident <= 1 or (self.datastore is None and not self.memory):
                raise TranslationError(f"--knn-skip-confident {value}: expected a probability in (0, 1] (1: every "
                                       "row searches), with --knn DATASTORE or --knn-memory")
            if self.skip_confident < 1 and (self.search_every or 1) > 1:
                raise TranslationError(f"--knn-skip-confident {value}: a search every N steps follows every row's "
                                       "neighbours; give it without --knn-search-every")
        if self.restrict is not None:
            self.restrict = int(self.restrict)
            if self.restrict < 0 or self.datastore is None:
                raise TranslationError(f"--knn-restrict {self.restrict}: expected >= 0 memory matches per sentence "
                                       "whose entries of a --knn DATASTORE are searched (0: the whole datastore)")
            if self.restrict and (self.exact_search or (self.search_every or 1) > 1 or self.probe is not None):
                raise TranslationError(f"--knn-restrict {self.restrict}: searches the matches' entries exactly; give it "
                                       "without --knn-exact-search / --knn-search-every / --knn-probe")

    def given(self) -> dict:
        return {name: getattr(self, name) for name in SEARCH_VALUES if getattr(self, name) is not None}

    @property
    def needs_memory(self) -> bool:
        return self.memory or bool(self.restriction())

    def restriction(self) -> int:
        """The memory matches per sentence a corpus datastore's search is restricted to: the option
        given, else the tuner's choice (``tuned.full.restrict`` of ``datastore.json``, read here
        because the memory is opened before the datastore), else 0 (the whole datastore)."""
        if self.datastore is None or self.exact_search or (self.search_every or 1) > 1 or self.probe is not None:
            return self.restrict or 0
        if self.restrict is not None:
            return self.restrict
        return tuned_restriction(self.datastore)

    def skipping(self, tuned: dict, every: int) -> float:
        """The probability above which a row skips the search: the option given, else the tuner's
        (``tuned``: a corpus datastore's ``tuned.full``) unless the search runs every ``every`` > 1
        steps (it follows every row), else 1 (no row skips)."""
        if self.skip_confident is not None:
            return self.skip_confident
        value = tuned.get("skip_confident", 1.0) if every == 1 and not self.exact_search else 1.0
        return float(value)


def tuned_restriction(datastore: str) -> int:
    """``tuned.full.restrict`` of a datastore directory's description; 0 when there is none (a
    missing or unreadable description is reported when the datastore is opened)."""
    import json
    from pathlib import Path

    try:
        meta = json.loads((Path(datastore) / "datastore.json").read_text(encoding="utf-8"))
        value = meta.get("tuned", {}).get("full", {}).get("restrict", 0)
    except (OSError, ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class KnnMixture(Guidance):
    """Mixes the neighbours in first, so that a bonus and the constraints act on the mixed
    distribution. In a document segment, a row with sentences still to write takes an entry that
    ended its sentence as a vote for the separator (:meth:`reluformer_mt.knn.search.KnnMixer.mix`)."""
    stage = "mixture"

    def __init__(self, mixer, options: KnnMtOptions, context: GuidanceContext, datastore=None, keys_store=None):
        super().__init__()
        self.mixer, self.options, self.datastore = mixer, options, datastore
        self.keys_store = keys_store  # --knn-memory-keys: the corpus datastore the per-input keys are read from
        self.stats = mixer.stats  # the mixer's counts are the part's
        self.restrict = options.restriction() if datastore is not None else 0
        self.memory_k = options.memory_k if options.memory else self.restrict
        self.context = context
        self._entry_states = {}   # (entry, memory ids) -> (keys, values), decoded once
        self._entry_sources = {}  # entry -> source token ids

    def apply(self, step: BeamStep) -> None:
        eos_as = sentences = None
        if step.required is not None:
            sentences = step.sentences  # the sentence each row is writing
            eos_as = torch.where(sentences < step.required, torch.full_like(step.required, step.separator),
                                 torch.full_like(step.required, step.eos))
        if hasattr(self.mixer.store, "follow"):  # which row continues which: the prefixes
            self.mixer.store.follow(step.prefix)
        self.mixer.mix(step.lprobs, step.sources, step.eos, eos_as, sentences)  # in place

    def start(self, batch: SourceBatch) -> None:
        if self.restrict:
            from reluformer_mt.knn.search import RestrictedSearch

            if batch.units is None:
                raise TranslationError(f"--knn-restrict {self.restrict}: needs each sentence's memory matches, which "
                                       "reluformer-translate looks up; give --knn-restrict 0 here")
            matches = [[batch.matches[key][0][:self.restrict] for key in units] for units in batch.units]
            self.mixer.store = RestrictedSearch(self.datastore, matches)
            self.stats["knn: restricted search entries"] += self.mixer.store.entries
        elif self.options.memory and self.keys_store is not None:
            from reluformer_mt.knn.search import RestrictedSearch

            k = self.options.memory_k
            matches = ([[batch.matches[key] for key in keys] for keys in batch.units] if batch.units is not None
                       else [[] for _ in batch.sources])
            self.mixer.store = RestrictedSearch(self.keys_store, [[ids[:k] for ids, _ in m] for m in matches],
                                                [[scores[:k] for _, scores in m] for m in matches])
            self.stats["knn: per-input datastore entries"] += self.mixer.store.entries
        elif self.options.memory:
            entries = ([[self.unit_entries(batch, key) for key in units] for units in batch.units]
                       if batch.units is not None else [[] for _ in batch.sources])
            self.mixer.store = self.per_input_datastores(entries)

    def unit_entries(self, batch: SourceBatch, key):
        """A unit's per-input datastore entries: its top ``memory_k`` matches, each as ((entry, the
        memory a memory-reading model decodes it with: the sentence's own matches, as at
        translation), fuzzy score)."""
        ids, scores = batch.matches[key]
        k = self.options.memory_k
        memory = tuple(int(e) for e in ids[:self.context.memory.k]) if self.context.reads_memory else ()
        return [((int(e), memory), float(f)) for e, f in zip(ids[:k], scores[:k]) if e >= 0]

    def per_input_datastores(self, entries_of_sources):
        """SK-MT's per-input datastores: each sentence's memory matches force-decoded (cached per
        entry and the memory it was decoded with), one unit per sentence of a source."""
        from reluformer_mt.knn.search import PerInputDatastores

        self.decode_entries({key for sentences in entries_of_sources for entries in sentences for key, _ in entries})
        units = []
        for sentences in entries_of_sources:
            units.append([])
            for entries in sentences:
                keys = [self._entry_states[key][0] for key, _ in entries]
                values = [self._entry_states[key][1] for key, _ in entries]
                trust = [torch.full((len(v),), fuzzy) for v, (_, fuzzy) in zip(values, entries)]
                units[-1].append((torch.cat(keys) if keys else torch.zeros(0, 1),
                                  torch.cat(values) if values else torch.zeros(0, dtype=torch.long),
                                  torch.cat(trust) if trust else torch.zeros(0)))
        store = PerInputDatastores(units, batched=self.options.batched_search)
        self.stats["knn: per-input datastore entries"] += store.entries
        return store

    def decode_entries(self, keys) -> None:
        """Force-decode the (entry, memory ids) pairs not decoded yet."""
        from reluformer_mt.knn.search import per_input_states

        c = self.context
        wanted = sorted(key for key in keys if key not in self._entry_states)
        if not wanted:
            return
        eos = torch.tensor([c.src_dict.eos()])
        pairs = [(torch.cat([self.entry_source(entry), eos]), c.memory.tokens[entry]) for entry, _ in wanted]
        memories = [c.memory.tokens_of([np.asarray(ids)]) for _, ids in wanted] if c.reads_memory else None
        for key, state in zip(wanted, per_input_states(c.models[0], c.task, pairs, memories, max_tokens=c.max_tokens,
                                                       device=c.device)):
            self._entry_states[key] = state

    def entry_source(self, entry: int) -> torch.Tensor:
        """Source token ids of a memory entry (without </s>), encoded once."""
        if entry not in self._entry_sources:
            line = " ".join(self.context.sp_src.encode(self.context.memory.entries.sources[entry], out_type=str))
            self._entry_sources[entry] = self.context.src_dict.encode_line(line, add_if_not_exist=False,
                                                                           append_eos=False).long()
        return self._entry_sources[entry]

    def describe(self) -> str:
        where = (f"the {self.options.memory_k} best memory matches of each sentence (per-input datastores"
                 + (f", their keys read from {self.keys_store.directory})" if self.keys_store is not None else ")")
                 if self.options.memory else self.datastore.describe())
        if self.restrict:
            where += f", each sentence searching the entries of its {self.restrict} best memory matches"
        return f"kNN-MT: {self.mixer.options.describe()} over {where}"


def build_knn(options: KnnMtOptions, context: GuidanceContext):
    """The mixture over a corpus datastore (refused when built with other weights) or per-input
    datastores; the search values given over the datastore's tuned ones."""
    from reluformer_mt.knn.adaptive import AdaptiveError
    from reluformer_mt.knn.datastore import DatastoreError
    from reluformer_mt.knn.readout import ReadoutError
    from reluformer_mt.knn.search import KnnMixer, KnnOptions, StateRecorder

    if options.datastore is None and not options.memory:
        return None
    model = context.models[0]
    try:
        datastore = keys_store = None
        if options.datastore is not None:
            datastore = open_datastore(options.datastore, context)
        if options.memory_keys is not None:
            keys_store = open_datastore(options.memory_keys, context)
            check_restriction(keys_store, context.memory, f"--knn-memory-keys {options.memory_keys}",
                              "leave it out to force-decode the matches")
        tuned = (datastore.meta.get("tuned", {}).get("full") if datastore is not None else None) or {}
        known = {f.name for f in fields(KnnOptions)}
        KnnOptions(**options.given()).check()  # the options' own ranges (--knn-k at most 2048, ...)
        mixer = KnnMixer(StateRecorder(model.decoder),
                         KnnOptions(**{**{k: v for k, v in tuned.items() if k in known}, **options.given()}))
        if datastore is not None:
            mixer.use_datastore(datastore)
            if options.restriction():
                check_restriction(datastore, context.memory, f"--knn-restrict {options.restriction()}",
                                  "give --knn-restrict 0 to search the whole datastore")
            else:
                use_search(mixer, datastore, *search_settings(options, tuned))
        mixer.skip_confident = options.skipping(tuned, search_settings(options, tuned)[1] if datastore is not None else 1)
    except (DatastoreError, ReadoutError, AdaptiveError) as e:
        raise TranslationError(str(e)) from None
    return KnnMixture(mixer, options, context, datastore, keys_store)


def open_datastore(directory: str, context: GuidanceContext):
    """A corpus datastore built with the model's weights (refused otherwise), its ids within the
    model's dictionary and its keys of the model's state width: checked before decoding."""
    from reluformer_mt.knn.datastore import Datastore, model_fingerprint

    model = context.models[0]
    datastore = Datastore.load(directory, fingerprint=model_fingerprint(model), checkpoint=context.checkpoint)
    datastore.check_model(len(context.task.target_dictionary), model.decoder.output_projection.weight.shape[1])
    return datastore


def check_restriction(datastore, memory, option: str, way_out: str) -> None:
    """A search among the memory matches' entries (``--knn-restrict M``, ``--knn-memory-keys``) needs
    the memory to be the datastore's own corpus (memory entry i = the datastore's sentence i), unchanged
    since the build (``pairs.npy``), and the datastore to know each entry's sentence: one line
    otherwise (naming ``option`` and ending with ``way_out``), before decoding."""
    from pathlib import Path

    from reluformer_mt.knn.datastore import DatastoreError

    source = datastore.meta["source"]
    if memory is None:
        raise DatastoreError(f"{option}: needs the translation memory (not --memory none); {way_out}")
    if (memory.corpus != Path(source["data"]).resolve() or source["split"] != "train"
            or len(memory.entries) != source["sentences"]):
        raise DatastoreError(f"{option}: the memory ({memory.entries.origin}, {len(memory.entries)} "
                             f"entries) is not the corpus {datastore.directory} was built from ({source['data']}, "
                             f"{source['split']}, {source['sentences']} sentences); {way_out}")
    datastore.check_source_unchanged()  # the same path prepared again: its sentences in another order
    datastore.sentence_entries()


def search_settings(options: KnnMtOptions, tuned: dict):
    """(probe, search every N steps) of a corpus datastore: the options given, else the tuner's
    choice (``tuned.full`` of ``datastore.json``), else the index as built and every step;
    ``--knn-exact-search``: as built whatever was tuned."""
    if options.exact_search:
        return None, 1
    probe = options.probe if options.probe is not None else tuned.get("probe")
    every = options.search_every if options.search_every is not None else tuned.get("search_every", 1)
    return probe, every


def use_search(mixer, datastore, probe, every: int) -> None:
    """Search ``datastore`` with ``probe`` lists (None: its own), every ``every`` steps."""
    if probe is not None:
        datastore.set_probe(probe)
    if every > 1:
        from reluformer_mt.knn.continued import ContinuedSearch

        mixer.store = ContinuedSearch(datastore, every, mixer.stats)


register_guidance("knn", KnnMtOptions, build_knn)
