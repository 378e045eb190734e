"""How good are the translation memory's matches? Each retrieval setting's best match for every
verse of a split, judged by its target against the reference (chrF, BLEU of copying it), beside the
nearest-verse baseline (TF-IDF cosine over source words, :func:`nearest_verse_translations`):

    python -m reluformer_mt.experiments.retrieval_study runs/demo/data/doc128.v2000            # valid
    python -m reluformer_mt.experiments.retrieval_study runs/demo/data/doc128.v2000 --split test

A setting is the candidates (MIPS over character n-gram keys, :class:`Retriever`) and the score
that reranks them (:data:`MATCH_SCORES`: word edit distance, the CAT tools' fuzzy score, or
character insertions/deletions, which an inflected form costs a character instead of a word), or
no rerank (the MIPS order). Choose on the validation split; the test split only reports.
"""
import argparse
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np

def settings() -> tuple:
    """Every match score of the retriever, and its MIPS candidates without a rerank."""
    from reluformer_mt.memory.tm import MATCH_SCORES

    return MATCH_SCORES + ("mips",)


def best_matches(retriever, queries: Sequence[str], setting: str) -> np.ndarray:
    """The best entry of every query under ``setting`` (the retriever's candidates)."""
    if setting == "mips":
        _, found = retriever.index.search(retriever.keys.encode(list(queries)), 1)
        return found[:, 0]
    retriever = retriever.rescored(setting)
    ids, _ = retriever.search(queries, 1)
    return ids[:, 0]


def judge(copies: List[str], references: List[str]) -> Dict[str, float]:
    from reluformer_mt.evaluation.bleu import corpus_chrf, corpus_sbleu

    return {"chrf": corpus_chrf(copies, references).score, "s_bleu": corpus_sbleu(copies, references).score}


def run_study(data_dir: Path, split: str = "valid", src: str = "grc", tgt: str = "en", candidates: int = 32,
              scores: Sequence[str] = ()) -> dict:
    from reluformer_mt.evaluation.baselines import nearest_verse_translations
    from reluformer_mt.memory.tm import MemoryEntries, Retriever

    read = lambda name: (data_dir / name).read_text(encoding="utf-8").splitlines()  # noqa: E731
    train_src, train_tgt = read(f"train.words.{src}"), read(f"train.words.{tgt}")
    queries, references = read(f"{split}.words.{src}"), read(f"{split}.words.{tgt}")
    if len(queries) != len(references):
        raise ValueError(f"{data_dir}: {split}.words.{src} has {len(queries)} lines, {split}.words.{tgt} {len(references)}")
    rows = {"nearest verse (baseline)": judge(nearest_verse_translations(train_src, train_tgt, queries), references)}
    spm = data_dir / "spm.model"
    retriever = Retriever(MemoryEntries(train_src, train_tgt, f"{data_dir}/train"), candidates=candidates,
                          sentencepiece=spm if spm.is_file() else None)
    for setting in scores or settings():
        if "pieces" in setting and retriever.sentencepiece is None:
            continue  # no SentencePiece model in the directory
        best_matches(retriever, queries[:1], setting)  # keys and spaces fitted once, outside the timing
        started = time.process_time()
        ids = best_matches(retriever, queries, setting)
        seconds = time.process_time() - started
        rows[f"memory: {setting}"] = {**judge([train_tgt[i] for i in ids], references),
                                      "ms_per_sentence": 1000 * seconds / max(1, len(queries))}
    return {"data": str(data_dir), "split": split, "sentences": len(queries), "candidates": candidates, "rows": rows,
            "bands": score_bands(retriever, queries, references)}


def score_bands(retriever, queries: Sequence[str], references: Sequence[str]) -> Dict[str, List[dict]]:
    """Per band of the best match's score: the verses and the s-BLEU of copying the match, under the
    default score and the word fuzzy score of older versions, side by side."""
    from reluformer_mt.memory.maintenance.bands import band_scores
    from reluformer_mt.memory.tm import DEFAULT_MATCH_SCORE, LEGACY_MATCH_SCORE

    out = {}
    for score in (LEGACY_MATCH_SCORE, DEFAULT_MATCH_SCORE):
        ids, scores = retriever.rescored(score).search(queries, 1)
        copies = [retriever.entries.targets[i] for i in ids[:, 0]]
        out[score] = band_scores(list(references), scores[:, 0].tolist(), {"copy": copies})
    return out


def render(result: dict) -> str:
    lines = [f"best match of each of the {result['sentences']} {result['split']} verses, copied "
             f"({result['data']}, {result['candidates']} candidates):",
             f"{'retrieval':30s} {'chrF':>6s} {'s-BLEU':>7s} {'CPU ms/sentence':>16s}"]
    for name, row in result["rows"].items():
        ms = f"{row['ms_per_sentence']:.2f}" if "ms_per_sentence" in row else ""
        lines.append(f"{name:30s} {row['chrf']:6.2f} {row['s_bleu']:7.2f} {ms:>16s}")
    scores = list(result["bands"])
    lines += ["", "by band of the best match's score (verses, s-BLEU of copying the match):",
              f"{'band (%)':10s}" + "".join(f" {s + ': verses':>20s} {'s-BLEU':>7s}" for s in scores)]
    for rows in zip(*result["bands"].values()):
        lines.append(f"{rows[0]['band']:10s}" + "".join(
            f" {r['sentences']:20d} {'' if r['copy'] is None else format(r['copy'], '.2f'):>7s}" for r in rows))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m reluformer_mt.experiments.retrieval_study",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("data", type=Path, help="a prepared directory with {train,SPLIT}.words.{SRC,TGT}")
    p.add_argument("--split", default="valid", choices=["valid", "test"], help="the queries (choose on valid)")
    p.add_argument("--src", default="grc")
    p.add_argument("--tgt", default="en")
    p.add_argument("--candidates", type=int, default=32, help="MIPS candidates each score reranks")
    args = p.parse_args(argv)
    for name in (f"train.words.{args.src}", f"train.words.{args.tgt}", f"{args.split}.words.{args.src}",
                 f"{args.split}.words.{args.tgt}"):
        if not (args.data / name).is_file():
            print(f"retrieval_study: error: {args.data / name}: no such file (a reluformer-prepare directory "
                  "with word files is expected)", file=sys.stderr)
            return 2
    if args.candidates < 1:
        print("retrieval_study: error: --candidates must be at least 1", file=sys.stderr)
        return 2
    try:
        print(render(run_study(args.data, args.split, args.src, args.tgt, args.candidates)))
    except ValueError as e:
        print(f"retrieval_study: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
