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
    """The pieces of one source: for every (n - 1)-token prefix, the tokens completing a piece and
    the piece weights, as tensors ready to add to a row of log-probabilities."""

    def __init__(self, entries: Iterable[Tuple[Sequence[int], float]], cap: Dict[int, int], max_n: int = 4,
                 min_n: int = 1):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"translation pieces: expected 1 <= min n <= max n, got {min_n}, {max_n}")
        best: Dict[Tuple[int, ...], float] = {}
        for tokens, weight in entries:
            tokens = [int(t) for t in tokens]
            for n in range(min_n, max_n + 1):
                for i in range(len(tokens) - n + 1):
                    gram = tuple(tokens[i:i + n])
                    if weight > best.get(gram, 0.0):
                        best[gram] = float(weight)
        by_prefix = defaultdict(dict)
        for gram, weight in best.items():
            by_prefix[gram[:-1]][gram[-1]] = weight
        self.max_n, self.min_n = max_n, min_n
        # a token earns the bonus only while the hypothesis holds fewer copies of it than the
        # matches suggest (``cap``): without a cap beam search loops on rewarded n-grams
        self.cap = dict(cap)
        self.next_tokens = {prefix: (torch.tensor(list(d.keys()), dtype=torch.long),
                                     torch.tensor(list(d.values()), dtype=torch.float32),
                                     torch.tensor([self.cap.get(t, 0) for t in d.keys()], dtype=torch.long))
                            for prefix, d in by_prefix.items()}

    def __len__(self) -> int:
        return sum(len(t) for t, _, _ in self.next_tokens.values())

    def bonus(self, row: Tensor, prefix: Sequence[int], counts: Tensor, weight: float) -> None:
        """Add ``weight`` x the pieces completed by each next token to ``row`` (vocab,), in place;
        ``counts`` (vocab,): how often each token occurs in the hypothesis so far."""
        for n in range(self.min_n, self.max_n + 1):
            if n - 1 > len(prefix):
                break
            found = self.next_tokens.get(tuple(prefix[len(prefix) - n + 1:]) if n > 1 else ())
            if found is not None:
                tokens, weights, cap = found
                open_ = counts[tokens] < cap
                row.index_add_(0, tokens[open_].to(row.device), weights[open_].to(row.device, row.dtype) * weight)


def pieces_of_entries(sentences: Sequence[Sequence[Tuple[Tensor, float]]], exclude: Sequence[int] = (),
                      max_n: int = 4, min_n: int = 1) -> TranslationPieces:
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
    return TranslationPieces(parts, cap, max_n=max_n, min_n=min_n)


def add_piece_bonus(lprobs: Tensor, prefix: Tensor, pieces: Sequence[Optional[TranslationPieces]],
                    weight: float) -> Tensor:
    """``lprobs`` (rows, vocab) += the bonus of each row's pieces given its ``prefix`` (rows,
    steps, starting with the BOS/EOS token fairseq puts first); ``pieces[row]`` None = no bonus."""
    if weight == 0:
        return lprobs
    history = prefix[:, 1:].cpu()
    counts = torch.zeros(lprobs.shape, dtype=torch.long).scatter_add_(1, history, torch.ones_like(history))
    longest = max((p.max_n - 1 for p in pieces if p is not None), default=0)
    tails = history[:, history.size(1) - min(longest, history.size(1)):].tolist()
    for r, p in enumerate(pieces):
        if p is not None:
            p.bonus(lprobs[r], tails[r][len(tails[r]) - min(p.max_n - 1, len(tails[r])):], counts[r], weight)
    return lprobs


__all__ = ["TranslationPieces", "add_piece_bonus", "pieces_of_entries"]
