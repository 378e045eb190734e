"""Learning curves from fairseq's JSON training log (``--log-format json --log-file``).

Training lines carry ``num_updates``, ``loss`` and ``wall`` (seconds since the run started; the
epoch summaries the same with a ``train_`` prefix);
validation lines carry ``valid_*`` values, among them the ``s_bleu``/``d_bleu`` that the
``document_translation`` task logs with ``--eval-bleu``. Validation lines have no wall time of
their own, so each gets the wall time of the first training line logged after it (the time at
which the validation had finished), or of the last one before it.
"""
import json
from pathlib import Path
from typing import Dict, List, Optional


def _records(log_file: Path):
    for line in Path(log_file).read_text(encoding="utf-8").splitlines():
        start = line.find("{")
        if start < 0:
            continue
        try:
            yield json.loads(line[start:])
        except json.JSONDecodeError:
            continue


def read_learning_curve(log_file: Path) -> Dict[str, List[dict]]:
    """{"train": [{update, loss, wall}], "valid": [{update, loss, nll_loss, s_bleu, d_bleu, wall}]},
    sorted by update; a point fairseq logged twice (end of epoch) is kept once."""
    train: Dict[int, dict] = {}
    valid: Dict[int, dict] = {}
    order = []  # (kind, update) in log order, to give validation points a wall time
    for record in _records(log_file):
        if "valid_loss" in record:
            update = int(record["valid_num_updates"])
            valid[update] = {"update": update, "loss": float(record["valid_loss"]),
                             "nll_loss": _float(record.get("valid_nll_loss")),
                             "s_bleu": _float(record.get("valid_s_bleu")), "d_bleu": _float(record.get("valid_d_bleu")),
                             "wall": None}
            order.append(("valid", update))
        elif "loss" in record and "num_updates" in record:  # a train_inner line (no prefix)
            update = int(record["num_updates"])
            train[update] = {"update": update, "loss": float(record["loss"]), "wall": _float(record.get("wall"))}
            order.append(("train", update))
        elif "train_loss" in record and "train_num_updates" in record:  # an epoch summary ("wall" prefixed)
            update = int(record["train_num_updates"])
            train.setdefault(update, {"update": update, "loss": float(record["train_loss"]),
                                      "wall": _float(record.get("train_wall"))})
            order.append(("train", update))
    _wall_times_for_validation(order, train, valid)
    return {"train": [train[k] for k in sorted(train)], "valid": [valid[k] for k in sorted(valid)]}


def _float(value) -> Optional[float]:
    return None if value is None else float(value)


def _wall_times_for_validation(order, train, valid) -> None:
    last_wall = None
    pending = []
    for kind, update in order:
        if kind == "train" and train[update]["wall"] is not None:
            for v in pending:  # the first training line after a validation: it has finished
                valid[v]["wall"] = train[update]["wall"]
            pending = []
            last_wall = train[update]["wall"]
        elif kind == "valid":
            pending.append(update)
            valid[update]["wall"] = last_wall
    # validations after the last training line keep the last known wall time


__all__ = ["read_learning_curve"]
