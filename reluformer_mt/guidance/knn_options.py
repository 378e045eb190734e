"""kNN-MT's options, declared once (``--knn``, ``--knn-memory``, ``--knn-*``; the task's
``--knn-datastore`` and ``--knn-k``...): where the neighbours come from, how the datastore is
searched, and the search values given (each None: the datastore's tuned value, else
:class:`reluformer_mt.knn.values.KnnOptions`' default; those fields are derived from that record).
Imports neither torch nor fairseq; the part itself is :mod:`reluformer_mt.guidance.knn`."""
import json
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Optional, Tuple

from reluformer_mt.guidance.declared import TranslationError, option, register_guidance
from reluformer_mt.knn.values import KnnOptions


def _given(f):
    """A search value of the tuner's record as an option given here: None = as tuned."""
    fallback = "off" if f.default is False else f"{f.default:g}" if isinstance(f.default, float) else f.default
    help = f"{f.metadata['help']} (default: tuned, else {fallback})"
    return f.name, Optional[f.type], field(default=None, metadata={**f.metadata, "help": help})


SEARCH_VALUES = tuple(f.name for f in fields(KnnOptions))


@dataclass(frozen=True)
class _KnnMtOwn:
    """kNN-MT's own options; :data:`KnnMtOptions` adds the search values (after these: the
    command line lists them last)."""
    datastore: Optional[str] = option(None, "a datastore built with 'reluformer-memory datastore build' for this "
                                      "checkpoint (its tuned values are the defaults of the options below)",
                                      flat="knn", metavar="DATASTORE", task="knn_datastore")
    memory: bool = option(False, "per-input datastores (SK-MT, Dai et al. 2023): each sentence's best --knn-memory-k "
                          "matches of the translation memory (--memory), force-decoded at translation time")
    memory_k: int = option(8, "matches per sentence of --knn-memory", metavar="M")
    memory_keys: Optional[str] = option(None, "--knn-memory: read the matches' keys from this datastore (built by the "
                                        "same checkpoint from the memory's corpus) instead of force-decoding them: "
                                        "faster (default: force-decoded)", metavar="DATASTORE")
    batched_search: bool = option(False, "--knn-memory: search each step's per-input datastores with one batched "
                                  "product per sentence (its beams together) instead of per beam row: faster, the "
                                  "same neighbours up to float rounding")
    probe: Optional[int] = option(None, "--knn: IVF lists searched per step (an HNSW index: efSearch); fewer is faster, "
                                  "recalls less (default: as tuned, else the datastore's, 16)", metavar="N")
    search_every: Optional[int] = option(
        None, "--knn: search the index every N steps; in between each beam row reads the successors of its last "
        "neighbours that voted for the token it wrote (chunk-based kNN-MT, Martins et al. 2022): faster, approximate "
        "(default: as tuned, else 1: every step)", metavar="N")
    exact_search: bool = option(False, "--knn: search the datastore as it was built (every step, the index's own probe) "
                                "even where the tuner chose a faster approximate search")
    restrict: Optional[int] = option(
        None, "--knn: each sentence searches only the datastore entries of its M best translation memory matches (the "
        "memory must be the corpus the datastore was built from), exactly, instead of the index over the whole "
        "corpus: faster (default: as tuned, else 0: the whole datastore)", metavar="M")
    skip_confident: Optional[float] = option(
        None, "a beam row whose model gives its best token a probability above P skips the search and keeps the "
        "model's distribution (retrieval skipping, Shi et al. 2023): faster (default: as tuned, else 1: every row "
        "searches)", metavar="P")

    def __post_init__(self):
        self._coerce()
        if self.memory and self.memory_k < 1:
            raise TranslationError(f"--knn-memory-k: expected >= 1 matches per sentence, got {self.memory_k}")
        if self.given() and self.datastore is None and not self.memory:
            names = "/".join(f"--{f.metadata['flat'].replace('_', '-')}" for f in fields(KnnOptions))
            raise TranslationError(f"{names} need --knn DATASTORE or --knn-memory")
        if self.adaptive and self.datastore is None:
            raise TranslationError("--knn-adaptive: the Meta-k network is trained for a corpus datastore; give --knn "
                                   "DATASTORE (per-input datastores of --knn-memory have none)")
        if self.datastore is not None and self.memory:
            raise TranslationError("--knn DATASTORE and --knn-memory: give one of them")
        if self.batched_search and not self.memory:
            raise TranslationError("--knn-batched-search: a search of per-input datastores; give --knn-memory")
        if self.memory_keys is not None and not self.memory:
            raise TranslationError(f"--knn-memory-keys {self.memory_keys}: the keys of per-input datastores; give "
                                   "--knn-memory too")
        self._check_search()
        self._check_skipping()
        self._check_restrict()

    def _coerce(self) -> None:
        """Paths as strings, counts as int, flags as bool (a value read from JSON or given as a Path)."""
        casts = {"datastore": str, "memory_keys": str, "memory": bool, "batched_search": bool, "exact_search": bool,
                 "memory_k": int, "probe": int, "search_every": int, "restrict": int}
        for name, cast in casts.items():
            if getattr(self, name) is not None:
                object.__setattr__(self, name, cast(getattr(self, name)))

    def _check_search(self) -> None:
        if self.probe is not None and (self.probe < 1 or self.datastore is None):
            raise TranslationError(f"--knn-probe {self.probe}: expected >= 1 lists of a --knn DATASTORE's index")
        if self.search_every is not None and (self.search_every < 1 or (self.search_every > 1 and self.datastore is None)):
            raise TranslationError(f"--knn-search-every {self.search_every}: expected >= 1 steps, > 1 only with "
                                   "--knn DATASTORE")
        if self.exact_search and (self.datastore is None or self.probe is not None or self.search_every is not None):
            raise TranslationError("--knn-exact-search: searches a --knn DATASTORE as it was built; give it without "
                                   "--knn-probe / --knn-search-every")

    def _check_skipping(self) -> None:
        value = self.skip_confident  # the messages name the value as given
        if value is None:
            return
        object.__setattr__(self, "skip_confident", float(value))
        if not 0 < self.skip_confident <= 1 or (self.datastore is None and not self.memory):
            raise TranslationError(f"--knn-skip-confident {value}: expected a probability in (0, 1] (1: every "
                                   "row searches), with --knn DATASTORE or --knn-memory")
        if self.skip_confident < 1 and (self.search_every or 1) > 1:
            raise TranslationError(f"--knn-skip-confident {value}: a search every N steps follows every row's "
                                   "neighbours; give it without --knn-search-every")

    def _check_restrict(self) -> None:
        if self.restrict is None:
            return
        if self.restrict < 0 or self.datastore is None:
            raise TranslationError(f"--knn-restrict {self.restrict}: expected >= 0 memory matches per sentence "
                                   "whose entries of a --knn DATASTORE are searched (0: the whole datastore)")
        if self.restrict and (self.exact_search or (self.search_every or 1) > 1 or self.probe is not None):
            raise TranslationError(f"--knn-restrict {self.restrict}: searches the matches' entries exactly; give it "
                                   "without --knn-exact-search / --knn-search-every / --knn-probe")

    def given(self) -> dict:
        return {name: getattr(self, name) for name in SEARCH_VALUES if getattr(self, name) is not None}

    def asks_for_matches(self) -> Optional[Tuple[str, str]]:
        """(the option given, what it reads) when an option needs each sentence's memory matches."""
        if self.memory:
            return "--knn-memory", "per-input datastores"
        return (f"--knn-restrict {self.restrict}", "the entries it searches") if self.restrict else None

    @property
    def needs_memory(self) -> bool:
        """Whether the translator opens the memory: per-input datastores or a restricted search, given or tuned."""
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


KnnMtOptions = make_dataclass("KnnMtOptions", [_given(f) for f in fields(KnnOptions)], bases=(_KnnMtOwn,), frozen=True)
KnnMtOptions.__module__ = __name__
KnnMtOptions.__doc__ = """kNN-MT (Khandelwal et al. 2021): the decoder state of every step looks up its nearest entries
    in a datastore and mixes their next tokens into the model's distribution; any checkpoint
    (docs/KNN_MT.md)"""


def tuned_restriction(datastore: str) -> int:
    """``tuned.full.restrict`` of a datastore directory's description; 0 when there is none (a
    missing or unreadable description is reported when the datastore is opened)."""
    try:
        meta = json.loads((Path(datastore) / "datastore.json").read_text(encoding="utf-8"))
        value = meta.get("tuned", {}).get("full", {}).get("restrict", 0)
    except (OSError, ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


register_guidance("knn", KnnMtOptions, "reluformer_mt.guidance.knn:build_knn")
