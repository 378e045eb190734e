"""PNG plots with matplotlib (Agg backend, no display needed): attention heatmaps per head,
AER per layer (like the per-layer AER figure of Zhang, Titov & Sennrich 2021, ReLA), and
sparsity (or any statistic) per layer."""
import math
from pathlib import Path
from typing import Mapping, Optional, Sequence, Tuple

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
        row_max = max(float(a.max()), 1e-12)  # one scale per model, so its heads compare and one bar reads all
        image = None
        for h in range(n_heads):
            ax = axes[r][h]
            if h >= a.shape[0]:
                ax.axis("off")
                continue
            image = ax.imshow(a[h], cmap=cmap, vmin=1e-12, vmax=row_max, aspect="auto", interpolation="nearest")
            ax.set_title(f"{name} head {h}", fontsize=8)
            ax.set_xticks(range(len(src_tokens)))
            ax.set_xticklabels(src_tokens, rotation=90, fontsize=6)
            ax.set_yticks(range(len(tgt_tokens)))
            ax.set_yticklabels(tgt_tokens if h == 0 else [], fontsize=6)
        if image is not None:
            add_colour_bar(fig, image, axes[r].tolist())
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def add_colour_bar(fig, image, axes) -> None:
    """A colour bar beside ``axes`` saying what the shades mean (white: exactly zero)."""
    bar = fig.colorbar(image, ax=axes, shrink=0.9, pad=0.01, extend="min")
    bar.set_label("attention weight (white: exactly 0)", fontsize=7)
    bar.ax.tick_params(labelsize=6)


AER_PANELS = (("normal", "best_head"), ("normal", "head_average"), ("shifted", "best_head"), ("shifted", "head_average"))


def plot_aer_per_layer(aer_by_model: Mapping[str, Mapping[str, Mapping[str, Sequence[float]]]], path,
                       title: Optional[str] = None, baselines: Optional[Mapping[str, float]] = None) -> Path:
    """AER per layer, four panels (normal / shifted x best head / head average), a line per model.

    ``aer_by_model[model][mode][kind]`` is a list over layers, mode in {"normal", "shifted"},
    kind in {"best_head", "head_average"}; missing entries leave their panel without that line.
    ``baselines`` ({"diagonal": AER, ...}) are drawn as horizontal lines in every panel: attention
    that does not go below the diagonal's line has not learnt to align.
    """
    fig, axes = plt.subplots(2, 2, figsize=(9, 6.5), sharey=True)
    for ax, (mode, kind) in zip(axes.flat, AER_PANELS):
        for model, modes in aer_by_model.items():
            values = modes.get(mode, {}).get(kind)
            if values:
                ax.plot(range(1, len(values) + 1), values, marker="o", label=model)
        for k, (name, value) in enumerate((baselines or {}).items()):
            if value is not None and not math.isnan(value):
                ax.axhline(value, color="0.35", linestyle=("--", ":", "-.")[k % 3], linewidth=1.2,
                           label=f"baseline: {name} ({value:.2f})")
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


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def plot_metric_per_layer(values_by_model: Mapping[str, Sequence[float]], path, ylabel: str,
                          title: Optional[str] = None,
                          panels: Optional[Mapping[str, Mapping[str, Sequence[float]]]] = None) -> Path:
    """A statistic per layer (e.g. sparsity rate averaged over heads), a line per model.

    ``panels`` ({panel title: {model: values}}, e.g. one panel per kind of attention) replaces
    ``values_by_model``. A model keeps its colour and marker in every panel, lines that coincide
    (softmax's sparsity is 0 everywhere) are drawn with decreasing marker sizes so that each stays
    visible, and the legend sits below the panels, never over the data."""
    panels = dict(panels) if panels else {"": dict(values_by_model)}
    models = list(dict.fromkeys(m for lines in panels.values() for m in lines))
    fig, axes = plt.subplots(1, len(panels), figsize=(max(6.0, 4.2 * len(panels)), 3.8), squeeze=False,
                             sharey=True, layout="constrained")
    for ax, (panel, lines) in zip(axes[0], panels.items()):
        for model, values in lines.items():
            k = models.index(model)
            ys = [math.nan if v is None else v for v in values]
            ax.plot(range(1, len(ys) + 1), ys, color=f"C{k % 10}", marker=MARKERS[k % len(MARKERS)],
                    markersize=max(3.0, 9.0 - 2.0 * k), linewidth=1.5, label=model, alpha=0.9)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if panel:
            ax.set_title(panel, fontsize=10)
    axes[0][0].set_ylabel(ylabel)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:  # models missing from the first panel
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 5), fontsize=8)
    fig.suptitle(title or f"{ylabel} per layer", fontsize=10)
    return _save(fig, path)


def plot_sparsity_per_layer(sparsity_by_model: Mapping[str, Sequence[float]], path, title: Optional[str] = None,
                            panels: Optional[Mapping[str, Mapping[str, Sequence[float]]]] = None) -> Path:
    """Sparsity rate (share of exact zeros) per layer, a line per model (a panel per attention kind
    with ``panels``)."""
    return plot_metric_per_layer(sparsity_by_model, path, "sparsity rate", title, panels)


def plot_word_alignment(words_by_model: Mapping[str, "object"], src_words: Sequence[str], tgt_words: Sequence[str],
                        gold_sure, path, gold_possible=(), subtitles: Optional[Mapping[str, str]] = None,
                        title: Optional[str] = None) -> Path:
    """One verse, one panel per model: word-level attention (target words x source words, e.g. the
    best layer's head average) with the gold links drawn over it (sure: black squares, possible:
    grey dots), so one sees whether attention lands on the aligned words. Exact zeros are white."""
    names = list(words_by_model)
    if not names:
        raise ValueError("no attention to plot")
    cell = 0.32
    width = len(src_words) * cell + 1.6
    height = len(tgt_words) * cell + 0.1 * max(map(len, src_words), default=1) + 1.2
    fig, axes = plt.subplots(1, len(names), figsize=(max(3.0, width) * len(names), max(3.0, height)),
                             squeeze=False, layout="constrained")
    cmap = matplotlib.colormaps["Blues"].with_extremes(under="white")
    for ax, name in zip(axes[0], names):
        a = words_by_model[name]
        a = a.detach().cpu().double().numpy() if hasattr(a, "detach") else a
        if a.shape != (len(tgt_words), len(src_words)):
            raise ValueError(f"model {name!r}: word attention {a.shape}, expected ({len(tgt_words)}, {len(src_words)})")
        image = ax.imshow(a, cmap=cmap, vmin=1e-12, vmax=max(float(a.max()), 1e-12), aspect="auto",
                          interpolation="nearest")
        add_colour_bar(fig, image, ax)
        for links, marker, color in ((gold_sure, "s", "black"), (gold_possible, "o", "grey")):
            if links:
                ax.scatter([i for i, _ in links], [j for _, j in links], marker=marker, s=40, facecolors="none",
                           edgecolors=color, linewidths=1.2)
        ax.set_title(f"{name}" + (f"\n{subtitles[name]}" if subtitles and name in subtitles else ""), fontsize=8)
        ax.set_xticks(range(len(src_words)))
        ax.set_xticklabels(src_words, rotation=90, fontsize=7)
        ax.set_yticks(range(len(tgt_words)))
        ax.set_yticklabels(tgt_words, fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def cumulative_updates(curve: Mapping[str, Sequence[Mapping]]) -> Mapping[str, int]:
    """Updates done before each phase: a later phase (fine-tuning with a fresh optimizer) counts its
    updates from 0, so its points are moved right by the updates of the phases before it."""
    offsets, total = {}, 0
    phases = list(curve.get("phase_starts", {})) or [None]
    for phase in phases:
        offsets[phase] = total
        total += max((p["update"] for part in ("train", "valid") for p in curve[part]
                      if p.get("phase") == phase and p.get("update") is not None), default=0)
    return offsets


def _curve_points(curve, part: str, x: str, y: str, offsets):
    """(x, y) pairs of a curve part; x is "minutes" (wall clock) or "updates" (across phases)."""
    out = []
    for p in curve[part]:
        if p.get(y) is None:
            continue
        if x == "minutes":
            if p.get("wall") is None:
                continue
            out.append((p["wall"] / 60, p[y]))
        else:
            out.append((p["update"] + offsets.get(p.get("phase"), 0), p[y]))
    return out


def plot_learning_curves(curves: Mapping[str, Mapping[str, Sequence[Mapping]]], path,
                         title: Optional[str] = None) -> Path:
    """Loss (train and valid) and greedy valid s-BLEU of each model against updates (left) and
    against wall-clock minutes (right): a model that is slower per update shows as slower on the
    right only, not as a slower learner (``curves[name]`` as
    :func:`reluformer_mt.experiments.curves.read_learning_curve` returns, with phases as the demo
    adds them). Dotted lines mark where a later phase begins."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.6), layout="constrained", sharex="col")
    for i, (name, curve) in enumerate(curves.items()):
        offsets = cumulative_updates(curve)
        for col, x in enumerate(("updates", "minutes")):
            loss_ax, bleu_ax = axes[0][col], axes[1][col]
            train = _curve_points(curve, "train", x, "loss", offsets)
            valid = _curve_points(curve, "valid", x, "loss", offsets)
            bleu = _curve_points(curve, "valid", x, "s_bleu", offsets)
            if train:
                loss_ax.plot(*zip(*train), color=f"C{i}", alpha=0.5, label=f"{name} train")
            if valid:
                loss_ax.plot(*zip(*valid), color=f"C{i}", marker="o", linestyle="--", label=f"{name} valid")
            if bleu:
                bleu_ax.plot(*zip(*bleu), color=f"C{i}", marker="o", label=name)
            # where a later phase (the document phase of the sentence-then-document recipe) begins
            for phase, start in list(curve.get("phase_starts", {}).items())[1:]:
                where = offsets[phase] if x == "updates" else start / 60
                for ax in (loss_ax, bleu_ax):
                    ax.axvline(where, color=f"C{i}", linestyle=":", linewidth=1)
                bleu_ax.annotate(f"{phase} phase", (where, 0), xycoords=("data", "axes fraction"), xytext=(2, 4),
                                 textcoords="offset points", fontsize=6, color=f"C{i}", rotation=90)
    for col, x in enumerate(("updates (all phases)", "minutes of training")):
        axes[0][col].set(ylabel="loss (base 2, as optimised)", title=f"loss against {x.split()[0]}")
        axes[1][col].set(xlabel=x, ylabel="valid s-BLEU (greedy)", title=f"quality against {x.split()[0]}")
        for ax in (axes[0][col], axes[1][col]):
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6), fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path)


# the demo's name from before the curves were also drawn against updates
plot_curves_against_minutes = plot_learning_curves


def plot_sweep(series: Mapping[str, Mapping[str, Sequence[Tuple[float, Optional[float]]]]], titles: Mapping[str, str],
               path, xlabel: str, log2_x: bool = True) -> Path:
    """One panel per measure (``series[measure][line] = [(x, y), ...]``, titled ``titles[measure]``),
    a line per variant; None is drawn as a gap. The FFN-memory sweep: measures against slots."""
    fig, axes = plt.subplots(1, len(series), figsize=(4.2 * len(series), 3.4), squeeze=False)
    for ax, (measure, lines) in zip(axes[0], series.items()):
        for name, points in lines.items():
            if points:
                ax.plot([x for x, _ in points], [math.nan if y is None else y for _, y in points], marker="o", label=name)
        if log2_x:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_title(titles.get(measure, measure))
    axes[0][0].legend()
    fig.tight_layout()
    return _save(fig, path)
