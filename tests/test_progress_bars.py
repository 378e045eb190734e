"""Progress within a long stage: a real fairseq training in a child process, watched through its
--log-file, moves a tqdm bar on a terminal console to the final update count; a console that is
not a terminal (a log, a pipe) gets plain lines every so often; --no-progress gets nothing."""
import io
import re
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
    for quiet in (io.StringIO(), Terminal()):  # --no-progress
        with TrainingProgress(updates_in_file(log), 12, "train", console=quiet, enabled=False) as progress:
            assert not progress.enabled
        assert quiet.getvalue() == ""


def test_a_console_that_is_no_terminal_gets_plain_progress_lines(sentence_data, tmp_path):
    """A pipe or a log file: no bar (tqdm's carriage returns would fill it) but a plain line every
    line_interval seconds, as fairseq's log lines, with the rate and the time left, and the final count."""
    log = tmp_path / "train.log"
    argv = tiny_train_args(sentence_data["bin"], tmp_path / "ckpt", max_update=40,
                           extra=["--disable-validation", "--log-format", "json", "--log-interval", "2",
                                  "--log-file", str(log), "--cpu"])
    pipe = io.StringIO()
    train = [str(Path(sys.executable).parent / "fairseq-train"), *map(str, argv)]
    with TrainingProgress(updates_in_file(log), 40, "train tiny", console=pipe, interval=0.1, line_interval=0.3):
        subprocess.run(train, check=True, capture_output=True, timeout=600)
    lines = pipe.getvalue().splitlines()
    assert "\r" not in pipe.getvalue() and len(lines) >= 2, lines
    assert all(line.startswith("train tiny: ") and " of 40 updates (" in line for line in lines), lines
    assert lines[-1].startswith("train tiny: 40 of 40 updates (100 %)")
    assert any("updates/s, about " in line and " left" in line for line in lines[:-1]), lines


def test_progress_lines_within_a_demo_stage_go_under_its_line():
    from reluformer_mt.experiments.progress import Stages

    console = io.StringIO()
    stages = Stages(plan=[("train", 0.01), ("decode", 0.01)], console=console)
    with stages.stage("train"):
        stages.note("train: 5 of 10 updates (50 %) in 1 s")
    with stages.stage("decode"):
        pass
    lines = console.getvalue().splitlines()
    assert lines[0] == "[demo 1/2] train ..." and lines[1] == "  train: 5 of 10 updates (50 %) in 1 s"
    assert lines[2].startswith("[demo 1/2] train: ") and "total" in lines[2]
    assert lines[3].startswith("[demo 2/2] decode ... ") and len(lines) == 4


def test_update_counts_from_each_fairseq_log_format():
    assert last_updates("2024 | INFO | train_inner | epoch 001:     10 / 63 loss=9.9, num_updates=10, lr=1e-3") == 10
    assert last_updates('{"epoch": 1, "num_updates": "25", "lr": "0.001"}\n{"num_updates": "50"}') == 50
    assert last_updates("epoch 001 | loss 3.2 | num_updates 75 | lr 0.001") == 75
    assert last_updates("no update yet") is None


def test_translate_reports_progress_and_retranslations_when_stderr_is_a_pipe(doc_checkpoint, tmp_path, monkeypatch):
    """reluformer-translate on a file of 60 two-sentence documents, standard error a pipe: plain
    progress lines (no bar) over the 120 sentences, the retranslated segments (free separators:
    the untrained model's outputs do not split into their sentences) counted in them, and the
    final count."""
    from helpers import run_subprocess

    monkeypatch.setenv("RELUFORMER_PROGRESS_SECONDS", "0")  # a line at every batch, not every 30 s
    source = tmp_path / "docs.en"
    source.write_text("\n\n".join(f"Sentence {k} here.\nAnd one more, {k}." for k in range(60)) + "\n", encoding="utf-8")
    proc = run_subprocess(["reluformer-translate", "-c", doc_checkpoint, "-i", source, "-o", tmp_path / "out.de",
                           "--separators", "free", "--beam", "1", "--max-len-a", "0", "--max-len-b", "3"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("translate: ")]
    assert "\r" not in proc.stderr and len(lines) >= 2, proc.stderr[-2000:]
    assert any("segments retranslated as halves or sentence by sentence" in line for line in lines), lines
    # the unit is the sentence, whose total retranslations do not change (segments: it grew as they came)
    totals = {re.search(r" of ([\d,]+) sentences", line).group(1) for line in lines}
    assert totals == {"120"}, lines
    assert lines[-1].startswith("translate: 120 of 120 sentences (100 %)"), lines[-1]


def test_counted_progress_draws_a_bar_on_a_terminal_and_prints_lines_elsewhere():
    """reluformer_mt.console.Progress (translate, datastore build, prepare, contrastive scoring)."""
    from reluformer_mt.console import Progress

    pipe, terminal, off = io.StringIO(), Terminal(), io.StringIO()
    for stream, enabled in ((pipe, True), (terminal, True), (off, False)):
        progress = Progress(4, "datastore", "batches", enabled=enabled, every=0, stream=stream)
        for _ in range(3):
            progress.update(1)
        progress.add(2)
        progress.set_postfix("2 added")
        progress.update(3)
        progress.close()
    lines = pipe.getvalue().splitlines()
    assert lines[0] == "datastore: 1 of 4 batches (25 %) in 0 s, about 0 s left"
    assert lines[-1] == "datastore: 6 of 6 batches (100 %) in 0 s; 2 added" and "\r" not in pipe.getvalue()
    assert "\r" in terminal.getvalue() and "datastore" in terminal.getvalue()  # tqdm's bar
    assert off.getvalue() == ""
