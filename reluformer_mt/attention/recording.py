"""Recording what attention modules compute during one block of code, returned by the recording.

Two context managers, the only way to turn recording on:

- ``with record_attention(model, regularise=fns, entropy_margin_ratio=0.7, statistics=True) as
  record:`` sums, over every call inside the block, the counts of zero weights among visible
  ones and of null rows (``zeros``, ``visible``, ``null_rows``, ``rows``) and, for the modules
  whose function is in ``regularise`` (``True``: all), ReLUFormer's two row losses
  (``norm_loss``, ``entropy_margin``, ``reg_rows``; tensors with gradients). ``record.totals()``
  sums them over the modules (the criterion's loss and logs), ``record.statistics(module)`` is
  one module's. Padding query rows are left out (``ReluformerAttention._live_queries``).
- ``with capture_attention(modules) as captured:`` keeps every module's per-head weights
  (heads x batch x tgt x src, detached) of its last call; ``captured.weights(module)``, or with
  ``modules`` a mapping kind -> modules by layer, ``captured.weights(kind)`` (layers first).

``model`` / ``modules``: a model, one ``ReluformerAttention``, an iterable of them or a mapping of
such iterables. A recording installs itself as each module's one private ``_recorder`` on entry
and puts back the previous one on exit, also when the block raises; the module calls it and
nothing else sets attributes on the module. Nested blocks each see every call of their modules.
"""
from typing import Dict, Iterator, List, Mapping, Optional, Union

import torch
from torch import Tensor

from reluformer_mt.attention.regularisers import regularisers_from_rows, row_regularisers
from reluformer_mt.attention.multihead import ReluformerAttention


def attention_modules_in(modules) -> List[ReluformerAttention]:
    """Every ``ReluformerAttention`` in a model, a module, an iterable or a mapping of them, once, in order."""
    if isinstance(modules, Mapping):
        modules = [m for group in modules.values() for m in group]
    elif isinstance(modules, torch.nn.Module):
        # one pre-order walk of the model (the criterion records every training update): walking
        # each module's own subtree again, as for a list below, visits every module once per
        # ancestor for the same list in the same order
        return [m for m in modules.modules() if isinstance(m, ReluformerAttention)]
    found = {}  # dict: ordered and without repeats
    for m in modules:
        for sub in (m.modules() if isinstance(m, torch.nn.Module) else [m]):
            if isinstance(sub, ReluformerAttention):
                found[sub] = None
    return list(found)


class AttentionRecording:
    """What ``record_attention`` and ``capture_attention`` return (see the module docstring)."""

    def __init__(self, modules, statistics: bool = False, regularise: Union[bool, set, list, tuple] = False,
                 entropy_margin_ratio: float = 0.7, weights: bool = False):
        self._kinds = {kind: list(group) for kind, group in modules.items()} if isinstance(modules, Mapping) else {}
        self.modules = attention_modules_in(modules)
        if isinstance(regularise, str):
            regularise = {regularise}
        self._regularised = {m for m in self.modules if regularise is True or (regularise and m.fn in regularise)}
        self._statistics = statistics
        self._ratio = entropy_margin_ratio
        self._capture = weights
        self._stats: Dict[ReluformerAttention, Dict[str, Tensor]] = {m: {} for m in self.modules}
        # the per-row sums of the fast paths' calls, kept as they come and summed up when asked
        # for (:func:`pending_statistics`): one computation per block instead of one per call
        self._rows: Dict[ReluformerAttention, List[tuple]] = {m: [] for m in self.modules}
        self._weights: Dict[ReluformerAttention, Tensor] = {}
        self._outer: Optional[Dict[ReluformerAttention, Optional["AttentionRecording"]]] = None

    # ------------------------------------------------------------ installation: only here
    def __enter__(self) -> "AttentionRecording":
        if self._outer is not None:
            raise RuntimeError("an attention recording serves one with-block; start a new one")
        self._outer = {}
        for m in self.modules:
            self._outer[m], m._recorder = m._recorder, self
        return self

    def __exit__(self, *exc_info) -> bool:
        for m, outer in self._outer.items():
            m._recorder = outer
        return False

    # ------------------------------------------------------------ results
    def statistics(self, module: ReluformerAttention) -> Dict[str, Tensor]:
        """One module's sums over the block's calls (empty if it recorded nothing)."""
        self._settle()
        return self._stats[module]

    def totals(self) -> Dict[str, Tensor]:
        """The modules' sums added up, in module order; only keys that were recorded. The rows of
        the fast paths are summed over all modules at once (:func:`pending_statistics`)."""
        totals: Dict[str, Tensor] = {}
        stats = [self._stats.values()]
        if any(self._rows.values()):
            stats.append([pending_statistics([c for calls in self._rows.values() for c in calls])])
        for group in stats:
            for one in group:
                for key, value in one.items():
                    totals[key] = totals.get(key, 0) + value
        return totals

    def _settle(self) -> None:
        """Move every module's kept rows into its own sums (for per-module statistics)."""
        for module, calls in self._rows.items():
            if calls:
                self._add(module, pending_statistics(calls))
                calls.clear()

    def weights(self, which: Union[str, ReluformerAttention]) -> Tensor:
        """A module's captured weights, or a kind's stacked over its modules (layers first)."""
        modules = self._kinds[which] if isinstance(which, str) else [which]
        missing = [m for m in modules if m not in self._weights]
        if missing:
            raise RuntimeError(f"{which if isinstance(which, str) else 'the'} attention was not captured "
                               f"(is the layer skipped?)")
        if not isinstance(which, str):
            return self._weights[which]
        return torch.stack([self._weights[m] for m in modules])

    # ------------------------------------------------------------ what the module calls
    def _chain(self, module) -> Iterator["AttentionRecording"]:
        """This recording and those it is nested in, for ``module``."""
        recording = self
        while recording is not None:
            yield recording
            recording = recording._outer[module]

    def _counts(self, module) -> bool:
        return self._statistics or module in self._regularised

    def records_statistics(self, module) -> bool:
        return any(r._counts(module) for r in self._chain(module))

    def regularises(self, module) -> bool:
        return any(module in r._regularised for r in self._chain(module))

    def captures(self, module) -> bool:
        return any(r._capture for r in self._chain(module))

    def add_weights(self, module, weights: Tensor, keep: Tensor, n_visible: Tensor,
                    live_queries: Optional[Tensor]) -> None:
        """The reference path: the weights of a call (B, H, T, S)."""
        for r in self._chain(module):
            if r._counts(module):
                r._add(module, weight_statistics(weights, keep, n_visible, live_queries, r._ratio_for(module)))

    def add_rows(self, module, mass: Tensor, xlogx: Tensor, nonzero: Tensor, n_visible: Tensor,
                 live_queries: Optional[Tensor]) -> None:
        """The fast paths: per-row sums (B, H, T each)."""
        for r in self._chain(module):
            if r._counts(module):
                r._rows[module].append((mass, xlogx, nonzero, n_visible, live_queries, r._ratio_for(module)))

    def add_softmax_rows(self, module, rows: Tensor) -> None:
        """fairseq's softmax forward: rows are never null and hold no exact zeros."""
        add = {"rows": rows * module.num_heads, "zeros": torch.tensor(0), "null_rows": torch.tensor(0)}
        for r in self._chain(module):
            if r._counts(module):
                r._add(module, add)

    def add_head_weights(self, module, weights: Tensor) -> None:
        for r in self._chain(module):
            if r._capture:
                r._weights[module] = weights.detach()

    def _ratio_for(self, module) -> Optional[float]:
        """The entropy-margin ratio where this recording regularises ``module``, else None."""
        return self._ratio if module in self._regularised else None

    def _add(self, module, add: Dict[str, Tensor]) -> None:
        stats = self._stats[module]
        for key, value in add.items():
            stats[key] = stats.get(key, 0) + value


def weight_statistics(weights: Tensor, keep: Tensor, n_visible: Tensor, live_queries: Optional[Tensor],
                      entropy_margin_ratio: Optional[float]) -> Dict[str, Tensor]:
    """Counts (and with a ratio, ReLUFormer's row losses) of weights (B, H, T, S).

    Every weight function writes exact zeros at hidden keys, so one count of non-zeros per row
    and the visible counts ``n_visible`` (B|1, 1, T, 1) give the counts: a few passes over T x S
    tensors less than masking them (profiled: a quarter of a sparsemax training step at 1024)."""
    # (B, H, T); summing the bool mask as bytes is ~1.7x faster than count_nonzero on CPU (profiled)
    nonzero = weights.detach().ne(0).view(torch.uint8).sum(-1, dtype=torch.int32)
    add = _row_counts(nonzero, n_visible.view(n_visible.size(0), 1, -1).expand_as(nonzero), live_queries)
    if entropy_margin_ratio is not None:
        if live_queries is not None:  # padding rows: as if they saw no key
            keep = keep & live_queries.unsqueeze(-1)
        norm_loss, margin, used = row_regularisers(weights, keep, n_visible, entropy_margin_ratio)
        add.update(norm_loss=norm_loss, entropy_margin=margin, reg_rows=used)
    return add


def _row_counts(nonzero: Tensor, n_visible: Tensor, live_queries: Optional[Tensor]) -> Dict[str, Tensor]:
    """zeros / visible / null rows / rows from per-row non-zero and visible counts (B, H, T)."""
    if live_queries is not None:  # padding rows: as if they saw no key
        n_visible = n_visible * live_queries
    live_rows = n_visible > 0
    return {
        "zeros": n_visible.sum() - (nonzero * live_rows).sum(),
        "visible": n_visible.sum(),
        "null_rows": (live_rows & (nonzero == 0)).sum(),
        "rows": live_rows.sum(),
    }


def row_statistics(mass: Tensor, xlogx: Tensor, nonzero: Tensor, n_visible: Tensor, live_queries: Optional[Tensor],
                   entropy_margin_ratio: Optional[float]) -> Dict[str, Tensor]:
    """``weight_statistics`` from the per-row sums of the fast paths: same keys and values."""
    add = _row_counts(nonzero, n_visible, live_queries)
    if entropy_margin_ratio is not None:
        if live_queries is not None:
            n_visible, mass = n_visible * live_queries, mass * live_queries
        norm_loss, margin, used = regularisers_from_rows(mass, xlogx, n_visible, entropy_margin_ratio)
        add.update(norm_loss=norm_loss, entropy_margin=margin, reg_rows=used)
    return add


def pending_statistics(calls: List[tuple]) -> Dict[str, Tensor]:
    """``row_statistics`` of many calls' rows (mass, xlogx, nonzero, n_visible, live_queries,
    ratio) at once: the rows of every call, flattened and joined, go through the counts and (for
    the calls with a ratio: one recording has one) the regularisers once. Same values as the sum
    of the calls' ``row_statistics``, but for the order of the float sums; a few operators per
    call (the joins and their backward) instead of some sixty (issue 64)."""
    if len(calls) == 1:
        return row_statistics(*calls[0])

    def joined(tensors):
        return torch.cat([t.reshape(-1) for t in tensors])

    def visible_rows(call):  # n_visible (B, H, T) with padding query rows at 0
        n_visible, live = call[3], call[4]
        return n_visible if live is None else n_visible * live

    add = _row_counts(joined([c[2] for c in calls]), joined([visible_rows(c) for c in calls]), None)
    regularised = [c for c in calls if c[5] is not None]
    if regularised:
        mass = joined([c[0] if c[4] is None else c[0] * c[4] for c in regularised])
        norm_loss, margin, used = regularisers_from_rows(mass, joined([c[1] for c in regularised]),
                                                         joined([visible_rows(c) for c in regularised]),
                                                         regularised[0][5])
        add.update(norm_loss=norm_loss, entropy_margin=margin, reg_rows=used)
    return add


def record_attention(modules, regularise: Union[bool, set, list, tuple] = False, entropy_margin_ratio: float = 0.7,
                     statistics: bool = True) -> AttentionRecording:
    """Counts and regularisers of every call of ``modules`` inside the with-block."""
    return AttentionRecording(modules, statistics=statistics, regularise=regularise,
                              entropy_margin_ratio=entropy_margin_ratio)


def capture_attention(modules) -> AttentionRecording:
    """The per-head weights of each module's last call inside the with-block."""
    return AttentionRecording(modules, weights=True)


__all__ = ["AttentionRecording", "attention_modules_in", "capture_attention", "pending_statistics",
           "record_attention", "row_statistics", "weight_statistics"]
