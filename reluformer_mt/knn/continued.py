"""A corpus datastore searched every few steps, its neighbours followed in between (``--knn-search-every N``).

A datastore's entries lie in the order of their training targets: entry ``i + 1`` is the state
that followed entry ``i`` once its token ``values[i]`` was written. So when a beam row writes the
token that some of its neighbours voted for, those neighbours' successors are candidates for its
next step's neighbours, which chunk-based kNN-MT (Martins, Marinho & Martins, "Chunk-based Nearest
Neighbor Machine Translation", EMNLP 2022) and the caching of Martins et al. ("Efficient Machine
Translation Domain Adaptation", 2022) use to skip most index searches. Here the index is searched
at every ``every``-th step and wherever a row has no successor to follow; the other steps read the
successors only, their distances to the row's own state computed exactly. An approximation of the
full search (fewer, possibly other neighbours): the tuner's validation decides whether it keeps
the quality.
"""
from collections import Counter
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor


class ContinuedSearch:
    """The neighbours of a :class:`reluformer_mt.knn.search.FullDatastore`'s datastore, searched every
    ``every`` steps and followed in between. :meth:`follow` gives it each step's prefixes (which row
    continues which of the last step's rows) before :meth:`neighbours`."""

    def __init__(self, datastore, every: int, stats: Counter):
        self.datastore, self.every, self.stats = datastore, every, stats
        self.prefix: Optional[Tensor] = None
        self._last: Dict[Tuple, np.ndarray] = {}  # (source, prefix) of the last step's rows -> entry ids

    def follow(self, prefix: Tensor) -> None:
        self.prefix = prefix

    def neighbours(self, states: Tensor, sources: Tensor, k: int, sentences: Optional[Tensor] = None):
        """(distances, values, trust None) as :meth:`FullDatastore.neighbours`."""
        queries = states.detach().float().cpu().numpy()
        prefixes = self.prefix.cpu().tolist()
        rows = [(int(s), tuple(p)) for s, p in zip(sources.cpu().tolist(), prefixes)]
        distances = np.full((len(rows), k), np.inf, dtype=np.float32)
        ids = np.full((len(rows), k), -1, dtype=np.int64)
        search = list(range(len(rows))) if len(prefixes[0]) % self.every == 0 else self._successors(queries, rows, distances, ids)
        if search:
            found, at = self.datastore.search_ids(queries[search], k)
            distances[search], ids[search] = found, at
        self.stats["knn: beam steps that followed their neighbours (no index search)"] += len(rows) - len(search)
        self._last = {row: ids[r] for r, row in enumerate(rows)}
        values = np.where(ids >= 0, self.datastore.values[np.maximum(ids, 0)], -1)
        return torch.from_numpy(distances), torch.from_numpy(values.astype(np.int64)), None

    def _successors(self, queries: np.ndarray, rows, distances: np.ndarray, ids: np.ndarray) -> List[int]:
        """Fill the rows whose parent's neighbours voted for the token the row wrote with those
        neighbours' successors (nearest first); returns the rows left to search."""
        store, search = self.datastore, []
        for r, (source, prefix) in enumerate(rows):
            parent = self._last.get((source, prefix[:-1]))
            if parent is None:
                search.append(r)
                continue
            parent = parent[parent >= 0]
            follow = parent[(store.values[parent] == prefix[-1]) & (parent + 1 < store.size)] + 1
            if not len(follow):
                search.append(r)
                continue
            d = ((np.asarray(store.keys[follow], dtype=np.float32) - queries[r]) ** 2).sum(axis=1)
            order = np.argsort(d, kind="stable")[:ids.shape[1]]
            distances[r, :len(order)], ids[r, :len(order)] = d[order], follow[order]
        return search


__all__ = ["ContinuedSearch"]
