"""Conditional cross-mutual information (CXMI) of a model with and without context.

Fernandes, Yin, Neubig & Martins, ACL 2021, "Measuring and Increasing Context Usage in
Context-Aware Machine Translation": with the same model queried with context C and without it,

    CXMI(C -> Y | X) ≈ (1/N) Σ_i [ log q(y_i | x_i, C_i) − log q(y_i | x_i) ]

over the N reference sentences of a corpus, i.e. how much more likely the references become when
the model sees the context (nats; 0 = the context is not used, the trivial baseline; negative =
the context makes the references less likely). Here C_i is the previous ``context_sentences``
sentences of the same document on both sides (source context and the reference target context,
forced as a prefix with the document separator, as in ``contrastive``), and only y_i's tokens
and its ``</s>`` are scored. The first sentence of a document has no context and is left out;
so is a sentence whose context does not fit the model's positions (counted).

Reported per sentence (the paper's estimate) and per target token (summed differences over
summed tokens), each with its standard error over sentences and a 95 % percentile bootstrap
interval (sentences resampled with replacement; sentences of one document are not independent,
so both understate the uncertainty somewhat).
"""
from collections import OrderedDict
from typing import List, Optional, Sequence, Tuple

import numpy as np

from reluformer_mt.data.segments import metadata_path, read_segment_metadata
from reluformer_mt.evaluation import extract
from reluformer_mt.evaluation.contrastive import ForcedScorer, Request

Sentence = Tuple[List[int], List[int]]  # (source ids, target ids), no separator, no </s>


def _split_ids(ids, sep: int, eos: int) -> List[List[int]]:
    ids = [int(t) for t in ids]
    if ids and ids[-1] == eos:
        ids = ids[:-1]
    parts, cur = [], []
    for t in ids:
        if t == sep:
            parts.append(cur)
            cur = []
        else:
            cur.append(t)
    return parts + [cur]


def document_sentences(loaded: "extract.LoadedModel", split: str, separator: str) -> "OrderedDict[str, List[Sentence]]":
    """The sentences of every document of a prepared, binarised split: its segments split at the
    separator and put in document order with ``{split}.segments.tsv``."""
    meta_path = metadata_path(loaded.data_dir, split)
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path}: segment metadata not found; CXMI needs a directory prepared by "
                                f"reluformer-prepare (--data)")
    infos = read_segment_metadata(meta_path)
    pairs = extract.pairs_from_dataset(loaded, split)
    if len(pairs) != len(infos):
        raise ValueError(f"{meta_path} has {len(infos)} lines but split {split!r} has {len(pairs)} examples")
    sep_s, sep_t = loaded.src_dict.index(separator), loaded.tgt_dict.index(separator)
    docs: "OrderedDict[str, List[Sentence]]" = OrderedDict()
    for i, (pair, info) in enumerate(zip(pairs, infos)):
        src = _split_ids(pair.src, sep_s, loaded.src_dict.eos())
        tgt = _split_ids(pair.tgt, sep_t, loaded.tgt_dict.eos())
        if not len(src) == len(tgt) == info.n_sentences:
            raise ValueError(f"{meta_path}:{i + 1}: document {info.doc_id!r} segment has {info.n_sentences} sentences "
                             f"but splits into {len(src)} source / {len(tgt)} target sentences at {separator!r}")
        sents = docs.setdefault(info.doc_id, [])
        if info.first_sentence != len(sents):
            raise ValueError(f"{meta_path}:{i + 1}: document {info.doc_id!r} segment starts at sentence "
                             f"{info.first_sentence}, expected {len(sents)} (segments must be in document order)")
        sents.extend(zip(src, tgt))
    return docs


def _join(parts: Sequence[List[int]], sep: int) -> List[int]:
    out: List[int] = []
    for k, p in enumerate(parts):
        out += ([sep] if k else []) + p
    return out


def _interval(values: np.ndarray, weights: Optional[np.ndarray], n_boot: int, seed: int) -> Tuple[float, float]:
    """95 % percentile bootstrap of sum(values) / sum(weights) (or the mean), sentences resampled."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(n_boot, len(values)))
    stats = values[idx].sum(1) / (weights[idx].sum(1) if weights is not None else len(values))
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return float(lo), float(hi)


def cxmi_from_scores(with_ctx: Sequence[float], without_ctx: Sequence[float], tokens: Sequence[int],
                     n_boot: int = 1000, seed: int = 1) -> dict:
    """Per-sentence and per-token CXMI with standard errors and bootstrap intervals."""
    d = np.asarray(with_ctx, dtype=np.float64) - np.asarray(without_ctx, dtype=np.float64)
    n = np.asarray(tokens, dtype=np.float64)
    if len(d) < 2:
        raise ValueError(f"CXMI needs at least 2 sentences with context, got {len(d)}")
    ratio = d.sum() / n.sum()
    # delta-method standard error of the ratio estimator sum(d) / sum(n)
    se_token = float(np.sqrt(((d - ratio * n) ** 2).sum() / (len(d) - 1) / len(d)) / n.mean())
    return {
        "sentences": int(len(d)), "tokens": int(n.sum()),
        "per_sentence": {"cxmi": float(d.mean()), "std_error": float(d.std(ddof=1) / np.sqrt(len(d))),
                         "bootstrap_95": _interval(d, None, n_boot, seed), "unit": "nats per sentence"},
        "per_token": {"cxmi": float(ratio), "std_error": se_token,
                      "bootstrap_95": _interval(d, n, n_boot, seed), "unit": "nats per target token"},
        "sentences_helped": int((d > 0).sum()),
        "baseline": 0.0,
    }


def run_cxmi(checkpoint, data=None, split: str = "test", context_sentences: int = 1, spm_models=None,
             limit_docs: Optional[int] = None, max_tokens: int = 4000, batch_size: int = 64, device: str = "cpu",
             n_boot: int = 1000, seed: int = 1, progress: Optional[bool] = None) -> dict:
    """CXMI of one checkpoint on a prepared document-level split: the report of ``reluformer-eval cxmi``."""
    if context_sentences < 1:
        raise ValueError(f"--context-sentences must be at least 1, got {context_sentences}")
    if limit_docs is not None and limit_docs < 1:
        raise ValueError(f"--limit-docs must be positive, got {limit_docs}")
    loaded = extract.load_checkpoint(checkpoint, data, spm_models, device)
    scorer = ForcedScorer(loaded, max_tokens=max_tokens, batch_size=batch_size, progress=progress)
    scorer.check_separator()
    docs = document_sentences(loaded, split, scorer.separator)
    if limit_docs is not None:
        docs = OrderedDict(list(docs.items())[:limit_docs])
    pairs: List[Tuple[Request, Request]] = []  # (with context, without)
    skipped = 0
    for doc_id, sents in docs.items():
        for i in range(1, len(sents)):
            ctx = sents[max(0, i - context_sentences):i]
            src, tgt = sents[i]
            try:
                with_c = scorer.request(src, tgt, _join([s for s, _ in ctx], scorer.sep_src),
                                        _join([t for _, t in ctx], scorer.sep_tgt), where=f"{doc_id}:{i}")
            except ValueError:
                skipped += 1  # the sentence with its context does not fit the model's positions
                continue
            pairs.append((with_c, scorer.request(src, tgt, where=f"{doc_id}:{i}")))
    logprobs = scorer.score([r for p in pairs for r in p], desc="cxmi")
    result = cxmi_from_scores([logprobs[a] for a, _ in pairs], [logprobs[b] for _, b in pairs],
                              [len(a.tgt) for a, _ in pairs], n_boot, seed)
    return {"model": loaded.describe(), "data": loaded.data_dir, "split": split, "context_sentences": context_sentences,
            "documents": len(docs), "skipped_too_long": skipped, "separator": scorer.separator,
            "definition": ("CXMI = mean over sentences of log q(y|x,C) - log q(y|x) (Fernandes et al. 2021), natural "
                           f"log; C = the previous {context_sentences} sentence(s) of the document, source and "
                           "reference target; first sentences of documents left out; 0 = context unused"),
            **result}


def table(report: dict) -> Tuple[List[str], List[list]]:
    headers = ["estimate", "CXMI", "std error", "bootstrap 95%", "baseline (no context use)", "unit"]
    rows = []
    for key in ("per_sentence", "per_token"):
        e = report[key]
        lo, hi = e["bootstrap_95"]
        rows.append([key.replace("_", " "), e["cxmi"], e["std_error"], f"[{lo:.4f}, {hi:.4f}]", report["baseline"], e["unit"]])
    return headers, rows
