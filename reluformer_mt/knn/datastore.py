"""The kNN-MT datastore: (decoder state -> next target token) over a parallel corpus.

Khandelwal et al. (ICLR 2021, arXiv:2010.00710): every target token of a corpus, force-decoded
by the model, gives one entry whose key is the decoder's last hidden state (the input of the
output projection) and whose value is the token. At translation the state of each step looks up
its nearest keys (:mod:`reluformer_mt.knn.search`).

On disk (``DIR/``): ``datastore.json`` (format version, the checkpoint's fingerprint, where the
entries come from, the index, tuned search values), ``keys.npy`` (float16, entries x dim),
``values.npy`` (int32), ``pairs.npy`` (a 64-bit hash of every (source, target) sentence the
entries come from, for the leakage checks), ``sentences.npy`` (int32: the sentence of the split each
entry comes from, so that a search can be restricted to the entries of a source's memory matches,
:class:`reluformer_mt.knn.search.RestrictedSearch`) and, for an approximate index, ``index.faiss``
(an exact index is rebuilt from the keys when the datastore is opened). A build writes shards of
``SHARD_BATCHES`` batches to ``DIR/shards/`` first, so a killed build resumes where it stopped.

A document model's datastore is built from the data directory's segments: its keys are states of
the document model with the segment's earlier sentences in context, as at translation. A model
trained with memory attention is force-decoded with the training neighbours it was trained on.
"""
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from reluformer_mt.data.arrays import load_checked_array
from reluformer_mt.data.outputs import check_distinct_files, folder_files
from reluformer_mt.data.textfiles import read_json_object, replace_atomically, write_text_atomically

logger = logging.getLogger(__name__)

FORMAT = "reluformer-knn-datastore"
VERSION = 1
META_NAME = "datastore.json"
OUTPUT_NAMES = (META_NAME, "keys.npy", "values.npy", "pairs.npy", "sentences.npy", "index.faiss")  # what a build writes into --out
SHARD_BATCHES = 50
# ``--index auto``: exact search up to this many entries, IVF above. Measured on the bible's 312k
# entries of dim 64 (docs/KNN_MT.md): exact search answers ~60-150 queries/s on one core, far too
# slow for a beam of 128 rows per step; IVF (nprobe 16) thousands at recall@16 ~0.96 and builds in
# ~5 s; HNSW (``--index hnsw``) answers faster still but takes a minute to build
EXACT_LIMIT = 20_000
IVF_NPROBE = 16
INDEX_KINDS = ("auto", "exact", "hnsw", "ivf")


class DatastoreError(ValueError):
    """A one-line, user-facing problem with a datastore (missing, another checkpoint's, leaking)."""


def model_fingerprint(model: torch.nn.Module) -> str:
    """sha256 of the model's parameters and buffers (names, shapes and bytes, in name order): the
    same weights give the same fingerprint whichever file (checkpoint_best, _last) they came from."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()[:16]


def pair_hashes(sources: Sequence[str], targets: Sequence[str]) -> np.ndarray:
    """64-bit hashes of (source, target) sentence pairs (the leakage checks compare them)."""
    out = np.empty(len(sources), dtype=np.uint64)
    for i, (s, t) in enumerate(zip(sources, targets)):
        out[i] = int.from_bytes(hashlib.blake2b(f"{s}\t{t}".encode(), digest_size=8).digest(), "little")
    return out


def split_pairs(data_dir, split: str, src_lang: str, tgt_lang: str, separator: str) -> Tuple[list, list]:
    """The (source, target) sentences of a prepared split, as SentencePiece pieces."""
    from reluformer_mt.memory.tm import split_sentences_of

    sides = []
    for lang in (src_lang, tgt_lang):
        path = Path(data_dir) / "text" / f"{split}.{lang}"
        if not path.is_file():
            raise DatastoreError(f"{path}: missing; a datastore is built from a directory prepared by reluformer-prepare")
        with open(path, encoding="utf-8") as f:
            sides.append(split_sentences_of(f, separator))
    if len(sides[0]) != len(sides[1]):
        raise DatastoreError(f"{data_dir}: {split} has {len(sides[0])} source and {len(sides[1])} target sentences")
    return sides[0], sides[1]


def segment_sentence_counts(data_dir, split: str, tgt_lang: str, separator: str) -> list:
    """The sentences of each segment (a line of the prepared target text) of ``split``."""
    with open(Path(data_dir) / "text" / f"{split}.{tgt_lang}", encoding="utf-8") as f:
        return [line.count(separator) + 1 for line in f]


def overlap(datastore_pairs: np.ndarray, pairs: np.ndarray) -> float:
    """Share of ``pairs`` that the datastore's sentences contain."""
    return float(np.isin(pairs, datastore_pairs).mean()) if len(pairs) else 0.0


def augmented(keys: np.ndarray) -> np.ndarray:
    """Keys as inner-product keys: [k, -|k|^2 / 2], so that with a query [q, 1] the largest inner
    product is the smallest L2 distance (|q - k|^2 = |q|^2 - 2 q'.k'): the MIPS index of the
    memory layers (:class:`reluformer_mt.memory.mips.MipsIndex`) serves the datastore unchanged."""
    keys = keys.astype(np.float32)
    return np.ascontiguousarray(np.hstack([keys, -0.5 * (keys.astype(np.float64) ** 2).sum(1, keepdims=True).astype(np.float32)]))


class Datastore:
    """A built datastore: metadata, float16 keys, int32 values and the index (loaded on demand)."""

    def __init__(self, directory, meta: dict, keys: np.ndarray, values: np.ndarray):
        self.directory, self.meta = Path(directory), meta
        self.keys, self.values = keys, values
        self._index = None
        self._sentence_entries = None

    @property
    def size(self) -> int:
        return len(self.values)

    @property
    def dim(self) -> int:
        return self.keys.shape[1]

    @classmethod
    def load(cls, directory, fingerprint: Optional[str] = None, checkpoint: Optional[str] = None,
             check_keys: bool = True) -> "Datastore":
        """Open ``directory``; with ``fingerprint``, refuse a datastore built with other weights;
        with ``check_keys``, one whose keys hold NaN or inf (``datastore info`` counts them instead)."""
        directory = Path(directory)
        meta_path = directory / META_NAME
        if not meta_path.is_file():
            raise DatastoreError(f"--knn {directory}: no {META_NAME} (build one with reluformer-memory datastore build)")
        meta = read_json_object(meta_path, DatastoreError, "a JSON object (the datastore's description)", "; rebuild it")
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise DatastoreError(f"{meta_path}: format {meta.get('format')!r} version {meta.get('version')!r}, expected "
                                 f"{FORMAT!r} version {VERSION}; rebuild it")
        if fingerprint is not None and meta.get("fingerprint") != fingerprint:
            raise DatastoreError(f"--knn {directory}: built with the weights of {meta.get('checkpoint')} (fingerprint "
                                 f"{meta.get('fingerprint')}), not those of {checkpoint or 'this model'} ({fingerprint}); "
                                 "its keys are another model's states: rebuild it with this checkpoint")
        check_meta(meta_path, meta)
        keys = load_array(directory / "keys.npy", "f", 2, mmap=True)
        values = load_array(directory / "values.npy", "iu", 1)
        if keys.shape[0] != len(values) or len(values) != meta["size"]:
            raise DatastoreError(f"{directory}: keys.npy has {keys.shape[0]} rows, values.npy {len(values)}, "
                                 f"{META_NAME} says {meta['size']}: an unfinished build; rebuild it")
        if keys.shape[1] != meta["dim"]:
            raise DatastoreError(f"{directory / 'keys.npy'}: keys of width {keys.shape[1]}, {META_NAME} says dim "
                                 f"{meta['dim']}; rebuild it")
        if len(values) and int(values.min()) < 0:
            raise DatastoreError(f"{directory / 'values.npy'}: negative token id {int(values.min())}; expected the "
                                 "ids of the target dictionary; rebuild it")
        store = cls(directory, meta, keys, values)
        bad = store.nonfinite_keys() if check_keys else 0
        if bad:  # an IVF or HNSW index keeps its own copy of the keys: checked here, not by the search
            raise DatastoreError(f"{directory / 'keys.npy'}: {bad:,} of {store.size:,} keys hold NaN or inf; rebuild "
                                 "it (reluformer-memory datastore build --force --drop-nonfinite leaves them out)")
        return store

    def nonfinite_keys(self) -> int:
        """How many entries' keys hold a NaN or an infinity (read in chunks: the keys are memory-mapped)."""
        return int(nonfinite_rows(self.keys).sum())

    def check_model(self, vocab: int, state_dim: int) -> "Datastore":
        """Refuse a datastore whose token ids lie outside a model's ``vocab`` target ids or whose keys
        are not of its decoder states' ``state_dim``, and open its index: every problem of its files
        is found before decoding starts."""
        if self.size and int(self.values.max()) >= vocab:
            raise DatastoreError(f"{self.directory / 'values.npy'}: token id {int(self.values.max())} outside the model's "
                                 f"target dictionary of {vocab} ids; built for another dictionary? rebuild it")
        if self.dim != state_dim:
            raise DatastoreError(f"{self.directory / 'keys.npy'}: keys of dim {self.dim}, the model's decoder states "
                                 f"have {state_dim}; rebuild it with this checkpoint")
        self.index()
        return self

    def pairs(self) -> np.ndarray:
        """The hashes of the sentence pairs the entries come from, one per sentence of the source
        (``pair_hashes``), checked against ``datastore.json``."""
        path = self.directory / "pairs.npy"
        pairs = load_array(path, "u", 1)
        if len(pairs) != self.meta["source"]["sentences"]:
            raise DatastoreError(f"{path}: {len(pairs)} sentence-pair hashes, {META_NAME} says the entries come from "
                                 f"{self.meta['source']['sentences']} sentences; rebuild the datastore")
        return pairs

    def check_source_unchanged(self) -> None:
        """Refuse, in one line naming the text files, a datastore whose data directory was prepared
        again since the build (its sentence pairs differ from ``pairs.npy``): entry i's sentence
        would no longer be memory entry i."""
        from reluformer_mt.data.prepared import Prepared

        source = self.meta["source"]
        prepared = Prepared.load(source["data"])
        sources, targets = split_pairs(source["data"], source["split"], prepared.src_lang, prepared.tgt_lang,
                                       prepared.separator)
        stored, now = self.pairs(), pair_hashes(sources, targets)
        changed = len(now) if len(now) != len(stored) else int((now != stored).sum())
        if changed:
            text = Path(source["data"]) / "text" / f"{source['split']}.{{{prepared.src_lang},{prepared.tgt_lang}}}"
            raise DatastoreError(f"{text}: {changed:,} of {len(stored):,} sentence pairs differ from "
                                 f"{self.directory / 'pairs.npy'} (the data was prepared again after the datastore "
                                 "was built); rebuild the datastore")

    def sentence_entries(self) -> Tuple[np.ndarray, np.ndarray]:
        """(first entry, entry count) of every sentence of the source split, from ``sentences.npy``
        (a sentence's entries are consecutive: one segment's target positions); one line for a
        datastore built before the file existed, or one whose file does not fit its entries."""
        if self._sentence_entries is None:
            path = self.directory / "sentences.npy"
            if not path.is_file():
                raise DatastoreError(f"{path}: missing (the datastore was built before entries recorded their "
                                     "sentence); rebuild it with reluformer-memory datastore build --force")
            owner = load_array(path, "iu", 1).astype(np.int64)
            n = self.meta["source"]["sentences"]
            if len(owner) != self.size or (len(owner) and (owner.min() < 0 or owner.max() >= n)):
                raise DatastoreError(f"{path}: expected one sentence id below {n} per entry ({self.size}), got "
                                     f"{len(owner)} ids; rebuild the datastore")
            counts = np.bincount(owner, minlength=n)
            first = np.full(n, len(owner), dtype=np.int64)
            np.minimum.at(first, owner, np.arange(len(owner)))
            spans = np.zeros(n, dtype=np.int64)
            np.maximum.at(spans, owner, np.arange(len(owner)))
            if np.any((counts > 0) & (spans - first + 1 != counts)):
                raise DatastoreError(f"{path}: a sentence's entries are not consecutive; rebuild the datastore")
            self._sentence_entries = (np.where(counts > 0, first, 0), counts)
        return self._sentence_entries

    def set_probe(self, probe: int) -> "Datastore":
        """Search ``probe`` IVF lists per query (an HNSW index: efSearch ``probe``) instead of the
        stored value: fewer is faster and recalls less; an exact index has nothing to probe."""
        kind, index = self.meta["index"]["kind"], self.index()
        if kind == "ivf":
            index.nprobe = index.index.nprobe = min(int(probe), index.index.nlist)
        elif kind == "hnsw":
            index.hnsw.efSearch = int(probe)
        return self

    def own_probe(self) -> Optional[int]:
        """The probe the datastore searches with unless told otherwise (``--knn-probe``): an IVF
        index's lists per query (at most all of them), an HNSW index's efSearch; None for an
        exact index, which has nothing to probe."""
        index = self.meta["index"]
        if index["kind"] == "ivf":
            nlist = index.get("nlist")
            probe = index.get("nprobe", IVF_NPROBE)
            return min(probe, nlist) if nlist else probe
        if index["kind"] == "hnsw":
            return index.get("ef_search", 128)
        return None

    def index(self):
        """The faiss index (read from ``index.faiss``; built from the keys if it is missing)."""
        if self._index is None:
            from reluformer_mt.memory.mips import MipsIndex

            kind = self.meta["index"]["kind"]
            path = self.directory / "index.faiss"
            if kind == "hnsw":
                index = self._read_index(path, kind)
                index.hnsw.efSearch = self.meta["index"].get("ef_search", 128)
                self._index = index
            else:
                mips = MipsIndex(kind, nprobe=self.meta["index"].get("nprobe", IVF_NPROBE))
                if path.is_file():
                    mips.index, mips.size = self._read_index(path, kind), self.size
                    if kind == "ivf":
                        mips.index.nprobe = mips.nprobe
                else:
                    mips.build(augmented(np.asarray(self.keys)))
                self._index = mips
        return self._index

    def _read_index(self, path: Path, kind: str):
        """``index.faiss``, refused unless it is a faiss index of ``kind`` over this datastore's keys (an
        HNSW graph over the keys, the others over the inner-product keys, one wider)."""
        import faiss

        if not path.is_file():
            raise DatastoreError(f"{path}: missing; {META_NAME} names a {kind} index: rebuild the datastore")
        try:
            index = faiss.read_index(str(path))
        except RuntimeError as e:
            reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise DatastoreError(f"{path}: not a faiss index ({reason}); rebuild the datastore") from None
        expected = {"hnsw": faiss.IndexHNSW, "ivf": faiss.IndexIVF, "exact": faiss.IndexFlat}[kind]
        width = self.dim + (kind != "hnsw")
        if not isinstance(index, expected):
            raise DatastoreError(f"{path}: a {type(index).__name__}, but {META_NAME} names a {kind} index; rebuild the datastore")
        if index.d != width or index.ntotal != self.size:
            raise DatastoreError(f"{path}: {index.ntotal} vectors of dim {index.d}, expected the {self.size} keys of "
                                 f"dim {width}; rebuild the datastore")
        return index

    def search(self, queries: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """(squared L2 distances, values) of the ``k`` nearest keys of each query (rows, k); a
        missing neighbour has distance inf and value -1."""
        distances, ids = self.search_ids(queries, k)
        return distances, np.where(ids >= 0, self.values[np.maximum(ids, 0)], -1)

    def search_ids(self, queries: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """(squared L2 distances, entry ids) of the ``k`` nearest keys of each query; a missing
        neighbour has distance inf and id -1."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        index = self.index()
        if self.meta["index"]["kind"] == "hnsw":  # an L2 graph: distances as they are
            distances, ids = index.search(queries, k)
        else:
            q = np.ascontiguousarray(np.hstack([queries, np.ones((len(queries), 1), np.float32)]))
            scores, ids = index.search(q, k)
            norms = (queries.astype(np.float64) ** 2).sum(1, keepdims=True)
            # float64: a missing neighbour's score (-FLT_MAX) doubled would overflow float32
            distances = np.maximum(norms - 2.0 * scores.astype(np.float64), 0.0).astype(np.float32)
        found = ids >= 0
        return np.where(found, distances, np.inf), np.where(found, ids, -1)

    def set_tuned(self, key: str, values: dict) -> None:
        """Record tuned search values under ``tuned.KEY`` in ``datastore.json`` (atomically)."""
        self.meta.setdefault("tuned", {})[key] = values
        write_meta(self.directory, self.meta)

    def describe(self) -> str:
        m = self.meta
        return (f"datastore {self.directory}: {self.size:,} entries of dim {self.dim} from {m['source']['data']} "
                f"({m['source']['split']}, {m['source']['sentences']:,} sentences), {m['index']['kind']} index, "
                f"checkpoint {m['checkpoint']} (fingerprint {m['fingerprint']})")


def nonfinite_rows(keys: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
    """(rows,) True where a key holds a NaN or an infinity."""
    bad = np.zeros(len(keys), dtype=bool)
    for start in range(0, len(keys), chunk):
        bad[start:start + chunk] = ~np.isfinite(np.asarray(keys[start:start + chunk])).all(axis=1)
    return bad


def load_array(path: Path, kinds: str, ndim: int, mmap: bool = False) -> np.ndarray:
    """A datastore's ``.npy`` array of ``ndim`` dimensions and a dtype kind in ``kinds`` ("f" float,
    "iu" integers), one line naming the file otherwise (truncated, pickled objects, another shape)."""
    return load_checked_array(path, kinds, ndim, DatastoreError, "rebuild the datastore", mmap)


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_meta(path: Path, meta: dict) -> None:
    """One line naming ``datastore.json`` and the field for a value the datastore cannot be opened
    with (the index kind and its search values, the size, the tuned search values)."""
    def bad(field, expected):
        value = meta
        for part in field.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        raise DatastoreError(f"{path}: {field} {json.dumps(value)}: expected {expected}; rebuild or retune it")

    if not (_whole(meta.get("size")) and meta["size"] >= 0):
        bad("size", "the number of entries")
    if not (_whole(meta.get("dim")) and meta["dim"] >= 1):
        bad("dim", "the keys' width")
    index = meta.get("index")
    if not isinstance(index, dict) or index.get("kind") not in INDEX_KINDS[1:]:
        bad("index.kind", f"one of {', '.join(INDEX_KINDS[1:])}")
    for field in ("nprobe", "ef_search"):
        if field in index and not (_whole(index[field]) and index[field] >= 1):
            bad(f"index.{field}", "a positive integer")
    source = meta.get("source")
    if not isinstance(source, dict) or not all(name in source for name in ("data", "split", "sentences")):
        bad("source", "an object with data, split and sentences")
    if not (_whole(source["sentences"]) and source["sentences"] >= 0):
        bad("source.sentences", "the number of sentences the entries come from")
    tuned = meta.get("tuned", {})
    if not isinstance(tuned, dict) or not all(isinstance(v, dict) for v in tuned.values()):
        bad("tuned", "an object of tuned search values")
    if "full" in tuned:
        from reluformer_mt.knn.readout import ReadoutError, check_search_values

        try:
            check_search_values(tuned["full"], lambda field: f"{path}: tuned.full.{field}")
        except ReadoutError as e:
            raise DatastoreError(f"{e}; retune it (reluformer-memory tune)") from None
        search = tuned["full"]  # and the approximate search the tuner chose
        if search.get("probe") is not None and not (_whole(search["probe"]) and search["probe"] >= 1):
            bad("tuned.full.probe", "a positive integer or null (the index's own)")
        if "search_every" in search and not (_whole(search["search_every"]) and search["search_every"] >= 1):
            bad("tuned.full.search_every", "a positive integer")
        if "restrict" in search and not (_whole(search["restrict"]) and search["restrict"] >= 0):
            bad("tuned.full.restrict", "a number of memory matches >= 0 (0: the whole datastore)")
        skip = search.get("skip_confident", 1.0)
        if not (_number(skip) and 0 < skip <= 1):
            bad("tuned.full.skip_confident", "a probability in (0, 1] (1: every row searches)")


def write_meta(directory: Path, meta: dict) -> None:
    write_text_atomically(directory / META_NAME, json.dumps(meta, indent=1) + "\n")


def write_index(index, path: Path) -> None:
    """A faiss index written whole (serialised in memory, then through a temporary file)."""
    import faiss

    replace_atomically(path, lambda f: f.write(faiss.serialize_index(index).tobytes()))


def choose_index(kind: str, size: int) -> str:
    if kind not in INDEX_KINDS:
        raise DatastoreError(f"--index: got {kind!r}, expected one of {', '.join(INDEX_KINDS)}")
    if kind == "auto":
        return "exact" if size <= EXACT_LIMIT else "ivf"
    return kind


def length_order(dataset) -> np.ndarray:
    """Examples by length, ties in index order: the same batches on every run (resuming needs it;
    fairseq's ``ordered_indices`` breaks ties at random)."""
    sizes = np.asarray(dataset.src_sizes) + (np.asarray(dataset.tgt_sizes) if dataset.tgt_sizes is not None else 0)
    return np.argsort(sizes, kind="stable")


def build_index(kind: str, keys: np.ndarray, path: Path) -> dict:
    """Write the faiss index of ``kind`` for ``keys`` to ``path`` (none for exact search, which is
    the keys themselves); returns its description for ``datastore.json``. Exact and IVF search the
    augmented inner-product keys with the memory layers' MIPS index; HNSW is an L2 graph over the
    keys themselves (an HNSW graph over the augmented keys does not find L2 neighbours: the inner
    product of the augmentation is no metric)."""
    import faiss

    from reluformer_mt.memory.mips import MipsIndex

    path.unlink(missing_ok=True)
    if kind == "exact":
        return {"kind": "exact"}
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(keys.shape[1], 32)
        index.hnsw.efConstruction = 64
        index.add(np.ascontiguousarray(keys, dtype=np.float32))
        write_index(index, path)
        return {"kind": "hnsw", "m": 32, "ef_construction": 64, "ef_search": 128}
    mips = MipsIndex("ivf", nprobe=IVF_NPROBE).build(augmented(keys))
    write_index(mips.index, path)
    return {"kind": "ivf", "nlist": int(mips.index.nlist), "nprobe": IVF_NPROBE}


@torch.no_grad()
def forced_states(model, sample) -> Tuple[torch.Tensor, torch.Tensor]:
    """(keys (tokens, dim), values (tokens,)) of one collated batch: the decoder's last hidden
    state before the output projection at every real target position, and the token it predicts."""
    features, _ = model(**sample["net_input"], features_only=True)
    target = sample["target"]
    real = target != model.decoder.padding_idx
    return features[real], target[real]


def entry_sentences(sample, first_sentence: np.ndarray, separator: Optional[int], pad: int) -> np.ndarray:
    """The sentence of the split each entry of a collated batch comes from, in the order
    :func:`forced_states` flattens them (rows, then positions): the segment's first sentence plus
    the separators before the position (the state that predicts a separator ends its sentence)."""
    target = sample["target"].cpu()
    real = target != pad
    within = torch.zeros_like(target)
    if separator is not None:
        before = (target == separator).long().cumsum(dim=1)
        within = before - (target == separator).long()
    first = torch.as_tensor(first_sentence[sample["id"].cpu().numpy()]).unsqueeze(1)
    return (first + within)[real].numpy().astype(np.int32)


def first_sentences(targets_per_segment: Sequence[int]) -> np.ndarray:
    """Each segment's first sentence index, from its sentence count."""
    counts = np.asarray(targets_per_segment, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(counts)[:-1]]) if len(counts) else counts


def shard_checksum(keys: np.ndarray, values: np.ndarray, sentences: np.ndarray) -> str:
    """sha256 of a shard's three arrays (dtype, shape and bytes): a rerun trusts a shard only when
    its arrays still give the checksum it was written with."""
    digest = hashlib.sha256()
    for array in (keys, values, sentences):
        digest.update(f"{array.dtype.str}:{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _resumable_shard(path: Path):
    """(keys, values, sentences) of a shard a killed build left, or None when there is none or it cannot be
    trusted (truncated, edited, zeroed, another dtype or shape: its checksum no longer matches): that
    shard is then computed again, so a damaged intermediate file costs its batches, never a wrong
    datastore."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            keys, values, sentences = saved["keys"], saved["values"], saved["sentences"]
            checksum = str(saved["sha256"])
    except Exception:  # noqa: BLE001 -- whatever a damaged zip raises (zlib, CRC, header), it is recomputed
        return None
    if (keys.dtype != np.float16 or keys.ndim != 2 or values.ndim != 1 or values.dtype.kind not in "iu"
            or len(keys) != len(values) or not len(values) or sentences.shape != values.shape):
        return None
    if checksum != shard_checksum(keys, values, sentences):
        return None
    return keys, values, sentences


def refuse_links(option: str, folder: Path, paths) -> None:
    """Refuse, before any work, a link among ``paths`` that a command writes into ``folder``: writing
    would go through it, onto whatever it points to (a checkpoint, another datastore's keys)."""
    for path in paths:
        if path.is_symlink():
            raise DatastoreError(f"{option} {folder}: {path.relative_to(folder)} is a symbolic link (to "
                                 f"{os.readlink(path)}); the command writes its own files, never through a link: "
                                 "remove it")


def check_output_links(out: Path) -> None:
    """:func:`refuse_links` for what a build writes into ``--out``: its arrays, index, description, shards."""
    shards = out / "shards"
    paths = [out / name for name in OUTPUT_NAMES] + [shards]
    if shards.is_dir() and not shards.is_symlink():
        paths += sorted(shards.iterdir())
    refuse_links("--out", out, paths)


def _start_plan(shard_dir: Path, plan: dict) -> None:
    """Keep the shards of a killed build of the same plan (checkpoint, data, batches); remove them
    otherwise, or when ``plan.json`` cannot be read (counted in the log: they are computed again)."""
    path = shard_dir / "plan.json"
    if path.is_file():
        try:
            same = json.loads(path.read_text(encoding="utf-8")) == plan
        except (ValueError, UnicodeDecodeError) as e:
            logger.warning("%s: unreadable (%s); its shards are computed again", path, e)
            same = False
        if not same:
            for stale in shard_dir.glob("*.npz"):  # another checkpoint or data: start over
                stale.unlink()
    write_text_atomically(path, json.dumps(plan) + "\n")


def _compute_shard(path: Path, chunk, dataset, model, device: str, first_sentence, sep, pad, bar):
    """Force-decode one shard's batches and write it (whole or not at all, with its checksum)."""
    keys, values, owners = [], [], []
    for batch in chunk:
        sample = dataset.collater([dataset[int(i)] for i in batch])
        if device != "cpu":
            from fairseq import utils

            sample = utils.move_to_cuda(sample, device=torch.device(device))
        k, v = forced_states(model, sample)
        keys.append(k.to(torch.float16).cpu().numpy())
        values.append(v.to(torch.int32).cpu().numpy())
        owners.append(entry_sentences(sample, first_sentence, sep, pad))
        bar.update(1)
    shard = {"keys": np.concatenate(keys), "values": np.concatenate(values), "sentences": np.concatenate(owners)}
    shard["sha256"] = np.array(shard_checksum(shard["keys"], shard["values"], shard["sentences"]))
    replace_atomically(path, lambda f: np.savez(f, **shard))
    return shard["keys"], shard["values"], shard["sentences"]


def _drop_nonfinite(keys, values, owners, drop: bool, split: str):
    """The entries whose keys are finite: a float16 key beyond +-65504 is inf, a NaN state NaN.
    Refused in one line unless ``drop`` (then counted); returns (keys, values, owners, dropped)."""
    bad = nonfinite_rows(keys)
    dropped = int(bad.sum())
    if dropped and not drop:
        raise DatastoreError(f"{dropped:,} of {len(keys):,} decoder states of {split} hold NaN or inf (in float16, "
                             "beyond +-65504); give --drop-nonfinite to leave those entries out (the finished shards "
                             "are kept: the rerun resumes)")
    if dropped:
        logger.warning("left out %d of %d entries whose keys hold NaN or inf", dropped, len(keys))
        keys, values, owners = keys[~bad], values[~bad], owners[~bad]
    return keys, values, owners, dropped


def _check_out(out: Path, force: bool, max_tokens: int, index: str) -> None:
    """The options a build can check before loading anything."""
    if max_tokens < 1:
        raise DatastoreError(f"--max-tokens: expected a positive number of tokens per batch, got {max_tokens}")
    choose_index(index, 0)
    if out.exists() and not out.is_dir():
        raise DatastoreError(f"--out {out}: exists and is not a directory")
    if (out / META_NAME).is_file() and not force:
        raise DatastoreError(f"--out {out}: a datastore is already there (give --force to rebuild it)")
    check_output_links(out)


def _batches(task, split: str, max_tokens: int, data_dir):
    """(dataset, batches) of ``split`` in a fixed order; one line when a segment exceeds ``max_tokens``."""
    from fairseq.data import data_utils

    try:
        task.load_dataset(split)
    except FileNotFoundError as e:
        raise DatastoreError(f"{data_dir}: cannot read the {split} split ({e})") from None
    dataset = task.dataset(split)
    order = length_order(dataset)
    longest = max((int(dataset.num_tokens(int(i))) for i in order), default=0)
    if longest > max_tokens:  # fairseq's batching would fail on an assertion
        raise DatastoreError(f"--max-tokens {max_tokens}: below the longest segment of {split} ({longest} tokens); "
                             f"give at least {longest}")
    return dataset, data_utils.batch_by_size(order, dataset.num_tokens, max_tokens=max_tokens)


def _entries(out: Path, plan: dict, batches, dataset, model, device, first_sentence, sep, pad, progress):
    """Every shard's (keys, values, sentences), resumed where a killed build left a trusted one;
    returns (keys, values, owners, resumed shards)."""
    from reluformer_mt.console import Progress

    shard_dir = out / "shards"
    shard_dir.mkdir(parents=True, exist_ok=True)
    _start_plan(shard_dir, plan)
    n_shards = (len(batches) + SHARD_BATCHES - 1) // SHARD_BATCHES
    bar = Progress(len(batches), "datastore", "batches", enabled=progress)  # a line every 30 s off a terminal
    resumed, parts = 0, []
    for s in range(n_shards):
        path = shard_dir / f"{s:05d}.npz"
        chunk = batches[s * SHARD_BATCHES:(s + 1) * SHARD_BATCHES]
        shard = _resumable_shard(path)
        if shard is not None:
            resumed += 1
            bar.update(len(chunk))
        else:
            shard = _compute_shard(path, chunk, dataset, model, device, first_sentence, sep, pad, bar)
        parts.append(shard)
    bar.close()
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3)) + (resumed,)


def build_datastore(checkpoint, out, data=None, split: str = "train", max_tokens: int = 8000, index: str = "auto",
                    device: str = "cpu", progress: bool = True, force: bool = False,
                    drop_nonfinite: bool = False) -> Datastore:
    """Force-decode ``split`` of the checkpoint's data directory (or ``data``, prepared with the same
    dictionaries) and write the datastore to ``out``; resumes an unfinished build of the same
    checkpoint and data. Keys holding NaN or inf are refused, or left out with ``drop_nonfinite``."""
    from reluformer_mt.checkpoints import load_model, pick_device
    from reluformer_mt.memory.neighbours import save_array

    device = pick_device(device)
    out = Path(out)
    _check_out(out, force, max_tokens, index)
    loaded = load_model(checkpoint, data, device=device, check_data=True)  # --data of the model's vocabulary
    check_distinct_files([("--out", out / name) for name in OUTPUT_NAMES],
                         [("--checkpoint", checkpoint)] + folder_files("--data", loaded.data_dir))
    (out / META_NAME).unlink(missing_ok=True)  # a rebuild killed half-way must not look finished
    model, task = loaded.model, loaded.task
    fingerprint = model_fingerprint(model)
    source = {"data": str(Path(loaded.data_dir).resolve()), "split": split}
    started = time.time()
    sources, targets = split_pairs(loaded.data_dir, split, loaded.src_lang, loaded.tgt_lang, loaded.separator)
    source["sentences"] = len(sources)
    first_sentence = first_sentences(segment_sentence_counts(loaded.data_dir, split, loaded.tgt_lang, loaded.separator))
    sep = task.tgt_dict.index(loaded.separator)
    sep = None if sep == task.tgt_dict.unk() else sep
    dataset, batches = _batches(task, split, max_tokens, loaded.data_dir)
    plan = {"fingerprint": fingerprint, "source": source, "max_tokens": max_tokens, "batches": len(batches)}
    keys, values, owners, resumed = _entries(out, plan, batches, dataset, model, device, first_sentence, sep,
                                             task.tgt_dict.pad(), progress)
    if len(owners) and (int(owners.max()) >= len(sources) or np.bincount(owners).min() == 0):
        # the binarized segments and the text disagree: a sentence beyond the text, or one without entries
        raise DatastoreError(f"{loaded.data_dir}: the {split} split's binarized segments do not split into the "
                             f"{len(sources)} sentences of its text; re-prepare it with reluformer-prepare")
    keys, values, owners, dropped = _drop_nonfinite(keys, values, owners, drop_nonfinite, split)
    save_array(out / "keys.npy", keys)
    save_array(out / "values.npy", values)
    save_array(out / "pairs.npy", pair_hashes(sources, targets))
    save_array(out / "sentences.npy", owners)
    index_meta = build_index(choose_index(index, len(values)), keys, out / "index.faiss")
    meta = {"format": FORMAT, "version": VERSION, "checkpoint": str(checkpoint), "fingerprint": fingerprint,
            "arch": getattr(loaded.cfg.model, "arch", "?"), "size": int(len(values)), "dim": int(keys.shape[1]),
            "source": source, "index": index_meta, "dtype": "float16", "build_seconds": round(time.time() - started, 1),
            "resumed_shards": resumed, "dropped_nonfinite": dropped}
    shard_dir = out / "shards"
    for f in shard_dir.glob("*"):
        f.unlink()
    shard_dir.rmdir()
    meta["bytes"] = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    write_meta(out, meta)  # last: a datastore.json means a finished build
    return Datastore(out, meta, np.load(out / "keys.npy", mmap_mode="r"), values)


__all__ = ["Datastore", "DatastoreError", "INDEX_KINDS", "build_datastore", "model_fingerprint", "overlap", "pair_hashes",
           "split_pairs"]
