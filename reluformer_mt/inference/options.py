"""The translator's options in groups, each a dataclass validated where it is declared: the search
(:class:`DecodingOptions`), the translation memory (:class:`MemoryOptions`) and the guidance parts'
own (:class:`~reluformer_mt.inference.guidance.separators.Separators`,
:class:`~reluformer_mt.inference.guidance.pieces.PiecesOptions`,
:class:`~reluformer_mt.inference.guidance.knn.KnnMtOptions`, and any registered kind).

Every field also has its command-line name (``pieces_weight`` is ``--pieces-weight``; a field's
``flat`` metadata where it differs from the field's name), which ``DocumentTranslator`` takes as a
keyword too, as before the groups, and reluformer-translate takes its defaults from
(:func:`flat_defaults`).
"""
import dataclasses
import os
import warnings
from dataclasses import dataclass, field
from typing import Optional, Sequence

from reluformer_mt.inference.guidance import TranslationError
from reluformer_mt.inference.guidance.knn import KnnMtOptions
from reluformer_mt.inference.guidance.pieces import PiecesOptions
from reluformer_mt.inference.guidance.separators import Separators


MEMORY_CACHE_PRECISIONS = ("float16", "float32")


@dataclass
class DecodingOptions:
    """The search: beam 4, the quick demo's decoding (``reluformer-demo``), so its chapter is
    reproduced with the defaults; segments of the trained length unless ``segment_tokens``."""
    beam: int = 4
    lenpen: float = 1.0
    batch_size: int = 32     # most segments per batch
    max_tokens: int = 4000   # most source tokens per batch (padded)
    max_len_a: float = 1.2   # output length limit a * source + b
    max_len_b: int = 10
    nbest: int = 1
    segment_tokens: Optional[int] = None  # None: prepared.json's; 0: sentence by sentence
    spm_model: Optional[str] = None       # MODEL or SRC,TGT; None: prepared.json's
    fp16: bool = False
    bf16: bool = False
    # the precision of the memory readers' cached keys and values in the C++ decoding step
    # (MemoryReader.step_cache_dtype): float16 halves the bytes a step reads, float32 keeps them exact
    memory_cache: str = "float16"

    def __post_init__(self):
        if self.beam < 1 or self.batch_size < 1 or self.max_tokens < 1:
            raise TranslationError(f"--beam, --batch-size and --max-tokens must be positive, got {self.beam}, "
                                   f"{self.batch_size}, {self.max_tokens}")
        if not 1 <= self.nbest <= self.beam:
            raise TranslationError(f"--nbest {self.nbest}: expected 1 <= N <= --beam ({self.beam}); beam search keeps "
                                   "--beam hypotheses")
        if self.fp16 and self.bf16:
            raise TranslationError("--fp16 and --bf16: give one of them")
        if self.memory_cache not in MEMORY_CACHE_PRECISIONS:
            raise TranslationError(f"--memory-cache {self.memory_cache}: expected one of {', '.join(MEMORY_CACHE_PRECISIONS)}")

    @property
    def precision(self) -> str:
        return "fp16" if self.fp16 else "bf16" if self.bf16 else "fp32"


@dataclass
class MemoryOptions:
    """The translation memory: None = the training split of the checkpoint's data directory, a
    prepared directory, a TMX or TSV file, or "none" (no matches)."""
    memory: Optional[str] = None
    tmx_placeholders: str = "space"  # a TMX memory's placeholders: 'space' or their 'text'
    match_score: Optional[str] = None  # how matches are ranked; None: the one the memory was prepared with
    # TM-first: a sentence whose best match scores >= this is translated by the match's target
    tm_first: Optional[float] = None

    def __post_init__(self):
        from reluformer_mt.memory.score_names import MATCH_SCORES

        if self.match_score is not None and self.match_score not in MATCH_SCORES:
            raise TranslationError(f"--match-score {self.match_score!r}: expected one of {', '.join(MATCH_SCORES)}")
        if self.tm_first is not None and not 0.0 <= self.tm_first <= 1.0:
            raise TranslationError(f"--tm-first {self.tm_first}: expected a match score between 0 and 1 (the "
                                   "threshold above which the match's target is the output)")
        if self.tm_first is not None and self.withheld:
            raise TranslationError("--tm-first copies the translation memory's matches, but --memory is none")
        if self.match_score is not None and self.withheld:
            raise TranslationError(f"--match-score {self.match_score}: ranks the translation memory's matches, but "
                                   "--memory is none; drop one of the two")

    @property
    def withheld(self) -> bool:
        return self.memory == "none"


GROUPS = {"decoding": DecodingOptions, "separators": Separators, "memory": MemoryOptions, "pieces": PiecesOptions,
          "knn": KnnMtOptions}
# the groups given as their plain value, as before: the field that value is
PLAIN = {"separators": "mode", "memory": "memory", "knn": "datastore"}
_RENAMED = {"piece_weight": "pieces_weight", "piece_k": "pieces_k", "piece_max_n": "pieces_max_n"}


def flat_names(cls) -> dict:
    """Command-line name -> field name of an options dataclass."""
    return {f.metadata.get("flat", f.name): f.name for f in dataclasses.fields(cls)}


def flat_defaults() -> dict:
    """Every translator keyword's default (= reluformer-translate's option of the same name)."""
    out = {"device": "auto"}
    for group, cls in GROUPS.items():
        names = {PLAIN[group]: group} if group in PLAIN else {}
        for flat, name in flat_names(cls).items():
            out[names.get(name, flat)] = getattr(cls(), name)
    return out


def _renamed(options: dict) -> dict:
    """The pieces options under their old names (``piece_weight``...), with a DeprecationWarning;
    any other unknown keyword is a TypeError as usual."""
    known = {flat for cls in GROUPS.values() for flat in flat_names(cls)}
    out = {}
    for name, value in options.items():
        if name in _RENAMED:
            warnings.warn(f"DocumentTranslator({name}=...) is now {_RENAMED[name]}=... (the "
                          f"--{_RENAMED[name].replace('_', '-')} option's name)", DeprecationWarning, stacklevel=4)
            name = _RENAMED[name]
        elif name not in known:
            raise TypeError(f"DocumentTranslator() got an unexpected keyword argument {name!r}")
        out[name] = value
    return out


def _group(group: str, given, flat: dict):
    """A group's options: the object given, its plain value (a mode, a path) or the defaults, with
    its fields among the keywords applied (validated again)."""
    cls = GROUPS[group]
    if given is None or not isinstance(given, cls):
        plain = given if given is None or isinstance(given, str) else os.fspath(given)
        given = cls(**({PLAIN[group]: plain} if group in PLAIN and plain is not None else {}))
    fields = {name: flat.pop(f) for f, name in flat_names(cls).items() if f in flat}
    return dataclasses.replace(given, **fields) if fields else given


@dataclass
class TranslatorOptions:
    """Every group of a translator, checked together where groups meet."""
    decoding: DecodingOptions
    separators: Separators
    memory: MemoryOptions
    pieces: PiecesOptions
    knn: KnnMtOptions
    guidance: Sequence = ()  # further guidance options, of registered kinds

    @classmethod
    def of(cls, decoding=None, separators=None, memory=None, pieces=None, knn=None, guidance=(), **options):
        flat = _renamed(options)
        given = {"decoding": decoding, "separators": separators, "memory": memory, "pieces": pieces, "knn": knn}
        groups = {group: _group(group, value, flat) for group, value in given.items()}
        assert not flat, flat  # every known name belongs to one group
        o = cls(**groups, guidance=tuple(guidance))
        if o.knn.memory and o.memory.withheld:
            raise TranslationError("--knn-memory reads the translation memory's matches, but --memory is none")
        return o

    def guidance_options(self) -> list:
        """Every part's options, for :func:`reluformer_mt.inference.guidance.build_guidance`."""
        return [self.knn, self.pieces, self.separators, *self.guidance]

    def needs_memory(self) -> bool:
        return any(getattr(o, "needs_memory", False) for o in self.guidance_options())
