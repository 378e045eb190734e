"""Attention statistics and word alignments from attention: pure functions on tensors.

Shapes: attention weights ``attn`` of shape (..., H, T, S) (e.g. layers x heads x target x source
for one sentence pair); ``mask`` is a bool tensor broadcastable to it, True where a weight is a
real query/key pair (False for padding). Weights are assumed non-negative (softmax, ReLU, ReLA,
sparsemax, entmax all are); ReLU-type rows need not sum to one, so the distributional statistics
(entropy, divergence, top-score ratio) use row-normalised rows and skip null rows.

Every statistic comes in two forms: ``*_counts`` returns (numerator, denominator) summed over
T (and S), so a data set is aggregated exactly by summing counts over sentences
(``AttentionStats`` does that), and the plain function returns their ratio.

- sparsity rate: share of exact zeros among unmasked weights (Zhang, Titov & Sennrich 2021, ReLA).
- null-attention rate: share of valid query rows with no non-zero weight (ReLA's "null attention").
- head diversity: mean pairwise Jensen-Shannon divergence (base 2, in [0, 1]) between the heads'
  normalised rows, over rows where both heads are non-null (Correia et al. 2019 measure head
  disagreement this way).
- attention entropy: Shannon entropy (nats) of normalised non-null rows.
- top-score ratio: share of a non-null row's mass held by its top p% entries (at least one entry).
"""
import math
from typing import Dict, List, Optional, Sequence, Set, Tuple

import torch

SPM_SPACE = "\u2581"
SPECIAL_PIECES = frozenset({"</s>", "<s>", "<pad>", "<unk>", "<sep>"})


def _mask(attn: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    if mask is None:
        return torch.ones_like(attn, dtype=torch.bool)
    return mask.to(torch.bool).expand_as(attn)


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    num, den = num.double(), den.double()
    return torch.where(den > 0, num / den.clamp_min(1), torch.full_like(num, math.nan))


def _rows(attn, mask):
    """Masked weights, valid rows (any unmasked key) and non-null rows (some non-zero weight)."""
    m = _mask(attn, mask)
    w = torch.where(m, attn, torch.zeros_like(attn)).double()
    valid = m.any(-1)
    live = valid & (w != 0).any(-1)
    return w, m, valid, live


def _normalised(w: torch.Tensor) -> torch.Tensor:
    total = w.sum(-1, keepdim=True)
    return w / torch.where(total > 0, total, torch.ones_like(total))


def sparsity_counts(attn, mask=None) -> Tuple[torch.Tensor, torch.Tensor]:
    m = _mask(attn, mask)
    return ((attn == 0) & m).sum((-2, -1)), m.sum((-2, -1))


def sparsity_rate(attn, mask=None) -> torch.Tensor:
    """Share of exact zeros among unmasked weights, shape (..., H)."""
    return _ratio(*sparsity_counts(attn, mask))


def null_counts(attn, mask=None):
    _, _, valid, live = _rows(attn, mask)
    return (valid & ~live).sum(-1), valid.sum(-1)


def null_rate(attn, mask=None) -> torch.Tensor:
    """Share of valid query rows whose weights are all zero, shape (..., H)."""
    return _ratio(*null_counts(attn, mask))


def _entropy(p: torch.Tensor) -> torch.Tensor:
    return -(p * torch.log(torch.where(p > 0, p, torch.ones_like(p)))).sum(-1)


def entropy_counts(attn, mask=None):
    w, _, _, live = _rows(attn, mask)
    h = _entropy(_normalised(w))
    return torch.where(live, h, torch.zeros_like(h)).sum(-1), live.sum(-1)


def attention_entropy(attn, mask=None) -> torch.Tensor:
    """Mean entropy (nats) of the normalised non-null rows, shape (..., H)."""
    return _ratio(*entropy_counts(attn, mask))


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence in bits (0 = same, 1 = disjoint) over the last dimension."""
    mid = (p + q) / 2
    return ((_entropy(mid) - (_entropy(p) + _entropy(q)) / 2) / math.log(2)).clamp_min(0)


def head_diversity_counts(attn, mask=None):
    """Sum of pairwise JS divergences and number of (head pair, row) terms, shape (...)."""
    w, _, _, live = _rows(attn, mask)
    p = _normalised(w)
    n_heads = attn.shape[-3]
    total = torch.zeros(attn.shape[:-3], dtype=torch.float64, device=attn.device)
    count = torch.zeros(attn.shape[:-3], dtype=torch.long, device=attn.device)
    for h in range(n_heads):
        for g in range(h + 1, n_heads):
            both = live[..., h, :] & live[..., g, :]
            js = js_divergence(p[..., h, :, :], p[..., g, :, :])
            total += torch.where(both, js, torch.zeros_like(js)).sum(-1)
            count += both.sum(-1)
    return total, count


def head_diversity(attn, mask=None) -> torch.Tensor:
    """Mean pairwise Jensen-Shannon divergence between heads, shape (...) e.g. (layers,)."""
    return _ratio(*head_diversity_counts(attn, mask))


def top_score_counts(attn, mask=None, top_percent: float = 10.0):
    if not 0 < top_percent <= 100:
        raise ValueError(f"top_percent must be in (0, 100], got {top_percent}")
    w, m, _, live = _rows(attn, mask)
    n_keys = m.sum(-1)
    k = torch.ceil(n_keys.double() * top_percent / 100).long().clamp(min=1)
    cum = torch.sort(w, dim=-1, descending=True).values.cumsum(-1)
    top = cum.gather(-1, (k - 1).clamp(max=w.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    ratio = top / torch.where(live, cum[..., -1], torch.ones_like(top))
    return torch.where(live, ratio, torch.zeros_like(ratio)).sum(-1), live.sum(-1)


def top_score_ratio(attn, mask=None, top_percent: float = 10.0) -> torch.Tensor:
    """Mean share of a non-null row's mass in its top ``top_percent``% unmasked entries, (..., H)."""
    return _ratio(*top_score_counts(attn, mask, top_percent))


class AttentionStats:
    """Sums the counts of every statistic over many sentences; ``result()`` gives the ratios.

    ``update(attn, mask)`` takes one sentence's (layers, H, T, S) weights (any leading shape that
    stays the same between calls).
    """
    def __init__(self, top_percent: float = 10.0):
        self.top_percent = top_percent
        self.sums: Dict[str, List[torch.Tensor]] = {}

    def _add(self, name, num, den):
        if name in self.sums:
            self.sums[name][0] += num.double()
            self.sums[name][1] += den.double()
        else:
            self.sums[name] = [num.double().clone(), den.double().clone()]

    def update(self, attn: torch.Tensor, mask: Optional[torch.Tensor] = None) -> None:
        attn = attn.detach()
        self._add("sparsity", *sparsity_counts(attn, mask))
        self._add("null_rate", *null_counts(attn, mask))
        self._add("entropy", *entropy_counts(attn, mask))
        self._add("top_score_ratio", *top_score_counts(attn, mask, self.top_percent))
        self._add("head_diversity", *head_diversity_counts(attn, mask))

    def result(self) -> Dict[str, torch.Tensor]:
        """{statistic: tensor}; per head (..., H) except head_diversity (...)."""
        return {name: _ratio(num, den) for name, (num, den) in self.sums.items()}


# ----------------------------------------------------------------------------------------------
# word alignments from attention

def sentencepiece_word_map(pieces: Sequence[str], special: frozenset = SPECIAL_PIECES) -> List[int]:
    """Word index of every SentencePiece piece; a piece starting with '▁' starts a new word.

    Special tokens (``</s>``, ``<sep>``, ...) belong to no word and get -1, so their rows and
    columns are left out of alignments. A first piece (or one after a special token) without '▁' still starts a word.
    """
    ids, word, new_word = [], -1, True
    for piece in pieces:
        if piece in special:
            ids.append(-1)
            new_word = True  # a piece right after a special token starts a word even without '▁'
            continue
        if piece.startswith(SPM_SPACE) or new_word:
            word += 1
        new_word = False
        ids.append(word)
    return ids


def _merge_matrix(word_ids: Sequence[int], dtype, device) -> torch.Tensor:
    """(n_words, n_pieces) 0/1 matrix of piece membership; pieces with id -1 belong to no word."""
    ids = torch.as_tensor(list(word_ids), dtype=torch.long, device=device)
    n_words = int(ids.max().item()) + 1 if ids.numel() and ids.max() >= 0 else 0
    return (ids.unsqueeze(0) == torch.arange(n_words, device=device).unsqueeze(1)).to(dtype)


def word_attention(attn: torch.Tensor, src_word_ids: Sequence[int], tgt_word_ids: Sequence[int]) -> torch.Tensor:
    """Merge piece-level attention (..., T, S) to (..., target words, source words).

    A target word's row is the mean of its pieces' rows; a source word's column is the sum of its
    pieces' columns (the mass the row gives that word). Pieces with word id -1 are dropped.
    Leading dims (layers, heads, normal/shifted, ...) are merged alike, in one product.
    """
    if attn.dim() < 2 or tuple(attn.shape[-2:]) != (len(tgt_word_ids), len(src_word_ids)):
        raise ValueError(f"attention shape {tuple(attn.shape)} does not match {len(tgt_word_ids)} target and "
                         f"{len(src_word_ids)} source word ids")
    a = attn.double()
    tgt = _merge_matrix(tgt_word_ids, a.dtype, a.device)
    src = _merge_matrix(src_word_ids, a.dtype, a.device)
    rows = tgt @ a / tgt.sum(1, keepdim=True).clamp_min(1)
    return rows @ src.T


def argmax_links(words: torch.Tensor) -> List[Set[Tuple[int, int]]]:
    """The links of every (target words, source words) matrix in ``words`` (leading dims
    flattened): each target word to its argmax source word, as 0-based (source, target) pairs.
    An all-zero row (every piece null-attends, or attends only to dropped tokens such as
    ``</s>``) gives no link; ties go to the first source word."""
    flat = words.reshape(-1, *words.shape[-2:])
    if flat.shape[-1] == 0 or flat.shape[-2] == 0:
        return [set() for _ in range(flat.shape[0])]
    best = flat.argmax(-1).tolist()
    live = (flat != 0).any(-1).tolist()
    return [{(b[j], j) for j in range(len(b)) if lv[j]} for b, lv in zip(best, live)]


def alignment_from_attention(attn: torch.Tensor, src_word_ids: Sequence[int], tgt_word_ids: Sequence[int]
                             ) -> List[Tuple[int, int]]:
    """Word links of one (T, S) piece-level matrix, sorted: ``argmax_links`` of ``word_attention``."""
    if attn.dim() != 2:
        raise ValueError(f"expected a (target, source) attention matrix, got shape {tuple(attn.shape)}")
    return sorted(argmax_links(word_attention(attn, src_word_ids, tgt_word_ids))[0])


def shift_rows(attn: torch.Tensor, shift: int = 1) -> torch.Tensor:
    """Shifted attention: row t becomes the row of step t + shift (where target token t is the
    decoder *input*, not the output); the last ``shift`` rows have no such step and become zero
    (no link). Works on (..., T, S).
    """
    if shift <= 0:
        raise ValueError(f"shift must be positive, got {shift}")
    pad = torch.zeros_like(attn[..., :shift, :])
    return torch.cat([attn[..., shift:, :], pad], dim=-2)[..., : attn.shape[-2], :]
