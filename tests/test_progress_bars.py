"""Progress within a long stage (issue 33): a real fairseq training in a child process, watched
through its --log-file, moves a tqdm bar on a terminal console to the final update count; a
console that is not a terminal (a log, a pipe) and --no-progress get nothing."""
import io
import subprocess
import sys
from pathlib import Path

from helpers import tiny_train_args
from reluformer_mt.experiments.progress import TrainingProgress, last_updates, updates_in_file


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_training_bar_follows_fairseqs_log(sentence_data, tmp_path):
    log = tmp_path / "train.log"
    argv = tiny_train_args(sentence_data["bin"], tmp_path / "ckpt", max_update=12,
                           extra=["--disable-validation", "--log-format", "json", "--log-interval", "2",
                                  "--log-file", str(log), "--cpu"])
    console = Terminal()
    train = [str(Path(sys.executable).parent / "fairseq-train"), *map(str, argv)]
    with TrainingProgress(updates_in_file(log), 12, "train tiny", console=console, interval=0.2) as progress:
        assert progress.enabled
        subprocess.run(train, check=True, capture_output=True, timeout=600)
    shown = console.getvalue()
    assert "train tiny" in shown and "12/12" in shown and "upd" in shown, shown[-500:]
    assert last_updates(log.read_text(encoding="utf-8")) == 12
    for quiet in (io.StringIO(), Terminal()):  # not a terminal; --no-progress
        with TrainingProgress(updates_in_file(log), 12, "train", console=quiet,
                              enabled=None if not quiet.isatty() else False) as progress:
            assert not progress.enabled
        assert quiet.getvalue() == ""


def test_update_counts_from_each_fairseq_log_format():
    assert last_updates("2024 | INFO | train_inner | epoch 001:     10 / 63 loss=9.9, num_updates=10, lr=1e-3") == 10
    assert last_updates('{"epoch": 1, "num_updates": "25", "lr": "0.001"}\n{"num_updates": "50"}') == 50
    assert last_updates("epoch 001 | loss 3.2 | num_updates 75 | lr 0.001") == 75
    assert last_updates("no update yet") is None
