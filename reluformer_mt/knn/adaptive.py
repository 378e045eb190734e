"""Adaptive kNN-MT: a small network chooses, at every step, how many neighbours to trust.

Zheng et al., "Adaptive Nearest Neighbor Machine Translation", ACL 2021 (arXiv:2105.13022). A
fixed (k, lambda) treats a step whose neighbours all agree at distance 0 like one whose neighbours
are far and disagree. The Meta-k network reads, for the ``k_max`` nearest entries of a step, their
distances and the number of distinct target tokens among the first 1, 2, ..., k_max of them, and
puts a probability on each choice of k in {0, 1, 2, 4, ..., k_max} (0 = the model alone). The
step's distribution is

    p(y) = w_0 p_model(y) + sum_j w_j [m_j p_knn^(k_j)(y) + (1 - m_j) p_model(y)]

where p_knn^(k) is the read-out (:mod:`reluformer_mt.knn.readout`) of the first k neighbours and m_j
its mass: 1 for softmax (the paper), the closest neighbour's ReLU weight for the relu read-out, so
the network can also learn when a ReLU read-out of many slots helps. The model keeps at least
``MODEL_SHARE`` (as in the fixed mixer).

Training needs no decoding: the model is frozen, so each validation token's p_model(reference) and
every choice's p_knn^(k_j)(reference) are computed once, and the network (2 k_max inputs, one tanh
layer of 32 units as in the paper) minimises the tokens' negative log-likelihood under the mixture in
seconds. One fifth of the validation segments is held out for early stopping; the held-out NLL is
reported beside the best fixed setting's. Our choices where the paper leaves room: distances are
divided by the median nearest-entry distance (the tuner's scale) so that one network suits every
family's state norms; the read-out's temperature / radius are the tuner's best for that read-out.
"""
import json
import math
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Tuple

import numpy as np
import torch
from torch import Tensor, nn

from reluformer_mt.data.textfiles import replace_atomically
from reluformer_mt.knn.readout import MODEL_SHARE, mix_neighbours, neighbour_weights

FILE_NAME = "adaptive.npz"  # plain arrays and a JSON header: nothing to unpickle
HELD_OUT_EVERY = 5  # segments whose id % 5 == 0 are the early-stopping set


class AdaptiveError(ValueError):
    """A one-line problem with the adaptive network's file."""


@dataclass
class MetaKConfig:
    k_max: int = 16
    hidden: int = 32
    readout: str = "softmax"
    temperature: float = 10.0  # in distance units (already times the scale)
    radius: float = 10.0
    scale: float = 1.0         # distances are divided by this for the features

    @property
    def choices(self) -> Tuple[int, ...]:
        """0 (the model alone) and the powers of two up to k_max."""
        return (0,) + tuple(2 ** i for i in range(int(math.log2(self.k_max)) + 1))


PAIRWISE_UP_TO = 32  # distinct_counts compares every pair up to this many neighbours


def distinct_counts(values: Tensor) -> Tensor:
    """(rows, k): the number of distinct values among each row's first 1, 2, ..., k entries
    (negative values, no neighbour, never count). Up to ``PAIRWISE_UP_TO`` neighbours every pair
    is compared; beyond, each value's first position comes from one scatter over the row's token
    ids, O(k + vocab) a row instead of O(k^2) (a (rows, 256, 256) tensor per step at k_max 256)."""
    rows, k = values.shape
    if k == 0:
        return values.new_zeros(rows, 0, dtype=torch.float32)
    valid = values >= 0
    if k <= PAIRWISE_UP_TO:  # a (rows, k, k) comparison is cheaper than a (rows, vocab) table here
        seen = (values.unsqueeze(2) == values.unsqueeze(1)).tril(diagonal=-1).any(dim=2)
        return torch.cumsum((valid & ~seen).long(), dim=1).float()
    ids = values.clamp_min(0).long()
    position = torch.arange(k, device=values.device).expand(rows, k)
    first = torch.full((rows, int(ids.max()) + 1), k, dtype=torch.long, device=values.device)
    first.scatter_reduce_(1, ids, torch.where(valid, position, torch.full_like(position, k)), reduce="amin")
    new = valid & (first.gather(1, ids) == position)
    return torch.cumsum(new.long(), dim=1).float()


class MetaK(nn.Module):
    """The Meta-k network: features of a step's neighbours -> weights over :attr:`MetaKConfig.choices`."""

    def __init__(self, config: MetaKConfig):
        super().__init__()
        self.config = config
        self.net = nn.Sequential(nn.Linear(2 * config.k_max, config.hidden), nn.Tanh(),
                                 nn.Linear(config.hidden, len(config.choices)))

    def features(self, distances: Tensor, values: Tensor) -> Tensor:
        d = distances[:, :self.config.k_max].float() / self.config.scale
        d = torch.nan_to_num(d, posinf=1e3).clamp(max=1e3)  # a missing neighbour: far away
        return torch.cat([d, distinct_counts(values[:, :self.config.k_max])], dim=1)

    def forward(self, distances: Tensor, values: Tensor) -> Tensor:
        """(rows, choices) weights summing to 1, at least MODEL_SHARE on the model alone."""
        w = torch.softmax(self.net(self.features(distances, values)), dim=1)
        floor = torch.zeros_like(w)
        floor[:, 0] = MODEL_SHARE
        return floor + (1 - MODEL_SHARE) * w

    # ------------------------------------------------------------------ files
    def save(self, directory: Path, fingerprint: str, report: dict) -> Path:
        path = Path(directory) / FILE_NAME
        header = json.dumps({"config": asdict(self.config), "fingerprint": fingerprint, "report": report})
        arrays = {k: v.detach().cpu().numpy() for k, v in self.state_dict().items()}
        return replace_atomically(path, lambda f: np.savez(f, header=np.array(header), **arrays))

    @classmethod
    def load(cls, directory: Path, fingerprint: str) -> "MetaK":
        path = Path(directory) / FILE_NAME
        if not path.is_file():
            raise AdaptiveError(f"{path}: no adaptive network (train it with 'reluformer-memory tune' on the "
                                "validation split; it is written beside the datastore)")
        try:
            with np.load(path, allow_pickle=False) as saved:
                header = json.loads(str(saved["header"]))
                state = {k: torch.from_numpy(saved[k]) for k in saved.files if k != "header"}
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            raise AdaptiveError(f"{path}: not an adaptive network file ({e}); tune again") from None
        if not isinstance(header, dict):
            raise AdaptiveError(f"{path}: its header is {type(header).__name__}, expected an object; tune again")
        if header.get("fingerprint") != fingerprint:
            raise AdaptiveError(f"{path}: trained for the datastore of another checkpoint (fingerprint "
                                f"{header.get('fingerprint')}, the datastore's {fingerprint}); tune again")
        net = cls(checked_config(header.get("config"), f"{path}: config"))
        try:
            net.load_state_dict(state)
        except RuntimeError as e:  # missing, unexpected or differently shaped weights
            reason = " ".join(str(e).split())
            raise AdaptiveError(f"{path}: its weights do not fit its config ({reason[:300]}); tune again") from None
        if not all(torch.isfinite(p).all() for p in net.parameters()):
            raise AdaptiveError(f"{path}: its weights are not all finite numbers; tune again")
        return net.eval()


def checked_config(values, where: str) -> MetaKConfig:
    """A Meta-k config from a file's ``values``, one line naming ``where`` and the field for a value
    out of range (not an option's: the user gave none)."""
    from reluformer_mt.knn.readout import READOUTS

    if not isinstance(values, dict) or set(values) - set(MetaKConfig.__dataclass_fields__):
        raise AdaptiveError(f"{where}: expected an object of {', '.join(MetaKConfig.__dataclass_fields__)}, "
                            f"got {json.dumps(values)[:200]}; tune again")
    config = MetaKConfig(**values)
    for field in ("k_max", "hidden"):
        value = getattr(config, field)
        if not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 2 ** 16):
            raise AdaptiveError(f"{where}.{field}: expected a positive integer, got {json.dumps(value)}; tune again")
    if config.readout not in READOUTS:
        raise AdaptiveError(f"{where}.readout: got {json.dumps(config.readout)}, expected one of {', '.join(READOUTS)}; "
                            "tune again")
    for field in ("temperature", "radius", "scale"):
        value = getattr(config, field)
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf):
            raise AdaptiveError(f"{where}.{field}: expected a positive number, got {json.dumps(value)}; tune again")
    return config


# ------------------------------------------------------------------ the mixture
def choice_distributions(distances: Tensor, values: Tensor, config: MetaKConfig):
    """For each choice k_j > 0: (weights over the first k_j neighbours, mass) of the read-out."""
    out = []
    for k in config.choices[1:]:
        w, mass = neighbour_weights(distances[:, :k], config.readout, config.temperature, config.radius)
        out.append((w, mass))
    return out


# read-outs whose weights for the first k neighbours are one base weight per neighbour divided by
# the sum of the first k base weights (softmax: exp((d_0 - d_i) / T); relu: ReLU(1 - d_i / tau)),
# with the mass a function of the nearest neighbour alone: every choice of k from one cumulative sum
PREFIX_READOUTS = ("softmax", "relu")


def prefix_mixture(distances: Tensor, choice: Tensor, config: MetaKConfig) -> Tuple[Tensor, Tensor, Tensor]:
    """(combined neighbour weights (rows, k), the model's share, the neighbours' share) of every
    choice at once, for ``distances`` sorted nearest first and a read-out in ``PREFIX_READOUTS``:
    choice j's weight of neighbour i is base_i / S_j (S_j the sum of the first k_j base weights) and
    its mass m_j, so neighbour i's combined weight is base_i * sum over the choices reading it
    (k_j > i) of w_j m_j / S_j -- a reversed cumulative sum over the choices' last positions, where
    :func:`choice_distributions` computes one read-out per choice (the same sums, other rounding)."""
    d = distances.float()
    rows, k = d.shape
    if config.readout == "softmax":  # shifted by the nearest distance: exp never overflows
        base = torch.exp((d[:, :1] - d) / config.temperature)
        base = torch.where(torch.isfinite(d), base, torch.zeros_like(base))  # no neighbour, or none at all
        mass = torch.isfinite(d[:, :1]).float()
    else:
        base = torch.relu(1.0 - d / config.radius)
        mass = base[:, :1]
    last = torch.tensor([min(size, k) - 1 for size in config.choices[1:]], dtype=torch.long)
    totals = base.cumsum(dim=1)[:, last]  # (rows, J)
    taken = choice[:, 1:] * mass
    coefficient = torch.where(totals > 0, taken / totals.clamp_min(1e-30), torch.zeros_like(totals))
    at_last = torch.zeros(rows, k).index_add_(1, last, coefficient)
    combined = base * at_last.flip(1).cumsum(dim=1).flip(1)
    model_share = choice[:, 0] + (choice[:, 1:] - taken).sum(dim=1)
    return combined, model_share, taken.sum(dim=1).cpu()


def adaptive_weights(distances: Tensor, values: Tensor, net: MetaK) -> Tuple[Tensor, Tensor, Tensor]:
    """(each neighbour's share of the final distribution (rows, k), the model's share (rows,), the
    neighbours' share (rows,)) of the adaptive mixture for one beam step's rows.

    The module docstring's mixture regrouped: p = p_model (w_0 + sum_j w_j (1 - m_j)) + sum_i W_i
    [y = v_i], where neighbour i's weight W_i = sum over the choices that read it (k_j > i) of
    w_j m_j times its read-out weight in choice j. So one scatter of k weights into the vocabulary
    replaces one dense (rows, vocab) distribution per choice (the same sum, in another order)."""
    with torch.no_grad():
        choice = net(distances, values)  # (rows, J)
        if net.config.readout in PREFIX_READOUTS and bool((distances[:, 1:] >= distances[:, :-1]).all()):
            return prefix_mixture(distances, choice, net.config)
        combined = distances.new_zeros(distances.shape, dtype=torch.float32)
        model_share = choice[:, 0].clone()
        knn_share = torch.zeros(len(choice))
        for j, (w, mass) in enumerate(choice_distributions(distances, values, net.config), start=1):
            taken = choice[:, j] * mass
            combined[:, :w.size(1)] += taken.unsqueeze(1) * w
            model_share += choice[:, j] - taken
            knn_share += taken.cpu()
        return combined, model_share, knn_share


def adaptive_mix(lprobs: Tensor, distances: Tensor, values: Tensor, net: MetaK) -> Tuple[Tensor, Tensor]:
    """(log p of the adaptive mixture for one beam step's rows, ruled-out tokens kept out -- a new
    tensor, ``lprobs`` is left as it is; each row's share taken by the neighbours)."""
    combined, model_share, knn_share = adaptive_weights(distances, values, net)
    return mix_neighbours(lprobs.clone(), combined, values, model_share), knn_share


def reference_terms(distances: Tensor, values: Tensor, refs: Tensor, config: MetaKConfig) -> Tuple[Tensor, Tensor]:
    """(p_knn^(k_j)(reference), m_j) per token and choice j > 0: all that training needs."""
    p, m = [], []
    for w, mass in choice_distributions(distances, values, config):
        hits = values[:, :w.size(1)] == refs.unsqueeze(1)
        p.append((w * hits).sum(1))
        m.append(mass)
    return torch.stack(p, 1).double(), torch.stack(m, 1).double()


def mixture_nll(choice: Tensor, p_ref: Tensor, p_knn: Tensor, mass: Tensor) -> Tensor:
    """Mean NLL of the references under the adaptive mixture (``choice`` (N, J), the rest per token)."""
    choice = choice.double()
    p = choice[:, 0] * p_ref + (choice[:, 1:] * (mass * p_knn + (1 - mass) * p_ref.unsqueeze(1))).sum(1)
    return -torch.log(p.clamp_min(1e-30)).mean()


def held_out(examples: Tensor) -> Tensor:
    """The early-stopping tokens: those of every fifth segment (every fifth token when the split
    has too few segments for that)."""
    held = (examples % HELD_OUT_EVERY) == 0
    if held.all() or not held.any():
        held = torch.arange(len(examples)) % HELD_OUT_EVERY == 0
    return held


def train_meta_k(distances: Tensor, values: Tensor, refs: Tensor, lp_ref: Tensor, examples: Tensor,
                 config: MetaKConfig, steps: int = 3000, lr: float = 3e-3, batch: int = 4096,
                 seed: int = 1) -> Tuple[MetaK, dict]:
    """Fit the network on the validation tokens (teacher-forced model probabilities ``lp_ref``,
    each token's nearest entries ``distances``/``values``, its segment ``examples``); early stopping
    on the held-out segments. Returns the network (best held-out NLL) and a report."""
    torch.manual_seed(seed)
    p_ref = lp_ref.double().exp()
    p_knn, mass = reference_terms(distances, values, refs, config)
    held = held_out(examples)
    fit, check = (~held).nonzero().squeeze(1), held.nonzero().squeeze(1)
    net = MetaK(config)
    features = net.features(distances, values).detach()
    optimiser = torch.optim.Adam(net.parameters(), lr=lr)

    def loss_on(idx):
        w = torch.softmax(net.net(features[idx]), dim=1)
        w = torch.cat([MODEL_SHARE + (1 - MODEL_SHARE) * w[:, :1], (1 - MODEL_SHARE) * w[:, 1:]], dim=1)
        return mixture_nll(w, p_ref[idx], p_knn[idx], mass[idx])

    best, best_state, best_step = float("inf"), None, 0
    for step in range(1, steps + 1):
        idx = fit[torch.randint(len(fit), (min(batch, len(fit)),))]
        optimiser.zero_grad()
        loss_on(idx).backward()
        optimiser.step()
        if step % 100 == 0 or step == steps:
            with torch.no_grad():
                held_nll = float(loss_on(check))
            if held_nll < best - 1e-5:
                best, best_step = held_nll, step
                best_state = {k: v.clone() for k, v in net.state_dict().items()}
            elif step - best_step >= 1000:  # no gain for 1,000 steps
                break
    net.load_state_dict(best_state)
    net.eval()
    with torch.no_grad():
        w = net(distances[check], values[check])
        share_by_choice = w.mean(0).tolist()
    report = {"held_out_nll": best, "held_out_model_nll": float(-lp_ref[check].double().mean()),
              "fit_tokens": len(fit), "held_out_tokens": len(check), "best_step": best_step,
              "choices": list(config.choices), "mean_weight_by_choice": [round(x, 4) for x in share_by_choice],
              "config": asdict(config)}
    return net, report


__all__ = ["AdaptiveError", "MetaK", "MetaKConfig", "adaptive_mix", "distinct_counts", "held_out", "mixture_nll",
           "train_meta_k"]
