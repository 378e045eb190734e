"""Neighbours of every sentence of a prepared directory in its translation memory, computed once
at preparation and stored in the directory (``prepared.json`` names them under ``memory``).

The memory is the training split's sentence pairs (entry ``i`` = the ``i``-th training
sentence). Files in ``DIR/memory/``:

- ``{split}.ids.npy``: (sentences of the split, k) int32, entry ids best first, -1 = none;
- ``{split}.scores.npy``: (sentences, k) float32, their fuzzy-match scores.

No leakage: a training sentence never retrieves itself (leave-one-out by id), and the memory
holds training pairs only, never a valid or test sentence.
"""
import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from reluformer_mt.data.textfiles import replace_atomically, write_text_atomically
from reluformer_mt.memory.tm import (DEFAULT_MATCH_SCORE, FUZZY_BANDS, LEGACY_MATCH_SCORE, Retriever,
                                     TranslationMemoryError, at_least, band_of, read_prepared, recall_at_k,
                                     score_parts)

MEMORY_DIR = "memory"
RECALL_SAMPLE = 500  # queries per split scored exhaustively for recall@k (the exact best fuzzy match)
# present while the neighbour files are being rewritten (rekey, the memory step): a run killed
# then leaves it, and training and translation refuse the directory instead of mixing old and new
REWRITING = "REWRITING"


def rewriting_marker(directory) -> Path:
    return Path(directory) / MEMORY_DIR / REWRITING


def left_rewriting(directory) -> str:
    """What left ``directory``'s neighbours half rewritten (the marker's text), '' when nothing did."""
    marker = rewriting_marker(directory)
    if not marker.is_file():
        return ""
    return marker.read_text(encoding="utf-8", errors="replace").strip() or "a rewrite"


def check_complete(directory) -> None:
    """One line when ``directory``'s neighbours were left half rewritten by a killed run."""
    marker = rewriting_marker(directory)
    what = left_rewriting(directory)
    if what:
        raise TranslationMemoryError(f"{marker}: {directory}'s memory was left half rewritten ({what}); "
                                     "re-run that command (or reluformer-prepare --force) before using it")


def check_same_sentencepiece(directory, sp_src, sp_tgt, what: str, reference: str) -> None:
    """One line when ``directory`` was prepared with other SentencePiece models than ``sp_src`` /
    ``sp_tgt`` (the processors of ``reference``, the model's side): its entries are pieces of
    another model, which the model's dictionary reads as other tokens or ``<unk>``, whatever the
    dictionaries' sizes. Compared by content (the models' bytes), not by file name."""
    from reluformer_mt.data.prepared import Prepared

    prepared = Prepared.load_if_present(directory)
    if prepared is None:
        return
    for side, path, sp in zip(("source", "target"), prepared.spm_paths(), (sp_src, sp_tgt)):
        if sp is None or not path.is_file():
            continue
        if path.read_bytes() != sp.serialized_model_proto():
            raise TranslationMemoryError(
                f"{what} {directory}: prepared with another SentencePiece model than {reference} ({path} is not the "
                f"{side} model of the checkpoint's pieces); its entries would be pieces the model does not know: "
                f"re-prepare it with reluformer-prepare --spm-model (the checkpoint's model), or give its text as a "
                f"TSV or TMX file")


def mark_rewriting(directory, what: str) -> Path:
    marker = rewriting_marker(directory)
    marker.parent.mkdir(exist_ok=True)
    write_text_atomically(marker, what + "\n")
    return marker


def save_array(path: Path, array: np.ndarray) -> None:
    """np.save through a temporary file and a rename (never half an array on disk)."""
    replace_atomically(path, lambda f: np.save(f, array))


def neighbour_paths(directory, split: str) -> Tuple[Path, Path]:
    base = Path(directory) / MEMORY_DIR
    return base / f"{split}.ids.npy", base / f"{split}.scores.npy"


def band_counts(scores: np.ndarray) -> Dict[str, int]:
    counts = {name: 0 for _, _, name in FUZZY_BANDS}
    for s in scores:
        counts[band_of(float(s))] += 1
    return counts


PREPARATION_CANDIDATES = 128  # MIPS candidates reranked by fuzzy match, at preparation and at translation


def recorded_match_score(memory_info: Optional[dict]) -> str:
    """The match score a prepared directory's neighbours were ranked by (``prepared.json``
    ``memory.match_score``); a directory prepared before it was recorded used the word fuzzy score."""
    return (memory_info or {}).get("match_score", LEGACY_MATCH_SCORE)


def keys_description(retriever: Retriever) -> str:
    sparse, edit = score_parts(retriever.score)
    if sparse is None:
        return f"tfidf-char2-4-svd{retriever.keys.svd.n_components}"
    return f"{sparse} over the whole memory" + (f", {retriever.candidates} reranked by {edit}" if edit else "")


def build_neighbours(directory, k: int = 16, dim: int = 256, candidates: int = PREPARATION_CANDIDATES,
                     progress: bool = True, match_score: str = DEFAULT_MATCH_SCORE) -> dict:
    """Retrieve the top-``k`` training entries of every sentence of every split; write the
    arrays and record the description (with recall@k on a sample and fuzzy bands) in
    ``prepared.json``. Returns the description."""
    from reluformer_mt.data.prepared import Prepared

    if k < 1:
        raise TranslationMemoryError(f"--memory-k: got {k}, expected >= 1")
    prepared = Prepared.load(directory)
    start = time.time()
    memory = read_prepared(directory, "train")
    spm = prepared.spm_paths()[0]
    retriever = Retriever(memory, dim=dim, candidates=candidates, score=match_score,
                          sentencepiece=spm if spm.is_file() else None)
    info = {"entries": len(memory), "k": k, "keys": keys_description(retriever), "match_score": match_score,
            "candidates": candidates, "splits": {}}
    if k >= len(memory):  # kept as asked (training reads the first --tm-k columns); said, not silent
        info["note"] = (f"--memory-k {k}: the memory has {len(memory)} entries, so a sentence gets at most {len(memory)} "
                        f"neighbours ({len(memory) - 1} for a training sentence, which never retrieves itself); the "
                        "rest of each row is -1 (none)")
        logging.getLogger(__name__).warning("%s: %s", directory, info["note"])
    marker = mark_rewriting(directory, "reluformer-prepare's memory step")
    for split in prepared.splits:
        queries = memory.sources if split == "train" else read_prepared(directory, split).sources
        exclude = np.arange(len(queries)) if split == "train" else None
        ids, scores = retriever.search(queries, k, exclude=exclude)
        if split != "train":
            # leakage check: a valid/test source that is also a training source retrieves its own
            # translation (a 100 % match); reported, since real corpora repeat short sentences
            training = set(memory.sources)
            leaked = [i for i, q in enumerate(queries) if q in training]
            if leaked:
                info.setdefault("sources_also_in_memory", {})[split] = {
                    "sentences": len(leaked), "first": [i + 1 for i in leaked[:5]]}
                if progress:
                    print(f"[memory] note: {len(leaked)} {split} sentence(s) have a source identical to a training "
                          f"entry's (sentences {', '.join(str(i + 1) for i in leaked[:5])}"
                          f"{', ...' if len(leaked) > 5 else ''}): their matches are 100 %", flush=True)
        ids_path, scores_path = neighbour_paths(directory, split)
        save_array(ids_path, ids.astype(np.int32))
        save_array(scores_path, scores)
        sample = np.linspace(0, len(queries) - 1, min(RECALL_SAMPLE, len(queries))).astype(int)
        best = retriever.exact_best([queries[i] for i in sample], exclude=None if exclude is None else exclude[sample])
        info["splits"][split] = {"sentences": len(queries), "mean_top1_fuzzy": round(float(scores[:, 0].mean()), 4),
                                 "bands_top1": band_counts(scores[:, 0]),
                                 **{key: round(v, 4) for key, v in recall_at_k(scores[sample], best).items()}}
        close = at_least(best, 0.5)  # the matches that matter to a translator
        if close.any():
            info["splits"][split].update({f"{key} (fuzzy >= 0.5)": round(v, 4) for key, v in
                                          recall_at_k(scores[sample][close], best[close]).items()})
        if progress:
            print(f"[memory] {split}: {len(queries)} sentences, top-1 fuzzy {scores[:, 0].mean():.3f}, "
                  f"bands {info['splits'][split]['bands_top1']}", flush=True)
    info["seconds"] = round(time.time() - start, 1)
    dataclasses.replace(prepared, memory=info).write(directory)
    marker.unlink()
    return info


def prepare_with_memory(cfg):
    """``reluformer-prepare``'s run (:func:`reluformer_mt.data.prepare.prepare`) and, with
    ``cfg.memory_k``, the neighbours step, stamped like the other steps (skipped when done with the
    same k and data, redone with ``force``)."""
    from reluformer_mt.data.prepare import STEP_DIR, prepare, run_step
    from reluformer_mt.data.prepared import Prepared

    stamp = Path(cfg.out) / STEP_DIR / "memory.json"
    score = getattr(cfg, "match_score", None) or DEFAULT_MATCH_SCORE
    if cfg.memory_k and stamp.is_file() and not cfg.force:
        # refused before prepare() rewrites prepared.json: refused after it, the memory entry was lost
        done = json.loads(stamp.read_text(encoding="utf-8")).get("config", {})
        if done.get("k") != cfg.memory_k:
            raise ValueError(f"{cfg.out}: step 'memory' was done with --memory-k {done.get('k')} (changed: k); pass "
                             "--force to redo it, or use another output directory")
        if recorded_match_score(done) != score:
            raise ValueError(f"{cfg.out}: step 'memory' was done with --match-score {recorded_match_score(done)} "
                             f"(changed: match score); pass --force to redo it with {score}, or --match-score "
                             f"{recorded_match_score(done)} to keep it")
    report = prepare(cfg)
    if cfg.memory_k:
        out = Path(cfg.out)
        prepared = Prepared.load(out)
        digest = hashlib.sha256()
        for split in sorted(prepared.splits):
            for lang in (prepared.src_lang, prepared.tgt_lang):
                digest.update((out / "text" / f"{split}.{lang}").read_bytes())
        config = {"k": cfg.memory_k, "data": digest.hexdigest()[:16]}
        if score != LEGACY_MATCH_SCORE:  # a stamp of the word score keeps the form older versions wrote
            config["match_score"] = score
        info = run_step(out, "memory", config, lambda: build_neighbours(out, k=cfg.memory_k, progress=cfg.progress,
                                                                        match_score=score), cfg.force)
        dataclasses.replace(Prepared.load(out), memory=info).write(out)
    return report


def load_neighbours(directory, split: str, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """(ids, scores) of ``split``'s sentences, the first ``k`` columns; one-line errors when the
    directory has no (or too few) neighbours."""
    from reluformer_mt.data.prepared import Prepared

    prepared = Prepared.load(directory)
    check_complete(directory)
    stored = int(prepared.memory.get("k", 0)) if prepared.memory else 0
    if not stored:
        raise TranslationMemoryError(f"{Prepared.path(directory)}: no translation-memory neighbours; re-run "
                                     "the same reluformer-prepare command with --memory-k K")
    if k > stored:
        raise TranslationMemoryError(f"--tm-k {k}: {directory} holds {stored} neighbours per sentence; re-run "
                                     f"the same reluformer-prepare command with --memory-k {k}")
    ids_path, scores_path = neighbour_paths(directory, split)
    if not ids_path.is_file():
        raise TranslationMemoryError(f"{ids_path}: missing; re-run the same reluformer-prepare "
                                     "command with --memory-k K")
    sentences = prepared.memory.get("splits", {}).get(split, {}).get("sentences")
    ids, scores = read_neighbour_files(directory, split, prepared.memory.get("entries"), stored, sentences)
    return ids[:, :k], scores[:, :k]


REDO = "re-run the same reluformer-prepare command with --memory-k K (or --force)"


def read_neighbour_files(directory, split: str, entries: Optional[int], k: int,
                         sentences: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """``split``'s (ids, scores) checked against the memory they point into: (sentences, k) int ids
    of entries in [-1, ``entries``) and float scores of the same shape; one line naming the file
    otherwise (an edited, truncated or other directory's file would index outside the memory).
    ``entries`` or ``sentences`` None (not recorded): not checked."""
    from reluformer_mt.data.arrays import load_checked_array

    ids_path, scores_path = neighbour_paths(directory, split)
    ids = load_checked_array(ids_path, "iu", 2, TranslationMemoryError, REDO)
    scores = load_checked_array(scores_path, "f", 2, TranslationMemoryError, REDO)
    rows = len(ids) if sentences is None else sentences
    if ids.shape != (rows, k):
        raise TranslationMemoryError(f"{ids_path}: shape {ids.shape}, expected ({rows}, {k}) (the split's sentences, "
                                     f"the neighbours per sentence prepared.json records); {REDO}")
    if scores.shape != ids.shape:
        raise TranslationMemoryError(f"{scores_path}: shape {scores.shape}, expected that of {ids_path.name} "
                                     f"{ids.shape}; {REDO}")
    check_entry_ids(ids_path, ids, entries)
    return ids, scores


def read_entry_ids(path: Path, entries: Optional[int], ndim: int = 2) -> np.ndarray:
    """An int array of memory entry ids (neighbours, positives) from ``path``, checked by
    :func:`check_entry_ids`."""
    from reluformer_mt.data.arrays import load_checked_array

    return check_entry_ids(path, load_checked_array(path, "iu", ndim, TranslationMemoryError, REDO), entries)


def check_entry_ids(path: Path, ids: np.ndarray, entries: Optional[int]) -> np.ndarray:
    """``ids`` (read from ``path``) are -1 (none) or indices of the memory's ``entries`` (None:
    not recorded, only -1 checked): one line naming the file otherwise, not an IndexError later."""
    low, high = (int(ids.min()), int(ids.max())) if ids.size else (-1, -1)
    if low < -1 or (entries is not None and high >= entries):
        expected = "-1 for none or an entry's index" if entries is None else \
            f"-1 for none or one of the memory's {entries} entries, 0..{entries - 1}"
        raise TranslationMemoryError(f"{path}: entry id {low if low < -1 else high}, expected {expected}; {REDO}")
    return ids


def sentence_rows(n_sentences: Sequence[int]) -> Sequence[range]:
    """The neighbour rows (sentence indices of the split) of each example, from the sentence
    counts of its segments in order."""
    rows, start = [], 0
    for n in n_sentences:
        rows.append(range(start, start + n))
        start += n
    return rows


__all__ = ["MEMORY_DIR", "REWRITING", "recorded_match_score", "band_counts", "check_complete", "left_rewriting",
           "mark_rewriting", "save_array", "build_neighbours", "prepare_with_memory", "load_neighbours", "neighbour_paths",
           "read_entry_ids", "read_neighbour_files", "check_entry_ids", "sentence_rows"]

