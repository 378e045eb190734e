"""Translation pieces as a part of decoding guidance (``--pieces-weight`` etc.): each sentence's
pieces from its memory matches (:mod:`reluformer_mt.inference.guidance.piece_table`), a bonus at
every step. Any model, with or without memory attention; reluformer-translate only (the pieces
come from the translator's memory lookups)."""
import difflib
import math
from dataclasses import dataclass, field
from typing import List, Optional

import torch

from reluformer_mt.inference.guidance.base import (BeamStep, Guidance, GuidanceContext, SourceBatch, TranslationError,
                                                   register_guidance)
from reluformer_mt.inference.guidance.piece_table import PieceTable, sentence_pieces


@dataclass
class PiecesOptions:
    """Translation pieces (Zhang et al. 2018); ``weight`` 0 is off. The command line's names are
    ``--pieces-weight`` etc. (field metadata ``flat``)."""
    weight: float = field(default=0.0, metadata={"flat": "pieces_weight"})
    k: int = field(default=8, metadata={"flat": "pieces_k"})          # matches per sentence whose n-grams are pieces
    max_n: int = field(default=4, metadata={"flat": "pieces_max_n"})  # longest piece, in tokens
    floor: float = field(default=0.0, metadata={"flat": "pieces_floor"})  # only matches of fuzzy >= floor give pieces
    aligned: bool = field(default=False, metadata={"flat": "pieces_aligned"})  # only words aligned to shared source words
    # a hypothesis must end the sentence it writes (only the separator or EOS may follow) once it is this
    # many times the sentence's expected length: a length control against hypotheses that follow pieces
    # to the length limit (then the segment is decoded again as halves); 0: off
    length_cap: float = field(default=0.0, metadata={"flat": "pieces_length_cap"})

    def __post_init__(self):
        weight, floor = self.weight, self.floor
        self.weight, self.floor, self.aligned = float(weight), float(floor), bool(self.aligned)
        if not math.isfinite(self.weight) or self.weight < 0:
            raise TranslationError(f"--pieces-weight: expected a finite number >= 0, got {weight}")
        if not 0 <= self.floor <= 1:
            raise TranslationError(f"--pieces-floor: expected a fuzzy score between 0 and 1, got {floor}")
        cap = self.length_cap
        self.length_cap = float(cap)
        if not math.isfinite(self.length_cap) or (self.length_cap != 0 and self.length_cap < 1):
            raise TranslationError(f"--pieces-length-cap: expected 0 (off) or a factor >= 1 of the expected length, got {cap}")
        if self.length_cap and not self.weight:
            raise TranslationError("--pieces-length-cap: only with translation pieces (--pieces-weight W > 0)")
        if self.aligned and not self.weight:
            raise TranslationError("--pieces-aligned: only with translation pieces (--pieces-weight W > 0)")
        if self.aligned:
            from reluformer_mt.evaluation.statistical_aligner import available

            if not available():
                raise TranslationError("--pieces-aligned: the word alignment of the memory needs eflomal "
                                       "(pip install eflomal)")
        k, max_n = self.k, self.max_n
        self.k, self.max_n = int(k), int(max_n)
        if self.k < 1 or not 1 <= self.max_n <= 8:
            raise TranslationError(f"--pieces-k {k} / --pieces-max-n {max_n}: expected k >= 1 and 1 <= n <= 8")

    @property
    def needs_memory(self) -> bool:
        return bool(self.weight)


class TranslationPiecesGuide(Guidance):
    """The pieces' bonus: a :class:`PieceTable` of each generate call's sources, one set of
    pieces per sentence, read by the sentence each row is writing."""
    stage = "bonus"

    def __init__(self, options: PiecesOptions, context: GuidanceContext):
        super().__init__()
        self.options, self.memory, self.reads_memory = options, context.memory, context.reads_memory
        self.memory_k = options.k
        tgt = self.tgt_dict = context.tgt_dict
        separator = tgt.index(context.separator) if context.separator else tgt.unk()
        self.exclude = (tgt.pad(), tgt.eos(), separator)  # never in a piece
        # what a sentence at its length cap may write: EOS, or the separator (the separator constraint keeps
        # the one a segment's row needs)
        self.ends = [tgt.eos()] + ([separator] if separator != tgt.unk() else [])
        # a segment's rows are rewarded by the pieces of the sentence they write
        self.table_separator = separator if context.segmented and separator != tgt.unk() else None
        self.table: Optional[PieceTable] = None

    def start(self, batch: SourceBatch) -> None:
        if batch.units is None:
            self.table = None
            return
        pieces = [[self.sentence_pieces(batch, key) for key in units] for units in batch.units]
        self.table = PieceTable(pieces, len(self.tgt_dict), self.table_separator)

    def apply(self, step: BeamStep) -> None:
        if self.table is not None:
            at_cap = self.table.add_bonus(step.lprobs, step.prefix, step.sources, self.options.weight,
                                          self.options.length_cap, self.ends)
            if self.options.length_cap:  # (no line for an option that is off)
                self.stats["pieces: beam steps made to end their sentence (--pieces-length-cap)"] += at_cap

    def sentence_pieces(self, batch: SourceBatch, key):
        """The pieces of one translation unit: its top ``k`` entries that reach the fuzzy floor; with
        ``aligned``, only the target words of each entry that are aligned with a source word the
        sentence shares with it."""
        o, words = self.options, self.memory.entries.sources
        unit_words = batch.unit_words[key]
        entries = []
        for entry, score in zip(*(a[:o.k] for a in batch.matches[key])):
            if entry < 0:
                continue
            tokens = self.memory.tokens[entry]
            described = (tokens, float(score), len(words[entry].split()))
            if o.aligned:
                described += (self.aligned_tokens(unit_words, int(entry), tokens),)
            entries.append(described)
        return sentence_pieces(entries, self.exclude, o.max_n, o.floor, source_length=len(unit_words))

    def aligned_tokens(self, unit_words: List[str], entry: int, tokens: torch.Tensor) -> List[bool]:
        """Which target tokens of a memory entry may be in a piece (Zhang et al. 2018): the tokens of
        target words that the memory's word alignment links to a source word left unedited by the
        edit alignment of the entry's source with the sentence's (difflib's matching blocks)."""
        links = self.memory.word_links()[entry]
        match_words = self.memory.entries.sources[entry].split()
        blocks = difflib.SequenceMatcher(None, unit_words, match_words, autojunk=False).get_matching_blocks()
        unedited = {b + n for _, b, size in blocks for n in range(size)}
        kept_words = {j for i, j in links if i in unedited}
        # each token's target word: SentencePiece marks a word's first piece
        word, kept = -1, []
        for t in tokens.tolist():
            if self.tgt_dict[t].startswith("\u2581"):
                word += 1
            kept.append(max(word, 0) in kept_words)
        if word + 1 != len(self.memory.entries.targets[entry].split()):
            self.stats["pieces: matches whose words and tokens disagree (no aligned pieces)"] += 1
            return [False] * len(kept)
        return kept

    def describe(self) -> str:
        o = self.options
        return (f"translation pieces (n <= {o.max_n}) of the top {o.k} matches"
                + (f" with fuzzy >= {o.floor:g}" if o.floor else "") + f", weight {o.weight:g}"
                + (f", sentences ended at {o.length_cap:g}x their expected length" if o.length_cap else "")
                + ("" if self.reads_memory else f", from {self.memory.entries.summary()}"))


def build_pieces(options: PiecesOptions, context: GuidanceContext):
    """The bonus when a weight is given and the translator consults a memory."""
    return TranslationPiecesGuide(options, context) if options.weight and context.memory is not None else None


register_guidance("pieces", PiecesOptions, build_pieces)
