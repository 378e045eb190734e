"""Attention weights of a trained checkpoint by force-decoding references (teacher forcing).

The model reads the source and, as decoder input, ``[eos] + target`` (fairseq's
``prev_output_tokens``); ``attention.capture_attention`` returns the per-head weights of every
``ReluformerAttention`` of the kinds asked for in that one forward, which works for every attention
function, softmax included. Weights come back per layer and head:

- ``cross``: decoder cross-attention, (layers, heads, T, S)
- ``decoder_self``: decoder self-attention, (layers, heads, T, T), causal
- ``encoder_self``: encoder self-attention, (layers, heads, S, S)

where S counts the source tokens plus the final ``</s>`` and T the target tokens plus ``</s>``:
row t of ``cross`` is the step whose decoder *input* is target token t - 1 (``</s>`` for t = 0)
and whose *output* is target token t (``</s>`` for t = T - 1). Keeping the ``</s>`` row lets
shifted attention (row t + 1 for target token t) reach the last target token.

Text is turned into tokens with the checkpoint's dictionaries: word by word with the
SentencePiece model(s) named in the data directory's ``prepared.json`` (or ``--spm-model``), or
one token per word for a word-level dictionary. Each token carries the index of the word it
came from, so piece-level attention can be merged to words (``stats.word_attention``).
"""
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

# the loaded model and its attention modules by kind come from the one checkpoint loader
from reluformer_mt.checkpoints import KINDS, LoadedModel, check_data_vocabulary, load_model, open_checkpoint  # noqa: F401
from reluformer_mt.data.batching import length_batches


def load_checkpoint(path, data_dir=None, spm_models=None, device: str = "cpu", quiet: bool = True) -> LoadedModel:
    """A reluformer checkpoint for force-decoding (:func:`reluformer_mt.checkpoints.load_model`;
    refuses a model without ``ReluformerAttention`` cross-attention, and a ``data_dir`` whose
    dictionaries or SentencePiece model are not the checkpoint's: the data's ids and pieces would
    mean other tokens to the model)."""
    return load_model(path, data_dir, spm_models, device, need_attention=True, quiet=quiet, check_data=True)


def check_data_of(checkpoints: Sequence[str], data_dir=None) -> None:
    """Every checkpoint of a comparison checked against ``data_dir`` (when given) before the first
    is loaded, so that the last one's refusal does not come after the others' work; each is only
    opened (its weights read, no model built)."""
    if data_dir is None:
        return
    for path in checkpoints:
        check_data_vocabulary(open_checkpoint(path, data_dir))


# ---------------------------------------------------------------------------------------------- text

@dataclass
class Pair:
    """One sentence pair as token ids (each ending in ``</s>``) and the word of every token
    (-1 for ``</s>`` and other tokens outside any word)."""
    src: torch.Tensor
    tgt: torch.Tensor
    src_word_ids: List[int]
    tgt_word_ids: List[int]


def encode_words(words: Sequence[str], dictionary, sp=None) -> Tuple[List[int], List[int]]:
    """Token ids and word index per token, ``</s>`` appended. With SentencePiece each word is
    encoded on its own, so token-to-word membership is exact; a word that encodes to nothing
    (all characters normalised away) has no tokens and hence no link."""
    ids, word_of = [], []
    for w, word in enumerate(words):
        pieces = sp.encode(word, out_type=str) if sp is not None else [word]
        ids += [dictionary.index(p) for p in pieces]
        word_of += [w] * len(pieces)
    return ids + [dictionary.eos()], word_of + [-1]


def encode_pairs(loaded: LoadedModel, src_lines: Sequence[Sequence[str]], tgt_lines: Sequence[Sequence[str]],
                 where: str = "input") -> List[Pair]:
    """Tokenised sentence pairs (lists of words) -> ``Pair`` s; a pair longer than the model's
    positions is an error naming its line."""
    max_src, max_tgt = loaded.model.max_positions()
    pairs = []
    for n, (s, t) in enumerate(zip(src_lines, tgt_lines), 1):
        s_ids, s_words = encode_words(s, loaded.src_dict, loaded.spm_src)
        t_ids, t_words = encode_words(t, loaded.tgt_dict, loaded.spm_tgt)
        if len(s_ids) > max_src or len(t_ids) > max_tgt:
            raise ValueError(f"{where}:{n}: {len(s_ids)} source / {len(t_ids)} target tokens exceed the model's "
                             f"positions ({max_src} / {max_tgt})")
        pairs.append(Pair(torch.tensor(s_ids), torch.tensor(t_ids), s_words, t_words))
    return pairs


def pairs_from_dataset(loaded: LoadedModel, split: str, limit: Optional[int] = None) -> List[Pair]:
    """The examples of a binarised split of the data directory (token ids only, no word ids)."""
    try:
        loaded.task.load_dataset(split)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{loaded.data_dir}: split {split!r} not found ({e})") from None
    data = loaded.task.dataset(split)
    n = len(data) if limit is None else min(limit, len(data))
    pairs = []
    for i in range(n):
        item = data[i]
        pairs.append(Pair(item["source"], item["target"], [], []))
    return pairs


# ---------------------------------------------------------------------------------------------- forward

@dataclass
class BatchAttention:
    """Captured weights of one padded batch: ``weights[kind]`` is (layers, heads, B, Tq, Tk) and
    ``masks[kind]`` (B, Tq, Tk) is True for real (query, key) pairs the model could see."""
    indices: List[int]
    weights: Dict[str, torch.Tensor]
    masks: Dict[str, torch.Tensor]
    src_lengths: torch.Tensor
    tgt_lengths: torch.Tensor


def batches(pairs: Sequence[Pair], max_tokens: int = 4000, max_sentences: int = 64) -> List[List[int]]:
    """Indices grouped by length (longest first, the longer side of a pair) so that B * longest <= max_tokens."""
    return length_batches([max(len(p.src), len(p.tgt)) for p in pairs], max_tokens, max_sentences)


def _pad(seqs: Sequence[torch.Tensor], pad: int, left: bool) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), pad, dtype=torch.long)
    for b, s in enumerate(seqs):
        if left:
            out[b, width - len(s):] = s
        else:
            out[b, : len(s)] = s
    return out


@torch.no_grad()
def forward_batch(loaded: LoadedModel, pairs: Sequence[Pair], indices: Sequence[int],
                  kinds: Sequence[str] = ("cross",)) -> BatchAttention:
    """Force-decode ``pairs[indices]`` in one padded batch and capture the weights of ``kinds``.

    Padding follows training: source left-padded (``--left-pad-source`` default), target right-padded.
    """
    from reluformer_mt.attention import capture_attention  # loads fairseq: after the loader registered

    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown attention kind {kind!r}, expected one of {', '.join(KINDS)}")
    pad, eos = loaded.src_dict.pad(), loaded.tgt_dict.eos()
    left_src = bool(getattr(loaded.cfg.task, "left_pad_source", True))
    srcs = [pairs[i].src for i in indices]
    tgts = [pairs[i].tgt for i in indices]
    src_tokens = _pad(srcs, pad, left_src).to(loaded.device)
    src_lengths = torch.tensor([len(s) for s in srcs])
    tgt_lengths = torch.tensor([len(t) for t in tgts])
    prev = _pad([torch.cat([t.new_tensor([eos]), t[:-1]]) for t in tgts], loaded.tgt_dict.pad(), False).to(loaded.device)

    with capture_attention({kind: loaded.modules[kind] for kind in kinds}) as captured:
        loaded.model(src_tokens, src_lengths.to(loaded.device), prev)
    weights = {kind: captured.weights(kind).cpu() for kind in kinds}

    S, T = src_tokens.shape[1], prev.shape[1]
    pos_s, pos_t = torch.arange(S), torch.arange(T)
    src_real = (pos_s >= S - src_lengths[:, None]) if left_src else (pos_s < src_lengths[:, None])  # (B, S)
    tgt_real = pos_t < tgt_lengths[:, None]  # (B, T)
    masks = {
        "cross": tgt_real[:, :, None] & src_real[:, None, :],
        "decoder_self": tgt_real[:, :, None] & tgt_real[:, None, :] & (pos_t[None, None, :] <= pos_t[None, :, None]),
        "encoder_self": src_real[:, :, None] & src_real[:, None, :],
    }
    return BatchAttention(list(indices), weights, {k: masks[k] for k in kinds}, src_lengths, tgt_lengths)


def crop(batch: BatchAttention, b: int, kind: str) -> torch.Tensor:
    """Pair ``b`` of the batch cut to its real tokens: (layers, heads, Tq, Tk)."""
    rows = batch.masks[kind][b].any(1).nonzero().squeeze(1)
    cols = batch.masks[kind][b].any(0).nonzero().squeeze(1)
    return batch.weights[kind][:, :, b].index_select(-2, rows).index_select(-1, cols)


def iterate_attention(loaded: LoadedModel, pairs: Sequence[Pair], kinds: Sequence[str] = ("cross",),
                      max_tokens: int = 4000) -> Iterator[Tuple[int, Dict[str, torch.Tensor]]]:
    """(pair index, {kind: (layers, heads, Tq, Tk)}) for every pair, cropped to real tokens, in
    batch order (not input order)."""
    for indices in batches(pairs, max_tokens):
        batch = forward_batch(loaded, pairs, indices, kinds)
        for b, i in enumerate(indices):
            yield i, {kind: crop(batch, b, kind) for kind in kinds}


def attention_of_pairs(loaded: LoadedModel, pairs: Sequence[Pair], kinds: Sequence[str] = ("cross",),
                       max_tokens: int = 4000) -> List[Dict[str, torch.Tensor]]:
    """``iterate_attention`` collected in input order."""
    out: List[Optional[Dict[str, torch.Tensor]]] = [None] * len(pairs)
    for i, attn in iterate_attention(loaded, pairs, kinds, max_tokens):
        out[i] = attn
    return out
