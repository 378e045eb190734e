"""What the demo's HTML report needs beyond report.json, written into the report folder, and the page.

``write_page_files`` is the demo's last step but one (the page itself, ``index.html``, is rendered
once the run's total time is known: ``html_report.write_html_report``). Into ``OUT/report/`` it writes

- ``test_{model}.{mode}.txt``: the hypotheses of every decoding mode (constrained, free, sentence,
  pieces, knn, ...: ``demo_translate.MODES``), one held-out verse a line, chapters in
  order (``test.chapters.txt`` holds the chapter of each line, ``test.ref.en.txt`` and
  ``test.src.grc.txt`` the reference and source lines), so that ``reluformer-eval bleu --hyp
  test_softmax.constrained.txt --hyp-doc-ids test.chapters.txt --ref test.ref.en.txt`` rescores
  them; ``test_{model}.free.hyp.json`` beside the demo's constrained ``test_{model}.hyp.json``;
- ``metrics.json``: standard metrics of every model and decoding mode (BLEU, chrF, chrF++, TER on
  Moses-detokenised text), 95 % intervals and significance against the softmax row (sacreBLEU's
  paired bootstrap), per-verse chrF;
- ``sentences.json``: the held-out chapters verse by verse: source, reference, the nearest
  training verse's copy, every model's constrained and free output;
- ``alignments.json``: word-level cross-attention of every model, layer, head (and head average),
  normal and shifted, for held-out verses with gold links, with the argmax links extracted from it;
- ``aligners.json``: AER of a statistical aligner (eflomal) on the same gold links, an informed
  reference beside the diagonal (also a line under table.md's table);

which ``index.html`` (:mod:`reluformer_mt.evaluation.html_report`) reads.
"""
import base64
import json
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

import torch
from sacrebleu.metrics import CHRF

from reluformer_mt.evaluation import aer as aer_lib
from reluformer_mt.evaluation import bleu as bleu_lib
from reluformer_mt.evaluation import extract
from reluformer_mt.evaluation.align import MODES, head_variants
from reluformer_mt.evaluation.baselines import nearest_verse_translations
from reluformer_mt.evaluation.reports import write_json
from reluformer_mt.data.textfiles import write_text_atomically
from reluformer_mt.evaluation.significance import paired_bootstrap
from reluformer_mt.evaluation.stats import argmax_links, word_attention

Docs = Dict[str, List[str]]
DECODING = ("constrained", "free")
NEAREST = "nearest training verse"
# the alignment viewer's data grows with verses x models x layers x heads; this many verses keep
# the page at a few MB for the quick preset (3 models, 2 layers, 4 heads)
MAX_ALIGNMENT_VERSES = 100
SHADES = 15  # heatmap cells are stored as 4-bit shades: 0 = exactly zero, 1..15 = share of the matrix's maximum


def read_test_documents(data_dir: Path, lang: str) -> Docs:
    """Held-out verses grouped by chapter, in order (``test.words.{lang}`` and ``test.verses.tsv``)."""
    words = (data_dir / f"test.words.{lang}").read_text(encoding="utf-8").splitlines()
    chapters = [line.split("\t")[1] for line in (data_dir / "test.verses.tsv").read_text(encoding="utf-8").splitlines()]
    if len(words) != len(chapters):
        raise ValueError(f"{data_dir}: test.words.{lang} has {len(words)} lines, test.verses.tsv {len(chapters)}")
    docs: Docs = {}
    for chapter, verse in zip(chapters, words):
        docs.setdefault(chapter, []).append(verse)
    return docs


def flat(docs: Mapping[str, Sequence[str]], chapters: Sequence[str]) -> List[str]:
    return [v for c in chapters for v in docs[c]]


# ------------------------------------------------------------------------------------ plain files
def write_plain_files(report_dir: Path, hypotheses: Mapping[str, Mapping[str, Docs]], sources: Docs,
                      references: Docs, chapters: Sequence[str]) -> List[Path]:
    """Hypotheses per model and decoding mode as text (one verse a line), with the chapter ids,
    references and sources line by line beside them; the free outputs also as JSON."""
    written = []

    def lines(path: Path, rows: Sequence[str]) -> None:
        write_text_atomically(path, "".join(r + "\n" for r in rows))
        written.append(path)

    lines(report_dir / "test.chapters.txt", [c for c in chapters for _ in references[c]])
    lines(report_dir / "test.ref.en.txt", flat(references, chapters))
    lines(report_dir / "test.src.grc.txt", flat(sources, chapters))
    for mode, by_model in hypotheses.items():
        for model, docs in by_model.items():
            lines(report_dir / f"test_{model}.{mode}.txt", flat(docs, chapters))
            if mode == "free":
                path = report_dir / f"test_{model}.free.hyp.json"
                write_text_atomically(path, json.dumps(docs, ensure_ascii=False, indent=0))
                written.append(path)
    return written


# ------------------------------------------------------------------------------------ metrics
def standard_metrics(hyps: Sequence[str], refs: Sequence[str], hyp_docs: Sequence[Sequence[str]],
                     ref_docs: Sequence[Sequence[str]]) -> dict:
    """BLEU (sentence and document level), chrF, chrF++ and TER of detokenised text."""
    return {"bleu": bleu_lib.corpus_sbleu(hyps, refs).score, "d_bleu": bleu_lib.corpus_dbleu(hyp_docs, ref_docs).score,
            "chrf": bleu_lib.corpus_chrf(hyps, refs, "sentence").score,
            "chrf_pp": bleu_lib.corpus_chrf(hyps, refs, "sentence", word_order=2).score,
            "ter": bleu_lib.corpus_ter(hyps, refs, "sentence").score}


def compute_metrics(hypotheses: Mapping[str, Mapping[str, Docs]], nearest: Docs, references: Docs,
                    chapters: Sequence[str], baseline: Optional[str] = "softmax") -> dict:
    """Every system (model x decoding mode, and the nearest-verse copy) on Moses-detokenised text:
    standard metrics, the paired bootstrap against ``baseline``'s constrained output (else the
    first model's) and chrF per verse."""
    detok_docs = lambda docs: {c: bleu_lib.moses_detokenize(docs[c]) for c in chapters}  # noqa: E731
    refs = detok_docs(references)
    systems = {f"{model} ({mode})": detok_docs(docs) for mode, by_model in hypotheses.items()
               for model, docs in by_model.items()}
    systems[NEAREST] = detok_docs(nearest)
    models = list(next(iter(hypotheses.values())))
    base_model = baseline if baseline in models else models[0]
    base = f"{base_model} (constrained)"
    flat_refs = flat(refs, chapters)
    bootstrap = paired_bootstrap({n: flat(d, chapters) for n, d in systems.items()}, flat_refs, base)
    chrf = CHRF()
    out = {"definition": "hypotheses and references detokenised with sacremoses' Moses detokeniser (en), then "
                         "sacreBLEU (13a): BLEU over verses, d-BLEU over whole chapters, chrF, chrF++ and TER over "
                         "verses; 95 % intervals and p-values from sacreBLEU's paired bootstrap "
                         f"({bootstrap['n_samples']} resamples) against {base}; significant: p < {bootstrap['alpha']}",
           "baseline": base, "bootstrap": bootstrap, "systems": {}}
    for name, docs in systems.items():
        hyps = flat(docs, chapters)
        entry = standard_metrics(hyps, flat_refs, [docs[c] for c in chapters], [refs[c] for c in chapters])
        entry["sentence_chrf"] = [round(chrf.sentence_score(h, [r]).score, 2) for h, r in zip(hyps, flat_refs)]
        out["systems"][name] = entry
    return out


# ------------------------------------------------------------------------------------ sentences
def sentence_view(sources: Docs, references: Docs, nearest: Docs, hypotheses: Mapping[str, Mapping[str, Docs]],
                  chapters: Sequence[str]) -> dict:
    """The held-out chapters verse by verse, as the per-sentence view shows them."""
    models = list(hypotheses["constrained"] if "constrained" in hypotheses else next(iter(hypotheses.values())))
    out = {"models": models, "modes": list(hypotheses), "chapters": []}
    for c in chapters:
        verses = []
        for k, (src, ref) in enumerate(zip(sources[c], references[c])):
            verses.append({"src": src, "ref": ref, "nearest": nearest[c][k],
                           "hyp": {m: {mode: hypotheses[mode][m][c][k] for mode in hypotheses if m in hypotheses[mode]}
                                   for m in models}})
        out["chapters"].append({"id": c, "verses": verses})
    return out


# ------------------------------------------------------------------------------------ alignments
def pack_shades(matrices: torch.Tensor) -> str:
    """(..., T, S) non-negative weights -> base64 of 4-bit shades, two a byte, each matrix scaled
    to its own maximum; exact zeros stay 0 (ReLU attention's sparsity stays visible)."""
    m = matrices.reshape(-1, *matrices.shape[-2:]).double()
    top = m.amax(dim=(-2, -1), keepdim=True).clamp_min(1e-30)
    shades = torch.where(m > 0, (m / top * SHADES).round().clamp(1, SHADES), torch.zeros_like(m)).to(torch.uint8)
    values = shades.flatten()
    if values.numel() % 2:
        values = torch.cat([values, values.new_zeros(1)])
    packed = (values[0::2] << 4) | values[1::2]
    return base64.b64encode(bytes(packed.tolist())).decode("ascii")


def pack_links(links: Sequence[set], n_tgt: int) -> str:
    """The argmax link of each target word of each matrix: 1 + source index, 0 = no link."""
    out = bytearray()
    for matrix_links in links:
        row = [0] * n_tgt
        for i, j in matrix_links:
            row[j] = min(i + 1, 255)
        out.extend(row)
    return base64.b64encode(bytes(out)).decode("ascii")


def alignment_view(checkpoints: Mapping[str, Path], data_dir: Path, aer: Mapping[str, dict], device: str = "cpu",
                   max_verses: int = MAX_ALIGNMENT_VERSES) -> dict:
    """Word-level cross-attention of the first ``max_verses`` held-out verses with gold links, for
    every model, layer, head (the last index: head average) and mode (normal, shifted), and the
    links extracted from it as ``reluformer-eval align`` extracts them; plus each model's corpus
    AER per layer and head (``aer[model]`` as the demo's report holds it)."""
    sources = (data_dir / "test.words.grc").read_text(encoding="utf-8").splitlines()
    targets = (data_dir / "test.words.en").read_text(encoding="utf-8").splitlines()
    chapters = [line.split("\t")[1] for line in (data_dir / "test.verses.tsv").read_text(encoding="utf-8").splitlines()]
    gold = aer_lib.read_gold(data_dir / "test.gold.align", base=0)
    chosen = [k for k, (s, p) in enumerate(gold) if s or p][:max_verses]
    verse_number = [chapters[:k + 1].count(chapters[k]) for k in range(len(chapters))]  # 1-based, within the chapter
    verses = []
    for k in chosen:
        sure, possible = gold[k]
        verses.append({"index": k, "chapter": chapters[k], "verse": verse_number[k],
                       "src": sources[k].split(), "tgt": targets[k].split(),
                       "sure": sorted(sure), "possible": sorted(possible - sure), "models": {}})
    models = {}
    for name, checkpoint in checkpoints.items():
        loaded = extract.load_checkpoint(str(checkpoint), str(data_dir), device=device)
        pairs = extract.encode_pairs(loaded, [v["src"] for v in verses], [v["tgt"] for v in verses], str(data_dir))
        n_layers, n_heads = len(loaded.modules["cross"]), loaded.modules["cross"][0].num_heads
        for i, attn in extract.iterate_attention(loaded, pairs, ("cross",)):
            words = word_attention(head_variants(attn["cross"]), pairs[i].src_word_ids, pairs[i].tgt_word_ids)
            verses[i]["models"][name] = {"shades": pack_shades(words),
                                         "links": pack_links(argmax_links(words), words.shape[-2])}
        per_model = aer.get(name, {})
        models[name] = {"layers": n_layers, "heads": n_heads,
                        "corpus_aer": {mode: {"per_head": per_model.get(mode, {}).get("per_head"),
                                              "head_average": per_model.get(mode, {}).get("head_average")}
                                       for mode in MODES}}
    total = sum(1 for s, p in gold if s or p)
    return {"modes": list(MODES), "models": models, "verses": verses, "shades": SHADES, "verses_with_gold": total,
            "note": f"the first {len(verses)} of the {total} held-out verses with gold links"}


# ------------------------------------------------------------------------------------ statistical aligner
def reference_aligners(data_dir: Path) -> dict:
    """AER of eflomal on the held-out verses (an informed reference beside the diagonal), or why not."""
    from reluformer_mt.evaluation import statistical_aligner

    if not statistical_aligner.available():
        return {"eflomal": {"skipped": "eflomal is not installed (pip install eflomal)"}}
    return {"eflomal": statistical_aligner.eflomal_aer(data_dir)}


def add_table_note(report_dir: Path, note: str) -> None:
    """One more line under table.md's table and in table.json's notes."""
    with open(report_dir / "table.md", "a", encoding="utf-8") as f:
        f.write(f"\n{note}\n")
    table_json = report_dir / "table.json"
    if table_json.exists():
        table = json.loads(table_json.read_text(encoding="utf-8"))
        table.setdefault("aer_references", []).append(note)
        write_json(table_json, {k: v for k, v in table.items() if k not in ("command", "created")})


def aligner_note(aligners: dict) -> str:
    e = aligners["eflomal"]
    if "skipped" in e:
        return f"Statistical aligner for AER: skipped ({e['skipped']})."
    return (f"Statistical aligner for AER: eflomal {e['aer']:.3f} (precision {e['precision']:.3f}, recall "
            f"{e['recall']:.3f}) on the same gold links; {e['method']}.")


# ------------------------------------------------------------------------------------ the page
def write_page_files(report_dir: Path, data_dir: Path, checkpoints: Mapping[str, Path],
                     hypotheses: Mapping[str, Mapping[str, Docs]], aer: Mapping[str, dict], device: str = "cpu",
                     max_alignment_verses: int = MAX_ALIGNMENT_VERSES) -> None:
    """The files above (not ``index.html``). ``hypotheses[mode][model][chapter]``: the translated
    verses of every decoding mode (:mod:`reluformer_mt.experiments.demo_translate`; "constrained"
    first, a mode may lack some models); the chapters are those translated."""
    report_dir, data_dir = Path(report_dir), Path(data_dir)
    sources, references = read_test_documents(data_dir, "grc"), read_test_documents(data_dir, "en")
    chapters = list(next(iter(next(iter(hypotheses.values())).values())))
    train_src = (data_dir / "train.words.grc").read_text(encoding="utf-8").splitlines()
    train_tgt = (data_dir / "train.words.en").read_text(encoding="utf-8").splitlines()
    copies = iter(nearest_verse_translations(train_src, train_tgt, flat(sources, chapters)))
    nearest = {c: [next(copies) for _ in sources[c]] for c in chapters}
    write_plain_files(report_dir, hypotheses, sources, references, chapters)
    write_json(report_dir / "metrics.json", compute_metrics(hypotheses, nearest, references, chapters))
    write_json(report_dir / "sentences.json", sentence_view(sources, references, nearest, hypotheses, chapters))
    write_json(report_dir / "alignments.json",
               alignment_view(checkpoints, data_dir, aer, device, max_alignment_verses))
    aligners = reference_aligners(data_dir)
    write_json(report_dir / "aligners.json", aligners)
    if (report_dir / "table.md").exists():
        add_table_note(report_dir, aligner_note(aligners))


__all__ = ["write_page_files", "compute_metrics", "alignment_view", "sentence_view", "write_plain_files"]
