"""Memory reading as a part (stage "input"): a model trained with a translation memory reads the
matches of every sentence of a segment (memory attention, EMAT-style, or concat fusion, Neural Fuzzy
Repair: Bulte & Tezcan, ACL 2019). The part acts on what the model is given, not on the beam steps:
:meth:`MemoryReading.inputs` joins each source's matches, cut to the model's positions, to the
dataset of a generate call."""
from typing import List, Optional, Sequence

import torch

from reluformer_mt.guidance.base import Guidance, GuidanceContext, SourceBatch
from reluformer_mt.guidance.declared import TranslationError
from reluformer_mt.guidance.memory_reading_options import MemoryReadingOptions


class MemoryReading(Guidance):
    stage = "input"

    def __init__(self, context: GuidanceContext):
        super().__init__()
        self.lookup, self.task, self.model = context.lookup, context.task, context.models[0]
        self.memory_k = self.lookup.k  # the matches per sentence the model was trained to read
        self.concat = getattr(self.task.cfg, "tm_fusion", "none") == "concat"

    def apply(self, step) -> None:
        """Nothing at a step: the model reads the matches itself."""

    def inputs(self, dataset, batch: SourceBatch):
        """The dataset with each source's matches: ``batch.memory_tokens`` where given, else the
        best ``memory_k`` matches of each of its sentences (``batch.units``), in their order; as it
        is when the caller gives neither (the model then reads no memory, as before any look-up)."""
        tokens = batch.memory_tokens
        if tokens is None and batch.units is None:
            return dataset
        if tokens is None:
            tokens = [self.lookup.tokens_of([batch.matches[unit][0][:self.memory_k] for unit in units])
                      for units in batch.units]
        return self.task.dataset_with_matches(dataset, self._fit(batch.sources, tokens))

    def _fit(self, sources: Sequence[torch.Tensor], matches: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """Each source's memory tokens cut to the model's source positions (with concat fusion, the
        room the source leaves): a long match (a TM entry of thousands of words) would otherwise
        reach positions the model never saw in training. Counted in the summary."""
        limit = self.model.max_positions()
        limit = int(limit[0] if isinstance(limit, (tuple, list)) else limit)
        fitted = []
        for src, tokens in zip(sources, matches):
            room = limit - (len(src) if self.concat else 0)
            if len(tokens) > room:
                self.stats[f"memory: segments whose matches were cut to the model's {limit} positions"] += 1
                tokens = tokens[:max(room, 0)]
            fitted.append(tokens)
        return fitted


def build_memory_reading(options: MemoryReadingOptions, context: GuidanceContext) -> Optional[MemoryReading]:
    """The part when the model reads a memory and the translator looks up its matches. Under
    fairseq-generate (which builds a kind without fields only when ``--guidance`` names it) the model
    reads the matches its data directory holds, loaded by the task: naming the part there is refused."""
    if not context.looks_up_matches:
        raise TranslationError("--guidance memory_reading: under fairseq-generate a memory model reads the matches "
                               "its data directory holds; the part is reluformer-translate's, which looks them up")
    return MemoryReading(context) if context.reads_memory and context.lookup is not None else None
