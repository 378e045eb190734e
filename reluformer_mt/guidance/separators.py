"""The separator constraint, a part of decoding guidance: every hypothesis of a segment of n sentences gets exactly
n - 1 separators, and no empty sentence, so it always splits back into the segment's sentences.

Why: a document model that drops or invents a separator leaves a segment whose translation cannot
be mapped back to its sentences -- the failure mode G-Transformer (Bao et al., ACL 2021,
arXiv:2105.14761) reports for doc-to-doc training -- and the translator then has to retranslate
it with less context (as halves, then sentence by sentence). The constraint only removes choices
(log-probability -inf); where it leaves nothing else to choose (the generator's last step, which
allows only EOS), EOS is kept, so a hypothesis cut at the length limit can still come out wrong
and falls back as before.

The part sees, at every step, the prefix of each hypothesis row (to count its separators) and the
separators each row's source needs (:attr:`reluformer_mt.guidance.base.BeamStep.required`),
looked up by the dataset ids of the sentences still in the batch (``original_batch_idxs``, which
fairseq's ``SequenceGenerator`` keeps in step with the rows as finished sentences leave the batch),
so the row -> source mapping never depends on the batch order, the beam size or which sentences
have finished.
"""
import math

import torch
from torch import Tensor

from reluformer_mt.guidance.base import BeamStep, Guidance, GuidanceContext
from reluformer_mt.guidance.separator_options import SEPARATOR_MODES, Separators  # noqa: F401  (re-exported)


def constrain_separators(lprobs: Tensor, prefix: Tensor, required: Tensor, separator: int, eos: int) -> Tensor:
    """Set to -inf, in place, the next tokens that would break the separator count of each row.

    ``lprobs``: (rows, vocab) next-token log-probabilities; ``prefix``: (rows, steps) the tokens so
    far, beginning with the BOS token; ``required``: (rows,) separators the row's source has.
    Forbidden: EOS while the row has fewer separators than required or right after a separator (an
    empty last sentence); the separator once the row has as many as required, at the start, or
    right after another separator (an empty sentence). A row left with no finite choice (the
    generator's max-length step allows only EOS) keeps its EOS.
    """
    count = (prefix == separator).sum(dim=1)
    last = prefix[:, -1]
    empty_sentence = last == separator if prefix.size(1) > 1 else torch.ones_like(last, dtype=torch.bool)
    eos_before = lprobs[:, eos].clone()
    lprobs[:, eos].masked_fill_((count < required) | (last == separator), -math.inf)
    lprobs[:, separator].masked_fill_((count >= required) | empty_sentence, -math.inf)
    stuck = lprobs.amax(dim=1) == -math.inf  # all -inf (a comparison over the vocabulary then all() cost 12x more)
    lprobs[:, eos] = torch.where(stuck, eos_before, lprobs[:, eos])
    return lprobs


class SeparatorConstraint(Guidance):
    """:func:`constrain_separators` at every step, for the rows whose source's separators are counted."""
    stage = "constraint"

    def __init__(self, source_separator: int, target_separator: int):
        super().__init__()
        self.separator_ids = (source_separator, target_separator)  # the search counts the sources' separators

    def apply(self, step: BeamStep) -> None:
        if step.required is not None:
            constrain_separators(step.lprobs, step.prefix, step.required, self.separator_ids[1], step.eos)


def build_separator_constraint(options: Separators, context: GuidanceContext):
    """The constraint for constrained decoding of a target dictionary with the separator (one
    without it has no separators to keep: sentence by sentence, nothing to constrain)."""
    ids = context.separator_ids()
    return SeparatorConstraint(*ids) if options.mode == "constrained" and ids is not None else None
