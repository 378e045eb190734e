"""Commands that write, hardened: an output is never one of the inputs (compared as files:
symlinks and hard links too), models are combined only with data, datastores and other models
of their own vocabulary, every writer is atomic, a killed re-keying reruns to the end, and the
experiment modules refuse what they cannot do instead of exiting 0."""
import os
import re

import pytest


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
    code, err = main_of(memory, ["rekey", "-c", tmp_path / "missing.pt", "--data", data, "--json", ids], capsys)
    one_line(code, err, r"--json .*train\.ids\.npy: the same file as the input --data")


def test_seed_report_over_a_run_summary_is_refused(tmp_path):
    """A --report-dir whose seeds.json is a run's summary.json (a link) would replace it."""
    import json

    from reluformer_mt.experiments.seeds import write_seed_report

    runs = []
    for seed in (1, 2):
        report = tmp_path / f"run{seed}" / "report"
        report.mkdir(parents=True)
        (report / "summary.json").write_text(json.dumps({"families": {"softmax": {"s_bleu": 1.0}}}))
        (report / "report.json").write_text(json.dumps({"options": {"seed": seed}}))
        runs.append(report.parent)
    out = tmp_path / "out"
    out.mkdir()
    (out / "seeds.json").symlink_to(runs[1] / "report" / "summary.json")
    with pytest.raises(ValueError, match=r"--report-dir .*seeds\.json: the same file as the input runs .*summary\.json"):
        write_seed_report(runs, report_dir=out)
