"""A training step's loss, logged statistics and gradients stay those of the code before issue 64.

Issue 64 moved ReLUFormer's regularisers and the attention statistics out of the attention calls
(one computation per step from the rows every call records) and made the criterion log tensors
instead of host numbers. Only the order of float sums may change, so a fixed tiny model and batch
(float64, dropout on, padded sentences and one 520-token segment that takes the C++ kernel) must
give the values ``tests/data/training_step_reference.json`` holds, computed with the code before
the change (``python tests/test_training_step_reference.py --write``): the loss, every ``attn_*``
log, and per parameter the gradient's norm and its projection on a fixed random direction
(which catches any change of any entry)."""
import json
import sys

import pytest
import torch

from helpers import REPO, load_benchmark_script

REFERENCE = REPO / "tests" / "data" / "training_step_reference.json"
DIMS = ["--encoder-layers", "1", "--decoder-layers", "2", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--dropout", "0.1", "--share-all-embeddings"]
# (family, tokens per sentence, sentences): short padded sentences take the direct route, 520 keys the C++ kernel
CASES = [("reluformer", 12, 3), ("rela", 12, 3), ("softmax", 12, 3), ("reluformer", 520, 1), ("rela", 520, 1)]


def step_values(family: str, length: int, batch: int) -> dict:
    """Loss, attn_* logs and per-parameter gradient norm and projection of one training step."""
    run = load_benchmark_script("run")
    model, criterion, dictionary = run.build_model(f"{family}_tiny", DIMS, 40, length)
    model = model.double().train()
    sample = run.make_sample(dictionary, batch, length, seed=3, padded=True)
    torch.manual_seed(5)  # the dropout masks
    loss, _, log = criterion(model, sample)
    loss.backward()
    values = {"loss": float(loss)}
    values.update({k: float(v) for k, v in sorted(log.items()) if k.startswith("attn_")})
    directions = torch.Generator().manual_seed(7)
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        direction = torch.randn(p.shape, generator=directions, dtype=torch.float64)
        values[f"{name}.grad_norm"] = float(p.grad.norm())
        values[f"{name}.grad_dot"] = float((p.grad * direction).sum())
    return values


def case_name(family, length, batch) -> str:
    return f"{family}_{length}x{batch}"


@pytest.mark.parametrize("family,length,batch", CASES, ids=[case_name(*c) for c in CASES])
def test_training_step_matches_reference(family, length, batch):
    expected = json.loads(REFERENCE.read_text(encoding="utf-8"))[case_name(family, length, batch)]
    got = step_values(family, length, batch)
    assert sorted(got) == sorted(expected)
    scale = max(abs(v) for k, v in expected.items() if k.endswith("grad_norm"))
    for key, value in expected.items():
        # float64: reordered sums differ in the last bits; 1e-9 relative leaves room for nothing else
        tolerance = 1e-9 * max(abs(value), scale if "grad" in key else abs(expected["loss"]), 1e-12)
        assert got[key] == pytest.approx(value, abs=tolerance), key


if __name__ == "__main__" and "--write" in sys.argv:
    sys.path.insert(0, str(REPO / "tests"))
    REFERENCE.write_text(json.dumps({case_name(*c): step_values(*c) for c in CASES}, indent=1) + "\n",
                         encoding="utf-8")
