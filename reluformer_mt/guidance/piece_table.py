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
that sentence only; no bonus once that sentence reaches its expected length (the longest a
match's target/source length ratio predicts for this source, at most the longest match), for a
separator or EOS; and only matches whose fuzzy score
reaches a floor (``--pieces-floor``, tuned with the weight) give pieces, so a 0.2-fuzzy match of
an unrelated verse no longer pastes its words.
"""
import math
from collections import Counter, defaultdict
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor


class TranslationPieces:
    """The pieces of one source: every n-gram (n <= ``max_n``) of its entries (``parts``: token
    runs with their weight) with the best weight of a run holding it (:attr:`best`), each token's
    cap and the expected length (see :func:`sentence_pieces`)."""

    def __init__(self, entries: Iterable[Tuple[Sequence[int], float]], cap: Dict[int, int], max_n: int = 4,
                 expected_length: Optional[int] = None):
        if max_n < 1:
            raise ValueError(f"translation pieces: expected max n >= 1, got {max_n}")
        self.max_n = max_n
        self.parts = [([int(t) for t in tokens], float(weight)) for tokens, weight in entries]
        # a token earns the bonus only while the hypothesis holds fewer copies of it than the
        # matches suggest (``cap``): without a cap beam search loops on rewarded n-grams
        self.cap = dict(cap)
        # no bonus once the sentence is this long (None: no limit)
        self.expected_length = expected_length
        self._best: Optional[Dict[Tuple[int, ...], float]] = None

    @property
    def best(self) -> Dict[Tuple[int, ...], float]:
        """Every piece and its weight, as a dict (for reading; :class:`PieceTable` builds its
        tensors from :attr:`parts` directly)."""
        if self._best is None:
            self._best = {}
            for tokens, weight in self.parts:
                for n in range(1, self.max_n + 1):
                    for i in range(len(tokens) - n + 1):
                        gram = tuple(tokens[i:i + n])
                        if weight > self._best.get(gram, 0.0):
                            self._best[gram] = weight
        return self._best

    def __len__(self) -> int:
        return len(self.best)


def _grams_of_runs(tokens: Tensor, run: Tensor, n: int) -> Tensor:
    """The start positions in ``tokens`` (all runs end to end, ``run`` naming each position's run)
    of the n-grams that stay inside one run."""
    if len(tokens) < n:
        return torch.zeros(0, dtype=torch.long)
    starts = torch.arange(len(tokens) - n + 1)
    return starts[run[starts] == run[starts + n - 1]]


def _best_of(keys: Tensor, last: Tensor, weights: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """The distinct (key, last token) pairs, sorted by key then token, and the highest weight of
    each (two stable sorts: one 64-bit key for the whole n-gram could overflow)."""
    order = torch.argsort(last, stable=True)
    order = order[torch.argsort(keys[order], stable=True)]
    keys, last, weights = keys[order], last[order], weights[order]
    first = torch.ones(len(keys), dtype=torch.bool)
    first[1:] = (keys[1:] != keys[:-1]) | (last[1:] != last[:-1])
    group = torch.cumsum(first, 0) - 1
    best = torch.zeros(int(first.sum())).scatter_reduce_(0, group, weights, "amax", include_self=False)
    return keys[first], last[first], best


class _RunGrams:
    """Every run of every unit end to end: its tokens, and per run its unit, weight and max n; the
    n-grams inside the runs (:meth:`of`)."""

    def __init__(self, units):
        # every run of every unit end to end: its tokens, and per run its unit, weight and max n
        flat, run_unit, run_weight, run_max_n, run_length = [], [], [], [], []
        for unit, p in enumerate(units):
            for tokens, weight in (p.parts if p is not None else ()):
                flat += tokens
                run_unit.append(unit)
                run_weight.append(weight)
                run_max_n.append(p.max_n)
                run_length.append(len(tokens))
        self.tokens = torch.tensor(flat, dtype=torch.long)
        self.run = torch.repeat_interleave(torch.arange(len(run_unit)), torch.tensor(run_length, dtype=torch.long))
        self.run_unit, self.run_weight = torch.tensor(run_unit, dtype=torch.long), torch.tensor(run_weight, dtype=torch.float32)
        self.run_max_n = torch.tensor(run_max_n, dtype=torch.long)

    def of(self, n: int, base: int) -> Tuple[Tensor, Tensor, Tensor]:
        """The distinct n-grams, sorted: keys (unit, the first n - 1 tokens in ``base``), last
        tokens, best weights."""
        starts = _grams_of_runs(self.tokens, self.run, n)
        starts = starts[self.run_max_n[self.run[starts]] >= n]
        keys = self.run_unit[self.run[starts]]
        for c in range(n - 1):
            keys = keys * base + self.tokens[starts + c]
        return _best_of(keys, self.tokens[starts + n - 1], self.run_weight[self.run[starts]])


class PieceTable:
    """The pieces of a batch's sources as tensors, so that one decoding step rewards all rows with a
    few tensor operations. A source has one :class:`TranslationPieces` per sentence (a segment) or
    one in all; each (source, sentence) is a *unit*. Only the tokens of a unit's pieces can earn a
    bonus, so a unit is stored sparsely: its distinct tokens sorted (its *slots*, padded with
    ``vocab``), each slot's unigram weight and cap; longer pieces grouped by their *context* (unit,
    the n - 1 previous tokens), the sorted contexts searched once a step for every n, each piece
    pointing at the slot of its last token. A step works on (rows, slots) tensors and adds the
    bonuses to the (rows, vocab) scores with one scatter, so its cost does not grow with the
    vocabulary, and the table is built with tensor operations over all runs at once. The caps count
    a row's tokens through a (unit, token) -> slot map (one lookup a step; a batch too large for it
    searches each row's slots instead). With a ``separator``, a row is rewarded by the unit of the
    sentence it is writing: its number of separators so far. (Issue 32 cut a step's tensor
    operations, with fewer searches and ``index_select`` for the row gathers: the same bonuses,
    bit for bit, in about a quarter less time: docs/history/KNN_MT.md.)"""

    DENSE_LIMIT = 2 ** 24  # entries of the (unit, token) -> slot map (32 MiB as int16)

    def __init__(self, pieces: Sequence, vocab: int, separator: Optional[int] = None):
        self.vocab, self.separator = vocab, separator
        units = self._units(pieces)
        grams = _RunGrams(units)
        position, slot_key, width = self._slots(units, grams)
        self._longer_pieces(units, grams, position, slot_key)
        # each (unit, token)'s slot (``width`` if none) as one flat map, for the caps' counts: one
        # lookup a step instead of a search per history token; where units x vocab would take more
        # than ``DENSE_LIMIT`` entries, the caps search the sorted slots instead
        self.slot_of = None
        if len(units) * self.vocab <= self.DENSE_LIMIT:
            self.slot_of = torch.full((len(units) * self.vocab,), width, dtype=torch.int16 if width < 2 ** 15 else torch.int32)
            self.slot_of[slot_key] = position.to(self.slot_of.dtype)

    def _units(self, pieces: Sequence) -> List[Optional[TranslationPieces]]:
        """Every (source, sentence)'s pieces in one list, with each source's first unit and count."""
        vocab = self.vocab
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
        if len(units) * sum(float(vocab + 1) ** (n - 1) for n in range(2, self.max_n + 1)) >= 2 ** 62:
            raise ValueError(f"translation pieces: {vocab} tokens and n <= {self.max_n} do not fit 64-bit keys; "
                             "lower --pieces-max-n")
        big = torch.iinfo(torch.long).max
        self.expected_length = torch.tensor([big if p is None or p.expected_length is None else p.expected_length
                                             for p in units], dtype=torch.long)
        return units

    def _slots(self, units, grams: "_RunGrams") -> Tuple[Tensor, Tensor, int]:
        """The slots of every unit: its distinct tokens, their unigram weights and caps."""
        vocab = self.vocab
        # slots: a unit's distinct tokens, ascending; padding slots hold the impossible token
        # ``vocab`` (keeps rows sorted for searchsorted), weight 0 and cap 0
        slot_unit, slot_tokens, unigram_weight = grams.of(1, vocab)
        slot_key = slot_unit * vocab + slot_tokens  # ascending
        position = torch.arange(len(slot_key)) - torch.searchsorted(slot_unit, torch.arange(len(units)))[slot_unit]
        width = int(position.max()) + 1 if len(position) else 1
        self.slot_token = torch.full((len(units), width), vocab, dtype=torch.long)
        self.slot_token[slot_unit, position] = slot_tokens
        self.slot_weight = torch.zeros(len(units), width)
        self.slot_weight[slot_unit, position] = unigram_weight
        self.slot_cap = torch.zeros(len(units), width, dtype=torch.long)
        cap = [(unit, t, c) for unit, p in enumerate(units) if p is not None for t, c in p.cap.items()]
        if cap and len(slot_key):
            cap = torch.tensor(cap, dtype=torch.long)
            wanted = cap[:, 0] * vocab + cap[:, 1]
            found = torch.searchsorted(slot_key, wanted).clamp_(max=len(slot_key) - 1)
            hit = slot_key[found] == wanted  # a capped token without a piece has no slot
            self.slot_cap[cap[hit, 0], position[found[hit]]] = cap[hit, 2]
        return position, slot_key, width

    def _longer_pieces(self, units, grams: "_RunGrams", position: Tensor, slot_key: Tensor) -> None:
        vocab = self.vocab
        # the longer pieces of every n in one sorted array: keys (unit, the n - 1 previous tokens)
        # written in base ``vocab + 1``, n's keys shifted past those of n - 1, so that one search
        # per step finds the pieces each row's last 1, 2, ... tokens begin; the digit ``vocab``
        # (no token) stands for the positions before a short history, so its keys never match
        base = vocab + 1
        self.context_sizes = max(self.max_n - 1, 0)
        self.gram_offset = torch.zeros(self.context_sizes, dtype=torch.long)
        keys_of_n, slots_of_n, weights_of_n, offset = [], [], [], 0
        for n in range(2, self.max_n + 1):
            self.gram_offset[n - 2] = offset
            keys, last, weights = grams.of(n, base)
            if len(keys):
                unit = keys // base ** (n - 1)
                slots_of_n.append(position[torch.searchsorted(slot_key, unit * vocab + last)])
                keys_of_n.append(keys + offset)
                weights_of_n.append(weights)
            offset += len(units) * base ** (n - 1)
        gram_keys = torch.cat(keys_of_n) if keys_of_n else torch.zeros(0, dtype=torch.long)
        self.gram_slots = torch.cat(slots_of_n) if slots_of_n else torch.zeros(0, dtype=torch.long)
        self.gram_weights = torch.cat(weights_of_n) if weights_of_n else torch.zeros(0)
        # each distinct key (a *context*: unit and previous tokens) once, with the range of its pieces
        first = torch.ones(len(gram_keys), dtype=torch.bool)
        first[1:] = gram_keys[1:] != gram_keys[:-1]
        self.context_key = gram_keys[first]
        self.context_start = first.nonzero().view(-1)
        self.context_count = torch.diff(self.context_start, append=torch.tensor([len(gram_keys)]))
        # key of a context of j tokens = unit x base^j + sum of token_i x base^(i - 1), token_1 the last
        self.powers = base ** torch.arange(self.context_sizes + 1, dtype=torch.long)
        self.scatter_token = self.slot_token.clamp(max=vocab - 1)  # padding slots add 0 to the last token
        self.position = torch.arange(1, 1)  # 1, 2, ...: grown to the longest history seen

    def add_bonus(self, lprobs: Tensor, prefix: Tensor, sources: Tensor, weight: float, length_cap: float = 0.0,
                  ends: Sequence[int] = ()) -> int:
        """``lprobs`` (rows, vocab) += ``weight`` x each row's bonus, in place; ``prefix`` (rows,
        steps) starts with the token fairseq puts first; ``sources`` (rows,) index the table. With a
        ``length_cap`` F > 0, a row whose sentence is F x its expected length long keeps only the
        ``ends`` tokens (separator, EOS) possible. Returns the number of such rows."""
        if weight == 0:
            return 0
        history, sources = prefix[:, 1:].cpu().contiguous(), sources.cpu()
        rows, steps = history.shape
        if len(self.position) < steps:
            self.position = torch.arange(1, 2 * steps + 1)
        position = self.position[:steps]
        # the sentence each row is writing, and where it starts (one past its last separator)
        if self.separator is not None and steps:
            is_sep = history == self.separator
            sentence = is_sep.sum(dim=1)
            start = (is_sep * position).amax(dim=1)
        else:
            sentence = start = torch.zeros(rows, dtype=torch.long)
        units = self.first_unit.index_select(0, sources) + torch.minimum(sentence, self.n_units.index_select(0, sources) - 1)
        bonus = self.slot_weight.index_select(0, units)  # a copy
        if len(self.context_key):
            self._add_longer_pieces(bonus, history, units)
        # copies of each slot's token in the sentence being written: the cap
        cap = self.slot_cap.index_select(0, units)
        if steps:
            bonus *= self._copies(history, units, position > start.unsqueeze(1)) < cap
        else:
            bonus *= cap > 0
        expected = self.expected_length.index_select(0, units)
        bonus *= (steps - start < expected).unsqueeze(1)
        lprobs.scatter_add_(1, self.scatter_token.index_select(0, units).to(lprobs.device),
                            (weight * bonus).to(lprobs.device, lprobs.dtype))
        return self._end_long_sentences(lprobs, steps - start, expected, length_cap, ends) if length_cap else 0

    @staticmethod
    def _end_long_sentences(lprobs: Tensor, length: Tensor, expected: Tensor, length_cap: float,
                            ends: Sequence[int]) -> int:
        """Rows whose sentence has ``length`` >= ``length_cap`` x ``expected`` tokens keep only the
        ``ends`` tokens possible (in place); their number."""
        over = (length.double() >= length_cap * expected.double()).nonzero().squeeze(1)
        if len(over):
            rows, ends = over.to(lprobs.device), torch.tensor(list(ends), device=lprobs.device)
            kept = lprobs.index_select(0, rows).index_select(1, ends)
            lprobs.index_fill_(0, rows, float("-inf"))
            lprobs[rows.unsqueeze(1), ends.unsqueeze(0)] = kept
        return len(over)

    def _copies(self, history: Tensor, units: Tensor, counted: Tensor) -> Tensor:
        """(rows, slots): how many times each slot's token occurs in the ``counted`` positions of
        its row's ``history``."""
        rows, width = history.size(0), self.slot_token.size(1)
        if self.slot_of is not None:  # the slot of every history token in one lookup
            at = self.slot_of.index_select(0, (units.unsqueeze(1) * self.vocab + history).view(-1)).view(history.shape)
            at = at.long().masked_fill_(~counted, width)  # column ``width``: tokens not counted
            return torch.zeros(rows, width + 1, dtype=torch.long).scatter_add_(1, at, torch.ones_like(at))[:, :width]
        tokens = self.slot_token.index_select(0, units)
        at = torch.searchsorted(tokens, history).clamp_(max=width - 1)
        same = (tokens.gather(1, at) == history) & counted
        return torch.zeros_like(tokens).scatter_add_(1, at, same.long())

    def _add_longer_pieces(self, bonus: Tensor, history: Tensor, units: Tensor) -> None:
        """``bonus`` (rows, slots) += the weights of the pieces of n >= 2 that each row's last
        n - 1 tokens begin, in one search over the contexts (n ascending, then by token, per row)."""
        rows, steps, sizes = history.size(0), history.size(1), self.context_sizes
        last = history[:, steps - sizes:] if steps >= sizes else \
            torch.cat([history.new_full((rows, sizes - steps), self.vocab), history], dim=1)
        # per row, the keys of its last 1, 2, ... tokens: (rows, sizes), then row-major
        keys = (last.flip(1) * self.powers[:sizes]).cumsum(1) + units.unsqueeze(1) * self.powers[1:] + self.gram_offset
        keys = keys.view(-1)
        found = torch.searchsorted(self.context_key, keys).clamp_(max=len(self.context_key) - 1)
        counts = self.context_count.index_select(0, found) * (self.context_key.index_select(0, found) == keys)
        total = int(counts.sum())
        if total:
            which = torch.repeat_interleave(torch.arange(len(keys)) // sizes, counts)
            entries = torch.repeat_interleave(self.context_start.index_select(0, found) - torch.cumsum(counts, 0) + counts,
                                              counts) + torch.arange(total)
            bonus.index_put_((which, self.gram_slots.index_select(0, entries)), self.gram_weights.index_select(0, entries),
                             accumulate=True)


def sentence_pieces(entries: Sequence[Tuple], exclude: Sequence[int] = (), max_n: int = 4, floor: float = 0.0,
                    source_length: Optional[int] = None) -> Optional[TranslationPieces]:
    """Pieces of one sentence from its retrieved entries, (target token ids, fuzzy score) or (target
    token ids, fuzzy score, the entry's source length[, which target tokens may be in a piece]) each:
    only entries scoring at least ``floor`` count (None if none does). An ``exclude``d token
    (padding, EOS, the separator) or one not kept ends a piece; a token's cap is the most copies of
    it one entry holds. The expected length is the longest entry's; given the sentence's
    ``source_length`` and the entries' source lengths, at most the longest an entry's length ratio
    predicts for this source (a 40-token match of a 10-token verse no longer rewards 40 tokens for
    a 5-token one)."""
    kept = [entry for entry in entries if entry[1] >= floor]
    if not kept:
        return None
    excluded = set(int(t) for t in exclude)
    parts, cap, longest, predicted = [], defaultdict(int), 0, 0
    for entry in kept:
        tokens, score = entry[0], entry[1]
        ids = tokens.tolist()
        real = [t for t in ids if t not in excluded]
        longest = max(longest, len(real))
        if source_length is not None and len(entry) > 2:
            predicted = max(predicted, math.ceil(len(real) * source_length / max(1, entry[2])))
        for t, count in Counter(real).items():
            cap[t] = max(cap[t], count)
        in_pieces = [bool(k) for k in entry[3]] if len(entry) > 3 else [True] * len(ids)
        part = []
        for t, allowed in zip(ids + [None], in_pieces + [False]):
            if t is None or t in excluded or not allowed:
                if part:
                    parts.append((part, score))
                part = []
            else:
                part.append(t)
    expected = min(longest, predicted) if source_length is not None and predicted else longest
    return TranslationPieces(parts, cap, max_n=max_n, expected_length=expected)


def add_piece_bonus(lprobs: Tensor, prefix: Tensor, pieces: Sequence, weight: float,
                    separator: Optional[int] = None) -> Tensor:
    """``lprobs`` (rows, vocab) += the bonus of each row's pieces (``pieces[row]``: None, one
    :class:`TranslationPieces` or one per sentence) given its ``prefix`` (rows, steps, starting
    with the token fairseq puts first)."""
    table = PieceTable(pieces, lprobs.size(1), separator)
    table.add_bonus(lprobs, prefix, torch.arange(len(pieces)), weight)
    return lprobs


__all__ = ["PieceTable", "TranslationPieces", "add_piece_bonus", "sentence_pieces"]
