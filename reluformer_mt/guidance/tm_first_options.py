"""TM-first's option, declared once (``--tm-first T``). Imports neither torch nor fairseq; the part
itself is :mod:`reluformer_mt.guidance.tm_first`."""
from dataclasses import dataclass
from typing import Optional

from reluformer_mt.guidance.declared import TranslationError, number, option, register_guidance


@dataclass(frozen=True)
class TmFirstOptions:
    """TM-first: the memory's match as the translation of a sentence it matches well enough."""
    # a sentence whose best match scores >= this is translated by the match's target
    threshold: Optional[float] = option(None, "TM-first: a sentence whose best match scores >= T is translated by the "
                                        "match's target, the others by the model (with its guidance); "
                                        "'reluformer-memory tune' tunes T on validation (default: off)",
                                        flat="tm_first", metavar="T", parse=number(float, 0.0, 1.0))

    def __post_init__(self):
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            raise TranslationError(f"--tm-first {self.threshold}: expected a match score between 0 and 1 (the "
                                   "threshold above which the match's target is the output)")

    def asks_for_matches(self):
        """(the option given, what it reads) when it needs each sentence's memory matches."""
        return None if self.threshold is None else (f"--tm-first {self.threshold:g}", "the targets it copies")

    @property
    def needs_memory(self) -> bool:
        return self.threshold is not None


register_guidance("tm_first", TmFirstOptions, "reluformer_mt.guidance.tm_first:build_tm_first",
                  section="memory")
