"""Examples with their translation-memory matches, in the two fusions the task offers.

- ``concat`` (Neural Fuzzy Repair, Bulté & Tezcan ACL 2019; Xu et al. ACL 2020): the source
  is followed by each retrieved target, every one introduced by the dictionary's ``<s>``
  token (fairseq never puts it into a translation source, so it marks "a match follows"
  without changing the dictionary). No architecture change.
- ``attention`` (EMAT-style, Wu et al. 2022): the source is unchanged; the batch carries
  ``net_input["memory_tokens"]``, the retrieved targets of the example (each introduced by
  ``<s>``), which the model encodes and reads through its memory-attention sublayers.

An example's matches are the top-``k`` entries of each of its sentences (a document segment
retrieves per sentence), in sentence order.

With the learned keys' retrieval loss (``--tm-key-loss``, :mod:`reluformer_mt.memory.learned_keys`)
the training batches also carry ``tm_positive`` (B, P), the source tokens of each example's
positive entry (right-padded; a row of padding where there is none), and ``tm_positive_ids`` (B,),
their entry ids (-1: none).
"""
from typing import List, Sequence

import numpy as np
import torch
from fairseq.data import LanguagePairDataset, data_utils

TM_FUSIONS = ("none", "concat", "attention")


def encode_entries(pieces: Sequence[str], dictionary) -> List[torch.Tensor]:
    """Token ids of memory targets given as SentencePiece pieces (no </s>)."""
    return [dictionary.encode_line(p, add_if_not_exist=False, append_eos=False).long() for p in pieces]


class EntryTokens:
    """Token ids of a memory file's targets (as :func:`encode_entries` gives them), each encoded
    when it is first read and kept: translation reads only the entries it retrieves, and encoding a
    100,000-unit TMX whole held millions of piece strings at once (hundreds of MiB)."""

    def __init__(self, targets: Sequence[str], sp, dictionary):
        self.targets, self.sp, self.dictionary, self._done = targets, sp, dictionary, {}

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, entry: int) -> torch.Tensor:
        entry = int(entry)
        if entry not in self._done:
            if not -len(self.targets) <= entry < len(self.targets):
                raise IndexError(f"memory entry {entry} of {len(self.targets)}")
            pieces = " ".join(self.sp.encode(self.targets[entry], out_type=str))
            self._done[entry] = encode_entries([pieces], self.dictionary)[0]
        return self._done[entry]


def match_tokens(entry_tokens: Sequence[torch.Tensor], id_rows: Sequence[Sequence[int]], bos: int) -> torch.Tensor:
    """``<s> entry`` for each retrieved id of each row, in order (-1 = nothing retrieved, skipped):
    the memory of one example, in training and in translation alike."""
    parts = []
    for ids in id_rows:
        for entry in ids:
            if entry >= 0:
                parts += [torch.tensor([bos], dtype=torch.long), entry_tokens[entry]]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def matches_of_rows(entry_tokens: Sequence[torch.Tensor], ids: np.ndarray, rows: Sequence[Sequence[int]],
                    bos: int) -> List[torch.Tensor]:
    """One tensor per example (:func:`match_tokens` of its sentences' rows of ``ids``)."""
    return [match_tokens(entry_tokens, [ids[r] for r in example_rows], bos) for example_rows in rows]


class MemoryPairDataset(LanguagePairDataset):
    """A :class:`LanguagePairDataset` whose examples carry their memory matches."""

    @classmethod
    def wrap(cls, base: LanguagePairDataset, matches: Sequence[torch.Tensor], fusion: str,
             max_memory_tokens: int = 0) -> "MemoryPairDataset":
        if fusion not in TM_FUSIONS[1:]:
            raise ValueError(f"--tm-fusion: got {fusion!r}, expected one of {', '.join(TM_FUSIONS[1:])}")
        if len(matches) != len(base):
            raise ValueError(f"{len(matches)} memory matches for {len(base)} examples")
        ds = cls.__new__(cls)
        ds.__dict__.update(base.__dict__)  # the same data, options and buckets
        ds.fusion = fusion
        ds.positive_ids, ds.entry_sources = None, None
        ds.matches = [m[:max_memory_tokens] if max_memory_tokens else m for m in matches]
        if fusion == "concat":  # the concatenated source decides batching and length checks
            ds.src_sizes = np.asarray(base.src_sizes) + np.array([len(m) for m in ds.matches], dtype=np.int64)
        return ds

    def set_positives(self, positive_ids: Sequence[int], entry_sources: Sequence[torch.Tensor]) -> None:
        """The positive entry of every example (-1: none) and the memory's source tokens."""
        if len(positive_ids) != len(self):
            raise ValueError(f"{len(positive_ids)} positives for {len(self)} examples")
        self.positive_ids = np.asarray(positive_ids, dtype=np.int64)
        self.entry_sources = entry_sources

    def set_matches(self, matches: Sequence[torch.Tensor]) -> None:
        """New matches (a re-keying during training); the attention fusion's sizes do not change."""
        if self.fusion != "attention" or len(matches) != len(self):
            raise ValueError(f"new matches need --tm-fusion attention and one per example ({len(matches)} for {len(self)})")
        self.matches = list(matches)

    def __getitem__(self, index):
        item = super().__getitem__(index)
        if self.fusion == "concat" and len(self.matches[index]):
            src = item["source"]  # ends with </s>
            item["source"] = torch.cat([src[:-1], self.matches[index], src[-1:]])
        return item

    def collater(self, samples, pad_to_length=None):
        batch = super().collater(samples, pad_to_length=pad_to_length)
        if self.fusion == "attention" and batch:
            memories = [self.matches[i] for i in batch["id"].tolist()]
            batch["net_input"]["memory_tokens"] = pad_memories(memories, self.src_dict.pad())
        if self.positive_ids is not None and batch:
            ids = self.positive_ids[batch["id"].numpy()]
            pad = torch.tensor([self.src_dict.pad()])
            batch["tm_positive"] = data_utils.collate_tokens(
                [self.entry_sources[i] if i >= 0 else pad for i in ids], self.src_dict.pad(), left_pad=False)
            batch["tm_positive_ids"] = torch.from_numpy(ids)
        return batch


def pad_memories(memories: Sequence[torch.Tensor], pad: int) -> torch.Tensor:
    """(B, M) right-padded memory tokens; an example without matches gets one padding slot."""
    longest = max(1, max((len(m) for m in memories), default=1))
    return data_utils.collate_tokens([m if len(m) else torch.tensor([pad]) for m in memories], pad,
                                     left_pad=False, pad_to_length=longest)


__all__ = ["MemoryPairDataset", "TM_FUSIONS", "encode_entries", "match_tokens", "matches_of_rows", "pad_memories"]
