"""Checkpoint averaging: the element-wise mean of the weights of several checkpoints of one
training run (Vaswani et al. 2017 average the last 5 or 20; fairseq's
``scripts/average_checkpoints.py``, which is not in its wheel, does the same).

The checkpoints are read with the package's one safe loader (:func:`reluformer_mt.checkpoints.read_state`);
floating-point weights are summed in float64 and divided, then stored in their own dtype; other
tensors (version counters) must be equal in every checkpoint. The result keeps the newest
checkpoint's configuration and training counters and drops its optimizer state (which belongs to
that one checkpoint's weights), so it is for translation and evaluation, not for resuming.
"""
import re
from pathlib import Path
from typing import List, Sequence

# torch and the checkpoint loader are imported by average_checkpoints only: choosing the files
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


def average_checkpoints(paths: Sequence, output) -> dict:
    """Write the average of ``paths`` to ``output``; returns what was done (for the summary)."""
    import torch

    from reluformer_mt.checkpoints import CheckpointError, read_state

    paths = [Path(p) for p in paths]
    if not paths:
        raise CheckpointError("give at least one checkpoint to average")
    output = Path(output)
    if output.resolve() in {p.resolve() for p in paths}:
        raise CheckpointError(f"--output {output}: is one of the inputs; write the average to a new file")
    if len({p.resolve() for p in paths}) != len(paths):
        raise CheckpointError("the same checkpoint is given twice: it would count double in the average")
    sums, first, newest, newest_updates = {}, None, None, -1
    for path in paths:
        state = read_state(path)
        model = state["model"]
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
    torch.save(newest, output)
    return {"inputs": [str(p) for p in paths], "output": str(output), "parameters": sum(v.numel() for v in averaged.values()),
            "newest_updates": newest_updates, "optimizer_state_dropped": dropped}
