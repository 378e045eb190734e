"""EMAT's learned keys for the translation memory: sentence keys from the model's own encoder,
trained with an in-batch retrieval loss, the index rebuilt as they change (Wu et al. 2022, "An
Efficient Memory-Augmented Transformer for Knowledge-Intensive NLP Tasks", arXiv:2210.16773,
section 3: keys from a low encoder layer, mean-pooled, contrastive in-batch pre-training).

- **Key**: embeddings + the first ``--tm-key-layers`` L encoder layers (default 1, EMAT's "low
  layer": cheap, and the layers above specialise for translation), mean-pooled over non-padding
  tokens, a learned projection ``encoder.tm_key_proj`` (``--tm-key-dim``, default the model width;
  built only when the key loss is on, so a model without it keeps its parameters and initial
  random state), L2-normalised, so inner product = cosine. A checkpoint without the projection
  gives the normalised pooled states.
- **Loss** (``--tm-key-loss W``, task option, default 0 = off): InfoNCE (van den Oord et al.
  2018) over the batch between the query key of each example's source and the key of its
  positive entry's source; the other examples' positives are the negatives (an entry shared by
  two examples is no negative of either), temperature ``--tm-key-temperature``. It is added to
  the cross-entropy as W x mean InfoNCE x sample size, like the attention regularisers.
- **Positive**: what matters in MT is a match worth copying, so among a sentence's prepared top-K
  candidates (the TF-IDF neighbours) it is the entry whose *target* has the best fuzzy-match score
  against the sentence's reference target (ties: the better source match); none when no candidate
  shares a word. Computed once per prepared directory, ``DIR/memory/train.positive.npy``, stamped
  with the digest of the neighbours it came from (``train.positive.json``).
- **Document segments**: the loss runs on single-sentence examples only; a multi-sentence
  segment has one encoder pass but one positive per sentence, and pooling a segment would give no
  sentence key. At sentence level (the demo's first phase) every example takes part.
"""
import hashlib
import json
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from reluformer_mt.data.textfiles import replace_atomically, write_text_atomically
from reluformer_mt.memory.tm import TranslationMemoryError, fuzzy_score, fuzzy_words
from reluformer_mt.model_args import fill_unset, task_option

KEY_DEFAULTS = {"tm_key_layers": 1, "tm_key_dim": 0, "tm_keys": False}
TFIDF_SUFFIX = ".tfidf"  # the TF-IDF neighbours kept beside learned ones: DIR/memory/{split}.ids.tfidf.npy


def add_key_args(parser) -> None:
    group = parser.add_argument_group("translation memory: learned keys (EMAT; the task's --tm-key-loss)")
    group.add_argument("--tm-key-layers", type=int, metavar="L",
                       help="sentence keys from the embeddings and the first L encoder layers (default 1)")
    group.add_argument("--tm-key-dim", type=int, metavar="D",
                       help="size of the learned key projection (default 0: the model width)")
    group.add_argument("--tm-keys", action="store_true", default=None,
                       help="build the key projection (set by --task document_translation --tm-key-loss W > 0)")


def fill_key_defaults(args, task=None) -> None:
    fill_unset(args, KEY_DEFAULTS)
    if task_option(task, "tm_key_loss", 0) > 0:
        args.tm_keys = True
    if not 0 <= args.tm_key_layers <= args.encoder_layers:
        raise ValueError(f"--tm-key-layers: got {args.tm_key_layers}, expected 0 <= L <= --encoder-layers "
                         f"({args.encoder_layers})")
    if args.tm_key_dim < 0:
        raise ValueError(f"--tm-key-dim: got {args.tm_key_dim}, expected >= 0 (0: the model width)")


def attach_key_head(encoder: nn.Module, args) -> None:
    """The key layer count (a plain attribute) and, with the key loss, the key projection."""
    encoder.tm_key_layers = args.tm_key_layers
    if args.tm_keys:
        dim = encoder.embed_tokens.embedding_dim
        encoder.tm_key_proj = nn.Linear(dim, args.tm_key_dim or dim)


# ---------------------------------------------------------------- keys

def sentence_keys(encoder: nn.Module, tokens: torch.Tensor, layers: Optional[int] = None) -> torch.Tensor:
    """(B, T) token ids (padding anywhere) -> (B, D) unit-norm float32 keys."""
    layers = getattr(encoder, "tm_key_layers", 1) if layers is None else layers
    padding = tokens.eq(encoder.padding_idx)
    x, _ = encoder.forward_embedding(tokens)
    x = (x * (~padding).unsqueeze(-1).type_as(x)).transpose(0, 1)
    mask = padding if padding.any() else None
    for layer in encoder.layers[:layers]:
        x = layer(x, encoder_padding_mask=mask)
        x = x[0] if isinstance(x, tuple) else x
    keep = (~padding).t().unsqueeze(-1).type_as(x)  # (T, B, 1)
    pooled = (x * keep).sum(0) / keep.sum(0).clamp_min(1)
    projection = encoder._modules.get("tm_key_proj")
    if projection is not None:
        pooled = projection(pooled)
    return F.normalize(pooled.float(), dim=-1)


def encode_keys(model: nn.Module, sequences: Sequence[torch.Tensor], max_tokens: int = 8000,
                progress: bool = False, label: str = "keys") -> np.ndarray:
    """Keys of token sequences (each ending in </s>, as sources do), in batches of similar
    length, without gradients, in eval mode (no dropout: deterministic); the model's mode is
    restored afterwards."""
    from fairseq.data import data_utils

    from reluformer_mt.data.batching import length_batches

    encoder = model.encoder
    device = next(model.parameters()).device
    out: Optional[np.ndarray] = None
    was_training = model.training
    model.eval()
    start, done, next_report = time.time(), 0, 0.1
    try:
        with torch.no_grad():
            for batch in length_batches([len(s) for s in sequences], max_tokens):
                tokens = data_utils.collate_tokens([sequences[i] for i in batch], encoder.padding_idx, left_pad=False)
                keys = sentence_keys(encoder, tokens.to(device)).cpu().numpy()
                if out is None:
                    out = np.zeros((len(sequences), keys.shape[1]), dtype=np.float32)
                out[batch] = keys
                done += len(batch)
                if progress and done >= next_report * len(sequences):
                    print(f"[{label}] {done}/{len(sequences)} sentences encoded ({time.time() - start:.0f} s)", flush=True)
                    next_report += 0.25
    finally:
        model.train(was_training)
    return out if out is not None else np.zeros((0, 1), dtype=np.float32)


def in_batch_key_loss(model: nn.Module, sample: dict, temperature: float) -> Tuple[torch.Tensor, int, int]:
    """(summed InfoNCE, examples, in-batch top-1 hits) over the examples of ``sample`` that have
    a positive (``sample["tm_positive"]``, see :class:`reluformer_mt.memory.tm_data.MemoryPairDataset`)."""
    has = sample["tm_positive_ids"].ge(0)
    n = int(has.sum())
    src = sample["net_input"]["src_tokens"]
    if n == 0:
        return src.new_zeros((), dtype=torch.float32), 0, 0
    encoder = getattr(model, "module", model).encoder
    queries = sentence_keys(encoder, src[has])
    keys = sentence_keys(encoder, sample["tm_positive"][has])
    logits = queries @ keys.t() / temperature
    ids = sample["tm_positive_ids"][has]
    shared = ids.unsqueeze(0).eq(ids.unsqueeze(1)) & ~torch.eye(n, dtype=torch.bool, device=ids.device)
    logits = logits.masked_fill(shared, float("-inf"))  # the same entry twice: not a negative
    target = torch.arange(n, device=logits.device)
    loss = F.cross_entropy(logits, target, reduction="sum")
    hits = int(logits.detach().argmax(1).eq(target).sum())
    return loss, n, hits


# ---------------------------------------------------------------- positives

def tfidf_ids_path(directory, split: str) -> Path:
    """The model-free neighbours of a split: the copy a re-keying keeps, else the prepared file."""
    from reluformer_mt.memory.neighbours import neighbour_paths

    ids_path, _ = neighbour_paths(directory, split)
    kept = ids_path.with_name(f"{split}.ids{TFIDF_SUFFIX}.npy")
    return kept if kept.is_file() else ids_path


def best_target_positives(candidates: np.ndarray, query_targets: Sequence[str], entry_targets: Sequence[str]) -> np.ndarray:
    """Per row, the candidate whose target is the best fuzzy match of the row's reference
    target (ties: the earlier candidate); -1 where no candidate scores above 0."""
    entry_words = {}
    positives = np.full(len(candidates), -1, dtype=np.int64)
    for i, row in enumerate(candidates):
        reference = fuzzy_words(query_targets[i])
        best = 0.0
        for c in row:
            if c < 0:
                continue
            words = entry_words.setdefault(int(c), fuzzy_words(entry_targets[int(c)]))
            score = fuzzy_score(reference, words)
            if score > best:
                best, positives[i] = score, int(c)
    return positives


def positives_of(directory, progress: bool = False) -> np.ndarray:
    """The positive entry of every training sentence (-1: none), computed from the TF-IDF
    neighbours once and stored as ``DIR/memory/train.positive.npy`` with its stamp."""
    from reluformer_mt.memory.neighbours import read_entry_ids
    from reluformer_mt.memory.tm import read_prepared

    ids_path = tfidf_ids_path(directory, "train")
    if not ids_path.is_file():
        raise TranslationMemoryError(f"{ids_path}: missing; --tm-key-loss needs the prepared neighbours "
                                     "(reluformer-prepare --memory-k K)")
    base = ids_path.parent
    path, stamp_path = base / "train.positive.npy", base / "train.positive.json"
    stamp = {"from": ids_path.name, "sha256": hashlib.sha256(ids_path.read_bytes()).hexdigest()[:16],
             "rule": "best target fuzzy match among the candidates"}
    if path.is_file() and stamp_path.is_file() and json.loads(stamp_path.read_text(encoding="utf-8")) == stamp:
        return read_entry_ids(path, None, ndim=1)
    memory = read_prepared(directory, "train")
    positives = best_target_positives(read_entry_ids(ids_path, len(memory)), memory.targets, memory.targets)
    try:
        replace_atomically(path, lambda f: np.save(f, positives.astype(np.int32)))
        write_text_atomically(stamp_path, json.dumps(stamp))  # last: the stamp vouches for the array
    except OSError as e:  # a read-only data directory: use them without storing
        if progress:
            print(f"[memory] cannot store {path} ({e.strerror}); positives computed for this run only", flush=True)
    if progress:
        print(f"[memory] positives: {int((positives >= 0).sum())} of {len(positives)} training sentences", flush=True)
    return positives.astype(np.int32)


# ---------------------------------------------------------------- search

def neighbours_from_keys(index, query_keys: np.ndarray, query_words: Sequence[List[str]],
                         entry_words: Sequence[List[str]], k: int, candidates: int = 128, rerank: bool = True,
                         exclude: Optional[Sequence[int]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """(ids, fuzzy scores), each (queries, k), from a :class:`MipsIndex` over learned keys: the
    top ``candidates`` by inner product reranked by source fuzzy match (``rerank``), or the top
    k by inner product alone (EMAT's pure MIPS). ``exclude[i]``: the entry query i must never
    get (itself, in training)."""
    n, size = len(query_keys), index.size
    ids = np.full((n, k), -1, dtype=np.int64)
    scores = np.zeros((n, k), dtype=np.float32)
    wanted = min(size, (max(k, candidates) if rerank else k) + (1 if exclude is not None else 0))
    _, found = index.search(query_keys, wanted)
    for i, row in enumerate(found):
        skip = exclude[i] if exclude is not None else -1
        kept = [int(c) for c in row if c >= 0 and c != skip]
        ranked = [(fuzzy_score(query_words[i], entry_words[c]), -r, c) for r, c in enumerate(kept)]
        if rerank:
            ranked.sort(reverse=True)
        for j, (score, _, c) in enumerate(ranked[:k]):
            ids[i, j], scores[i, j] = c, score
    return ids, scores


class LearnedRetriever:
    """:class:`reluformer_mt.memory.tm.Retriever`'s ``search`` over a model's learned keys: what
    a translator uses when the model was trained on learned-key matches, so that translation
    retrieves as training did. ``encode`` turns source sentences into token ids (with </s>)."""

    def __init__(self, model: nn.Module, entries, entry_tokens: Sequence[torch.Tensor], encode,
                 rerank: bool = True, candidates: int = 128):
        from reluformer_mt.memory.mips import MipsIndex

        if len(entries) == 0:
            raise TranslationMemoryError(f"{entries.origin}: the memory is empty")
        self.model, self.entries, self.encode = model, entries, encode
        self.rerank, self.candidates = rerank, candidates
        self.index = MipsIndex("exact").build(encode_keys(model, entry_tokens))
        self._words = [fuzzy_words(s) for s in entries.sources]

    def search(self, queries: Sequence[str], k: int, exclude: Optional[Sequence[int]] = None):
        keys = encode_keys(self.model, [self.encode(q) for q in queries])
        return neighbours_from_keys(self.index, keys, [fuzzy_words(q) for q in queries], self._words, k,
                                    self.candidates, self.rerank, exclude)


__all__ = ["KEY_DEFAULTS", "LearnedRetriever", "add_key_args", "attach_key_head", "best_target_positives", "encode_keys",
           "fill_key_defaults", "in_batch_key_loss", "neighbours_from_keys", "positives_of", "sentence_keys",
           "tfidf_ids_path"]
