"""The translation memory a translator consults: matches of every input sentence.

A checkpoint trained with ``--tm-fusion concat|attention`` reads, for each sentence, the
targets of its top ``--tm-k`` memory entries. By default the memory is the training split of
the data directory the checkpoint was trained on (the same entries, keys and retrieval as in
training); ``--memory`` names another one: a prepared directory, a TMX or a TSV file
(:func:`reluformer_mt.memory.tm.read_memory`). Every sentence's best match and its fuzzy-match
score are kept, so the summary counts sentences per fuzzy band and a side output lists them.

Keys: the TF-IDF keys of preparation, unless the model was trained on matches of its own
learned keys (``--tm-refresh-epochs``) or the training memory was re-keyed with them
(``reluformer-memory rekey``, ``prepared.json`` says ``keys: learned...``): then the model's
keys (:class:`reluformer_mt.memory.learned_keys.LearnedRetriever`) with the same rerank.
"""
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from reluformer_mt.memory.neighbours import (PREPARATION_CANDIDATES, check_complete, check_same_sentencepiece,
                                             recorded_match_score)
from reluformer_mt.memory.tm import DEFAULT_MATCH_SCORE, LEGACY_MATCH_SCORE, Retriever, read_memory, read_prepared
from reluformer_mt.memory.tm_data import EntryTokens, match_tokens


def learned_key_rerank(task, data_dir) -> Optional[str]:
    """'fuzzy' or 'none' when the model was trained on its learned keys' matches (the rerank it
    used), None for the TF-IDF keys."""
    from reluformer_mt.data.prepared import Prepared

    if getattr(task.cfg, "tm_refresh_epochs", 0):
        return task.cfg.tm_refresh_rerank
    prepared = Prepared.load_if_present(data_dir)
    memory = prepared.memory if prepared is not None else {}
    if str(memory.get("keys", "")).startswith("learned"):
        return memory.get("rerank", "fuzzy")
    return None


_RETRIEVERS: dict = {}  # the last few TF-IDF retrievers of this process, by the memory's content
_WORD_LINKS: dict = {}  # the last few memories' word alignments, by content


def content_key(entries) -> str:
    """A digest of a memory's sentences: the same memory opened again (another path, another
    translator) reuses what was computed from it."""
    import hashlib

    digest = hashlib.sha256()
    for text in (*entries.sources, "\0", *entries.targets):
        digest.update(text.encode("utf-8") + b"\n")
    return digest.hexdigest()


def cached_retriever(entries, candidates: int, score: str = DEFAULT_MATCH_SCORE, sentencepiece=None) -> Retriever:
    """A :class:`Retriever` of ``entries``, reused when the same memory is opened again in this
    process (the demo and the tuner open a translator per decoding mode; fitting the keys of the
    bible's 7,187 verses each time cost seconds). Keyed by the entries' content, not their path."""
    key = (content_key(entries), candidates)
    if key not in _RETRIEVERS:
        if len(_RETRIEVERS) >= 4:
            _RETRIEVERS.pop(next(iter(_RETRIEVERS)))
        _RETRIEVERS[key] = Retriever(entries, candidates=candidates, score=score, sentencepiece=sentencepiece)
    # another score reuses what was fitted (keys, sparse spaces) for the same memory
    return _RETRIEVERS[key].rescored(score) if _RETRIEVERS[key].score != score else _RETRIEVERS[key]


def memory_word_links(entries) -> list:
    """(source word, target word) links of every memory entry (whitespace words of its text), by
    eflomal in both directions symmetrised with grow-diag-final-and
    (:mod:`reluformer_mt.evaluation.statistical_aligner`): the word alignment Zhang et al. (2018)
    read the translation pieces of a match through. Aligned once per memory and process."""
    from reluformer_mt.evaluation.statistical_aligner import eflomal_alignments

    key = content_key(entries)
    if key not in _WORD_LINKS:
        if len(_WORD_LINKS) >= 2:
            _WORD_LINKS.pop(next(iter(_WORD_LINKS)))
        _WORD_LINKS[key] = eflomal_alignments(entries.sources, entries.targets)
    return _WORD_LINKS[key]


class MemoryLookup:
    def __init__(self, task, spec, data_dir: Path, src_lang: str, tgt_lang: str, sp_tgt, model=None, sp_src=None,
                 placeholders: str = "space", match_score: Optional[str] = None):
        # a model trained without a memory (any task, fairseq's plain translation too) has no
        # --tm-k: it is guided by pieces only, whose k is the translator's --pieces-k
        self.k = int(getattr(task.cfg, "tm_k", 1))
        self.bos = task.src_dict.bos()
        training_memory = spec is None or (Path(spec).is_dir() and Path(spec).resolve() == Path(data_dir).resolve())
        if training_memory or Path(spec).is_dir():  # a killed rekey leaves its keys and neighbours apart
            check_complete(data_dir if training_memory else spec)
        if not training_memory and Path(spec).is_dir():
            check_same_sentencepiece(spec, sp_src, sp_tgt, "--memory", data_dir)
        # the prepared directory whose training split the memory is (None: a TMX or TSV file): a
        # corpus datastore built from that split can restrict its search to the matches' entries
        self.corpus = Path(data_dir if training_memory else spec).resolve() if (
            training_memory or Path(spec).is_dir()) else None
        if training_memory:
            # the training memory: entry tokens exactly as the task built them in training
            self.entries = read_prepared(data_dir)
        else:
            self.entries = read_memory(spec, src_lang, tgt_lang, placeholders)
        if Path(data_dir if training_memory else spec).is_dir() and hasattr(task, "memory_entries"):
            self.tokens = task.memory_entries(str(data_dir if training_memory else spec))
        else:  # a file, or a task without the document task's memory (pieces for any model)
            self.tokens = EntryTokens(self.entries.targets, sp_tgt, task.tgt_dict)  # encoded when retrieved
        rerank = learned_key_rerank(task, data_dir) if model is not None and sp_src is not None else None
        if rerank is None:
            # one retrieval: the candidates that preparation reranked for the training neighbours
            # (prepared.json's memory.candidates; 128 by default), so a sentence gets at translation
            # the matches it would have got at preparation
            from reluformer_mt.data.prepared import Prepared

            prepared = Prepared.load_if_present(data_dir)
            info = (prepared.memory if prepared is not None else None) or {}
            self.match_score = match_score or (recorded_match_score(info) if info else DEFAULT_MATCH_SCORE)
            self.retriever = cached_retriever(self.entries, int(info.get("candidates", PREPARATION_CANDIDATES)),
                                              self.match_score, sp_src)
            # a memory prepared before the score was recorded: its own (word) score, said once
            self.note = (f"; ranked by {LEGACY_MATCH_SCORE}, the score {data_dir} was prepared with (--match-score "
                         f"{DEFAULT_MATCH_SCORE} ranks by the new default)"
                         if info and "match_score" not in info and match_score is None else "")
        else:
            from reluformer_mt.memory.learned_keys import LearnedRetriever

            def encode(text: str) -> torch.Tensor:
                line = " ".join(sp_src.encode(text, out_type=str))
                return task.src_dict.encode_line(line, add_if_not_exist=False, append_eos=True).long()

            # the training memory's keys from the very tokens that training encoded
            entry_tokens = (task.sentence_sources(str(data_dir), "train") if training_memory
                            else [encode(s) for s in self.entries.sources])
            self.retriever = LearnedRetriever(model, self.entries, entry_tokens, encode, rerank=rerank == "fuzzy")
            self.match_score, self.note = LEGACY_MATCH_SCORE, ""  # the learned keys rerank by the word score
        self.keys = "learned" if rerank is not None else "tfidf"

    def describe(self) -> str:
        keys = "learned keys" if self.keys == "learned" else f"match score {self.match_score}"
        return (f"translation memory {self.entries.summary()}; {self.k} match(es) per sentence ({keys}){self.note}")

    def lookup(self, sentences: Sequence[str], k: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
        """(ids, fuzzy scores), each (len(sentences), k), best first; k: the model's by default."""
        k = k or self.k
        if not sentences:
            return np.zeros((0, k), dtype=np.int64), np.zeros((0, k), dtype=np.float32)
        return self.retriever.search(list(sentences), k)

    def word_links(self) -> list:
        """The memory's word alignment (:func:`memory_word_links`), kept here: translation pieces
        read it for every match, and its process cache is keyed by a digest of the whole memory."""
        if getattr(self, "_word_links", None) is None:
            self._word_links = memory_word_links(self.entries)
        return self._word_links

    def tokens_of(self, rows: Sequence[np.ndarray]) -> torch.Tensor:
        """``<s> entry`` for each retrieved id of each row (as in training)."""
        return match_tokens(self.tokens, rows, self.bos)

    def target(self, entry: int) -> Optional[str]:
        return self.entries.targets[entry] if entry >= 0 else None
