"""Label-smoothed cross-entropy plus ReLUFormer's attention regularisers and attention statistics.

ReLUFormer (Shen et al. 2023, arXiv:2302.06461) adds two losses over the scaled ReLU weights a_i
of each query row: the normalisation loss |log sum_j a_ij| and the entropy-margin loss
max(H(p_i) - 0.7 log n_i, 0). Their weights are not published; we default both to 0.1, which
keeps them an order of magnitude below the cross-entropy at the start of training and trained
stably in our runs (tests/test_end_to_end.py), and make them options.

What is logged as ``loss`` is what is optimised: label-smoothed cross-entropy plus the weighted
regularisers, so validation loss and ``checkpoint_best.pt`` see the same objective as training.
The regularisers alone are logged as ``attn_reg_loss``; ``nll_loss`` stays fairseq's plain
cross-entropy (``--best-checkpoint-metric nll_loss`` selects checkpoints on translation alone).

Per update the criterion also logs, for every attention sublayer, the sparsity rate (share of
exact zeros among visible weights), the null-attention rate (share of query rows with no
non-zero weight) and the two regularisers (row means), so fairseq's progress lines and
validation show them. Both come from ``attention.record_attention`` around the model's forward.

With the task's ``--tm-key-loss W`` (learned translation-memory keys, EMAT), training batches carry
each example's positive memory entry and the criterion adds W x the mean in-batch InfoNCE x the
sample size (:func:`reluformer_mt.memory.learned_keys.in_batch_key_loss`); it is logged as
``tm_key_loss`` (nats per example) with ``tm_key_acc``, the share of examples whose own positive
is the best key of the batch.
"""
import argparse
import math
from dataclasses import dataclass, field

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion, LabelSmoothedCrossEntropyCriterionConfig)
from fairseq.logging import metrics

from reluformer_mt.attention import ATTENTION_FUNCTIONS, record_attention

STAT_KEYS = ("zeros", "visible", "null_rows", "rows", "norm_loss", "entropy_margin", "reg_rows")


@dataclass
class ReluformerCriterionConfig(LabelSmoothedCrossEntropyCriterionConfig):
    norm_loss_weight: float = field(default=0.1, metadata={"help": "weight of ReLUFormer's normalisation loss |log sum_j a_ij|"})
    entropy_margin_weight: float = field(default=0.1, metadata={"help": "weight of ReLUFormer's entropy-margin loss max(H - C, 0)"})
    entropy_margin_ratio: float = field(default=0.7, metadata={"help": "C_i = ratio * log(n_i)"})
    regularise_fns: str = field(default="relu", metadata={"help": "comma-separated attention functions whose rows get the two losses"})
    attention_stats: bool = field(default=True, metadata={"help": "log sparsity and null-attention rates per update"})


def non_negative_number(text) -> float:
    value = float(text)
    if not (0 <= value < math.inf):
        raise ValueError(f"got {text!r}, expected a finite number >= 0")
    return value


# softmax runs fairseq's own attention, which records no rows (only a cross-attention that
# fairseq asks for head weights would be seen), and its rows sum to 1: nothing to regularise
NOT_REGULARISABLE = ("softmax",)


def attention_function_names(text) -> str:
    names = {name.strip() for name in str(text).split(",") if name.strip()}
    unknown = names - set(ATTENTION_FUNCTIONS)
    choices = [f for f in ATTENTION_FUNCTIONS if f not in NOT_REGULARISABLE]
    if unknown:
        raise ValueError(f"unknown {', '.join(sorted(unknown))}; expected comma-separated names from "
                         f"{', '.join(choices)}")
    if names & set(NOT_REGULARISABLE):
        raise ValueError(f"softmax runs fairseq's own attention, whose rows are not recorded and sum to 1 "
                         f"(nothing to regularise); expected comma-separated names from {', '.join(choices)}")
    return str(text)


# option -> check; used at option parsing (argparse's one-line error) and again for hydra configs
OPTION_CHECKS = {
    "norm_loss_weight": non_negative_number,
    "entropy_margin_weight": non_negative_number,
    "entropy_margin_ratio": non_negative_number,
    "regularise_fns": attention_function_names,
}


def _argparse_type(check):
    def parse(text):
        try:
            return check(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error))
    return parse


@register_criterion("reluformer_cross_entropy", dataclass=ReluformerCriterionConfig)
class ReluformerCriterion(LabelSmoothedCrossEntropyCriterion):
    @classmethod
    def add_args(cls, parser):
        """fairseq's options from the dataclass, with the checks above as argparse types, so
        that bad values stop at option parsing with one line."""
        super().add_args(parser)
        for action in parser._actions:
            check = OPTION_CHECKS.get(action.dest)
            if check is not None:
                action.type = _argparse_type(check)

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 norm_loss_weight=0.1, entropy_margin_weight=0.1, entropy_margin_ratio=0.7,
                 regularise_fns="relu", attention_stats=True):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        given = dict(norm_loss_weight=norm_loss_weight, entropy_margin_weight=entropy_margin_weight,
                     entropy_margin_ratio=entropy_margin_ratio, regularise_fns=regularise_fns)
        for name, value in given.items():  # hydra configs bypass argparse
            try:
                OPTION_CHECKS[name](value)
            except ValueError as error:
                raise ValueError(f"--{name.replace('_', '-')}: {error}") from None
        self.regularise_fns = {f.strip() for f in regularise_fns.split(",") if f.strip()}
        self.norm_loss_weight = norm_loss_weight
        self.entropy_margin_weight = entropy_margin_weight
        self.entropy_margin_ratio = entropy_margin_ratio
        self.attention_stats = attention_stats

    def forward(self, model, sample, reduce=True):
        regularising = self.norm_loss_weight > 0 or self.entropy_margin_weight > 0
        with record_attention(model, regularise=self.regularise_fns if regularising else False,
                              entropy_margin_ratio=self.entropy_margin_ratio,
                              statistics=self.attention_stats) as record:
            loss, sample_size, logging_output = super().forward(model, sample, reduce=reduce)
        totals = {k: 0 for k in STAT_KEYS}
        totals.update(record.totals())

        reg_loss = 0.0
        if torch.is_tensor(totals["reg_rows"]):
            # no branch on the row count (a host synchronisation per update, issue 64): with no
            # regularised row both sums are 0, and so is what is added
            rows = totals["reg_rows"].clamp(min=1)
            reg = (self.norm_loss_weight * totals["norm_loss"] + self.entropy_margin_weight * totals["entropy_margin"]) / rows
            # the CE is a sum over the sample; the regulariser is a per-row mean: scale alike
            loss = loss + reg * sample_size
            reg_loss = reg.detach() * sample_size
        loss = self._add_key_loss(model, sample, loss, sample_size, logging_output)
        # the logged loss is the optimised one (see the module docstring)
        logging_output["loss"] = loss.data
        # tensors, as fairseq logs its own loss: the trainer reads them once per update, after the step
        logging_output["attn_reg_loss"] = reg_loss
        for k in STAT_KEYS:
            v = totals[k]
            logging_output[f"attn_{k}"] = v.detach() if torch.is_tensor(v) else float(v)
        return loss, sample_size, logging_output

    def _add_key_loss(self, model, sample, loss, sample_size, logging_output):
        """The learned memory keys' in-batch retrieval loss, when the task asks for it and the
        batch carries positives (training batches)."""
        weight = getattr(getattr(self.task, "cfg", None), "tm_key_loss", 0.0)
        if not weight or "tm_positive_ids" not in sample:
            return loss
        from reluformer_mt.memory.learned_keys import in_batch_key_loss

        key_loss, n, hits = in_batch_key_loss(model, sample, self.task.cfg.tm_key_temperature)
        if n:
            loss = loss + weight * key_loss / n * sample_size
        logging_output.update(tm_key_loss=float(key_loss.detach()), tm_key_n=n, tm_key_hits=hits)
        return loss

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        key_n = sum(log.get("tm_key_n", 0) for log in logging_outputs)
        if key_n > 0:
            metrics.log_scalar("tm_key_loss", sum(log.get("tm_key_loss", 0) for log in logging_outputs) / key_n, key_n,
                               round=3)
            metrics.log_scalar("tm_key_acc", sum(log.get("tm_key_hits", 0) for log in logging_outputs) / key_n, key_n,
                               round=3)

        def total(key):
            return sum(log.get(f"attn_{key}", 0) for log in logging_outputs)

        if total("visible") > 0:
            metrics.log_scalar("attn_sparsity", total("zeros") / total("visible"), total("visible"), round=4)
        if total("rows") > 0:
            metrics.log_scalar("attn_null", total("null_rows") / total("rows"), total("rows"), round=4)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        if total("reg_rows") > 0 and sample_size > 0:
            # same units as fairseq's loss (base 2, per sample_size unit)
            metrics.log_scalar("attn_reg_loss", total("reg_loss") / sample_size / math.log(2), sample_size, round=3)
        if total("reg_rows") > 0:
            metrics.log_scalar("attn_norm_loss", total("norm_loss") / total("reg_rows"), total("reg_rows"), round=4)
            metrics.log_scalar("attn_entropy_margin", total("entropy_margin") / total("reg_rows"), total("reg_rows"), round=4)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


__all__ = ["ReluformerCriterion", "ReluformerCriterionConfig"]
