"""Re-keying a prepared directory's translation memory with a checkpoint's learned keys
(:mod:`reluformer_mt.memory.learned_keys`; EMAT rebuilds its index as its keys change).

The memory is the training split's sentences (entry ``i`` = the ``i``-th training sentence):
all entries are encoded with the model's keys and put into an exact faiss inner-product index
(:class:`reluformer_mt.memory.mips.MipsIndex`); every sentence of every split retrieves its
top-k (leave-one-out in training, so no sentence retrieves itself; valid and test sentences are
never entries), either the top 128 by inner product reranked by fuzzy match (``rerank="fuzzy"``,
as the TF-IDF neighbours are) or the top k by inner product alone (``"none"``, EMAT's pure
MIPS). The neighbour files are rewritten in place; the TF-IDF ones are kept beside them once
(``{split}.ids.tfidf.npy``, ``.scores.tfidf.npy``) for comparison and for the key loss's
positives. ``prepared.json`` (and the preparation's stamp, so that re-running the same
``reluformer-prepare`` keeps them) records ``keys: learned ...``.

Per split it measures, for the learned and the TF-IDF neighbours alike: recall@k of the exact
best fuzzy match (on a sample of up to 500 sentences scored against the whole memory) and, on
valid and test, the s-BLEU (sacreBLEU via :func:`reluformer_mt.evaluation.bleu.corpus_sbleu`) of
copying the top-1 match's target as the translation.
"""
import dataclasses
import json
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import torch

from reluformer_mt.data.arrays import load_checked_array
from reluformer_mt.data.textfiles import replace_atomically, write_text_atomically
from reluformer_mt.memory.learned_keys import TFIDF_SUFFIX, encode_keys, neighbours_from_keys
from reluformer_mt.memory.neighbours import (MEMORY_DIR, RECALL_SAMPLE, band_counts, check_complete, left_rewriting,
                                             mark_rewriting, neighbour_paths, read_entry_ids, recorded_match_score,
                                             save_array)
from reluformer_mt.memory.tm import (LEGACY_MATCH_SCORE, Retriever, TranslationMemoryError, fuzzy_words, read_prepared,
                                     recall_at_k)

RERANKS = ("fuzzy", "none")
REKEY = "reluformer-memory rekey"  # how its REWRITING marker starts


def source_tokens(directory, split: str, dictionary) -> List[torch.Tensor]:
    """Source token ids of a split's sentences, each with </s> (as the model's sources)."""
    from reluformer_mt.data.prepared import Prepared
    from reluformer_mt.memory.tm import split_sentences_of
    from reluformer_mt.memory.tm_data import encode_entries

    prepared = Prepared.load(directory)
    path = Path(directory) / "text" / f"{split}.{prepared.src_lang}"
    if not path.is_file():
        raise TranslationMemoryError(f"{path}: missing; re-prepare {directory} with reluformer-prepare")
    pieces = split_sentences_of(path.read_text(encoding="utf-8").splitlines(), prepared.separator)
    eos = torch.tensor([dictionary.eos()])
    return [torch.cat([t, eos]) for t in encode_entries(pieces, dictionary)]


def keep_tfidf_neighbours(directory, split: str) -> Path:
    """Copy a split's model-free neighbours aside the first time the directory is re-keyed (whole
    or not at all: a rerun after a kill trusts a copy it finds)."""
    for path in neighbour_paths(directory, split):
        kept = path.with_name(path.name.replace(".npy", f"{TFIDF_SUFFIX}.npy"))
        if not kept.is_file():
            replace_atomically(kept, lambda f: f.write(path.read_bytes()))
    return neighbour_paths(directory, split)[0].with_name(f"{split}.ids{TFIDF_SUFFIX}.npy")


def copy_sbleu(ids: np.ndarray, memory_targets: List[str], references: List[str]) -> float:
    """s-BLEU of the top-1 match's target taken as the translation (empty where none)."""
    from reluformer_mt.evaluation.bleu import corpus_sbleu

    hyps = [memory_targets[i] if i >= 0 else "" for i in ids[:, 0]]
    return round(corpus_sbleu(hyps, references).score, 2)


def quality(scores: np.ndarray, best: np.ndarray, sample: np.ndarray) -> Dict[str, float]:
    out = {key: round(v, 4) for key, v in recall_at_k(scores[sample], best).items()}
    out["mean_top1_fuzzy"] = round(float(scores[:, 0].mean()), 4)
    return out


@dataclasses.dataclass
class KeyedMemory:
    """The training split's entries, their learned keys in an exact inner-product index, and the
    scores of the exact best match: the word fuzzy score the learned keys rerank by, and the score
    the directory was prepared with, which ranked the model-free neighbours."""
    memory: object
    entry_words: list
    keys: torch.Tensor
    index: object
    word_score: Retriever
    prepared_score: Retriever


def rekey(directory, model, dictionary, rerank: str = "fuzzy", candidates: int = 128, checkpoint: str = "",
          max_tokens: int = 8000, progress: bool = True) -> dict:
    """Rewrite the neighbours of every split of ``directory`` with ``model``'s keys; returns
    the description written into ``prepared.json`` (with the measured comparison)."""
    prepared, info, k = rekey_inputs(directory, model, dictionary, rerank, candidates)
    start = time.time()

    def encode(split: str, label: str) -> torch.Tensor:
        return encode_keys(model, source_tokens(directory, split, dictionary), max_tokens, progress, label)

    keyed = keyed_memory(directory, info, encode, candidates)
    layers = getattr(model.encoder, "tm_key_layers", 1)
    projection = "proj" if "tm_key_proj" in model.encoder._modules else "no-proj"
    description = f"learned-enc{layers}-mean-{projection}{keyed.keys.shape[1]}, rerank {rerank}"
    report = {"keys": description, "checkpoint": str(checkpoint), "splits": {}}
    splits = {}
    marker = mark_rewriting(directory, f"{REKEY} --checkpoint {checkpoint}")
    for split in prepared.splits:
        splits[split], report["splits"][split] = rekey_split(directory, split, keyed, encode, k, candidates, rerank)
        if progress:
            comparison = report["splits"][split]
            print(f"[rekey] {split}: learned {comparison['learned']} | tfidf {comparison['tfidf']}", flush=True)
    info.update({"keys": description, "rekeyed_from": str(checkpoint), "tfidf_kept": f"{MEMORY_DIR}/*{TFIDF_SUFFIX}.npy",
                 "rerank": rerank, "candidates": candidates, "splits": splits, "comparison": report["splits"],
                 "seconds": round(time.time() - start, 1)})
    dataclasses.replace(prepared, memory=info).write(directory)
    update_stamp(directory, info)
    marker.unlink()  # the neighbours, prepared.json and the stamp agree again
    return report


def rekey_inputs(directory, model, dictionary, rerank: str, candidates: int):
    """The directory's preparation, its memory's description and neighbours per sentence; what
    cannot be re-keyed is refused before any key is encoded."""
    from reluformer_mt.data.prepared import Prepared

    if rerank not in RERANKS:
        raise TranslationMemoryError(f"--rerank: got {rerank!r}, expected one of {', '.join(RERANKS)}")
    if candidates < 1:
        raise TranslationMemoryError(f"--candidates: got {candidates}, expected >= 1")
    prepared = Prepared.load(directory)
    info = dict(prepared.memory or {})
    k = int(info.get("k", 0))
    if not k:
        raise TranslationMemoryError(f"{Prepared.path(directory)}: no translation-memory neighbours to re-key; run "
                                     "reluformer-prepare with --memory-k K first")
    if model.encoder.embed_tokens.num_embeddings != len(dictionary):
        raise TranslationMemoryError(f"{directory}: its dictionary has {len(dictionary)} entries but the checkpoint's "
                                     f"embeddings {model.encoder.embed_tokens.num_embeddings}; re-key with the data "
                                     "directory the model was trained on")
    check_rekey_can_run(directory)
    return prepared, info, k


def keyed_memory(directory, info: dict, encode, candidates: int) -> KeyedMemory:
    from reluformer_mt.memory.mips import MipsIndex

    memory = read_prepared(directory, "train")
    keys = encode("train", "keys: memory")
    word_score = Retriever(memory, candidates=candidates, score=LEGACY_MATCH_SCORE)
    return KeyedMemory(memory, [fuzzy_words(s) for s in memory.sources], keys, MipsIndex("exact").build(keys),
                       word_score, word_score.rescored(recorded_match_score(info)))


def rekey_split(directory, split: str, keyed: KeyedMemory, encode, k: int, candidates: int, rerank: str):
    """Rewrite one split's neighbours from the learned keys (the TF-IDF ones kept aside first);
    returns (its row of prepared.json, the learned and TF-IDF neighbours' measures)."""
    memory = keyed.memory
    pairs = memory if split == "train" else read_prepared(directory, split)
    exclude = np.arange(len(pairs)) if split == "train" else None  # leave-one-out: no sentence retrieves itself
    queries = keyed.keys if split == "train" else encode(split, f"keys: {split}")
    words = keyed.entry_words if split == "train" else [fuzzy_words(s) for s in pairs.sources]
    ids, scores = neighbours_from_keys(keyed.index, queries, words, keyed.entry_words, k, candidates,
                                       rerank == "fuzzy", exclude)
    tfidf_ids_file = keep_tfidf_neighbours(directory, split)
    old_ids = read_entry_ids(tfidf_ids_file, len(memory))
    old_scores = load_checked_array(tfidf_ids_file.with_name(f"{split}.scores{TFIDF_SUFFIX}.npy"), "f", 2,
                                    TranslationMemoryError, "re-run reluformer-prepare --memory-k K --force")
    ids_path, scores_path = neighbour_paths(directory, split)
    save_array(ids_path, ids.astype(np.int32))
    save_array(scores_path, scores)
    sample = np.linspace(0, len(pairs) - 1, min(RECALL_SAMPLE, len(pairs))).astype(int)
    sampled, skip = [pairs.sources[i] for i in sample], None if exclude is None else exclude[sample]
    best = keyed.word_score.exact_best(sampled, exclude=skip)
    best_prepared = best if keyed.prepared_score.score == keyed.word_score.score \
        else keyed.prepared_score.exact_best(sampled, exclude=skip)
    learned, model_free = quality(scores, best, sample), quality(old_scores, best_prepared, sample)
    if split != "train":
        learned["copy_top1_sbleu"] = copy_sbleu(ids, memory.targets, pairs.targets)
        model_free["copy_top1_sbleu"] = copy_sbleu(old_ids, memory.targets, pairs.targets)
    row = {"sentences": len(pairs), "mean_top1_fuzzy": learned["mean_top1_fuzzy"], "bands_top1": band_counts(scores[:, 0]),
           **{key: v for key, v in learned.items() if key.startswith("recall@")}}
    return row, {"learned": learned, "tfidf": model_free}



def check_rekey_can_run(directory) -> None:
    """A directory left half rewritten by a killed re-keying is re-keyed again from the start: each
    split's TF-IDF neighbours were copied aside whole before its files changed, and every split is
    rewritten from the keys, so the rerun ends where an unbroken run would have. One left half
    rewritten by another command (the preparation's memory step) is refused: its TF-IDF neighbours
    themselves are unfinished."""
    what = left_rewriting(directory)
    if what and not what.startswith(REKEY):
        check_complete(directory)


def update_stamp(directory, info: dict) -> None:
    """The preparation's memory stamp describes the neighbours on disk: a re-run of the same
    ``reluformer-prepare`` skips the step and keeps the learned description."""
    from reluformer_mt.data.prepare import STEP_DIR

    stamp = Path(directory) / STEP_DIR / "memory.json"
    if stamp.is_file():
        saved = json.loads(stamp.read_text(encoding="utf-8"))
        saved["result"] = info
        write_text_atomically(stamp, json.dumps(saved, indent=1, ensure_ascii=False))


def format_report(report: dict) -> str:
    lines = [f"keys: {report['keys']}",
             f"{'split':6} {'keys':8} {'recall@1':>8} {'recall@4':>8} {'recall@16':>9} {'top-1 fuzzy':>11} {'copy s-BLEU':>11}"]
    for split, both in report["splits"].items():
        for name, row in both.items():
            cells = [f"{row.get(key, float('nan')):.3f}" for key in ("recall@1", "recall@4", "recall@16")]
            copy = f"{row['copy_top1_sbleu']:.2f}" if "copy_top1_sbleu" in row else "-"
            lines.append(f"{split:6} {name:8} {cells[0]:>8} {cells[1]:>8} {cells[2]:>9} {row['mean_top1_fuzzy']:>11.3f} "
                         f"{copy:>11}")
    return "\n".join(lines)


__all__ = ["RERANKS", "format_report", "rekey", "source_tokens"]
