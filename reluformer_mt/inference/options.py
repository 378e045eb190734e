"""The translator's options, each declared once, in groups owned by the part that reads them: the
resources (:class:`ResourceOptions`), the search (:class:`SearchOptions`), the device and precision
(:class:`PrecisionOptions`), the translation memory (:class:`MemoryOptions`) and every registered
kind of decoding guidance (kNN-MT, the translation pieces, the separator constraint, TM-first:
:mod:`reluformer_mt.guidance.kinds`).

:class:`TranslatorOptions` assembles them from ``DocumentTranslator``'s keywords: a group object
under the group's name (``search=SearchOptions(beam=5)``), a group's plain value under its name
(``knn="DIR"``, ``memory="tm.tmx"``) or any field under its keyword (``beam=5``,
``pieces_weight=0.5``), which is also reluformer-translate's option (``--pieces-weight``). Imports
neither torch nor fairseq (:mod:`reluformer_mt.guidance.declared`).
"""
import dataclasses
import functools
import importlib.util
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from reluformer_mt.data.segmentation import parse_segment_tokens
from reluformer_mt.guidance.declared import TranslationError, keyword, number, option
from reluformer_mt.guidance.kinds import group_of, groups, register_group
from reluformer_mt.guidance.tm_first_options import TmFirstOptions  # noqa: F401  (re-exported)

MEMORY_CACHE_PRECISIONS = ("float16", "float32")
_RENAMED = {"piece_weight": "pieces_weight", "piece_k": "pieces_k", "piece_max_n": "pieces_max_n"}


@dataclass(frozen=True)
class ResourceOptions:
    """Where the checkpoint's resources come from when not from prepared.json."""
    spm_model: Optional[str] = option(None, "the one prepared.json names")  # MODEL or SRC,TGT (--spm-model's syntax)
    segment_tokens: Optional[int] = option(None, "segment length in source tokens, or 'sentence' (default: the "
                                           "trained length from prepared.json)", parse=parse_segment_tokens)


@dataclass(frozen=True)
class SearchOptions:
    """The beam search and its batches."""
    beam: int = option(4, "beam size (4: the demo's decoding)")
    nbest: int = option(1, "write the N best translations of every sentence instead, Moses' n-best format: 'SENTENCE "
                        "||| translation ||| score' (0-based sentence number over the input, mean token log-probability "
                        "in natural log, where fairseq-generate prints base 2), best first; N <= --beam", metavar="N")
    lenpen: float = option(1.0, "length penalty")
    batch_size: int = option(32, "most segments per batch")
    max_tokens: int = option(4000, "most source tokens per batch (padded)")
    max_len_a: float = option(1.2, "output length limit a * source + b", parse=number(float, 0.0))
    max_len_b: int = option(10, "see --max-len-a", parse=number(int, 0, what="an integer"))

    def __post_init__(self):
        if self.beam < 1 or self.batch_size < 1 or self.max_tokens < 1:
            raise TranslationError(f"--beam, --batch-size and --max-tokens must be positive, got {self.beam}, "
                                   f"{self.batch_size}, {self.max_tokens}")
        if not 1 <= self.nbest <= self.beam:
            raise TranslationError(f"--nbest {self.nbest}: expected 1 <= N <= --beam ({self.beam}); beam search keeps "
                                   "--beam hypotheses")


@dataclass(frozen=True)
class PrecisionOptions:
    """The device and the precision of the models (and of a memory reader's cache)."""
    device: str = option("auto", "auto (CUDA when available, else CPU), cpu, cuda or cuda:N")
    fp16: bool = option(False, "half precision (float16) on CUDA; an error on the CPU")
    bf16: bool = option(False, "bfloat16 on CUDA; an error on the CPU")
    # float16 halves the bytes a step reads, float32 keeps them exact
    memory_cache: str = option("float16", "precision of a memory-attention model's cached memory keys and values in "
                               "the CPU decoding step: float16 (default) reads half the bytes a step (the step's "
                               "arithmetic stays float32; docs/TRANSLATION_MEMORY.md#translation-with-memory-attention),"
                               " float32 keeps them as computed", choices=MEMORY_CACHE_PRECISIONS)

    def __post_init__(self):
        if self.fp16 and self.bf16:
            raise TranslationError("--fp16 and --bf16: give one of them")
        if self.memory_cache not in MEMORY_CACHE_PRECISIONS:
            raise TranslationError(f"--memory-cache {self.memory_cache}: expected one of "
                                   f"{', '.join(MEMORY_CACHE_PRECISIONS)}")

    @property
    def precision(self) -> str:
        return "fp16" if self.fp16 else "bf16" if self.bf16 else "fp32"


@functools.lru_cache(maxsize=None)
def match_scores() -> tuple:
    """``MATCH_SCORES`` of reluformer_mt/memory/score_names.py, a module of constants loaded from its
    file: importing it by name imports the memory package, and torch with it."""
    path = Path(__file__).resolve().parents[1] / "memory" / "score_names.py"
    spec = importlib.util.spec_from_file_location("reluformer_mt_score_names", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MATCH_SCORES


@dataclass(frozen=True)
class MemoryOptions:
    """The translation memory the matches come from and how they are ranked."""
    memory: Optional[str] = option(None, "the memory to retrieve matches from: a prepared directory (its training "
                                   "split), a TMX file (languages from the checkpoint) or a 'source<TAB>target' TSV "
                                   "file (default: the training split of the checkpoint's data directory); 'none' "
                                   "translates without matches", metavar="DIR|FILE.tmx|FILE.tsv")
    tmx_placeholders: str = option("space", "a TMX memory's placeholders (<ph>, <ut>): a space where they stood between "
                                   "words, or their own text (Value<ph>{0}</ph>here: 'Value here' or 'Value {0} here')",
                                   choices=("space", "text"))
    match_score: Optional[str] = option(None, "how the memory ranks its matches (default: the score the checkpoint's "
                                        "data directory was prepared with; bm25-chars for a directory prepared without "
                                        "memory, words for one prepared before the score was recorded; "
                                        "docs/TRANSLATION_MEMORY.md)", metavar="SCORE", choices=match_scores())

    def __post_init__(self):
        if self.memory is not None and not isinstance(self.memory, str):
            object.__setattr__(self, "memory", os.fspath(self.memory))
        if self.match_score is not None and self.match_score not in match_scores():
            raise TranslationError(f"--match-score {self.match_score!r}: expected one of {', '.join(match_scores())}")
        if self.match_score is not None and self.withheld:
            raise TranslationError(f"--match-score {self.match_score}: ranks the memory's matches, which --memory "
                                   "none withholds; drop one of the two")

    @property
    def withheld(self) -> bool:
        return self.memory == "none"


register_group("resources", ResourceOptions, "resources")
register_group("search", SearchOptions, "search")
register_group("precision", PrecisionOptions, "search")
register_group("memory", MemoryOptions, "memory")


def flat_defaults() -> dict:
    """Every translator keyword's default (= reluformer-translate's option of the same name)."""
    return {keyword(g, f): f.default for g in groups() for f in dataclasses.fields(g.options)}


def _renamed(keywords: dict, known) -> dict:
    """The pieces options under their old names (``piece_weight``...), with a DeprecationWarning;
    any other unknown keyword is a TypeError as usual."""
    out = {}
    for name, value in keywords.items():
        if name in _RENAMED:
            warnings.warn(f"DocumentTranslator({name}=...) is now {_RENAMED[name]}=... (the "
                          f"--{_RENAMED[name].replace('_', '-')} option's name)", DeprecationWarning, stacklevel=4)
            name = _RENAMED[name]
        elif name not in known:
            raise TypeError(f"DocumentTranslator() got an unexpected keyword argument {name!r}")
        out[name] = value
    return out


def _assemble(group, given, flat: dict):
    """A group's options: the object given (under the group's name or in ``guidance``) or the
    defaults, with its fields among the keywords applied (validated again)."""
    names = group.flat_names()
    fields = {names[k]: flat.pop(k) for k in list(flat) if k in names}
    if given is None:
        return group.options(**fields)
    return dataclasses.replace(given, **fields) if fields else given


class TranslatorOptions:
    """Every group of a translator's options, by name (``options.search.beam``, ``options.knn``),
    checked together where groups meet."""

    def __init__(self, groups_by_name: dict):
        self.groups = dict(groups_by_name)

    def __getattr__(self, name):
        try:
            return self.__dict__["groups"][name]
        except KeyError:
            raise AttributeError(name) from None

    @classmethod
    def of(cls, guidance: Sequence = (), **keywords) -> "TranslatorOptions":
        """From ``DocumentTranslator``'s keywords: group objects, plain values and field keywords;
        ``guidance``: options objects of registered kinds."""
        registered = groups()
        objects = {group_of(o).name: o for o in guidance}
        for g in registered:  # a group's plain value (knn="DIR") is its field of the group's name
            if isinstance(keywords.get(g.name), g.options):
                objects[g.name] = keywords.pop(g.name)
        flat = _renamed(keywords, {k for g in registered for k in g.flat_names()})
        o = cls({g.name: _assemble(g, objects.get(g.name), flat) for g in registered})
        o.check()
        return o

    def check(self) -> None:
        """What no group can check alone: a part that reads the memory's matches with ``--memory none``."""
        if not self.memory.withheld:
            return
        for options in self.guidance_options():
            asks = getattr(options, "asks_for_matches", lambda: None)()
            if asks:
                raise TranslationError(f"{asks[0]}: {asks[1]} come from the memory, which --memory none withholds; "
                                       "drop one of the two")

    def guidance_options(self) -> list:
        """Every guidance kind's options, in registration order, for
        :func:`reluformer_mt.guidance.build_guidance`."""
        return [self.groups[g.name] for g in groups() if g.guidance and g.name in self.groups]

    def needs_memory(self) -> bool:
        return any(getattr(o, "needs_memory", False) for o in self.guidance_options())

    def keywords(self) -> dict:
        """Every option under its keyword, as ``DocumentTranslator`` takes it."""
        return {keyword(g, f): getattr(self.groups[g.name], f.name) for g in groups() if g.name in self.groups
                for f in dataclasses.fields(g.options)}
