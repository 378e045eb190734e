"""Read-outs: how the k nearest datastore entries of a decoding step become a distribution.

Each read-out maps the squared L2 distances ``d`` (rows, k) of a step's neighbours and their
values (the target tokens that followed them) to a distribution over the vocabulary and a
per-row *mass*, the share of the final distribution the neighbours may take:

    p(y) = lambda * mass * p_knn(y) + (1 - lambda * mass) * p_model(y)

- ``softmax`` (kNN-MT, Khandelwal et al., ICLR 2021, arXiv:2010.00710): weights softmax(-d / T),
  mass 1, so lambda is the same at every step however far the neighbours are.
- ``relu`` (ours; the ReLUFormer paper's claim that ReLU reads many value slots better, Shen et
  al. 2023, arXiv:2302.06461, transposed to a datastore): each neighbour gets a = ReLU(1 - d / tau),
  1 for an exact match, 0 beyond the radius tau, and p_knn is a / sum(a). The mass is the closest
  neighbour's a: a step whose neighbours are all beyond tau gives the datastore no mass at all, one
  with an exact match gives it lambda, so lambda becomes data-dependent without a trained network
  (adaptive kNN-MT, Zheng et al., ACL 2021, trains one for that). Our choice where nothing is
  published: the row is normalised by its sum (ReLUFormer's sqrt(n / 2) length factor keeps an
  attention output's variance, which a distribution does not need) and the mass is the largest
  weight (the sum of k weights would grow with k).
- ``sparsemax`` / ``entmax15`` over -d / T (the ``entmax`` package; Peters et al., ACL 2019):
  sparse weights that sum to 1, mass 1.
"""
from typing import Tuple

import torch
from torch import Tensor

# the values' declaration and check (re-exported: the read-outs' names, limits and one-line errors)
from reluformer_mt.knn.values import MAX_K, MIN_TEMPERATURE, READOUTS, ReadoutError, check_search_values  # noqa: F401

MODEL_SHARE = 1e-3  # the least share of the model's own distribution in a mixed step (lambda 1 included)


def neighbour_weights(distances: Tensor, readout: str, temperature: float = 10.0, radius: float = 10.0) -> Tuple[Tensor, Tensor]:
    """(weights (rows, k) summing to 1 or 0 per row, mass (rows,)) of ``distances`` (rows, k);
    ``inf`` distances (no neighbour) get weight 0."""
    if readout not in READOUTS:
        raise ReadoutError(f"--knn-readout: got {readout!r}, expected one of {', '.join(READOUTS)}")
    distances = distances.float()
    missing = ~torch.isfinite(distances)
    if readout == "relu":
        if not radius > 0:
            raise ReadoutError(f"--knn-radius: expected a positive distance, got {radius}")
        a = torch.relu(1.0 - distances.masked_fill(missing, float("inf")) / radius)
        total = a.sum(dim=1, keepdim=True)
        weights = torch.where(total > 0, a / total.clamp_min(1e-30), torch.zeros_like(a))
        return weights, a.max(dim=1).values if a.size(1) else a.new_zeros(a.size(0))
    if not temperature > 0:
        raise ReadoutError(f"--knn-temperature: expected a positive number, got {temperature}")
    logits = _scaled_logits(distances, missing, temperature)
    if readout == "softmax":
        weights = torch.softmax(logits, dim=1)
    else:
        import entmax

        # entmax takes no -inf: a missing neighbour sits far below every real one instead
        low = logits.masked_fill(missing, 0).min(dim=1, keepdim=True).values - 1e4
        fn = entmax.sparsemax if readout == "sparsemax" else entmax.entmax15
        weights = fn(torch.where(missing, low, logits), dim=1)
    none = missing.all(dim=1, keepdim=True)
    weights = torch.where(none, torch.zeros_like(weights), torch.nan_to_num(weights))
    return weights, (~none.squeeze(1)).float()


# in a row whose logits -d / T leave float32's range, they are taken relative to its nearest
# neighbour and floored at this far below it: every read-out here is shift-invariant and gives a
# logit this far below the largest no weight (sparsemax and 1.5-entmax none from 2 below)
_FAR_BELOW = -1e4


def _scaled_logits(distances: Tensor, missing: Tensor, temperature: float) -> Tensor:
    """-d / T, -inf for missing neighbours. A row where that overflows (a finite distance whose logit
    is -inf: the softmax's weights were all 0 with mass 1, the sparse maps failed) or whose spread
    could overflow the sparse maps' cumulative sums gets (d_min - d) / T floored at ``_FAR_BELOW``
    instead: the same weights; the other rows are computed as they always were, bit for bit."""
    plain = (-distances / temperature).masked_fill(missing, float("-inf"))
    nearest = distances.masked_fill(missing, float("inf")).amin(dim=1, keepdim=True)
    farthest = plain.masked_fill(missing, float("inf")).amin(dim=1, keepdim=True)
    spread = plain.amax(dim=1, keepdim=True) - farthest
    limit = torch.finfo(plain.dtype).max / (2 * max(plain.size(1), 1))
    outside = ((~torch.isfinite(plain) & ~missing).any(dim=1, keepdim=True)
               | (torch.isfinite(nearest) & ~(spread <= limit)))
    shifted = ((nearest - distances) / temperature).clamp_min(_FAR_BELOW).masked_fill(missing, float("-inf"))
    return torch.where(outside, shifted, plain)


def knn_probabilities(weights: Tensor, values: Tensor, vocab: int) -> Tensor:
    """(rows, vocab) distribution: each neighbour's weight on the token it stores (rows, k)."""
    probs = weights.new_zeros(weights.size(0), vocab)
    return probs.scatter_add_(1, values.long().clamp_min(0), weights * (values >= 0))


def mix_log_probs(lprobs: Tensor, knn_probs: Tensor, mass: Tensor, lam: float) -> Tensor:
    """log(lambda * mass * p_knn + (1 - lambda * mass) * p_model) per row, from a dense ``knn_probs``
    (decoding mixes sparsely, :func:`mix_neighbours`: the same values); a token the search has
    ruled out (log-probability -inf: padding, EOS before the minimum length, every token but EOS
    at the length limit) stays ruled out."""
    # the model keeps at least MODEL_SHARE of every row: with the neighbours' share at 1 every token
    # they did not vote for would be impossible, and once the separator constraint forbids those they
    # did vote for, beam search would be left without a finite candidate (fairseq then fails)
    share = (lam * mass).clamp(0.0, 1.0 - MODEL_SHARE).unsqueeze(1).to(lprobs.dtype)
    # in place on one fresh (rows, vocab) tensor: a step's new large tensors cost more (allocation,
    # page faults) than its arithmetic; the same operations, bit for bit
    mixed = lprobs.exp().mul_(1 - share).add_(knn_probs.to(lprobs.dtype) * share).log_()
    return mixed.masked_fill_(torch.isneginf(lprobs), float("-inf"))


def mix_neighbours(lprobs: Tensor, weights: Tensor, values: Tensor, model_share: Tensor) -> Tensor:
    """In place, and returned: log(model_share * p_model + sum_i weights_i [y = values_i]) per row
    (``weights`` (rows, k) already the neighbours' shares, ``values`` their tokens, -1 none), the
    tokens the search ruled out kept out. The same sum as :func:`mix_log_probs`, touching the
    vocabulary once: a token no neighbour voted for only moves by log(model_share), so the exp and
    log run on the k voted tokens of a row, not on all of its (rows, vocab) scores."""
    at = values.long().clamp_min(0)  # a missing neighbour points at token 0 and writes its own mixed value
    p_knn = knn_probabilities(weights, values, lprobs.size(1)).gather(1, at).to(lprobs.device, lprobs.dtype)
    at = at.to(lprobs.device)
    before = lprobs.gather(1, at)
    share = model_share.to(lprobs.device, lprobs.dtype).unsqueeze(1)
    voted = (share * before.exp() + p_knn).log_().masked_fill_(torch.isneginf(before), float("-inf"))
    return lprobs.add_(share.log()).scatter_(1, at, voted)


__all__ = ["MAX_K", "READOUTS", "ReadoutError", "check_search_values", "knn_probabilities", "mix_log_probs", "mix_neighbours",
           "neighbour_weights"]
