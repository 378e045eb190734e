"""Memory reading's declaration: the kind of guidance that gives a model trained with a
translation memory (``--tm-fusion attention`` or ``concat``) the matches of the sentences it
translates. It has no options of its own (the memory is ``--memory``'s, the number of matches the
model's ``--tm-k``): it applies whenever the translator looks up matches for such a model.
Imports neither torch nor fairseq; the part is :mod:`reluformer_mt.guidance.memory_reading`."""
from dataclasses import dataclass

from reluformer_mt.guidance.declared import register_guidance


@dataclass(frozen=True)
class MemoryReadingOptions:
    """Memory reading: a memory model's matches, as its inputs."""


register_guidance("memory_reading", MemoryReadingOptions,
                  "reluformer_mt.guidance.memory_reading:build_memory_reading", section="memory")
