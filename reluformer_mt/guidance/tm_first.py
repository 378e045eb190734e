"""TM-first as a part (``--tm-first T``): a sentence whose best match scores >= T gets the match's
target as its translation, as a CAT tool offers a high fuzzy match before any MT; the others keep
the model's. It acts on the finished translations (:meth:`Guidance.finish`), not on the beam steps:
the model still translated the whole segment, so the other sentences of a segment keep their
context (and the speed is the model's alone)."""
from dataclasses import replace

from reluformer_mt.guidance.base import Guidance, GuidanceContext
from reluformer_mt.guidance.tm_first_options import TmFirstOptions


class MemoryFirst(Guidance):
    stage = "finish"

    def __init__(self, threshold: float, context: GuidanceContext):
        super().__init__()
        self.threshold, self.lookup, self.separator = threshold, context.lookup, context.separator
        self.reads_memory = context.reads_memory

    def apply(self, step) -> None:
        """Nothing at a step: the part acts on the finished translations."""

    def finish(self, documents: list, nbest: int) -> list:
        """Each result (:class:`reluformer_mt.inference.translator.SentenceResult`) whose best match
        reaches the threshold replaced by the match's target, the model's hypotheses kept as its
        n-best alternatives; the copy has no model score."""
        from reluformer_mt.memory.tm import at_least, copyable_target

        for doc in documents:
            for i, r in enumerate(doc):
                if r.match is None or r.match[0] < 0 or not at_least(r.match[1], self.threshold):
                    continue
                target = self.lookup.target(r.match[0])
                if not copyable_target(target, self.separator):
                    self.stats["TM-first: matches left to the model (a control character, the separator or a "
                               "document marker in their target)"] += 1
                    continue
                model = replace(r, alternatives=[])
                doc[i] = replace(r, text=target, score=None, alignment=None, tm_copy=True,
                                 alternatives=([model] + r.alternatives)[:nbest - 1])
                self.stats[f"TM-first: sentences translated by their match (score >= {self.threshold:g})"] += 1
        return documents

    def describe(self) -> str:
        return (f"TM-first: a match scoring >= {self.threshold:g} is the output"
                + ("" if self.reads_memory else f" ({self.lookup.describe()})"))


def build_tm_first(options: TmFirstOptions, context: GuidanceContext):
    """The part when a threshold is given and the translator consults a memory."""
    return MemoryFirst(options.threshold, context) if options.threshold is not None and context.lookup else None
