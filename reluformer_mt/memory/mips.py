"""A large key-value memory read by top-k maximum inner product search (EMAT / product-key style).

A dense FFN-memory scores every slot: O(slots) per query. Here the query retrieves only its
top-k keys from a faiss index (exact ``IndexFlatIP``, or approximate HNSW / IVF with the
inner-product metric), the k scores are recomputed in torch from the gathered key rows, and
only those k slots are activated (relu, or a softmax over the k) and read. Gathering rows from
embedding tables keeps autograd exact: gradients reach the query projection and the retrieved
key and value rows only (Lample et al. 2019, arXiv:1907.05242; EMAT, Wu et al. 2022,
arXiv:2210.16773).

The index holds a copy of the keys, so it goes stale as they train: it is rebuilt every
``refresh_updates`` updates (fairseq calls ``set_num_updates`` on every module), after a
checkpoint load, and on first use. Retrieval with a stale index is approximate, but the
scores and gradients always use the current keys.
"""
import math
from typing import Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from reluformer_mt.memory.ffn import MemoryOptionError

MEMORY_INDEXES = ("exact", "hnsw", "ivf")
MEMORY_ACTIVATIONS = ("relu", "softmax")


def check_memory_options(slots: int, topk: int, index: str = "exact", activation: str = "relu",
                         refresh_updates: int = 1) -> None:
    """One-line errors naming the option, before anything is allocated."""
    if slots < 1:
        raise MemoryOptionError(f"--memory-slots: got {slots}, expected a positive number of slots")
    if not 1 <= topk <= slots:
        raise MemoryOptionError(f"--memory-topk: got {topk}, expected 1 <= k <= --memory-slots ({slots})")
    if index not in MEMORY_INDEXES:
        raise MemoryOptionError(f"--memory-index: got {index!r}, expected one of {', '.join(MEMORY_INDEXES)}")
    if activation not in MEMORY_ACTIVATIONS:
        raise MemoryOptionError(f"--memory-activation: got {activation!r}, expected one of {', '.join(MEMORY_ACTIVATIONS)}")
    if refresh_updates < 1:
        raise MemoryOptionError(f"--memory-refresh-updates: got {refresh_updates}, expected >= 1")


class MipsIndex:
    """A faiss inner-product index over a key matrix: build once, search many times.

    ``exact``: IndexFlatIP (brute force, exact). ``hnsw``: an HNSW graph (``hnsw_m`` links,
    ``ef_search``) with METRIC_INNER_PRODUCT; with ``hnsw_l2=True`` over the MIPS-to-L2
    transform instead (Bachrach et al. 2014, as EMAT does): keys get one extra coordinate
    sqrt(R^2 - |k|^2), queries a 0, so the nearest key in L2 has the largest inner product (on
    our benchmark keys, whose norms vary, it recalls less than the inner-product graph). ``ivf``: IndexIVFFlat with an
    inner-product coarse quantiser (``nlist`` lists, default ~4 sqrt(n); ``nprobe`` searched).
    """

    def __init__(self, kind: str = "exact", hnsw_m: int = 32, ef_construction: int = 64, ef_search: int = 128,
                 nlist: Optional[int] = None, nprobe: int = 16, seed: int = 1, hnsw_l2: bool = False):
        if kind not in MEMORY_INDEXES:
            raise MemoryOptionError(f"--memory-index: got {kind!r}, expected one of {', '.join(MEMORY_INDEXES)}")
        self.kind, self.hnsw_m, self.ef_construction, self.ef_search = kind, hnsw_m, ef_construction, ef_search
        self.hnsw_l2 = hnsw_l2
        self.nlist, self.nprobe, self.seed = nlist, nprobe, seed
        self.index = None
        self.size = 0

    def build(self, keys: np.ndarray) -> "MipsIndex":
        import faiss

        keys = np.ascontiguousarray(keys, dtype=np.float32)
        n, d = keys.shape
        if self.kind == "exact":
            index = faiss.IndexFlatIP(d)
        elif self.kind == "hnsw" and self.hnsw_l2:
            norms = (keys.astype(np.float64) ** 2).sum(1)
            extra = np.sqrt(np.maximum(norms.max() - norms, 0.0)).astype(np.float32)[:, None]
            keys = np.ascontiguousarray(np.hstack([keys, extra]))
            index = faiss.IndexHNSWFlat(d + 1, self.hnsw_m)
            index.hnsw.efConstruction = self.ef_construction
        elif self.kind == "hnsw":
            index = faiss.IndexHNSWFlat(d, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = self.ef_construction
        else:
            # faiss wants >= 39 training points per list (64 are sampled); small memories get fewer lists
            nlist = self.nlist or int(4 * math.sqrt(n))
            nlist = max(1, min(nlist, n // 39 if n >= 39 else 1))
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
            rng = np.random.default_rng(self.seed)
            sample = keys if n <= 64 * nlist else keys[rng.choice(n, 64 * nlist, replace=False)]
            index.train(sample)
            index.nprobe = min(self.nprobe, nlist)
        index.add(keys)
        self.index, self.size = index, n
        return self

    def search(self, queries: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """(scores, ids) of the top-k keys by inner product; id -1 where fewer than k were found."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if self.kind == "hnsw":
            self.index.hnsw.efSearch = max(self.ef_search, k)
            if self.hnsw_l2:  # scores come back as L2 distances: callers recompute inner products
                queries = np.ascontiguousarray(np.hstack([queries, np.zeros((len(queries), 1), np.float32)]))
        return self.index.search(queries, k)


def topk_read(query: torch.Tensor, ids: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
              activation: str = "relu", sparse: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Read ``values`` at the retrieved ``ids`` (N, k) for ``query`` (N, d_k): (output, weights).

    Scores are recomputed from the gathered key rows, so autograd reaches exactly those rows.
    Ids < 0 (nothing found) get weight 0.
    """
    valid = ids >= 0
    safe = ids.clamp(min=0)
    k_sel = F.embedding(safe, keys, sparse=sparse)  # (N, k, d_k)
    scores = torch.einsum("nd,nkd->nk", query, k_sel)
    if activation == "relu":
        weights = F.relu(scores) * valid
    else:
        weights = F.softmax(scores.float().masked_fill(~valid, float("-inf")), dim=-1).type_as(scores)
        weights = torch.nan_to_num(weights)  # a row with nothing found reads zero
    v_sel = F.embedding(safe, values, sparse=sparse)  # (N, k, d_v)
    return torch.einsum("nk,nkv->nv", weights, v_sel), weights


class TopKMemory(nn.Module):
    """``slots`` key/value rows; a query reads its top-k slots found by a faiss MIPS index.

    With ``record = True`` the last read's ids and weights are kept (``last_ids``,
    ``last_weights``) for diagnostics.
    """

    def __init__(self, slots: int, key_dim: int, value_dim: int, topk: int = 32, activation: str = "relu",
                 index: str = "exact", refresh_updates: int = 100, sparse: bool = False, **index_kwargs):
        super().__init__()
        check_memory_options(slots, topk, index, activation, refresh_updates)
        self.slots, self.topk, self.activation = slots, topk, activation
        self.refresh_updates, self.sparse = refresh_updates, sparse
        self.keys = nn.Embedding(slots, key_dim, sparse=sparse)
        self.values = nn.Embedding(slots, value_dim, sparse=sparse)
        nn.init.normal_(self.keys.weight, std=key_dim ** -0.5)
        nn.init.normal_(self.values.weight, std=value_dim ** -0.5)
        self.index = MipsIndex(index, **index_kwargs)
        self._stale = True
        self._built_at = 0  # update count at the last build
        self.num_builds = 0
        self.record = False
        self.last_ids = self.last_weights = None

    def extra_repr(self):
        return (f"slots={self.slots}, topk={self.topk}, activation={self.activation}, index={self.index.kind}, "
                f"refresh_updates={self.refresh_updates}")

    def set_num_updates(self, num_updates: int) -> None:
        """fairseq calls this after every update: mark the index stale every ``refresh_updates``."""
        if num_updates - self._built_at >= self.refresh_updates:
            self._stale = True
            self._built_at = num_updates

    def refresh(self) -> None:
        """Rebuild the index from the current keys."""
        self.index.build(self.keys.weight.detach().float().cpu().numpy())
        self._stale = False
        self.num_builds += 1

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._stale = True  # new keys: the index must be rebuilt

    def search(self, query: torch.Tensor) -> torch.Tensor:
        """Ids (N, k) of the top-k keys of each query row."""
        if self._stale or self.index.index is None:
            self.refresh()
        _, ids = self.index.search(query.detach().float().cpu().numpy(), self.topk)
        return torch.from_numpy(ids).to(query.device)

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        shape = query.shape
        flat = query.reshape(-1, shape[-1])
        ids = self.search(flat)
        out, weights = topk_read(flat, ids, self.keys.weight, self.values.weight, self.activation, self.sparse)
        if self.record:
            self.last_ids, self.last_weights = ids.detach(), weights.detach()
        return out.reshape(*shape[:-1], out.shape[-1])


class MipsFfn(nn.Module):
    """A sublayer in place of a layer's FFN: x -> W_q x -> top-k memory read -> (same width as x).

    The query projection keeps the key size free of the model width; values live in model space.
    """

    def __init__(self, embed_dim: int, slots: int, key_dim: Optional[int] = None, **memory_kwargs):
        super().__init__()
        key_dim = key_dim or embed_dim
        self.query_proj = nn.Linear(embed_dim, key_dim)
        self.memory = TopKMemory(slots, key_dim, embed_dim, **memory_kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.memory(self.query_proj(x))
