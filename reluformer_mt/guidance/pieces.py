"""Translation pieces as a part of decoding guidance (``--pieces-weight`` etc.): each sentence's
pieces from its memory matches (:mod:`reluformer_mt.guidance.piece_table`), a bonus at
every step. Any model, with or without memory attention; reluformer-translate only (the pieces
come from the translator's memory lookups)."""
import difflib
from typing import List, Optional

import torch

from reluformer_mt.guidance.base import BeamStep, Guidance, GuidanceContext, SourceBatch
from reluformer_mt.guidance.piece_table import PieceTable, sentence_pieces
from reluformer_mt.guidance.pieces_options import PiecesOptions


class TranslationPiecesGuide(Guidance):
    """The pieces' bonus: a :class:`PieceTable` of each generate call's sources, one set of
    pieces per sentence, read by the sentence each row is writing."""
    stage = "bonus"

    def __init__(self, options: PiecesOptions, context: GuidanceContext):
        super().__init__()
        self.options, self.memory, self.reads_memory = options, context.lookup, context.reads_memory
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
    return TranslationPiecesGuide(options, context) if options.weight and context.lookup is not None else None
