"""PNG plots with matplotlib (Agg backend, no display needed): attention heatmaps per head,
AER per layer (like the per-layer AER figure of Zhang, Titov & Sennrich 2021, ReLA), and
sparsity (or any statistic) per layer."""
import math
from pathlib import Path
from typing import Mapping, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_attention_heatmaps(attn_by_model: Mapping[str, "object"], src_tokens: Sequence[str],
                            tgt_tokens: Sequence[str], path, title: Optional[str] = None) -> Path:
    """One sentence pair: a row of heads per model (models stacked for comparison).

    ``attn_by_model[name]`` has shape (H, T, S) (torch tensor or array). Exact zeros are shown
    white, so the sparsity of ReLU-type attention is visible.
    """
    names = list(attn_by_model)
    if not names:
        raise ValueError("no attention to plot")
    arrays = {n: (a.detach().cpu().double().numpy() if hasattr(a, "detach") else a) for n, a in attn_by_model.items()}
    n_heads = max(a.shape[0] for a in arrays.values())
    for n, a in arrays.items():
        if a.ndim != 3 or a.shape[1:] != (len(tgt_tokens), len(src_tokens)):
            raise ValueError(f"model {n!r}: attention shape {a.shape}, expected (heads, {len(tgt_tokens)}, {len(src_tokens)})")
    cell = 0.22
    fig_w = max(3.0, n_heads * (len(src_tokens) * cell + 1.0))
    label_room = 0.08 * max(len(t) for t in src_tokens) + 0.6  # rotated source labels under each row
    fig_h = max(2.5, len(names) * (len(tgt_tokens) * cell + label_room + 0.4))
    fig, axes = plt.subplots(len(names), n_heads, figsize=(fig_w, fig_h), squeeze=False, layout="constrained")
    cmap = matplotlib.colormaps["Blues"].with_extremes(under="white")  # exact zeros below vmin: white
    for r, name in enumerate(names):
        a = arrays[name]
        for h in range(n_heads):
            ax = axes[r][h]
            if h >= a.shape[0]:
                ax.axis("off")
                continue
            vmax = max(float(a[h].max()), 1e-12)
            ax.imshow(a[h], cmap=cmap, vmin=1e-12, vmax=vmax, aspect="auto", interpolation="nearest")
            ax.set_title(f"{name} head {h}", fontsize=8)
            ax.set_xticks(range(len(src_tokens)))
            ax.set_xticklabels(src_tokens, rotation=90, fontsize=6)
            ax.set_yticks(range(len(tgt_tokens)))
            ax.set_yticklabels(tgt_tokens if h == 0 else [], fontsize=6)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


AER_PANELS = (("normal", "best_head"), ("normal", "head_average"), ("shifted", "best_head"), ("shifted", "head_average"))


def plot_aer_per_layer(aer_by_model: Mapping[str, Mapping[str, Mapping[str, Sequence[float]]]], path,
                       title: Optional[str] = None) -> Path:
    """AER per layer, four panels (normal / shifted x best head / head average), a line per model.

    ``aer_by_model[model][mode][kind]`` is a list over layers, mode in {"normal", "shifted"},
    kind in {"best_head", "head_average"}; missing entries leave their panel without that line.
    """
    fig, axes = plt.subplots(2, 2, figsize=(9, 6.5), sharey=True)
    for ax, (mode, kind) in zip(axes.flat, AER_PANELS):
        for model, modes in aer_by_model.items():
            values = modes.get(mode, {}).get(kind)
            if values:
                ax.plot(range(1, len(values) + 1), values, marker="o", label=model)
        ax.set_title(f"{mode}, {kind.replace('_', ' ')}", fontsize=10)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("layer")
        ax.set_ylabel("AER")
        ax.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5))
    fig.suptitle(title or "AER per layer (lower is better)")
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    return _save(fig, path)


def plot_metric_per_layer(values_by_model: Mapping[str, Sequence[float]], path, ylabel: str,
                          title: Optional[str] = None) -> Path:
    """A statistic per layer (e.g. sparsity rate averaged over heads), a line per model."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for model, values in values_by_model.items():
        ys = [math.nan if v is None else v for v in values]
        ax.plot(range(1, len(ys) + 1), ys, marker="o", label=model)
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title or f"{ylabel} per layer")
    return _save(fig, path)


def plot_sparsity_per_layer(sparsity_by_model: Mapping[str, Sequence[float]], path, title: Optional[str] = None) -> Path:
    """Sparsity rate (share of exact zeros) per layer, a line per model."""
    return plot_metric_per_layer(sparsity_by_model, path, "sparsity rate", title)
