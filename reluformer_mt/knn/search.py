"""kNN-MT at decoding time: the state of every beam step looks up its nearest datastore entries,
and a read-out (:mod:`reluformer_mt.knn.readout`) mixes their tokens into the model's distribution.

Two kinds of datastore:
- :class:`FullDatastore`: one datastore over a whole corpus (:mod:`reluformer_mt.knn.datastore`),
  searched with its faiss index (Khandelwal et al., ICLR 2021);
- :class:`PerInputDatastores`: for each source, a tiny datastore of its translation memory
  matches only, force-decoded at translation time and searched exactly (SK-MT, Dai et al., ICLR
  2023, arXiv:2211.05578): nothing is stored ahead, only the memory itself.

The state is read where fairseq's decoder hands it to the output projection (a forward hook,
:class:`StateRecorder`), so every family, with or without memory attention, is served the same
way and fairseq's ``SequenceGenerator`` is used unchanged; the mixing happens in a part of the beam
search's guidance (:mod:`reluformer_mt.guidance.knn`), whose rows are the rows the decoder
just ran.
"""
import math
from collections import Counter
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from reluformer_mt.knn import fused
from reluformer_mt.knn.adaptive import FILE_NAME, MetaK, adaptive_weights
from reluformer_mt.knn.readout import MODEL_SHARE, ReadoutError, mix_neighbours, neighbour_weights
from reluformer_mt.knn.values import KnnOptions  # noqa: F401  (the search values; re-exported)


def describe_values(options: KnnOptions) -> str:
    """The search values in words, for the translator's description."""
    spread = f"radius {options.radius:g}" if options.readout == "relu" else f"T {options.temperature:g}"
    if options.adaptive:
        return f"adaptive kNN-MT (a Meta-k network picks k and the share per step; the datastore's {FILE_NAME})"
    return f"{options.readout} read-out of k={options.k}, lambda {options.lam:g}, {spread}"


class StateRecorder:
    """Keeps the last input of a decoder's output projection: the hidden state kNN-MT searches with
    ((rows, 1, dim) at each incremental step)."""

    def __init__(self, decoder):
        projection = getattr(decoder, "output_projection", None)
        if projection is None:
            raise ReadoutError(f"kNN-MT: the decoder {type(decoder).__name__} has no output_projection to read states from")
        self.state: Optional[Tensor] = None
        self._handle = projection.register_forward_hook(self._keep)

    def _keep(self, module, inputs, output):
        self.state = inputs[0]

    def last_states(self, rows: int) -> Tensor:
        if self.state is None:
            raise RuntimeError("kNN-MT: no decoder state recorded for this step")
        state = self.state[:, -1, :] if self.state.dim() == 3 else self.state
        if state.size(0) != rows:
            raise RuntimeError(f"kNN-MT: {state.size(0)} decoder states for {rows} beam rows")
        return state

    def close(self) -> None:
        self._handle.remove()


class FullDatastore:
    """A corpus datastore searched by its index (sources are ignored: every row searches all)."""

    def __init__(self, datastore):
        self.datastore = datastore

    def neighbours(self, states: Tensor, sources: Tensor, k: int, sentences: Optional[Tensor] = None):
        """(distances, values, trust): trust None (every entry is equally a corpus entry)."""
        distances, values = self.datastore.search(states.detach().float().cpu().numpy(), k)
        return torch.from_numpy(distances), torch.from_numpy(values.astype(np.int64)), None


class PerInputDatastores:
    """Small datastores of memory matches, searched exactly in torch: one per *unit*, a source's
    sentence (a document segment has several), so that a row writing sentence i of a segment
    searches only sentence i's matches -- another verse's match is no evidence for this one. Each
    entry also carries the fuzzy score of the match it comes from (its *trust*): the mixer scales
    the neighbours' mass by the trust of those that voted, so a 0.9-similar match may decide the
    token and a 0.3-similar one barely moves it."""

    def __init__(self, units: Sequence[Sequence[Tuple[Tensor, Tensor, float]]], batched: bool = False):
        """``units[source][sentence]`` = (keys (n, dim), values (n,), fuzzy score); a source with no
        sentence gets one empty unit. ``batched``: each step's distances as one batched product of
        every unit the rows read with the rows reading it (:meth:`_products`), instead of a copy of
        the unit's keys for every beam row; the same neighbours up to float rounding."""
        flat, self.first_unit, self.n_units = [], [], []
        for sentences in units:
            self.first_unit.append(len(flat))
            self.n_units.append(max(1, len(sentences)))
            flat += list(sentences) or [(torch.zeros(0, 1), torch.zeros(0, dtype=torch.long), 0.0)]
        self.first_unit = torch.tensor(self.first_unit, dtype=torch.long)
        self.n_units = torch.tensor(self.n_units, dtype=torch.long)
        dim = next((k.size(1) for k, v, _ in flat if len(v)), 1)
        longest = max(1, max(len(v) for _, v, _ in flat))
        self.keys = torch.zeros(len(flat), longest, dim)
        self.values = torch.full((len(flat), longest), -1, dtype=torch.long)
        self.trust = torch.zeros(len(flat), longest)
        for u, (k, v, t) in enumerate(flat):
            self.keys[u, :len(v)] = k.float()
            self.values[u, :len(v)] = v
            self.trust[u, :len(v)] = t if isinstance(t, float) else torch.as_tensor(t, dtype=torch.float32)
        # padding slots at distance inf: added to the distances (inf + x = inf, 0 + x = x exactly)
        self.norms = (self.keys ** 2).sum(-1).masked_fill(self.values < 0, float("inf"))
        self.counts = torch.tensor([len(v) for _, v, _ in flat], dtype=torch.long)  # each unit's entries, first in its row
        self.entries = sum(len(v) for _, v, _ in flat)
        self.batched = batched
        # (units, dim, n): read by the batched product and the C++ search
        self.keys_t = self.keys.transpose(1, 2).contiguous() if batched or fused.available(self.keys) else None
        self._read, self._read_keys = None, None  # the units the last step read, and their keys
        # False: a row's neighbours may come in any order (a read-out that only sums over them; the
        # C++ search then skips sorting them, at k 256 the larger part of its time)
        self.ordered = True

    def neighbours(self, states: Tensor, sources: Tensor, k: int, sentences: Optional[Tensor] = None):
        """(distances, values, trust) of each row's nearest entries in the unit of its source and
        sentence (``sentences``: the row's sentence index in its segment; None = the first)."""
        states = states.detach().float().cpu()
        sources = sources.cpu()
        sentence = torch.zeros_like(sources) if sentences is None else sentences.cpu()
        units = self.first_unit[sources] + torch.minimum(sentence, self.n_units[sources] - 1)
        if self.keys_t is not None and fused.available(states, self.keys):  # the same neighbours, one C++ loop
            return fused.unit_neighbours(states, units, self.keys_t, self.norms, self.counts, self.values, self.trust, k,
                                         self.ordered)
        if self.batched:
            products, norms = self._products(states, units)
        else:
            products, norms = torch.einsum("rd,rnd->rn", states, self.keys[units]), self.norms.index_select(0, units)
        # the negated distances' largest: topk's smallest is slower on the CPU
        closeness = (2 * products - norms - (states ** 2).sum(-1, keepdim=True)).clamp_max(0)
        # a NaN (a NaN or inf key) is farthest of all: topk would rank it first
        closeness = closeness.masked_fill_(closeness.isnan(), float("-inf"))
        closest, at = torch.topk(closeness, min(k, closeness.size(1)), dim=1)
        nearest = closest.neg_()
        # only the k chosen slots of each row's unit are read: one gather from the flat tables
        flat = (units.unsqueeze(1) * self.values.size(1) + at).view(-1)
        values = self.values.view(-1).index_select(0, flat).view_as(at)
        return nearest, values.masked_fill(torch.isinf(nearest), -1), self.trust.view(-1).index_select(0, flat).view_as(at)

    def _products(self, states: Tensor, units: Tensor) -> Tuple[Tensor, Tensor]:
        """((rows, n) inner products of each row's state with its unit's keys, (rows, n) the keys'
        norms): the rows grouped by unit (a sentence's beams read one unit), one bmm of (units read,
        rows per unit, dim) by (units read, dim, n)."""
        read, group, counts = torch.unique(units, return_inverse=True, return_counts=True)
        width = int(counts.max())
        order = torch.argsort(group, stable=True)
        # each row's place in the (units read x width) grid of queries
        place = torch.empty_like(order)
        place[order] = group[order] * width + torch.arange(len(units)) - (torch.cumsum(counts, 0) - counts)[group[order]]
        # the read units' keys are gathered again only when the set changes (a copy of every read
        # unit's keys each step cost more than the product); index_select is faster than keys_t[read]
        if self._read is None or not torch.equal(self._read, read):
            self._read, self._read_keys = read, self.keys_t.index_select(0, read)
        queries = states.new_zeros(len(read) * width, states.size(1)).index_copy_(0, place, states)
        products = torch.bmm(queries.view(len(read), width, -1), self._read_keys)
        return products.view(len(read) * width, -1).index_select(0, place), self.norms.index_select(0, units)


class RestrictedSearch(PerInputDatastores):
    """A corpus datastore searched, for each sentence, among the entries of its memory matches only
    (``--knn-restrict M``): the entries of the M training sentences the memory retrieves for it, read
    from the datastore (nothing is force-decoded) and searched exactly in one batched product per
    sentence. Fast kNN-MT (Meng et al., ACL 2022 Findings, arXiv:2105.14528) restricts the search to
    the entries of the source's own tokens; the memory's retrieval is the same idea at the sentence
    level, and it replaces an index probe over the whole corpus by a product with a few hundred keys.
    Without ``scores`` the neighbours are corpus entries like any other: no trust scaling. With the
    matches' fuzzy ``scores`` it is per-input kNN-MT whose keys are read from the datastore instead
    of force-decoded (``--knn-memory-keys``): each entry trusted as its match."""

    def __init__(self, datastore, matches_of_sources: Sequence[Sequence[Sequence[int]]],
                 scores_of_sources: Optional[Sequence[Sequence[Sequence[float]]]] = None):
        """``matches_of_sources[source][sentence]``: the memory entries (= the datastore's sentences)
        whose datastore entries that sentence searches; ``scores_of_sources``, the same shape: their
        fuzzy scores (the entries' trust), or None."""
        first, counts = datastore.sentence_entries()
        self.trusted = scores_of_sources is not None
        units = []
        for s, sentences in enumerate(matches_of_sources):
            units.append([])
            for u, ids in enumerate(sentences):
                scores = scores_of_sources[s][u] if self.trusted else [0.0] * len(ids)
                kept = [(int(i), float(f)) for i, f in zip(ids, scores) if i >= 0]
                at = (np.concatenate([np.arange(first[i], first[i] + counts[i]) for i, _ in kept]) if kept
                      else np.zeros(0, dtype=np.int64))
                trust = torch.from_numpy(np.repeat(np.asarray([f for _, f in kept], dtype=np.float32),
                                                   [int(counts[i]) for i, _ in kept]))
                keys = torch.from_numpy(np.asarray(datastore.keys[at], dtype=np.float32)).reshape(len(at), datastore.dim)
                units[-1].append((keys, torch.from_numpy(datastore.values[at].astype(np.int64)), trust))
        super().__init__(units, batched=True)

    def neighbours(self, states: Tensor, sources: Tensor, k: int, sentences: Optional[Tensor] = None):
        distances, values, trust = super().neighbours(states, sources, k, sentences)
        return distances, values, trust if self.trusted else None


class KnnMixer:
    """Mixes a datastore's neighbours into one beam step's log-probabilities (:meth:`mix`)."""

    def __init__(self, recorder: StateRecorder, options: KnnOptions):
        self.recorder, self.options = recorder, options.check()
        self.store = None  # FullDatastore or PerInputDatastores, set before generating
        self.adaptive: Optional[MetaK] = None  # with options.adaptive: the full datastore's Meta-k network
        self.skip_confident = 1.0  # rows whose best token is more probable skip the search (1: none)
        self.stats: Counter = Counter()
        self.cpp_steps = 0  # steps mixed by the C++ step (the translator's summary names its loops)

    def use_datastore(self, datastore) -> "KnnMixer":
        """Search ``datastore`` (a loaded :class:`reluformer_mt.knn.datastore.Datastore`); with
        ``options.adaptive`` its Meta-k network (trained by the tuner) decides each step's mixture."""
        self.store = FullDatastore(datastore)
        if self.options.adaptive:
            self.adaptive = MetaK.load(datastore.directory, datastore.meta["fingerprint"])
        return self

    def mix(self, lprobs: Tensor, sources: Tensor, eos: Optional[int] = None, eos_as: Optional[Tensor] = None,
            sentences: Optional[Tensor] = None) -> Tensor:
        """``lprobs`` (rows, vocab) mixed, in place, with the kNN distribution of each row's state;
        ``sources`` (rows,) index the per-input datastores. ``eos_as`` (rows,): the token a neighbour's
        ``eos`` votes for in each row -- in a document segment, a row with sentences still to write
        takes an entry that ended its sentence (a single-sentence match, a training segment's last
        sentence) as a vote for the separator, else the vote would go to an EOS the constraint forbids.
        With :attr:`skip_confident` P < 1, a row whose best token has a probability above P is left
        to the model: only the other rows search and mix."""
        if self.store is None or (self.options.lam == 0 and self.adaptive is None):
            return lprobs
        rows = lprobs.size(0)
        states = self.recorder.last_states(rows)
        top = lprobs.amax(dim=1, keepdim=True)  # (an amax is ~10x faster than an argmax on CPU)
        self.stats["knn: beam steps"] += rows
        if self.skip_confident < 1:
            searching = (top.squeeze(1) <= math.log(self.skip_confident)).nonzero().squeeze(1)
            if len(searching) < rows:
                self.stats["knn: beam steps left to the model (confident)"] += rows - len(searching)
                if len(searching) == 0:
                    return lprobs
                def pick(t):
                    return None if t is None else t.index_select(0, searching.to(t.device))

                if fused.available(lprobs) and lprobs.is_contiguous():  # mixed in place at the searching rows
                    return self._mix_rows(lprobs, pick(top), pick(states), pick(sources), eos, pick(eos_as),
                                          pick(sentences), rows=searching)
                part = lprobs.index_select(0, searching)
                self._mix_rows(part, pick(top), pick(states), pick(sources), eos, pick(eos_as), pick(sentences))
                return lprobs.index_copy_(0, searching, part)
        return self._mix_rows(lprobs, top, states, sources, eos, eos_as, sentences)

    def _mix_rows(self, lprobs: Tensor, top: Tensor, states: Tensor, sources: Tensor, eos: Optional[int],
                  eos_as: Optional[Tensor], sentences: Optional[Tensor], rows: Optional[Tensor] = None) -> Tensor:
        """:meth:`mix` of the rows that search (``top``: their best log-probabilities): all rows of
        ``lprobs``, or with ``rows`` (the C++ mixture only) those rows of it, in place."""
        o = self.options
        k = self.adaptive.config.k_max if self.adaptive is not None else o.k
        if isinstance(self.store, PerInputDatastores):
            # only the adaptive mixture reads the neighbours in order (nearest first: the Meta-k features)
            self.store.ordered = self.adaptive is not None
        distances, values, trust = self.store.neighbours(states, sources, k, sentences)
        if eos_as is not None:
            values = torch.where(values == eos, eos_as.cpu().unsqueeze(1).to(values.dtype), values)
        # the C++ step where it serves (knn/fused.py): read-out, share and mixture in one loop
        in_cpp = rows is not None or (fused.available(lprobs, distances) and lprobs.is_contiguous())
        self.cpp_steps += in_cpp
        if in_cpp and self.adaptive is None and o.readout in fused.READOUTS:
            counts = fused.mix_readout(lprobs, rows, distances, values, trust, top, o.lam, o.readout, o.temperature,
                                       o.radius, MODEL_SHARE)
            return self._counted(lprobs, *counts)
        if (in_cpp and self.adaptive is not None and self.adaptive.config.readout in fused.READOUTS
                and distances.size(1) == self.adaptive.config.k_max
                and bool((distances[:, 1:] >= distances[:, :-1]).all())):  # its prefix sums need them in order
            return self._counted(lprobs, *fused.mix_adaptive(lprobs, rows, distances, values, top, self.adaptive,
                                                             MODEL_SHARE))
        if self.adaptive is not None:
            weights, model_share, mass = adaptive_weights(distances, values, self.adaptive)
        else:
            weights, mass = neighbour_weights(distances, o.readout, o.temperature, o.radius)
            if trust is not None:  # per-input entries: the mass the voting matches' fuzzy scores allow
                mass = mass * (weights * trust).sum(dim=1)
            # the model keeps at least MODEL_SHARE (readout.mix_log_probs says why)
            share = (o.lam * mass).clamp(0.0, 1.0 - MODEL_SHARE)
            weights, model_share = weights * share.unsqueeze(1), 1 - share
        self.stats["knn: beam steps with kNN mass"] += int((mass > 0).sum())
        if in_cpp:
            return self._counted(lprobs, fused.mix_votes(lprobs, rows, weights, values, model_share, top), 0)
        at = values.long().clamp_min(0).to(lprobs.device)
        was_best = lprobs.gather(1, at) == top  # the voted tokens that were the best
        mix_neighbours(lprobs, weights, values, model_share)
        # the steps where the neighbours decided the token: another voted token now scores above the
        # one that was best (every token no neighbour voted for moved by the same log share)
        after = lprobs.gather(1, at)
        old_best = torch.where(was_best.any(dim=1), after.masked_fill(~was_best, float("-inf")).amax(dim=1),
                               top.squeeze(1) + model_share.to(lprobs.device, lprobs.dtype).log())
        self.stats["knn: beam steps whose best token the neighbours changed"] += int(
            (after.masked_fill(was_best, float("-inf")).amax(dim=1) > old_best).sum())
        return lprobs

    def _counted(self, lprobs: Tensor, changed: int, with_mass: int) -> Tensor:
        """``lprobs``, after counting the C++ mixture's rows in :attr:`stats`."""
        self.stats["knn: beam steps whose best token the neighbours changed"] += changed
        self.stats["knn: beam steps with kNN mass"] += with_mass
        return lprobs


@torch.no_grad()
def per_input_states(model, task, pairs: Sequence[Tuple[Tensor, Tensor]], memories: Optional[Sequence[Tensor]] = None,
                     max_tokens: int = 8000, device: str = "cpu") -> List[Tuple[Tensor, Tensor]]:
    """(keys, values) of each (source ids with </s>, target ids without </s>) pair, force-decoded;
    ``memories``: the memory tokens each pair is decoded with (models trained with memory attention)."""
    from fairseq.data import LanguagePairDataset, data_utils

    if not pairs:
        return []
    eos = task.tgt_dict.eos()
    targets = [torch.cat([t, torch.tensor([eos])]) for _, t in pairs]
    sources = [s for s, _ in pairs]
    dataset = LanguagePairDataset(sources, [len(s) for s in sources], task.src_dict, targets, [len(t) for t in targets],
                                  task.tgt_dict, shuffle=False)
    if memories is not None:
        dataset = task.dataset_with_matches(dataset, list(memories))
    out: List[Optional[Tuple[Tensor, Tensor]]] = [None] * len(pairs)
    order = np.argsort([len(s) + len(t) for s, t in zip(sources, targets)], kind="stable")
    for batch in data_utils.batch_by_size(order, dataset.num_tokens, max_tokens=max_tokens):
        sample = dataset.collater([dataset[int(i)] for i in batch])
        if device != "cpu":
            from fairseq import utils

            sample = utils.move_to_cuda(sample, device=torch.device(device))
        features, _ = model(**sample["net_input"], features_only=True)
        target = sample["target"]
        for row, idx in enumerate(sample["id"].tolist()):
            real = target[row] != task.tgt_dict.pad()
            out[idx] = (features[row][real].float().cpu(), target[row][real].cpu())
    return out


__all__ = ["FullDatastore", "KnnMixer", "KnnOptions", "PerInputDatastores", "RestrictedSearch", "StateRecorder", "per_input_states"]
