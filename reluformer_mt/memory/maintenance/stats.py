"""Diagnostics of key-value memories (ReLUFormer section 3; docs/METHODS.md section 2), per layer.

- top-score ratio: the share of a row's activation mass held by its top p % of slots
  (Shen et al. 2023: a softmax memory puts more than 85 % of its mass in the top 0.2 %);
- anisotropy: the mean pairwise cosine similarity of the memory outputs H (rows = tokens);
- zero fraction: the share of exactly-zero activations (ReLU sparsity).

Collected with forward hooks on a trained checkpoint: for an FFN, the input of ``fc2`` is the
activation row and its output is H; for a top-k MIPS memory, the k retrieved weights (the other
slots are zero) and the output of the memory sublayer. Padding positions are left out.
"""
import math
from typing import List, Optional, Sequence

import torch

DEFAULT_TOP_PERCENT = (0.2, 1.0, 10.0)


def top_score_ratio(acts: torch.Tensor, percent: float, slots: Optional[int] = None) -> torch.Tensor:
    """Per row: mass of the top ceil(percent % of slots) entries / total mass (rows without mass: NaN).

    ``acts`` (N, S) are the activations (absolute values are used); ``slots`` is the memory size
    when ``acts`` hold only the retrieved entries of a larger memory.
    """
    acts = acts.float().abs()
    slots = slots or acts.shape[-1]
    m = min(acts.shape[-1], max(1, math.ceil(percent / 100.0 * slots)))
    total = acts.sum(-1)
    top = acts.topk(m, dim=-1).values.sum(-1)
    return torch.where(total > 0, top / total.clamp(min=1e-30), torch.full_like(total, float("nan")))


def anisotropy(outputs: torch.Tensor) -> float:
    """Mean cosine similarity over all pairs of distinct rows of ``outputs`` (N, d)."""
    n = outputs.shape[0]
    if n < 2:
        return float("nan")
    u = torch.nn.functional.normalize(outputs.double(), dim=-1)
    s = u.sum(0)
    return float(((s @ s) - (u * u).sum()) / (n * (n - 1)))


class _LayerRecord:
    def __init__(self, name: str, kind: str, slots: int, percents: Sequence[float], max_rows: int):
        self.name, self.kind, self.slots, self.percents, self.max_rows = name, kind, slots, percents, max_rows
        self.ratio_sum = {p: 0.0 for p in percents}
        self.ratio_rows = {p: 0 for p in percents}
        self.zero, self.entries, self.rows = 0, 0, 0
        self.outputs: List[torch.Tensor] = []
        self.n_out = 0

    def add_acts(self, acts: torch.Tensor) -> None:
        for p in self.percents:
            r = top_score_ratio(acts, p, self.slots)
            ok = ~torch.isnan(r)
            self.ratio_sum[p] += float(r[ok].sum())
            self.ratio_rows[p] += int(ok.sum())
        self.zero += int((acts == 0).sum()) + (self.slots - acts.shape[-1]) * acts.shape[0]
        self.entries += self.slots * acts.shape[0]
        self.rows += acts.shape[0]

    def add_outputs(self, out: torch.Tensor) -> None:
        if self.n_out < self.max_rows:
            out = out[: self.max_rows - self.n_out].detach().float().cpu()
            self.outputs.append(out)
            self.n_out += out.shape[0]

    def result(self) -> dict:
        return {"layer": self.name, "kind": self.kind, "slots": self.slots, "rows": self.rows,
                "top_score_ratio": {str(p): (self.ratio_sum[p] / self.ratio_rows[p] if self.ratio_rows[p] else float("nan"))
                                    for p in self.percents},
                "anisotropy": anisotropy(torch.cat(self.outputs)) if self.outputs else float("nan"),
                "zero_fraction": self.zero / self.entries if self.entries else float("nan")}


def _rows(t: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """(T, B, X) or (N, X) -> the non-padding rows (N', X); mask (T*B,) True = keep."""
    flat = t.reshape(-1, t.shape[-1])
    return flat[mask] if mask is not None and mask.shape[0] == flat.shape[0] else flat


def collect_memory_stats(model, batches, pad: int, percents: Sequence[float] = DEFAULT_TOP_PERCENT,
                         max_rows: int = 2000) -> List[dict]:
    """Run ``model`` (a fairseq encoder-decoder) over ``batches`` and return per-layer diagnostics."""
    from reluformer_mt.memory import MipsFfn

    records, hooks = [], []
    current = {"encoder": None, "decoder": None}

    def ffn_hooks(rec, side):
        def pre(_, inputs):
            rec.add_acts(_rows(inputs[0].detach(), current[side]))

        def post(_, __, output):
            rec.add_outputs(_rows(output.detach(), current[side]))
        return pre, post

    def mips_hook(rec, side, memory):
        def post(_, __, output):
            keep = current[side]
            w = memory.last_weights
            rec.add_acts(w[keep] if keep is not None and keep.shape[0] == w.shape[0] else w)
            rec.add_outputs(_rows(output.detach(), keep))
        return post

    for side in ("encoder", "decoder"):
        for i, layer in enumerate(getattr(model, side).layers):
            if isinstance(layer.fc1, MipsFfn):
                mem = layer.fc1.memory
                mem.record = True
                rec = _LayerRecord(f"{side}.{i}", f"mips-{mem.index.kind}-top{mem.topk}-{mem.activation}",
                                   mem.slots, percents, max_rows)
                hooks.append(layer.fc1.register_forward_hook(mips_hook(rec, side, mem)))
            else:
                rec = _LayerRecord(f"{side}.{i}", "ffn", layer.fc1.out_features, percents, max_rows)
                pre, post = ffn_hooks(rec, side)
                hooks.append(layer.fc2.register_forward_pre_hook(pre))
                hooks.append(layer.fc2.register_forward_hook(post))
            records.append(rec)
    try:
        with torch.no_grad():
            for sample in batches:
                net = sample["net_input"]
                current["encoder"] = (net["src_tokens"] != pad).t().reshape(-1)
                current["decoder"] = (net["prev_output_tokens"] != pad).t().reshape(-1)
                model(**net)
    finally:
        for h in hooks:
            h.remove()
    return [r.result() for r in records]


def memory_stats_report(checkpoint, data_dir, split: str = "valid", top_percent: Sequence[float] = DEFAULT_TOP_PERCENT,
                        max_tokens: int = 4000, max_batches: Optional[int] = None, max_rows: int = 2000,
                        json_path=None, quiet: bool = False, device: str = "auto") -> dict:
    """Top-score ratio, anisotropy and zero fraction per layer of ``checkpoint`` on ``data_dir``/``split``.

    Returns a dict (``layers``: one entry per layer; ``mean``: averages over layers) and prints a
    table unless ``quiet``; with ``json_path`` the report is also written as JSON.
    """
    from reluformer_mt.checkpoints import load_model
    from reluformer_mt.evaluation.reports import format_table, write_json

    for p in top_percent:
        if not 0 < p <= 100:
            raise ValueError(f"--top-percent: got {p}, expected a percentage in (0, 100]")
    loaded = load_model(checkpoint, data_dir, device=device, check_data=True)  # --data of the model's vocabulary
    model, cfg, task = loaded.model, loaded.cfg, loaded.task
    task.load_dataset(split)
    dataset = task.dataset(split)
    itr = task.get_batch_iterator(dataset=dataset, max_tokens=max_tokens, max_positions=model.max_positions(),
                                  ignore_invalid_inputs=True, seed=1, num_workers=0).next_epoch_itr(shuffle=False)
    batches = (b for n, b in enumerate(itr) if max_batches is None or n < max_batches)
    if loaded.device != "cpu":
        from fairseq import utils

        batches = (utils.move_to_cuda(b, device=torch.device(loaded.device)) for b in batches)
    layers = collect_memory_stats(model, batches, task.source_dictionary.pad(), top_percent, max_rows)
    keys = [str(p) for p in top_percent]

    def mean(values):
        values = [v for v in values if v == v]
        return sum(values) / len(values) if values else float("nan")

    report = {
        "checkpoint": str(checkpoint), "data": str(data_dir), "split": split,
        "ffn_variant": getattr(cfg.model, "ffn_variant", "relu") or "relu", "top_percent": list(top_percent),
        "layers": layers,
        "mean": {"top_score_ratio": {k: mean([l["top_score_ratio"][k] for l in layers]) for k in keys},
                 "anisotropy": mean([l["anisotropy"] for l in layers]),
                 "zero_fraction": mean([l["zero_fraction"] for l in layers])},
    }
    if not quiet:
        headers = ["layer", "kind", "slots", *[f"top {k}%" for k in keys], "anisotropy", "zeros", "rows"]
        rows = [(l["layer"], l["kind"], l["slots"], *[l["top_score_ratio"][k] for k in keys], l["anisotropy"],
                 l["zero_fraction"], l["rows"]) for l in layers]
        m = report["mean"]
        rows.append(("mean", "", "", *[m["top_score_ratio"][k] for k in keys], m["anisotropy"], m["zero_fraction"], ""))
        print(f"memory diagnostics of {checkpoint} on {split} (ffn variant {report['ffn_variant']})")
        print(format_table(headers, rows, digits=3))
    if json_path:
        write_json(json_path, report)
    return report
