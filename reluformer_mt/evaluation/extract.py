"""Attention weights of a trained checkpoint by force-decoding references (teacher forcing).

The model reads the source and, as decoder input, ``[eos] + target`` (fairseq's
``prev_output_tokens``); every ``ReluformerAttention`` is asked to keep its per-head weights of
that one forward (``capture_weights``), which works for every attention function, softmax
included. Weights come back per layer and head:

- ``cross``: decoder cross-attention, (layers, heads, T, S)
- ``decoder_self``: decoder self-attention, (layers, heads, T, T), causal
- ``encoder_self``: encoder self-attention, (layers, heads, S, S)

where S counts the source tokens plus the final ``</s>`` and T the target tokens plus ``</s>``:
row t of ``cross`` is the step whose decoder *input* is target token t - 1 (``</s>`` for t = 0)
and whose *output* is target token t (``</s>`` for t = T - 1). Keeping the ``</s>`` row lets
shifted attention (row t + 1 for target token t) reach the last target token.

Text is turned into tokens with the checkpoint's dictionaries: word by word with the
SentencePiece model(s) named in the data directory's ``prepared.json`` (or given explicitly), or
one token per word for a word-level dictionary. Each token carries the index of the word it
came from, so piece-level attention can be merged to words (``stats.word_attention``).
"""
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

KINDS = ("encoder_self", "decoder_self", "cross")
_MODULE_SUFFIX = {"cross": "encoder_attn", "decoder_self": "self_attn", "encoder_self": "self_attn"}
_MODULE_STACK = {"cross": "decoder", "decoder_self": "decoder", "encoder_self": "encoder"}


@dataclass
class LoadedModel:
    """A checkpoint ready for force-decoding (eval mode, on ``device``)."""
    path: str
    model: torch.nn.Module
    task: object
    cfg: object
    data_dir: str
    spm_src: Optional[object] = None  # SentencePieceProcessor, or None for a word-level dictionary
    spm_tgt: Optional[object] = None
    device: str = "cpu"
    modules: Dict[str, List[torch.nn.Module]] = field(default_factory=dict)  # kind -> per-layer modules

    @property
    def src_dict(self):
        return self.task.source_dictionary

    @property
    def tgt_dict(self):
        return self.task.target_dictionary

    @property
    def n_layers(self) -> Dict[str, int]:
        return {k: len(v) for k, v in self.modules.items()}

    def describe(self) -> dict:
        fns = {k: sorted({m.fn for m in mods}) for k, mods in self.modules.items()}
        return {"checkpoint": self.path, "data": self.data_dir, "arch": getattr(self.cfg.model, "arch", "?"),
                "attention_functions": {k: "/".join(v) for k, v in fns.items()},
                "layers": self.n_layers, "heads": {k: mods[0].num_heads for k, mods in self.modules.items() if mods},
                "tokens": "sentencepiece" if self.spm_src is not None else "words"}


def _attention_modules(model) -> Dict[str, List[torch.nn.Module]]:
    """kind -> modules ordered by layer, from the model's ``ReluformerAttention`` names
    (``encoder.layers.3.self_attn``, ``decoder.layers.0.encoder_attn``)."""
    from reluformer_mt.attention.multihead import ReluformerAttention

    found: Dict[str, Dict[int, torch.nn.Module]] = {k: {} for k in KINDS}
    for name, module in model.named_modules():
        if not isinstance(module, ReluformerAttention):
            continue
        parts = name.split(".")
        if "layers" not in parts:
            continue
        at = parts.index("layers")
        stack, layer, suffix = parts[at - 1] if at else "", int(parts[at + 1]), parts[-1]
        for kind in KINDS:
            if stack == _MODULE_STACK[kind] and suffix == _MODULE_SUFFIX[kind]:
                found[kind][layer] = module
    return {k: [v[i] for i in sorted(v)] for k, v in found.items()}


def _load_spm_models(data_dir: Path, spm_models: Optional[Sequence[str]]):
    """(source, target) SentencePiece processors: given paths, else prepared.json's, else None."""
    import sentencepiece as spm

    from reluformer_mt.data.segments import MANIFEST_NAME

    if spm_models:
        paths = [Path(p) for p in spm_models]
    else:
        manifest = data_dir / MANIFEST_NAME
        if not manifest.is_file():
            return None, None  # word-level (or externally tokenised) data: one token per word
        import json

        info = json.loads(manifest.read_text(encoding="utf-8"))
        names = [info.get("spm_model_src") or info.get("spm_model"), info.get("spm_model_tgt") or info.get("spm_model")]
        if not all(names):
            raise ValueError(f"{manifest}: names no SentencePiece model (spm_model_src/spm_model_tgt)")
        paths = [data_dir / n for n in names]
    if len(paths) == 1:
        paths = paths * 2
    if len(paths) != 2:
        raise ValueError(f"--spm-model takes one joint model or two (source, target), got {len(paths)}")
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"{p}: SentencePiece model not found")
    return tuple(spm.SentencePieceProcessor(model_file=str(p)) for p in paths)


def load_checkpoint(path, data_dir=None, spm_models: Optional[Sequence[str]] = None, device: str = "cpu",
                    quiet: bool = True) -> LoadedModel:
    """Load a reluformer checkpoint with fairseq, its dictionaries from ``data_dir`` (default: the
    data directory it was trained on)."""
    import reluformer_mt  # noqa: F401  registers the model, architectures, criterion and task
    from fairseq import checkpoint_utils

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: checkpoint not found")
    overrides = {}
    if data_dir is not None:
        if not Path(data_dir).is_dir():
            raise FileNotFoundError(f"{data_dir}: data directory not found (--data)")
        overrides["data"] = str(data_dir)
    level = logging.getLogger("fairseq").level
    if quiet:
        logging.getLogger("fairseq").setLevel(logging.WARNING)
    try:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides=overrides)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{path}: loading needs the data directory's dictionaries, not found "
                                f"({e}); give the directory with --data") from None
    except (RuntimeError, EOFError, KeyError, AttributeError, __import__("pickle").UnpicklingError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"{path}: cannot be loaded as a fairseq checkpoint ({type(e).__name__}: {first})") from None
    finally:
        logging.getLogger("fairseq").setLevel(level)
    model = models[0].to(device).eval()
    modules = _attention_modules(model)
    if not modules["cross"]:
        raise ValueError(f"{path}: the model has no ReluformerAttention cross-attention; "
                         f"train it with --arch reluformer or one of its architectures")
    data = Path(cfg.task.data.split(":")[0])
    spm_src, spm_tgt = _load_spm_models(data, spm_models)
    return LoadedModel(path=str(path), model=model, task=task, cfg=cfg, data_dir=str(data), spm_src=spm_src,
                       spm_tgt=spm_tgt, device=device, modules=modules)


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


def batches(pairs: Sequence[Pair], max_tokens: int = 4000, max_sentences: int = 64) -> Iterator[List[int]]:
    """Indices grouped by length (longest first) so that B * longest <= max_tokens."""
    order = sorted(range(len(pairs)), key=lambda i: (-max(len(pairs[i].src), len(pairs[i].tgt)), i))
    batch, longest = [], 0
    for i in order:
        size = max(len(pairs[i].src), len(pairs[i].tgt))
        if batch and (max(longest, size) * (len(batch) + 1) > max_tokens or len(batch) == max_sentences):
            yield batch
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, size)
    if batch:
        yield batch


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

    wanted = [m for kind in kinds for m in loaded.modules[kind]]
    for m in wanted:
        m.capture_weights, m.captured = True, None
    try:
        loaded.model(src_tokens, src_lengths.to(loaded.device), prev)
        weights = {}
        for kind in kinds:
            mods = loaded.modules[kind]
            if any(m.captured is None for m in mods):
                raise RuntimeError(f"{kind} attention was not captured (is the layer skipped?)")
            weights[kind] = torch.stack([m.captured.float().cpu() for m in mods])
    finally:
        for m in wanted:
            m.capture_weights, m.captured = False, None

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
