"""Commands that write, hardened: an output is never one of the inputs (compared as files:
symlinks and hard links too), models are combined only with data, datastores and other models
of their own vocabulary, every writer is atomic, a killed re-keying reruns to the end, and the
experiment modules refuse what they cannot do instead of exiting 0."""
import os
import re

import pytest

from helpers import SHARED_DATA


def one_line(code, err, message):
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(message, err), err


def main_of(module, argv, capsys):
    """(exit code, stderr) of a console script's main, whether argparse exits or main returns."""
    try:
        code = module.main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def a_file(path, content=b"the checkpoint's bytes"):
    path.write_bytes(content)
    return path


# ---------------------------------------------------------------- outputs never equal to inputs

@pytest.mark.parametrize("link", ["same", "symlink", "hardlink"])
def test_tune_json_on_its_own_checkpoint_is_refused(tmp_path, capsys, link):
    """Before, `reluformer-memory tune --json CKPT` wrote the report over the checkpoint."""
    from reluformer_mt.cli import memory

    checkpoint = a_file(tmp_path / "checkpoint.pt")
    report = {"same": checkpoint, "symlink": tmp_path / "report.json", "hardlink": tmp_path / "report.json"}[link]
    if link == "symlink":
        report.symlink_to(checkpoint)
    elif link == "hardlink":
        os.link(checkpoint, report)
    code, err = main_of(memory, ["tune", "-c", checkpoint, "--json", report, "--no-decode"], capsys)
    one_line(code, err, r"--json .*: the same file as the input --checkpoint .*checkpoint\.pt")
    assert checkpoint.read_bytes() == b"the checkpoint's bytes"


def test_tune_json_on_a_datastore_file_is_refused(tmp_path, capsys):
    from reluformer_mt.cli import memory

    checkpoint, store = a_file(tmp_path / "checkpoint.pt"), tmp_path / "store"
    store.mkdir()
    meta = a_file(store / "datastore.json", b"{}")
    code, err = main_of(memory, ["tune", "-c", checkpoint, "--knn", store, "--json", meta], capsys)
    one_line(code, err, r"--json .*datastore\.json: the same file as the input --knn")
    assert meta.read_bytes() == b"{}"


def test_average_output_hard_linked_to_an_input_is_refused(tmp_path, capsys):
    """Before, only resolved paths were compared: a hard link to an input was overwritten."""
    from reluformer_mt.cli import average

    a, b = a_file(tmp_path / "a.pt"), a_file(tmp_path / "b.pt")
    os.link(b, tmp_path / "avg.pt")
    code, err = main_of(average, ["--inputs", a, b, "-o", tmp_path / "avg.pt"], capsys)
    one_line(code, err, r"--output .*avg\.pt: the same file as the input --inputs .*b\.pt")
    code, err = main_of(average, ["--inputs", b, tmp_path / "avg.pt", "-o", tmp_path / "new.pt"], capsys)
    one_line(code, err, r"--inputs .*avg\.pt: the same file as --inputs .*b\.pt; it would count double")


def test_rekey_json_on_a_neighbour_file_is_refused(tmp_path, capsys):
    """Before, only prepared.json was guarded: --json DATA/memory/train.ids.npy was written over
    the neighbours the re-keying had just rewritten."""
    from reluformer_mt.cli import memory

    data = tmp_path / "data"
    (data / "memory").mkdir(parents=True)
    a_file(data / "prepared.json", b"{}")
    ids = a_file(data / "memory" / "train.ids.npy", b"ids")
    checkpoint = a_file(tmp_path / "model.pt", b"not read: the outputs are checked first")
    code, err = main_of(memory, ["rekey", "-c", checkpoint, "--data", data, "--json", ids], capsys)
    one_line(code, err, r"--json .*train\.ids\.npy: the same file as the input --data")


# the scores every family of a demo summary has (experiments/summaries.py checks them)
SCORES = {"s_bleu": 1.0, "d_bleu": 2.0, "aer_head_average": 0.7}


def test_seed_report_over_a_run_summary_is_refused(tmp_path):
    """A --report-dir whose seeds.json is a run's summary.json (a link) would replace it."""
    import json

    from reluformer_mt.experiments.seeds import write_seed_report

    runs = []
    for seed in (1, 2):
        report = tmp_path / f"run{seed}" / "report"
        report.mkdir(parents=True)
        (report / "summary.json").write_text(json.dumps({"families": {"softmax": SCORES}}))
        (report / "report.json").write_text(json.dumps({"options": {"seed": seed}}))
        runs.append(report.parent)
    out = tmp_path / "out"
    out.mkdir()
    (out / "seeds.json").symlink_to(runs[1] / "report" / "summary.json")
    with pytest.raises(ValueError, match=r"--report-dir .*seeds\.json: the same file as the input runs .*summary\.json"):
        write_seed_report(runs, report_dir=out)


# ---------------------------------------------------------------- one vocabulary, compared by content

@pytest.fixture(scope="module")
def other_vocabulary(prepared_doc_data, tmp_path_factory):
    """The document directory with two symbols of its (joined) dictionaries swapped: the same
    size, the same SentencePiece model, another vocabulary (its binarised ids unchanged)."""
    import shutil

    out = tmp_path_factory.mktemp("other_vocabulary") / "doc128"
    shutil.copytree(prepared_doc_data["doc"], out)
    for lang in ("en", "de"):
        path = out / f"dict.{lang}.txt"
        lines = path.read_text(encoding="utf-8").splitlines()
        lines[20], lines[21] = lines[21], lines[20]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def checkpoint_copy(source, dest, data=None, **model):
    """``source`` saved again as ``dest`` with another recorded training data / model options."""
    import argparse

    import torch

    state = torch.load(source, map_location="cpu", weights_only=False)
    if data is not None:
        state["cfg"]["task"]["data"] = str(data)
    for key, value in model.items():
        m = state["cfg"]["model"]
        setattr(m, key, value) if isinstance(m, argparse.Namespace) else m.__setitem__(key, value)
    torch.save(state, dest)
    return dest


OTHER_DICTIONARIES = r"its source dictionary and target dictionary differ from the checkpoint .*, compared by content"


def test_datastore_build_refuses_data_of_another_vocabulary(doc_checkpoint, other_vocabulary, tmp_path, capsys):
    """Before, the directory was force-decoded without a word: its ids mean other pieces to the model."""
    from reluformer_mt.cli import memory

    code, err = main_of(memory, ["datastore", "build", "-c", doc_checkpoint, "--data", other_vocabulary,
                                 "--out", tmp_path / "store", "--quiet"], capsys)
    one_line(code, err, rf"--data {re.escape(str(other_vocabulary))}: {OTHER_DICTIONARIES}")
    assert not (tmp_path / "store").exists()


def test_tune_refuses_data_of_another_vocabulary(doc_checkpoint, other_vocabulary, tmp_path, capsys):
    from reluformer_mt.cli import memory

    code, err = main_of(memory, ["tune", "-c", doc_checkpoint, "--data", other_vocabulary, "--no-decode",
                                 "--device", "cpu", "--json", tmp_path / "t.json"], capsys)
    one_line(code, err, rf"--data {re.escape(str(other_vocabulary))}: {OTHER_DICTIONARIES}")
    assert not (tmp_path / "t.json").exists()


def test_translate_refuses_an_ensemble_member_of_another_vocabulary(doc_checkpoint, prepared_doc_data,
                                                                    other_vocabulary, tmp_path, capsys):
    """Before, with --data both members read the same dictionaries and the ensemble averaged
    probabilities over different pieces; a --data of another vocabulary was used as well."""
    from reluformer_mt.cli import translate

    other = checkpoint_copy(doc_checkpoint, tmp_path / "other.pt", data=other_vocabulary)
    src = tmp_path / "in.en"
    src.write_text("Thank you.\n", encoding="utf-8")
    fast = ["--beam", "1", "--max-len-a", "0", "--max-len-b", "4", "--device", "cpu", "-o", tmp_path / "out.de"]
    code, err = main_of(translate, ["-c", doc_checkpoint, other, "--data", prepared_doc_data["doc"], "-i", src, *fast],
                        capsys)
    one_line(code, err, rf"--checkpoint {re.escape(str(other))}: {OTHER_DICTIONARIES}.*models combined need one vocabulary")
    code, err = main_of(translate, ["-c", doc_checkpoint, "--data", other_vocabulary, "-i", src, *fast], capsys)
    one_line(code, err, rf"--data {re.escape(str(other_vocabulary))}: {OTHER_DICTIONARIES}")
    assert not (tmp_path / "out.de").exists()


def test_average_refuses_another_vocabulary_and_another_architecture(doc_checkpoint, other_vocabulary, tmp_path,
                                                                     capsys):
    """Before, both were averaged: the weights have the same names and shapes."""
    from reluformer_mt.cli import average

    other = checkpoint_copy(doc_checkpoint, tmp_path / "other.pt", data=other_vocabulary)
    code, err = main_of(average, ["--inputs", doc_checkpoint, other, "-o", tmp_path / "avg.pt"], capsys)
    one_line(code, err, rf"{re.escape(str(other))}: {OTHER_DICTIONARIES.replace('the checkpoint ', '')}"
                        r".*average checkpoints of one model")
    plain = checkpoint_copy(doc_checkpoint, tmp_path / "transformer.pt", arch="transformer", _name="transformer")
    code, err = main_of(average, ["--inputs", doc_checkpoint, plain, "-o", tmp_path / "avg.pt"], capsys)
    one_line(code, err, r"transformer\.pt: its architecture is 'transformer', .*'reluformer_tiny': another model")
    softmax = checkpoint_copy(doc_checkpoint, tmp_path / "softmax.pt", cross_attn_fn="softmax")
    code, err = main_of(average, ["--inputs", doc_checkpoint, softmax, "-o", tmp_path / "avg.pt"], capsys)
    one_line(code, err, r"softmax\.pt: its --cross-attn-fn is 'softmax', .*'relu': another model")
    assert not (tmp_path / "avg.pt").exists()


@pytest.mark.parametrize("command", ["rekey", "datastore"])
def test_data_whose_vocabulary_cannot_be_checked_is_refused(command, doc_checkpoint, prepared_doc_data, tmp_path,
                                                            capsys, monkeypatch):
    """Before, rekey skipped its SentencePiece check when the checkpoint's relative training-data
    path did not resolve from the current folder, and rewrote the neighbours."""
    import shutil

    from reluformer_mt.cli import memory

    data = tmp_path / "data"
    shutil.copytree(prepared_doc_data["doc"], data)
    (tmp_path / "ckpt").mkdir()
    moved = checkpoint_copy(doc_checkpoint, tmp_path / "ckpt" / "model.pt", data="runs/demo/data/doc128")
    monkeypatch.chdir(tmp_path)
    argv = (["rekey", "-c", moved, "--data", data, "--quiet"] if command == "rekey" else
            ["datastore", "build", "-c", moved, "--data", data, "--out", tmp_path / "store", "--quiet"])
    code, err = main_of(memory, argv, capsys)
    one_line(code, err, rf"--data {re.escape(str(data))}: cannot check that it holds the vocabulary of .*model\.pt: "
                        r"the training data it records \(runs/demo/data/doc128\) is not found from .* and no dict\.en\.txt")
    assert not (tmp_path / "store").exists() and not (data / "memory" / "REWRITING").exists()
    for name in ("dict.en.txt", "dict.de.txt", "prepared.json", "spm.model"):  # its resources beside it: checked
        shutil.copy(prepared_doc_data["doc"] / name, tmp_path / "ckpt")
    if command == "datastore":
        code, err = main_of(memory, argv, capsys)
        assert code == 0 and (tmp_path / "store" / "datastore.json").is_file(), err



EVAL_COMMANDS = {  # each subcommand that force-decodes with a model, with what it reads
    "align": lambda src, tmp: ["--src", src, "--tgt", src, "--output", tmp / "links.align"],
    "attn-stats": lambda src, tmp: ["--split", "valid"],
    "cxmi": lambda src, tmp: ["--split", "valid", "--bootstrap", "10"],
    "contrastive": lambda src, tmp: ["--suite", "contrapro", "--suite-dir", SHARED_DATA / "contrapro_ctx1",
                                     "--limit", "2"],
    "memory": lambda src, tmp: ["--split", "valid", "--max-batches", "1"],
}


@pytest.mark.parametrize("command", sorted(EVAL_COMMANDS))
def test_eval_refuses_data_of_another_vocabulary(command, doc_checkpoint, other_vocabulary, tmp_path, capsys):
    """Before, reluformer-eval force-decoded a --data of another vocabulary (of the same size) without
    a word: its binarised ids and its dictionaries' pieces mean other tokens to the model."""
    from reluformer_mt.cli import eval as eval_cli

    if command == "contrastive" and not (SHARED_DATA / "contrapro_ctx1").is_dir():
        pytest.skip("ContraPro not found")
    src = tmp_path / "in.txt"
    src.write_text("Thank you .\n", encoding="utf-8")
    argv = [command, "--checkpoint", doc_checkpoint, "--data", other_vocabulary, "--device", "cpu",
            *EVAL_COMMANDS[command](src, tmp_path), "--json", tmp_path / "report.json"]
    code, err = main_of(eval_cli, argv, capsys)
    one_line(code, err, rf"--data {re.escape(str(other_vocabulary))}: {OTHER_DICTIONARIES}")
    assert not (tmp_path / "report.json").exists() and not (tmp_path / "links.align").exists()


def test_eval_refuses_a_compared_checkpoint_of_another_vocabulary_before_any_work(doc_checkpoint, prepared_doc_data,
                                                                                   other_vocabulary, tmp_path, capsys):
    """align and attn-stats compare several checkpoints on one --data: the last one's vocabulary is
    checked before the first one is force-decoded."""
    from reluformer_mt.cli import eval as eval_cli

    other = checkpoint_copy(doc_checkpoint, tmp_path / "other.pt", data=other_vocabulary)
    src = tmp_path / "in.txt"
    src.write_text("Thank you .\n", encoding="utf-8")
    code, err = main_of(eval_cli, ["align", "--checkpoint", doc_checkpoint, other, "--data", prepared_doc_data["doc"],
                                   "--src", src, "--tgt", src, "--output", tmp_path / "links.align", "--device", "cpu"],
                        capsys)
    one_line(code, err, rf"--data {re.escape(str(prepared_doc_data['doc']))}: {OTHER_DICTIONARIES}")
    assert re.search(r"differ from the checkpoint .*other\.pt's", err), err
    assert not list(tmp_path.glob("links*"))


def test_tune_json_on_the_training_data_it_reads_is_refused(doc_checkpoint, prepared_doc_data, tmp_path, capsys):
    """Without --data the tuner reads the checkpoint's training data: its files are inputs too."""
    import shutil

    from reluformer_mt.cli import memory

    data = tmp_path / "data"
    shutil.copytree(prepared_doc_data["doc"], data)
    checkpoint = checkpoint_copy(doc_checkpoint, tmp_path / "model.pt", data=data)
    before = (data / "prepared.json").read_bytes()
    code, err = main_of(memory, ["tune", "-c", checkpoint, "--no-decode", "--device", "cpu",
                                 "--json", data / "prepared.json"], capsys)
    one_line(code, err, r"--json .*prepared\.json: the same file as the input --data .*prepared\.json")
    assert (data / "prepared.json").read_bytes() == before

# ---------------------------------------------------------------- writers: whole or not at all

def with_file_size_limit(limit: int):
    """A child process whose files cannot grow beyond ``limit`` bytes: each write past it fails
    with EFBIG, as on a full disk (SIGXFSZ ignored so that the write returns the error)."""
    import resource
    import signal

    def limit_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return limit_files


def test_average_on_a_full_disk_leaves_no_partial_output(doc_checkpoint, tmp_path, capsys):
    """Before, torch's RuntimeError (a traceback) and a partial avg.pt; -o /dev/full too."""
    from helpers import run_subprocess

    from reluformer_mt.cli import average

    second = checkpoint_copy(doc_checkpoint, tmp_path / "second.pt")
    code, err = main_of(average, ["--inputs", doc_checkpoint, second, "-o", "/dev/full"], capsys)
    one_line(code, err, r"reluformer-average: error: cannot write /dev/full: No space left on device")
    out = tmp_path / "out"
    out.mkdir()
    proc = run_subprocess(["reluformer-average", "--inputs", doc_checkpoint, second, "-o", out / "avg.pt"],
                          preexec_fn=with_file_size_limit(32 * 1024), timeout=300)
    one_line(proc.returncode, proc.stderr, rf"reluformer-average: error: cannot write {re.escape(str(out / 'avg.pt'))}: "
                                           r"File too large")
    assert list(out.iterdir()) == []  # neither avg.pt nor its temporary file


def test_datastore_build_on_a_full_disk_leaves_no_shard_a_rerun_would_trust(doc_checkpoint, tmp_path):
    """Before, 'cannot write' named the data directory instead of the shard, and the half-written
    shard stayed behind."""
    from helpers import run_subprocess

    store = tmp_path / "store"
    argv = ["reluformer-memory", "datastore", "build", "-c", doc_checkpoint, "--out", store, "--device", "cpu", "--quiet"]
    proc = run_subprocess(argv, preexec_fn=with_file_size_limit(16 * 1024), timeout=300)
    one_line(proc.returncode, proc.stderr, rf"reluformer-memory: error: cannot write {re.escape(str(store))}/shards/00000\.npz: "
                                           r"File too large")
    assert sorted(f.name for f in (store / "shards").iterdir()) == ["plan.json"]
    proc = run_subprocess(argv, timeout=300)  # the rerun on a disk with room: a whole datastore
    assert proc.returncode == 0 and (store / "datastore.json").is_file(), proc.stderr
    assert "resumed" not in proc.stdout


# ---------------------------------------------------------------- a killed rekey reruns to the end

from test_learned_keys import key_checkpoint, key_data  # noqa: E402,F401 (fixtures)


def test_a_rerun_completes_a_killed_rekey(key_checkpoint, key_data, tmp_path, capsys, monkeypatch):  # noqa: F811
    """Before, the REWRITING marker asked for a rerun and the rerun was refused because of it."""
    import json
    import shutil

    import numpy as np

    from reluformer_mt.checkpoints import load_model
    from reluformer_mt.cli import memory
    from reluformer_mt.memory.maintenance import rekey as rekey_lib

    unbroken, killed = tmp_path / "unbroken", tmp_path / "killed"
    shutil.copytree(key_data, unbroken)
    shutil.copytree(key_data, killed)
    tfidf = {f.name: f.read_bytes() for f in (key_data / "memory").glob("*.npy")}
    m = load_model(key_checkpoint, killed)
    real, calls = rekey_lib.neighbours_from_keys, []

    def killed_after_the_first_split(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as SIGINT, between the training split and the next
        return real(*args, **kwargs)

    monkeypatch.setattr(rekey_lib, "neighbours_from_keys", killed_after_the_first_split)
    with pytest.raises(KeyboardInterrupt):
        rekey_lib.rekey(killed, m.model, m.task.source_dictionary, checkpoint=str(key_checkpoint), progress=False)
    monkeypatch.setattr(rekey_lib, "neighbours_from_keys", real)
    assert (killed / "memory" / "REWRITING").is_file()
    # the kill's half-written state: the training split re-keyed, the others not, half a TF-IDF copy
    assert (killed / "memory" / "train.ids.npy").read_bytes() != tfidf["train.ids.npy"]
    (killed / "memory" / ".valid.ids.tfidf.npy.123.partial").write_bytes(b"half")
    for directory in (killed, unbroken):
        code, err = main_of(memory, ["rekey", "-c", key_checkpoint, "--data", directory, "--device", "cpu", "--quiet"],
                            capsys)
        assert code == 0, err
    assert not (killed / "memory" / "REWRITING").exists()
    for f in sorted((unbroken / "memory").glob("*.npy")):  # the neighbours an unbroken run writes
        assert np.array_equal(np.load(killed / "memory" / f.name), np.load(f)), f.name
        if f.name.endswith(".tfidf.npy"):  # and the TF-IDF ones kept as they were before any re-keying
            assert f.read_bytes() == tfidf[f.name.replace(".tfidf", "")]
    described = [json.loads((d / "prepared.json").read_text())["memory"] for d in (killed, unbroken)]
    for d in described:
        d.pop("seconds")
    assert described[0] == described[1] and described[0]["keys"].startswith("learned")


def test_rekey_still_refuses_a_memory_step_left_unfinished(key_checkpoint, key_data, tmp_path, capsys):  # noqa: F811
    import shutil

    from reluformer_mt.cli import memory
    from reluformer_mt.memory.neighbours import mark_rewriting

    data = tmp_path / "data"
    shutil.copytree(key_data, data)
    mark_rewriting(data, "reluformer-prepare's memory step")
    code, err = main_of(memory, ["rekey", "-c", key_checkpoint, "--data", data, "--device", "cpu", "--quiet"], capsys)
    one_line(code, err, r"REWRITING: .*left half rewritten \(reluformer-prepare's memory step\); re-run that command")


# ---------------------------------------------------------------- experiment modules: no silent exit 0

def seed_runs(tmp_path, families=("softmax", "reluformer")):
    import json

    runs = []
    for seed in (1, 2):
        report = tmp_path / f"run{seed}" / "report"
        report.mkdir(parents=True)
        scores = {f: {**SCORES, "s_bleu": 10.0 + seed + i} for i, f in enumerate(families)}
        (report / "summary.json").write_text(json.dumps({"families": scores}))
        (report / "report.json").write_text(json.dumps({"options": {"seed": seed}}))
        runs.append(report.parent)
    return runs


def test_seeds_with_an_unknown_baseline_is_one_line(tmp_path, capsys):
    """Before, --baseline bogus exited 0 and the comparison section was dropped without a word."""
    from reluformer_mt.experiments import seeds

    runs = seed_runs(tmp_path)
    code, err = main_of(seeds, [*runs, "--baseline", "bogus"], capsys)
    one_line(code, err, r"seeds: error: --baseline bogus: unknown family; the families of every run: softmax, reluformer")
    assert not (runs[0] / "report" / "seeds.json").exists()


def test_seeds_without_the_default_baseline_says_so(tmp_path, capsys):
    from reluformer_mt.experiments import seeds

    runs = seed_runs(tmp_path, families=("reluformer", "rela"))
    code, err = main_of(seeds, runs, capsys)
    assert code == 0, err
    assert "No comparison between families: softmax, the baseline, is not in every run." in \
        (runs[0] / "report" / "seeds.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("module, command", [("tm_study", "python -m reluformer_mt.cli.tm_study"),
                                             ("sweep", "reluformer-sweep")])
def test_an_old_study_command_line_says_where_the_command_is(module, command, tmp_path):
    """Before, `python -m reluformer_mt.experiments.tm_study --out ... --ks 1` exited 0 doing nothing."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", f"reluformer_mt.experiments.{module}", "--out", str(tmp_path / "o"),
                           "--ks", "1"], capture_output=True, text=True, timeout=300)
    one_line(proc.returncode, proc.stderr, rf"python -m reluformer_mt\.experiments\.{module}: error: this module is a "
                                           rf"library; its command line is '{re.escape(command)} --out .*o --ks 1'")
    assert not (tmp_path / "o").exists()
