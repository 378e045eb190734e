"""kNN-MT as a part of decoding guidance (``--knn``, ``--knn-memory``, ``--knn-*``; the task's
``--knn-datastore``): the neighbours of each step's decoder state mixed into the model's
distribution (:mod:`reluformer_mt.knn.search`), from a corpus datastore or, in reluformer-translate,
from per-input datastores of each sentence's memory matches (SK-MT)."""
from dataclasses import fields

import numpy as np
import torch

from reluformer_mt.guidance.base import BeamStep, Guidance, GuidanceContext, SourceBatch, TranslationError
from reluformer_mt.guidance.knn_options import KnnMtOptions, tuned_restriction  # noqa: F401  (re-exported)

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
        # fairseq-generate looks up no matches: there a tuned restriction searches the whole datastore
        self.restrict = options.restriction() if datastore is not None and context.looks_up_matches else 0
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
        memory = tuple(int(e) for e in ids[:self.context.lookup.k]) if self.context.reads_memory else ()
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
        pairs = [(torch.cat([self.entry_source(entry), eos]), c.lookup.tokens[entry]) for entry, _ in wanted]
        memories = [c.lookup.tokens_of([np.asarray(ids)]) for _, ids in wanted] if c.reads_memory else None
        for key, state in zip(wanted, per_input_states(c.models[0], c.task, pairs, memories, max_tokens=c.decode_tokens,
                                                       device=c.device)):
            self._entry_states[key] = state

    def entry_source(self, entry: int) -> torch.Tensor:
        """Source token ids of a memory entry (without </s>), encoded once."""
        if entry not in self._entry_sources:
            line = " ".join(self.context.sp_src.encode(self.context.lookup.entries.sources[entry], out_type=str))
            self._entry_sources[entry] = self.context.src_dict.encode_line(line, add_if_not_exist=False,
                                                                           append_eos=False).long()
        return self._entry_sources[entry]

    def describe(self) -> str:
        where = (f"the {self.options.memory_k} best memory matches of each sentence (per-input datastores"
                 + (f", their keys read from {self.keys_store.directory})" if self.keys_store is not None else ")")
                 if self.options.memory else self.datastore.describe())
        if self.restrict:
            where += f", each sentence searching the entries of its {self.restrict} best memory matches"
        from reluformer_mt.knn.search import describe_values

        return f"kNN-MT: {describe_values(self.mixer.options)} over {where}"


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
            check_restriction(keys_store, context.lookup, f"--knn-memory-keys {options.memory_keys}",
                              "leave it out to force-decode the matches")
        tuned = (datastore.meta.get("tuned", {}).get("full") if datastore is not None else None) or {}
        known = {f.name for f in fields(KnnOptions)}
        KnnOptions(**options.given()).check()  # the options' own ranges (--knn-k at most 2048, ...)
        mixer = KnnMixer(StateRecorder(model.decoder),
                         KnnOptions(**{**{k: v for k, v in tuned.items() if k in known}, **options.given()}))
        if datastore is not None:
            mixer.use_datastore(datastore)
            if options.restriction() and context.looks_up_matches:
                check_restriction(datastore, context.lookup, f"--knn-restrict {options.restriction()}",
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
