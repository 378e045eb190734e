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
which needs a word aligner at translation time); n-grams do not cross a document segment's
sentences' matches, and the entry markers and separators never belong to a piece.
"""
from collections import defaultdict
from typing import Dict, Iterable, Optional, Sequence, Tuple

import torch
from torch import Tensor


class TranslationPieces:
    """The pieces of one source: every n-gram (n <= ``max_n``) of its entries with the best weight
    of an entry holding it, and each token's cap (see :func:`pieces_of_entries`)."""

    def __init__(self, entries: Iterable[Tuple[Sequence[int], float]], cap: Dict[int, int], max_n: int = 4):
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

    def __len__(self) -> int:
        return len(self.best)


class PieceTable:
    """The pieces of a batch's sources as tensors, so that one decoding step rewards all rows with a
    few tensor operations: unigram bonuses and caps as (sources, vocab) rows, longer pieces as
    sorted keys (source, the n - 1 previous tokens) searched with ``searchsorted``."""

    def __init__(self, pieces: Sequence[Optional[TranslationPieces]], vocab: int):
        self.vocab = vocab
        present = [p for p in pieces if p is not None]
        self.max_n = max((p.max_n for p in present), default=1)
        if len(pieces) * float(vocab) ** (self.max_n - 1) >= 2 ** 62:
            raise ValueError(f"translation pieces: {vocab} tokens and n <= {self.max_n} do not fit 64-bit keys; "
                             "lower --pieces-max-n")
        self.unigram = torch.zeros(len(pieces), vocab)
        self.cap = torch.zeros(len(pieces), vocab, dtype=torch.long)
        grams = {n: ([], [], []) for n in range(2, self.max_n + 1)}  # keys, tokens, weights
        for source, p in enumerate(pieces):
            if p is None:
                continue
            for token, count in p.cap.items():
                self.cap[source, token] = count
            for gram, weight in p.best.items():
                if len(gram) == 1:
                    self.unigram[source, gram[0]] = weight
                else:
                    keys, tokens, weights = grams[len(gram)]
                    keys.append(self._key(source, gram[:-1]))
                    tokens.append(gram[-1])
                    weights.append(weight)
        self.grams = {}
        for n, (keys, tokens, weights) in grams.items():
            if keys:
                keys, order = torch.sort(torch.tensor(keys, dtype=torch.long))
                self.grams[n] = (keys, torch.tensor(tokens, dtype=torch.long)[order],
                                 torch.tensor(weights, dtype=torch.float32)[order])

    def _key(self, source: int, prefix: Sequence[int]) -> int:
        key = source
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
        bonus = self.unigram[sources].clone()  # (rows, vocab)
        for n, (keys, tokens, weights) in self.grams.items():
            if history.size(1) < n - 1:
                continue
            row_keys = sources.clone()
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
        used = torch.zeros(rows, self.vocab, dtype=torch.long).scatter_add_(1, history, torch.ones_like(history))
        bonus *= used < self.cap[sources]
        lprobs += (weight * bonus).to(device, lprobs.dtype)
        return lprobs


def pieces_of_entries(sentences: Sequence[Sequence[Tuple[Tensor, float]]], exclude: Sequence[int] = (),
                      max_n: int = 4) -> TranslationPieces:
    """Pieces of one source from the retrieved entries of each of its sentences (a document
    segment has several): (target token ids, fuzzy score) each. An ``exclude``d token (padding,
    EOS, the separator) ends a piece. A token's cap is, summed over the sentences, the most
    copies of it one entry of the sentence holds."""
    excluded = set(int(t) for t in exclude)
    parts, cap = [], defaultdict(int)
    for entries in sentences:
        most: Dict[int, int] = defaultdict(int)
        for tokens, score in entries:
            ids = tokens.tolist()
            for t in set(ids):
                most[t] = max(most[t], ids.count(t))
            part = []
            for t in ids + [None]:
                if t is None or t in excluded:
                    if part:
                        parts.append((part, score))
                    part = []
                else:
                    part.append(t)
        for t, n in most.items():
            cap[t] += n
    return TranslationPieces(parts, cap, max_n=max_n)


def add_piece_bonus(lprobs: Tensor, prefix: Tensor, pieces: Sequence[Optional[TranslationPieces]],
                    weight: float) -> Tensor:
    """``lprobs`` (rows, vocab) += the bonus of each row's pieces (``pieces[row]``, None = none)
    given its ``prefix`` (rows, steps, starting with the token fairseq puts first)."""
    table = PieceTable(pieces, lprobs.size(1))
    return table.add_bonus(lprobs, prefix, torch.arange(len(pieces)), weight)


__all__ = ["PieceTable", "TranslationPieces", "add_piece_bonus", "pieces_of_entries"]
