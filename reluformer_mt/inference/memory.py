"""The translation memory a translator consults: matches of every input sentence.

A checkpoint trained with ``--tm-fusion concat|attention`` reads, for each sentence, the
targets of its top ``--tm-k`` memory entries. By default the memory is the training split of
the data directory the checkpoint was trained on (the same entries, keys and retrieval as in
training); ``--memory`` names another one: a prepared directory, a TMX or a TSV file
(:func:`reluformer_mt.memory.tm.read_memory`). Every sentence's best match and its fuzzy-match
score are kept, so the summary counts sentences per fuzzy band and a side output lists them.
"""
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from reluformer_mt.memory.tm import Retriever, read_memory, read_prepared
from reluformer_mt.memory.tm_data import encode_entries, match_tokens


class MemoryLookup:
    def __init__(self, task, spec, data_dir: Path, src_lang: str, tgt_lang: str, sp_tgt):
        self.k = int(task.cfg.tm_k)
        self.bos = task.src_dict.bos()
        if spec is None or (Path(spec).is_dir() and Path(spec).resolve() == Path(data_dir).resolve()):
            # the training memory: entry tokens exactly as the task built them in training
            self.entries = read_prepared(data_dir)
            self.tokens = task.memory_entries(str(data_dir))
        else:
            self.entries = read_memory(spec, src_lang, tgt_lang)
            if Path(spec).is_dir():
                self.tokens = task.memory_entries(str(spec))
            else:
                pieces = [" ".join(p) for p in sp_tgt.encode(self.entries.targets, out_type=str)]
                self.tokens = encode_entries(pieces, task.tgt_dict)
        self.retriever = Retriever(self.entries)

    def describe(self) -> str:
        return f"translation memory {self.entries.summary()}; {self.k} match(es) per sentence"

    def lookup(self, sentences: Sequence[str], k: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
        """(ids, fuzzy scores), each (len(sentences), k), best first; k: the model's by default."""
        k = k or self.k
        if not sentences:
            return np.zeros((0, k), dtype=np.int64), np.zeros((0, k), dtype=np.float32)
        return self.retriever.search(list(sentences), k)

    def tokens_of(self, rows: Sequence[np.ndarray]) -> torch.Tensor:
        """``<s> entry`` for each retrieved id of each row (as in training)."""
        return match_tokens(self.tokens, rows, self.bos)

    def target(self, entry: int) -> Optional[str]:
        return self.entries.targets[entry] if entry >= 0 else None
