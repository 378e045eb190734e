"""Attention statistics of trained checkpoints on a data set (docs/METHODS.md section 4).

Per layer and head, for encoder self-, decoder self- and cross-attention: sparsity rate, null
rate, head diversity, entropy and top-score ratio (definitions in ``stats``), computed on
force-decoded references. Counts are summed over every sentence before dividing, so a
statistic is exact for the whole data set; a layer's value sums its heads' counts. Only
(query, key) pairs the model could see count: padding and the causal mask of decoder
self-attention are left out, ``</s>`` (and ``<sep>``) are real tokens and count. Several
checkpoints on the same data are reported side by side.
"""
from pathlib import Path
from typing import Optional, Sequence

import torch

from reluformer_mt.evaluation import extract
from reluformer_mt.evaluation.align import model_names, read_tokenised
from reluformer_mt.evaluation import stats as st

STATISTICS = ("sparsity", "null_rate", "entropy", "top_score_ratio", "head_diversity")
KIND_LABELS = {"encoder_self": "enc-self", "decoder_self": "dec-self", "cross": "cross"}


class Accumulator:
    """Sums (numerator, denominator) of every statistic per layer and head over padded batches."""

    def __init__(self, n_layers: int, n_heads: int, top_percent: float = 10.0):
        self.top_percent = top_percent
        shape = {s: (n_layers,) if s == "head_diversity" else (n_layers, n_heads) for s in STATISTICS}
        self.num = {s: torch.zeros(shape[s], dtype=torch.float64) for s in STATISTICS}
        self.den = {s: torch.zeros(shape[s], dtype=torch.float64) for s in STATISTICS}

    def update(self, weights: torch.Tensor, mask: torch.Tensor) -> None:
        """weights (layers, heads, B, Tq, Tk), mask (B, Tq, Tk); one layer at a time to bound memory."""
        m = mask[:, None]  # (B, 1, Tq, Tk)
        for layer in range(weights.shape[0]):
            w = weights[layer].transpose(0, 1)  # (B, H, Tq, Tk)
            counts = {
                "sparsity": st.sparsity_counts(w, m),
                "null_rate": st.null_counts(w, m),
                "entropy": st.entropy_counts(w, m),
                "top_score_ratio": st.top_score_counts(w, m, self.top_percent),
                "head_diversity": st.head_diversity_counts(w, m),  # (B,)
            }
            for s, (num, den) in counts.items():
                self.num[s][layer] += num.double().sum(0).reshape(self.num[s][layer].shape)
                self.den[s][layer] += den.double().sum(0).reshape(self.den[s][layer].shape)

    def result(self) -> dict:
        """{"per_head": {stat: [[layer][head]]}, "per_layer": {stat: [layer]}, "all": {stat: value}};
        head diversity has no per-head value."""
        ratio = lambda n, d: st._ratio(n, d)  # noqa: E731
        per_head = {s: ratio(self.num[s], self.den[s]) for s in STATISTICS if s != "head_diversity"}
        per_layer = {s: ratio(self.num[s].reshape(len(self.num[s]), -1).sum(1),
                              self.den[s].reshape(len(self.den[s]), -1).sum(1)) for s in STATISTICS}
        overall = {s: float(ratio(self.num[s].sum(), self.den[s].sum())) for s in STATISTICS}
        return {"per_head": {k: v.tolist() for k, v in per_head.items()},
                "per_layer": {k: v.tolist() for k, v in per_layer.items()}, "all": overall}


def model_statistics(loaded: "extract.LoadedModel", pairs: Sequence["extract.Pair"],
                     kinds: Sequence[str] = extract.KINDS, top_percent: float = 10.0, max_tokens: int = 4000) -> dict:
    """{kind: Accumulator.result()} for one model over ``pairs``."""
    acc = {k: Accumulator(len(loaded.modules[k]), loaded.modules[k][0].num_heads, top_percent)
           for k in kinds if loaded.modules[k]}
    kinds = list(acc)
    for indices in extract.batches(pairs, max_tokens):
        batch = extract.forward_batch(loaded, pairs, indices, kinds)
        for k in kinds:
            acc[k].update(batch.weights[k], batch.masks[k])
    return {k: a.result() for k, a in acc.items()}


def run_attn_stats(checkpoints: Sequence[str], data=None, split: Optional[str] = "test", src=None, tgt=None,
                   pairs=None, spm_models=None, kinds: Sequence[str] = extract.KINDS, top_percent: float = 10.0,
                   limit: Optional[int] = None, names: Optional[Sequence[str]] = None, plot: Optional[str] = None,
                   max_tokens: int = 4000, device: str = "cpu") -> dict:
    """The ``attn-stats`` pipeline over a binarised split (default) or tokenised text files."""
    text = None
    if src or tgt or pairs:
        text = read_tokenised(src, tgt, pairs)
        if limit is not None:
            text = (text[0][:limit], text[1][:limit], text[2])
    names = model_names(checkpoints, names)
    report = {"data": text[2] if text else f"split {split}", "top_percent": top_percent, "kinds": list(kinds),
              "definitions": "sparsity: share of exact zeros among visible weights; null_rate: share of query rows "
                             "without a non-zero weight; entropy: nats of normalised non-null rows; top_score_ratio: "
                             f"mass share of a row's top {top_percent:g}% keys; head_diversity: mean pairwise "
                             "Jensen-Shannon divergence (bits) between heads' normalised rows",
              "models": {}}
    if len(checkpoints) > 1:
        extract.check_data_of(checkpoints, data)
    for ckpt, name in zip(checkpoints, names):
        loaded = extract.load_checkpoint(ckpt, data, spm_models, device)
        if text:
            encoded = extract.encode_pairs(loaded, text[0], text[1], text[2])
        else:
            encoded = extract.pairs_from_dataset(loaded, split, limit)
        report["models"][name] = {"model": loaded.describe(), "examples": len(encoded),
                                  "stats": model_statistics(loaded, encoded, kinds, top_percent, max_tokens)}
    if plot:
        from reluformer_mt.evaluation.plots import plot_sparsity_per_layer

        panels = {}  # a panel per kind of attention, a line per model
        for n, e in report["models"].items():
            for k, s in e["stats"].items():
                panels.setdefault(f"{KIND_LABELS[k]} attention", {})[n] = s["per_layer"]["sparsity"]
        report["plot"] = str(plot_sparsity_per_layer({}, plot, panels=panels,
                                                     title=f"sparsity per layer ({Path(report['data']).name})"))
    return report


def layer_table(report: dict, kind: str):
    """Headers and rows: a row per layer (and 'all') and model, the models of a layer adjacent."""
    models = [n for n, e in report["models"].items() if kind in e["stats"]]
    headers = ["layer", "model"] + list(STATISTICS)
    n_layers = max(len(report["models"][n]["stats"][kind]["per_layer"]["sparsity"]) for n in models)
    rows = []
    for layer in list(range(n_layers)) + ["all"]:
        for n in models:
            res = report["models"][n]["stats"][kind]
            if layer == "all":
                values = [res["all"][s] for s in STATISTICS]
            elif layer < len(res["per_layer"]["sparsity"]):
                values = [res["per_layer"][s][layer] for s in STATISTICS]
            else:
                continue  # this model has fewer layers
            rows.append([layer if layer == "all" else layer + 1, n] + [float("nan") if v is None else v for v in values])
    return headers, rows


def head_table(report: dict, kind: str):
    """Headers and rows: a row per model, layer and head."""
    headers = ["model", "layer", "head"] + [s for s in STATISTICS if s != "head_diversity"]
    rows = []
    for n, e in report["models"].items():
        if kind not in e["stats"]:
            continue
        ph = e["stats"][kind]["per_head"]
        for layer, heads in enumerate(ph["sparsity"]):
            for h in range(len(heads)):
                rows.append([n, layer + 1, h + 1] + [ph[s][layer][h] for s in headers[3:]])
    return headers, rows
