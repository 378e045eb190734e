"""Every family trains, generates, aligns, serves interactively and resumes through fairseq's CLIs."""
import re

import pytest
import torch

from helpers import USER_DIR, needs_shared_data, run_fairseq, tiny_train_args

pytestmark = needs_shared_data

FAMILIES = ["softmax", "reluformer", "rela", "pointwise", "sparsemax", "entmax15"]

def train_args(data, save_dir, arch, max_update=40):
    return tiny_train_args(data, save_dir, arch, max_update, extra=["--log-format", "json", "--log-interval", "5"])


@pytest.mark.parametrize("family", FAMILIES)
def test_family_trains_generates_and_resumes(family, sentence_data, tmp_path, caplog):
    data = sentence_data["bin"]
    save = tmp_path / "ckpt"
    caplog.set_level("INFO")
    run_fairseq("train", train_args(data, save, f"{family}_tiny"))
    text = caplog.text
    train_losses = [float(m) for m in re.findall(r'"loss": "([0-9.]+)"', text)]
    assert len(train_losses) >= 3, text[-2000:]
    assert all(l == l for l in train_losses)  # no NaN
    assert train_losses[-1] < train_losses[0] - 0.5, train_losses
    assert (save / "checkpoint_last.pt").exists()

    # resume: 5 more updates from checkpoint_last
    caplog.clear()
    run_fairseq("train", train_args(data, save, f"{family}_tiny", max_update=45))
    assert re.search(r"[Ll]oaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 40 updates\)", caplog.text)
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert state["optimizer_history"][-1]["num_updates"] == 45

    out = run_fairseq("generate", [data, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt",
                                   "--source-lang", "en", "--target-lang", "de", "--gen-subset", "valid",
                                   "--beam", "2", "--max-len-b", "20", "--print-alignment",
                                   "--num-workers", "0"], capture=True)
    hyps = [l for l in out.splitlines() if l.startswith("H-")]
    aligns = [l for l in out.splitlines() if l.startswith("A-")]
    assert len(hyps) == sentence_data["sizes"]["valid"], out[-1500:]
    assert len(aligns) == len(hyps)
    for line in aligns:  # source-target index pairs inside the sentence bounds
        assert all(re.fullmatch(r"\d+-\d+", link) for link in line.split("\t")[1].split())

    few_sentences = tmp_path / "five.en"
    few_sentences.write_text("\n".join((sentence_data["raw"] / "test.en").read_text().splitlines()[:5]) + "\n")
    inter = run_fairseq("interactive", [data, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt",
                                        "--source-lang", "en", "--target-lang", "de", "--beam", "2",
                                        "--max-len-b", "20", "--input", few_sentences,
                                        "--buffer-size", "8", "--batch-size", "8"], capture=True)
    assert sum(1 for l in inter.splitlines() if l.startswith("H-")) == 5
