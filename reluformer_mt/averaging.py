"""Checkpoint averaging: the element-wise mean of the weights of several checkpoints of one
training run (Vaswani et al. 2017 average the last 5 or 20; fairseq's
``scripts/average_checkpoints.py``, which is not in its wheel, does the same).

The checkpoints are read with the package's one safe loader (:func:`reluformer_mt.checkpoints.read_state`);
floating-point weights are summed in float64 and divided, then stored in their own dtype; other
tensors (version counters) must be equal in every checkpoint. The result keeps the newest
checkpoint's configuration and training counters and drops its optimizer state (which belongs to
that one checkpoint's weights), so it is for translation and evaluation, not for resuming.
"""
import io
import re
from pathlib import Path
from typing import List, Sequence

from reluformer_mt.data.outputs import check_distinct_files, check_no_repeats
from reluformer_mt.data.textfiles import replace_atomically

# torch and the checkpoint loader are imported where a checkpoint is read: choosing the files
# (last_checkpoints) answers a wrong --dir or --last before they load

_UPDATE = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")  # --save-interval-updates: checkpoint_EPOCH_UPDATE.pt
_EPOCH = re.compile(r"^checkpoint(\d+)\.pt$")            # end of each epoch: checkpointEPOCH.pt


def last_checkpoints(folder, n: int) -> List[Path]:
    """The ``n`` newest checkpoints of a fairseq save folder, oldest first: those saved every
    --save-interval-updates when there are any (by update), else the epoch checkpoints (by epoch)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"--dir {folder}: folder not found")
    if n < 1:
        raise ValueError(f"--last {n}: expected a positive number")
    by_update = sorted((int(m.group(2)), p) for p in folder.iterdir() if (m := _UPDATE.match(p.name)))
    by_epoch = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _EPOCH.match(p.name)))
    found = by_update or by_epoch
    if len(found) < n:
        names = ", ".join(p.name for _, p in found) or "none"
        raise ValueError(f"--dir {folder}: --last {n} asks for {n} checkpoints but it holds {len(found)} "
                              f"(checkpoint_E_U.pt or checkpointE.pt: {names}); checkpoint_best/last are copies, not counted")
    return [p for _, p in found[-n:]]


# the options that say what a model's weights compute (beside its architecture's name): two
# checkpoints with the same parameter names and shapes but another attention function, FFN or
# memory reader are two models, whose average is neither
FUNCTION_OPTIONS = ("activation_fn", "encoder_attn_fn", "decoder_attn_fn", "cross_attn_fn", "tm_attn_fn", "ffn_variant",
                    "rela_variant", "relu_gamma_mode", "tm_fusion", "memory_layers", "memory_activation",
                    "encoder_normalize_before", "decoder_normalize_before")


class ModelOf:
    """What an averaged checkpoint must share with the others: its architecture, the options of
    :data:`FUNCTION_OPTIONS` and its vocabulary (the dictionaries' symbols and SentencePiece models
    it was trained with: another vocabulary of the same size has the same shapes)."""

    def __init__(self, path: Path, state: dict):
        from reluformer_mt.checkpoints import _get, config_of, recorded_vocabulary

        cfg = config_of(state)
        self.path, self.data = path, str(_get(cfg.task, "data", "") or "")
        self.function = {"arch": _get(cfg.model, "arch") or _get(cfg.model, "_name"),
                         **{name: _get(cfg.model, name) for name in FUNCTION_OPTIONS}}
        self.vocabulary = recorded_vocabulary(path, cfg)

    def check_same(self, other: "ModelOf") -> None:
        from reluformer_mt.checkpoints import CheckpointError
        from reluformer_mt.data.vocabulary import check_same_vocabulary

        for name, mine in self.function.items():
            if other.function[name] != mine:
                what = "architecture" if name == "arch" else f"--{name.replace('_', '-')}"
                raise CheckpointError(f"{other.path}: its {what} is {other.function[name]!r}, {self.path}'s {mine!r}: "
                                      "another model; average checkpoints of one model")
        if self.vocabulary is not None and other.vocabulary is not None:
            check_same_vocabulary(self.vocabulary, other.vocabulary, str(other.path), str(self.path),
                                  remedy="average checkpoints of one model")
        elif self.data != other.data:  # one is not found from here: their recorded training data must agree
            raise CheckpointError(f"{other.path}: cannot check that it shares the vocabulary of {self.path}: they record "
                                  f"other training data ({other.data or 'none'}, {self.data or 'none'}) and the "
                                  "dictionaries of one are not found from here; run from the folder they were trained in")


def average_checkpoints(paths: Sequence, output) -> dict:
    """Write the average of ``paths`` to ``output``; returns what was done (for the summary)."""
    import torch

    from reluformer_mt.checkpoints import CheckpointError, read_state

    paths = [Path(p) for p in paths]
    if not paths:
        raise CheckpointError("give at least one checkpoint to average")
    output = Path(output)
    inputs = [("--inputs", p) for p in paths]
    check_no_repeats(inputs, "it would count double in the average")
    check_distinct_files([("--output", output)], inputs)
    sums, first, newest, newest_updates = {}, None, None, -1
    for path in paths:
        state = read_state(path)
        model = state["model"]
        if first is None:
            model_of_first = ModelOf(paths[0], state)
        else:
            model_of_first.check_same(ModelOf(path, state))
        if first is None:
            first = {k: (v.shape, v.dtype) for k, v in model.items()}
            sums = {k: v.to(torch.float64).clone() if v.is_floating_point() else v.clone() for k, v in model.items()}
        else:
            if set(model) != set(first):
                diff = sorted(set(model) ^ set(first))
                raise CheckpointError(f"{path}: its weights differ from {paths[0]}'s ({', '.join(diff[:3])}...); "
                                      "average checkpoints of one model")
            for k, v in model.items():
                if (v.shape, v.dtype) != first[k]:
                    raise CheckpointError(f"{path}: weight {k} is {tuple(v.shape)} {v.dtype}, in {paths[0]} "
                                          f"{tuple(first[k][0])} {first[k][1]}; average checkpoints of one model")
                if v.is_floating_point():
                    sums[k] += v.to(torch.float64)
                elif not torch.equal(v, sums[k]):
                    raise CheckpointError(f"{path}: the non-float tensor {k} differs from {paths[0]}'s")
        updates = int((state.get("optimizer_history") or [{}])[-1].get("num_updates", 0))
        if updates >= newest_updates:
            newest, newest_updates = state, updates
    averaged = {k: (v / len(paths)).to(first[k][1]) if first[k][1].is_floating_point else v for k, v in sums.items()}
    newest["model"] = averaged
    dropped = newest.pop("last_optimizer_state", None) is not None
    output.parent.mkdir(parents=True, exist_ok=True)
    # serialised in memory first: a write error inside torch.save (a full disk) surfaces as its
    # RuntimeError ('unexpected pos'); f.write gives the OSError that names the file
    serialised = io.BytesIO()
    torch.save(newest, serialised)
    replace_atomically(output, lambda f: f.write(serialised.getbuffer()))  # whole or not at all
    return {"inputs": [str(p) for p in paths], "output": str(output), "parameters": sum(v.numel() for v in averaged.values()),
            "newest_updates": newest_updates, "optimizer_state_dropped": dropped}
