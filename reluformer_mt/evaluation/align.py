"""Word alignments from cross-attention, and their AER per layer (docs/METHODS.md section 4).

Force-decode the reference (``extract``), take the cross-attention of a decoder layer -- one
head or the mean over heads -- merge subword pieces to words (a target word's row is the mean
of its pieces' rows, a source word's column the sum of its pieces' columns) and link each target
word to its argmax source word; a target word whose row is all zero (ReLA's null attention, or
mass only on ``</s>``) gets no link. "Shifted" attention (Chen et al. 2020, "Accurate word
alignment induction from neural machine translation"; used by ReLA, Zhang et al. 2021) reads
the row of the step where the target word is the decoder *input*, i.e. one step later.

With gold links, the per-layer table reports AER for the best head (the head with the lowest
AER on these gold links, an oracle choice as in ReLA's figure) and for the head average,
normal and shifted. Layers and heads are numbered from 1 in options and reports; links are
0-based ``i-j``, source first.

Every sentence pair is force-decoded on its own, also with a document-level model (e.g. the
bible corpus: ``{split}.words.{src,tgt}`` and ``{split}.gold.align`` of a prepared directory are
the inputs): the model then sees one-sentence segments, without document context.
"""
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

import torch

from reluformer_mt.data.textfiles import read_lines
from reluformer_mt.evaluation import aer as aer_lib
from reluformer_mt.evaluation import extract
from reluformer_mt.evaluation.stats import argmax_links, shift_rows, word_attention

MODES = ("normal", "shifted")
Link = Tuple[int, int]


# ---------------------------------------------------------------------------------------------- input

def read_tokenised(src: Optional[str] = None, tgt: Optional[str] = None, pairs: Optional[str] = None
                   ) -> Tuple[List[List[str]], List[List[str]], str]:
    """(source words, target words, description) from two token files or one ``src ||| tgt``
    file; words are split on spaces and tabs (as in ``aer``)."""
    if pairs and (src or tgt):
        raise ValueError("give --pairs or --src/--tgt, not both")
    if pairs:
        s_words, t_words = [], []
        for n, line in enumerate(read_lines(pairs), 1):
            if line.count("|||") != 1:
                raise ValueError(f"{pairs}:{n}: expected 'source ||| target', found {line.count('|||')} '|||'")
            s, t = line.split("|||")
            s_words.append(aer_lib.tokens(s))
            t_words.append(aer_lib.tokens(t))
        return s_words, t_words, str(pairs)
    if not (src and tgt):
        raise ValueError("give the sentence pairs: --src and --tgt token files, or --pairs 'src ||| tgt' file")
    s_lines, t_lines = read_lines(src), read_lines(tgt)
    if len(s_lines) != len(t_lines):
        raise ValueError(f"{src} has {len(s_lines)} lines but {tgt} has {len(t_lines)}")
    return [aer_lib.tokens(x) for x in s_lines], [aer_lib.tokens(x) for x in t_lines], str(src)


def read_gold_for(path, base: int, possible_mark: str, lengths: Sequence[Tuple[int, int]], swap: bool = False,
                  check: bool = True):
    """Gold (S, P) per sentence, 0-based, source first; line count and ranges checked against
    the input. ``swap``: the file lists target-side indices first (e.g. Biçici's de-en.wa used
    with an en->de model)."""
    gold = aer_lib.read_gold(path, base, possible_mark)
    if len(gold) != len(lengths):
        raise ValueError(f"{path} has {len(gold)} lines but the input has {len(lengths)} sentence pairs")
    if check:
        file_lengths = [(nt, ns) for ns, nt in lengths] if swap else list(lengths)
        aer_lib.check_ranges([p for _, p in gold], file_lengths, path, base)
    if swap:
        flip = lambda links: {(j, i) for i, j in links}  # noqa: E731
        gold = [(flip(s), flip(p)) for s, p in gold]
    return gold


# ---------------------------------------------------------------------------------------------- links

def head_variants(cross: torch.Tensor) -> torch.Tensor:
    """(L, H, T, S) -> (modes, L, H + 1, T, S): every head and (last) the head mean, normal and shifted."""
    with_mean = torch.cat([cross, cross.mean(1, keepdim=True)], dim=1)
    return torch.stack([with_mean, shift_rows(with_mean)])


@dataclass
class ModelLinks:
    """links[mode][layer][head] -> one set of links per sentence; head index H is the head average."""
    name: str
    model: dict
    n_layers: int
    n_heads: int
    links: Dict[str, List[List[List[Set[Link]]]]] = field(default_factory=dict)

    def get(self, mode: str, layer: int, head: Optional[int]) -> List[Set[Link]]:
        """0-based layer; head None = head average."""
        return self.links[mode][layer][self.n_heads if head is None else head]


def induce_links(loaded: "extract.LoadedModel", pairs: Sequence["extract.Pair"], name: str = "model",
                 max_tokens: int = 4000) -> ModelLinks:
    """Links of every layer, head (and head average), normal and shifted, for all pairs."""
    n_layers, n_heads = len(loaded.modules["cross"]), loaded.modules["cross"][0].num_heads
    out = ModelLinks(name, loaded.describe(), n_layers, n_heads)
    out.links = {m: [[[set() for _ in pairs] for _ in range(n_heads + 1)] for _ in range(n_layers)] for m in MODES}
    for i, attn in extract.iterate_attention(loaded, pairs, ("cross",), max_tokens):
        words = word_attention(head_variants(attn["cross"]), pairs[i].src_word_ids, pairs[i].tgt_word_ids)
        flat = argmax_links(words)
        k = 0
        for mode in MODES:
            for layer in range(n_layers):
                for head in range(n_heads + 1):
                    out.links[mode][layer][head][i] = flat[k]
                    k += 1
    return out


# ---------------------------------------------------------------------------------------------- AER

def aer_per_layer(ml: ModelLinks, gold) -> dict:
    """{mode: {"best_head": [AER per layer], "best_head_index": [1-based], "head_average": [...],
    "per_head": [[AER per head] per layer]}} plus the full results of the best and average."""
    table = {}
    for mode in MODES:
        per_head, best, best_idx, avg, details = [], [], [], [], []
        for layer in range(ml.n_layers):
            results = [aer_lib.corpus_aer(ml.get(mode, layer, h), gold) for h in range(ml.n_heads)]
            aers = [r.aer for r in results]
            h_best = min(range(ml.n_heads), key=lambda h: (math.inf if math.isnan(aers[h]) else aers[h], h))
            mean = aer_lib.corpus_aer(ml.get(mode, layer, None), gold)
            per_head.append(aers)
            best.append(aers[h_best])
            best_idx.append(h_best + 1)
            avg.append(mean.aer)
            details.append({"best_head": results[h_best].to_dict(), "head_average": mean.to_dict()})
        table[mode] = {"best_head": best, "best_head_index": best_idx, "head_average": avg, "per_head": per_head,
                       "details": details}
    return table


def aer_rows(table: dict) -> List[list]:
    rows = []
    n_layers = len(table["normal"]["best_head"])
    for layer in range(n_layers):
        row = [layer + 1]
        for mode in MODES:
            t = table[mode]
            row += [t["best_head"][layer], t["best_head_index"][layer], t["head_average"][layer]]
        rows.append(row)
    return rows


AER_HEADERS = ["layer", "normal best head", "(head)", "normal head avg", "shifted best head", "(head)",
               "shifted head avg"]


# ---------------------------------------------------------------------------------------------- selection

ALL_LAYERS = "all"


def selected_layers(layer: Union[int, str], n_layers: int) -> List[int]:
    """``ALL_LAYERS`` or a 1-based layer number -> 0-based layers, checked against the model."""
    if layer == ALL_LAYERS:
        return list(range(n_layers))
    if not 1 <= int(layer) <= n_layers:
        raise ValueError(f"--layer {layer}: the model has decoder layers 1..{n_layers}")
    return [int(layer) - 1]


def selected_head(head: Optional[int], n_heads: int) -> Optional[int]:
    """None (the head average) or a 1-based head number -> 0-based head, checked against the model."""
    if head is None:
        return None
    if not 1 <= head <= n_heads:
        raise ValueError(f"--head {head}: the model has heads 1..{n_heads}")
    return head - 1


def output_path(base: str, layer: int, all_layers: bool, name: Optional[str]) -> Path:
    """``pred.align`` -> ``pred.layer3.align`` (--layer all) / ``pred.relu.align`` (several models)."""
    p = Path(base)
    tags = ([name] if name else []) + ([f"layer{layer + 1}"] if all_layers else [])
    if not tags:
        return p
    return p.with_name(f"{p.stem}.{'.'.join(tags)}{p.suffix}" if p.suffix else f"{p.name}.{'.'.join(tags)}")


def write_links(path: Path, links: Sequence[Set[Link]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(aer_lib.format_links(s) + "\n" for s in links)


def model_names(checkpoints: Sequence[str], names: Optional[Sequence[str]]) -> List[str]:
    """Display names: given, else the checkpoint's folder name (made unique)."""
    if names:
        if len(names) != len(checkpoints):
            raise ValueError(f"--names has {len(names)} names for {len(checkpoints)} checkpoints")
        return list(names)
    out = []
    for k, c in enumerate(checkpoints):
        n = Path(c).parent.name or Path(c).stem
        out.append(n if n not in out else f"{n}-{k + 1}")
    return out


def run_align(checkpoints: Sequence[str], src=None, tgt=None, pairs=None, data=None, spm_models=None,
              layer: Union[int, str] = ALL_LAYERS, head: Optional[int] = None, shifted: bool = False, output: Optional[str] = None,
              gold: Optional[str] = None, gold_base: Optional[int] = None, possible_mark: str = "p",
              gold_swap: bool = False, unchecked_gold: bool = False, plot: Optional[str] = None,
              names: Optional[Sequence[str]] = None, max_tokens: int = 4000, device: str = "cpu") -> dict:
    """The ``align`` pipeline; returns the report (tables are printed by the CLI). ``layer``: a
    1-based decoder layer or ``ALL_LAYERS``; ``head``: a 1-based head, None = the head average."""
    if gold and gold_base is None:
        raise ValueError("--gold needs --gold-base 0 or 1 (the index base of the gold file; never guessed)")
    if not output and not gold:
        raise ValueError("nothing to do: give --output for the links and/or --gold for AER")
    if plot and not gold:
        raise ValueError("--plot draws AER per layer and needs --gold")
    src_words, tgt_words, where = read_tokenised(src, tgt, pairs)
    lengths = [(len(s), len(t)) for s, t in zip(src_words, tgt_words)]
    gold_links = read_gold_for(gold, gold_base, possible_mark, lengths, gold_swap, not unchecked_gold) if gold else None
    names = model_names(checkpoints, names)
    report = {"input": where, "sentences": len(lengths), "mode": "shifted" if shifted else "normal",
              "layer": str(layer), "head": "average" if head is None else str(head), "models": {}}
    if gold:
        report["gold"] = {"path": str(gold), "base": gold_base, "possible_mark": possible_mark, "swapped": gold_swap,
                          "range_checked": not unchecked_gold}
    if len(checkpoints) > 1:
        extract.check_data_of(checkpoints, data)
    for ckpt, name in zip(checkpoints, names):
        loaded = extract.load_checkpoint(ckpt, data, spm_models, device)
        encoded = extract.encode_pairs(loaded, src_words, tgt_words, where)
        ml = induce_links(loaded, encoded, name, max_tokens)
        layers = selected_layers(layer, ml.n_layers)
        h = selected_head(head, ml.n_heads)
        mode = "shifted" if shifted else "normal"
        entry = {"model": ml.model, "n_layers": ml.n_layers, "n_heads": ml.n_heads, "outputs": [], "selected": []}
        for lay in layers:
            links = ml.get(mode, lay, h)
            sel = {"layer": lay + 1, "head": "average" if h is None else h + 1, "mode": mode,
                   "links": sum(len(s) for s in links)}
            if output:
                path = output_path(output, lay, layer == ALL_LAYERS, name if len(checkpoints) > 1 else None)
                write_links(path, links)
                sel["output"] = str(path)
                entry["outputs"].append(str(path))
            if gold_links is not None:
                sel["aer"] = aer_lib.corpus_aer(links, gold_links).to_dict()
            entry["selected"].append(sel)
        if gold_links is not None:
            entry["aer_per_layer"] = aer_per_layer(ml, gold_links)
        report["models"][name] = entry
    if gold_links is not None:  # the trivial reference every attention AER stands beside
        diagonal = [aer_lib.diagonal_alignment(ns, nt) for ns, nt in lengths]
        report["diagonal_aer"] = aer_lib.corpus_aer(diagonal, gold_links).aer
    if plot:
        from reluformer_mt.evaluation.plots import plot_aer_per_layer

        data_by_model = {n: {m: {k: e["aer_per_layer"][m][k] for k in ("best_head", "head_average")} for m in MODES}
                         for n, e in report["models"].items()}
        report["plot"] = str(plot_aer_per_layer(data_by_model, plot, title=f"AER per layer on {Path(gold).name}",
                                                baselines={"diagonal": report["diagonal_aer"]}))
    return report
