"""What every kind of decoding guidance shares: the step it acts on, the part interface, the one
builder, and the beam search that applies the parts.

A *part* (:class:`Guidance`) acts on each beam step's next-token scores in place: it may replace
the distribution (kNN-MT's mixture), add to it (the translation pieces' bonus) or rule tokens out
(the separator constraint); a part may also act on what the model is given (memory reading: a
memory model's matches) or on the finished translations (TM-first). A *kind* of part is its options dataclass, validated where it is
declared, and a build function, joined by
:func:`~reluformer_mt.guidance.declared.register_guidance`; :func:`build_guidance` turns a
list of options into the parts that apply, ordered by their stage, and :func:`install_guidance`
wraps the search fairseq's generator built (beam search, sampling, constraints...) in a
:class:`GuidedSearch` that applies them first. reluformer-translate
(``DocumentTranslator``) and fairseq-generate/-interactive (the task's ``build_generator``) both
build their decoder's guidance this way.
"""
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from fairseq.search import Search
from torch import Tensor

from reluformer_mt.guidance.declared import TranslationError
from reluformer_mt.guidance.kinds import group_of

# the order in which the parts act: "input" parts on the model's inputs before the search (memory
# reading); at a step, a mixture replaces the distribution, a bonus is added to the mixed one, and
# the constraints rule tokens out of the result; "finish" parts act on the finished translations
# only (TM-first)
STAGES = ("input", "mixture", "bonus", "constraint", "finish")


@dataclass
class GuidanceContext:
    """What parts are built from: the models (the first one's decoder states), the task and its
    dictionaries, the device the models are on; in reluformer-translate also the translation
    memory's lookup, the checkpoint's name and the separators of the segments."""
    models: list
    task: object
    device: str                    # where the models are (resolved: cpu, cuda:N)
    checkpoint: Optional[str] = None
    lookup: object = None          # the memory's reluformer_mt.inference.memory.MemoryLookup, or None
    reads_memory: bool = False     # the model reads its matches (trained with --tm-fusion)
    separator: Optional[str] = None  # the token between the sentences of a segment
    segmented: bool = False          # sources are segments of sentences (not sentence by sentence)
    decode_tokens: Optional[int] = None  # most source tokens per force-decoding batch (the translator's)
    sp_src: object = None          # the source SentencePiece processor
    # each generate call starts the parts with its sources' memory matches (reluformer-translate);
    # fairseq-generate starts none, so a part that reads matches is refused there
    looks_up_matches: bool = False

    @property
    def tgt_dict(self):
        return self.task.target_dictionary

    @property
    def src_dict(self):
        return self.task.source_dictionary

    def separator_ids(self) -> Optional[Tuple[int, int]]:
        """(source, target) ids of the separator, None without one in the target dictionary."""
        if self.separator is None or self.tgt_dict.index(self.separator) == self.tgt_dict.unk():
            return None
        return self.src_dict.index(self.separator), self.tgt_dict.index(self.separator)


@dataclass
class SourceBatch:
    """The sources of one generate call, indexed as fairseq's ``sample["id"]``: their token ids and,
    in reluformer-translate, each source's translation units (the (document, unit) keys of its
    sentences) with the memory's matches and source words of every unit."""
    sources: Sequence[Tensor]
    units: Optional[Sequence[Sequence[Tuple[int, int]]]] = None
    matches: Dict = field(default_factory=dict)     # (document, unit) -> (ids, fuzzy scores), best first
    unit_words: Dict = field(default_factory=dict)  # (document, unit) -> source words
    memory_tokens: Optional[Sequence[Tensor]] = None  # each source's memory tokens, where the caller gives them


class BeamStep:
    """One beam step as the parts see it: ``lprobs`` (rows, vocab), edited in place, rows
    sentence-major (a sentence's beams are consecutive rows); ``prefix`` (rows, steps) the tokens so
    far, starting with the one fairseq puts first; ``sources`` (rows,) each row's source (its
    ``sample["id"]``); ``required`` (rows,) the separators each row's source needs, None where the
    separators are not kept; ``sentences`` (rows,) the separators each row has written."""

    def __init__(self, lprobs: Tensor, prefix: Tensor, batch_ids: Tensor, beam_size: int, eos: int,
                 separator: Optional[int], required: Optional[Tensor]):
        self.lprobs, self.prefix, self.eos, self.separator = lprobs, prefix, eos, separator
        self.sources = batch_ids.repeat_interleave(beam_size)
        self.required = None if required is None else required.to(batch_ids.device)[batch_ids].repeat_interleave(beam_size)
        self._sentences = None

    @property
    def sentences(self) -> Tensor:
        if self._sentences is None:
            self._sentences = (self.prefix == self.separator).sum(dim=1)
        return self._sentences


class Guidance:
    """A part acting on each beam step's scores (:meth:`apply`, in place). :meth:`start` is called
    before each generate call of reluformer-translate with the sources to come (fairseq-generate
    calls none: a part that needs it is a translator's only); :attr:`stats` joins the translator's
    summary; :attr:`memory_k`: the memory matches per sentence the part reads."""
    stage = "constraint"
    memory_k = 0

    def __init__(self):
        self.stats: Counter = Counter()

    def start(self, batch: SourceBatch) -> None:
        """Prepare for ``batch`` (per-source tables, datastores)."""

    def apply(self, step: BeamStep) -> None:
        raise NotImplementedError

    def inputs(self, dataset, batch: SourceBatch):
        """The dataset of ``batch``'s sources as the model is to read it (reluformer-translate; a
        step part leaves it as it is)."""
        return dataset

    def finish(self, documents: list, nbest: int) -> list:
        """The translations of a translate() call (documents of ``SentenceResult``), as the part
        leaves them (reluformer-translate; a step part leaves them as they are)."""
        return documents

    def describe(self) -> str:
        """What the part does, for the translator's description ('' for nothing to say)."""
        return ""


def build_guidance(options: Sequence, context: GuidanceContext) -> List[Guidance]:
    """The parts the ``options`` ask for (each an options object of a registered kind), ordered by
    stage (a stage's parts in the given order). Where the context looks up no memory matches
    (fairseq-generate), an option that needs them is refused in one line naming it."""
    parts = []
    for o in options:
        kind = group_of(o)
        asks = getattr(o, "asks_for_matches", lambda: None)()
        if asks and not context.looks_up_matches:
            raise TranslationError(f"{asks[0]}: {asks[1]} come from each sentence's translation memory matches, "
                                   "which only reluformer-translate looks up (fairseq-generate has none)")
        part = kind.builder()(o, context)
        if part is not None:
            parts.append(part)
    return sorted(parts, key=lambda part: STAGES.index(part.stage))


class GuidedSearch(Search):
    """The search fairseq built (beam search, sampling, lexical constraints, diverse beam search...)
    with the guidance parts applied, in order, to the scores it is given at every step: the parts
    edit the step's log-probabilities, then the search fairseq chose picks from them, so its own
    behaviour (and any state it keeps, e.g. the constraints') is untouched.
    A part with ``separator_ids`` (source, target) keeps the segments' separators: then
    :meth:`start` counts each source's separators (what :attr:`BeamStep.required` reads).
    With ``limits`` (reluformer-translate), each source's own length limit: fairseq's generator
    computes one limit per batch from the padded source length, so a source's output (and whether
    it falls back) would depend on the sources batched with it."""

    def __init__(self, inner: Search, tgt_dict, parts: Sequence[Guidance]):
        super().__init__(tgt_dict)
        self.inner = inner
        self.supports_constraints, self.stop_on_max_len = inner.supports_constraints, inner.stop_on_max_len
        self.needs_src_lengths = getattr(inner, "needs_src_lengths", False)
        self.parts = list(parts)
        self.separators = next((p.separator_ids for p in self.parts if getattr(p, "separator_ids", None)), None)
        self.required: Optional[Tensor] = None
        self.limits: Optional[Tensor] = None

    def start(self, batch: SourceBatch, device: str = "cpu", limits: Optional[Sequence[int]] = None) -> None:
        """``limits``: each source's length limit (the step from which only EOS may follow), by sample["id"]."""
        if self.separators is not None:  # looked up by sample["id"], i.e. the index into the sources
            self.required = torch.tensor([int((s == self.separators[0]).sum()) for s in batch.sources], device=device)
        self.limits = None if limits is None else torch.tensor(list(limits), device=device)
        for part in self.parts:
            part.start(batch)

    def _limit_lengths(self, step: int, lprobs: Tensor, original_batch_idxs: Tensor) -> None:
        """Only EOS for the sentences at their own limit, as fairseq's generator does at the batch's
        (and, like it, before the parts act)."""
        if self.limits is None:
            return
        over = self.limits[original_batch_idxs.to(self.limits.device)].to(lprobs.device) <= step
        if bool(over.any()):
            lprobs[over, :, :self.eos] = -math.inf
            lprobs[over, :, self.eos + 1:] = -math.inf

    def step(self, step: int, lprobs, scores: Optional[Tensor], prev_output_tokens: Optional[Tensor] = None,
             original_batch_idxs: Optional[Tensor] = None, **more):
        assert original_batch_idxs is not None and prev_output_tokens is not None
        bsz, beam_size, vocab_size = lprobs.size()
        self._limit_lengths(step, lprobs, original_batch_idxs)
        separator = self.separators[1] if self.separators is not None else None
        view = BeamStep(lprobs.view(bsz * beam_size, vocab_size), prev_output_tokens, original_batch_idxs, beam_size,
                        self.eos, separator, self.required if separator is not None else None)
        for part in self.parts:
            part.apply(view)
        return self.inner.step(step, lprobs, scores, prev_output_tokens, original_batch_idxs, **more)

    # the rest of the search's interface is the wrapped search's
    def set_src_lengths(self, src_lengths):
        self.inner.set_src_lengths(src_lengths)

    def init_constraints(self, batch_constraints: Optional[Tensor], beam_size: int):
        self.inner.init_constraints(batch_constraints, beam_size)

    def prune_sentences(self, batch_idxs: Tensor):
        self.inner.prune_sentences(batch_idxs)

    def update_constraints(self, active_hypos: Tensor):
        self.inner.update_constraints(active_hypos)


def install_guidance(generator, parts: Sequence[Guidance], always: bool = False) -> Optional[GuidedSearch]:
    """Wrap the search of ``generator`` (fairseq's SequenceGenerator, with the search its options
    chose) in a :class:`GuidedSearch` of ``parts``; nothing to guide keeps it as it is unless
    ``always`` (reluformer-translate: its per-source length limits). Returns the search object (or None)."""
    if (not parts and not always) or not hasattr(generator, "search"):
        return None
    generator.search = GuidedSearch(generator.search, generator.tgt_dict, parts)
    return generator.search
