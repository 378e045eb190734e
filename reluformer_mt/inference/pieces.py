"""Translation pieces: decoding guided by the n-grams of a translation memory's matches.

Zhang et al. (NAACL 2018, arXiv:1804.02559), "Guiding Neural Machine Translation with Retrieved
Translation Pieces": the n-grams (n = 1..4) of the retrieved targets are collected, each weighted
by the similarity of its sentence's source to the input, and at every decoding step a candidate
token earns a bonus of lambda times the summed weights of the pieces it completes (the n-gram of
the last n - 1 tokens and itself, for every n). Nothing is trained: any model, with or without
memory attention, can be guided this way, and lambda = 0 is plain beam search.

Our choices where the paper leaves them or where we lack its parts: a piece's weight is the
fuzzy-match score of the best match containing it (the paper uses a similarity of the same kind);
all n-grams of a match are pieces (the paper keeps those aligned with the unedited source words,
which needs a word aligner at translation time); the entry markers and separators never belong to
a piece.

Documents (issue 32: pieces pooled over a segment's sentences made hypotheses paste a later
verse's match into an earlier one, run to the length limit and fall back): a segment keeps one
set of pieces *per sentence*, and a hypothesis is rewarded only by the pieces of the sentence it
is writing (the separators it has written so far say which); a token's cap counts its copies in
that sentence only; no bonus once that sentence is as long as its longest match (the expected
length, read from the matches), for a separator or EOS; and only matches whose fuzzy score
reaches a floor (``--pieces-floor``, tuned with the weight) give pieces, so a 0.2-fuzzy match of
an unrelated verse no longer pastes its words.
"""
from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor


class TranslationPieces:
    """The pieces of one source: every n-gram (n <= ``max_n``) of its entries with the best weight
    of an entry holding it, and each token's cap (see :func:`pieces_of_entries`)."""

    def __init__(self, entries: Iterable[Tuple[Sequence[int], float]], cap: Dict[int, int], max_n: int = 4,
                 expected_length: Optional[int] = None):
        if max_n < 1:
            raise ValueError(f"translation pieces: expected max n >= 1, got {max_n}")
        self.max_n = max_n
        self.best: Dict[Tuple[int, ...], float] = {}
        for tokens, weight in entries:
            tokens = [int(t) for t in tokens]
            for n in range(1, max_n + 1):
                for i in range(len(tokens) - n + 1):
                    gram = tuple(tokens[i:i + n])
                    if weight > self.best.get(gram, 0.0):
                        self.best[gram] = float(weight)
        # a token earns the bonus only while the hypothesis holds fewer copies of it than the
        # matches suggest (``cap``): without a cap beam search loops on rewarded n-grams
        self.cap = dict(cap)
        # no bonus once the sentence is this long (None: no limit)
        self.expected_length = expected_length

    def __len__(self) -> int:
        return len(self.best)


class PieceTable:
    """The pieces of a batch's sources as tensors, so that one decoding step rewards all rows with a
    few tensor operations. A source has one :class:`TranslationPieces` per sentence (a segment) or
    one in all; each (source, sentence) is a *unit*: unigram bonuses, caps and expected lengths as
    (units, vocab) rows, longer pieces as sorted keys (unit, the n - 1 previous tokens) searched
    with ``searchsorted``. With a ``separator``, a row is rewarded by the unit of the sentence it is
    writing: its number of separators so far."""

    def __init__(self, pieces: Sequence, vocab: int, separator: Optional[int] = None):
        self.vocab, self.separator = vocab, separator
        units: List[Optional[TranslationPieces]] = []
        self.first_unit, self.n_units = [], []
        for p in pieces:
            sentences = list(p) if isinstance(p, (list, tuple)) else [p]
            self.first_unit.append(len(units))
            self.n_units.append(max(1, len(sentences)))
            units += sentences or [None]
        self.first_unit = torch.tensor(self.first_unit, dtype=torch.long)
        self.n_units = torch.tensor(self.n_units, dtype=torch.long)
        present = [p for p in units if p is not None]
        self.max_n = max((p.max_n for p in present), default=1)
        if len(units) * float(vocab) ** (self.max_n - 1) >= 2 ** 62:
            raise ValueError(f"translation pieces: {vocab} tokens and n <= {self.max_n} do not fit 64-bit keys; "
                             "lower --pieces-max-n")
        self.unigram = torch.zeros(len(units), vocab)
        self.cap = torch.zeros(len(units), vocab, dtype=torch.long)
        big = torch.iinfo(torch.long).max
        self.expected_length = torch.tensor([big if p is None or p.expected_length is None else p.expected_length
                                             for p in units], dtype=torch.long)
        grams = {n: ([], [], []) for n in range(2, self.max_n + 1)}  # keys, tokens, weights
        for unit, p in enumerate(units):
            if p is None:
                continue
            for token, count in p.cap.items():
                self.cap[unit, token] = count
            for gram, weight in p.best.items():
                if len(gram) == 1:
                    self.unigram[unit, gram[0]] = weight
                else:
                    keys, tokens, weights = grams[len(gram)]
                    keys.append(self._key(unit, gram[:-1]))
                    tokens.append(gram[-1])
                    weights.append(weight)
        self.grams = {}
        for n, (keys, tokens, weights) in grams.items():
            if keys:
                keys, order = torch.sort(torch.tensor(keys, dtype=torch.long))
                self.grams[n] = (keys, torch.tensor(tokens, dtype=torch.long)[order],
                                 torch.tensor(weights, dtype=torch.float32)[order])

    def _key(self, unit: int, prefix: Sequence[int]) -> int:
        key = unit
        for t in prefix:
            key = key * self.vocab + int(t)
        return key

    def add_bonus(self, lprobs: Tensor, prefix: Tensor, sources: Tensor, weight: float) -> Tensor:
        """``lprobs`` (rows, vocab) += ``weight`` x each row's bonus, in place; ``prefix`` (rows,
        steps) starts with the token fairseq puts first; ``sources`` (rows,) index the table."""
        if weight == 0:
            return lprobs
        device = lprobs.device
        history, sources = prefix[:, 1:].cpu(), sources.cpu()
        rows = lprobs.size(0)
        # the sentence each row is writing, and which of its tokens belong to that sentence
        if self.separator is not None and history.size(1):
            is_sep = history == self.separator
            sentence = is_sep.sum(dim=1)
            current = is_sep.flip(1).cumsum(1).flip(1) == 0
        else:
            sentence = torch.zeros(rows, dtype=torch.long)
            current = torch.ones_like(history, dtype=torch.bool)
        units = self.first_unit[sources] + torch.minimum(sentence, self.n_units[sources] - 1)
        bonus = self.unigram[units].clone()  # (rows, vocab)
        for n, (keys, tokens, weights) in self.grams.items():
            if history.size(1) < n - 1:
                continue
            row_keys = units.clone()
            for t in history[:, history.size(1) - (n - 1):].unbind(1):
                row_keys = row_keys * self.vocab + t
            lo = torch.searchsorted(keys, row_keys)
            hi = torch.searchsorted(keys, row_keys, right=True)
            counts = hi - lo
            if int(counts.sum()) == 0:
                continue
            which = torch.repeat_interleave(torch.arange(rows), counts)
            starts = torch.repeat_interleave(lo - torch.cumsum(counts, 0) + counts, counts)
            entries = starts + torch.arange(len(which))
            bonus.index_put_((which, tokens[entries]), weights[entries], accumulate=True)
        used = torch.zeros(rows, self.vocab, dtype=torch.long).scatter_add_(1, history, current.long())
        bonus *= used < self.cap[units]
        bonus *= (current.sum(dim=1) < self.expected_length[units]).unsqueeze(1)
        lprobs += (weight * bonus).to(device, lprobs.dtype)
        return lprobs


def sentence_pieces(entries: Sequence[Tuple[Tensor, float]], exclude: Sequence[int] = (), max_n: int = 4,
                    floor: float = 0.0) -> Optional[TranslationPieces]:
    """Pieces of one sentence from its retrieved entries, (target token ids, fuzzy score) each:
    only entries scoring at least ``floor`` count (None if none does). An ``exclude``d token
    (padding, EOS, the separator) ends a piece; a token's cap is the most copies of it one entry
    holds; the expected length is the longest entry's."""
    kept = [(tokens, score) for tokens, score in entries if score >= floor]
    if not kept:
        return None
    excluded = set(int(t) for t in exclude)
    parts, cap, longest = [], defaultdict(int), 0
    for tokens, score in kept:
        ids = [t for t in tokens.tolist()]
        real = [t for t in ids if t not in excluded]
        longest = max(longest, len(real))
        for t in set(real):
            cap[t] = max(cap[t], real.count(t))
        part = []
        for t in ids + [None]:
            if t is None or t in excluded:
                if part:
                    parts.append((part, score))
                part = []
            else:
                part.append(t)
    return TranslationPieces(parts, cap, max_n=max_n, expected_length=longest)


def add_piece_bonus(lprobs: Tensor, prefix: Tensor, pieces: Sequence, weight: float,
                    separator: Optional[int] = None) -> Tensor:
    """``lprobs`` (rows, vocab) += the bonus of each row's pieces (``pieces[row]``: None, one
    :class:`TranslationPieces` or one per sentence) given its ``prefix`` (rows, steps, starting
    with the token fairseq puts first)."""
    table = PieceTable(pieces, lprobs.size(1), separator)
    return table.add_bonus(lprobs, prefix, torch.arange(len(pieces)), weight)


__all__ = ["PieceTable", "TranslationPieces", "add_piece_bonus", "sentence_pieces"]
