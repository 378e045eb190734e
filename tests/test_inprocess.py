"""Running fairseq CLIs twice in one process keeps their logs and best checkpoints apart."""
from helpers import USER_DIR, needs_shared_data, run_fairseq

pytestmark = needs_shared_data


def train(data, save, log_file, arch, lr):
    run_fairseq("train", [data, "--user-dir", USER_DIR, "--arch", arch, "--task", "translation",
                          "-s", "en", "-t", "de", "--encoder-layers", "1", "--decoder-layers", "1",
                          "--optimizer", "adam", "--lr", lr, "--max-tokens", "1000", "--max-update", "3",
                          "--num-workers", "0", "--save-dir", save, "--no-epoch-checkpoints",
                          "--log-format", "json", "--log-interval", "1", "--log-file", log_file])


def test_second_run_has_its_own_log_and_best_checkpoint(sentence_data, tmp_path):
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    train(sentence_data["bin"], tmp_path / "a", first, "softmax_tiny", "1e-3")
    # a much worse model second: fairseq's per-process best score would keep it from being saved
    train(sentence_data["bin"], tmp_path / "b", second, "reluformer_tiny", "1e-9")
    assert (tmp_path / "b" / "checkpoint_best.pt").exists()
    size_a = first.stat().st_size
    assert size_a > 0 and second.stat().st_size > 0
    arch_lines = [l for l in first.read_text().splitlines() if "reluformer_tiny" in l]
    assert not arch_lines, "the second run wrote into the first run's log"
