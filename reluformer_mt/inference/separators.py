"""Separator-constrained beam search: every hypothesis of a segment of n sentences gets exactly
n - 1 separators, and no empty sentence, so it always splits back into the segment's sentences.

Why: a document model that drops or invents a separator leaves a segment whose translation cannot
be mapped back to its sentences -- the failure mode G-Transformer (Bao et al., ACL 2021,
arXiv:2105.14761) reports for doc-to-doc training -- and the translator then has to retranslate
it with less context (as halves, then sentence by sentence). The constraint only removes choices
(log-probability -inf); where it leaves nothing else to choose (the generator's last step, which
allows only EOS), EOS is kept, so a hypothesis cut at the length limit can still come out wrong
and falls back as before.

The search object sees, at every step, the prefix of each hypothesis row (to count its separators)
and the dataset ids of the sentences still in the batch (``original_batch_idxs``, which fairseq's
``SequenceGenerator`` keeps in step with the rows as finished sentences leave the batch); the
separators each source needs are looked up by that id, so the row -> source mapping never depends
on the batch order, the beam size or which sentences have finished.
"""
import math
from typing import Optional

import torch
from fairseq.search import BeamSearch
from torch import Tensor


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


class SeparatorConstrainedBeamSearch(BeamSearch):
    """fairseq's beam search with :func:`constrain_separators` applied before every step, and
    optionally the translation-piece bonus of a memory (:mod:`reluformer_mt.inference.pieces`).

    Set :attr:`required` before generating: a tensor indexed by the batch's ``sample["id"]`` values
    (the dataset index of each source) giving that source's number of separators, or None (a
    sentence-level model: nothing to constrain). :attr:`pieces`: None, or a
    :class:`reluformer_mt.inference.pieces.PieceTable` of the sources indexed the same way, rewarded
    with :attr:`piece_weight`. :attr:`knn`: None, or a :class:`reluformer_mt.knn.search.KnnMixer` whose
    neighbours are mixed into the model's distribution first (kNN-MT), so that the bonus and the
    constraint act on the mixed distribution.
    """

    def __init__(self, tgt_dict, separator: Optional[int]):
        super().__init__(tgt_dict)
        self.separator = separator
        self.required: Optional[Tensor] = None
        self.pieces = None
        self.piece_weight = 0.0
        self.knn = None

    def step(self, step: int, lprobs, scores: Optional[Tensor], prev_output_tokens: Optional[Tensor] = None,
             original_batch_idxs: Optional[Tensor] = None, candidate_multiple: int = 2):
        assert original_batch_idxs is not None and prev_output_tokens is not None
        bsz, beam_size, vocab_size = lprobs.size()
        rows = lprobs.view(bsz * beam_size, vocab_size)
        # rows are sentence-major (sentence b's beams are rows b*beam .. b*beam+beam-1), as tokens are
        if self.knn is not None:
            eos_as = sentences = None
            if self.required is not None and self.separator is not None:
                required = self.required.to(original_batch_idxs.device)[original_batch_idxs].repeat_interleave(beam_size)
                sentences = (prev_output_tokens == self.separator).sum(dim=1)  # the sentence each row is writing
                eos_as = torch.where(sentences < required, torch.full_like(required, self.separator),
                                     torch.full_like(required, self.eos))
            rows.copy_(self.knn.mix(rows, original_batch_idxs.repeat_interleave(beam_size), self.eos, eos_as, sentences))
        if self.pieces is not None and self.piece_weight:
            sources = original_batch_idxs.repeat_interleave(beam_size)
            self.pieces.add_bonus(rows, prev_output_tokens, sources, self.piece_weight)
        if self.required is not None and self.separator is not None:
            required = self.required.to(original_batch_idxs.device)[original_batch_idxs].repeat_interleave(beam_size)
            constrain_separators(rows, prev_output_tokens, required, self.separator, self.eos)
        return super().step(step, lprobs, scores, prev_output_tokens, original_batch_idxs, candidate_multiple)
