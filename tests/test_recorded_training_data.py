"""A checkpoint records its training data by the relative path it was trained with. Run from another
folder, --data naming that very directory (its path ends with the recorded one) is the training
data: the rekey and the datastore build accept it (they refused it since the vocabulary check, as
if its vocabulary could not be checked); another directory is still refused."""
import shutil

import pytest

from test_hardening_commands import checkpoint_copy
from test_hardening_outputs_and_rekeying import one_line
from test_learned_keys import key_checkpoint, key_data  # noqa: F401 (fixtures: a memory model and its data)


def memory_main(argv, capsys):
    from reluformer_mt.cli.memory import main

    code = main([str(a) for a in argv])
    return code, "\n".join(line for line in capsys.readouterr().err.splitlines() if "INFO:" not in line)


def training_folder(tmp_path, data, checkpoint):
    """The run's folder as training left it (its data under runs/demo/data/sent), the checkpoint
    recording that relative path, and another folder to run from."""
    run = tmp_path / "run"
    shutil.copytree(data, run / "runs" / "demo" / "data" / "sent")
    moved = checkpoint_copy(checkpoint, tmp_path / "model.pt", data="runs/demo/data/sent")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return run / "runs" / "demo" / "data" / "sent", moved, elsewhere


def test_rekey_of_the_recorded_data_from_another_folder(key_checkpoint, key_data, tmp_path, capsys,  # noqa: F811
                                                        monkeypatch):
    data, moved, elsewhere = training_folder(tmp_path, key_data, key_checkpoint)
    monkeypatch.chdir(elsewhere)
    code, err = memory_main(["rekey", "-c", moved, "--data", data, "--quiet"], capsys)
    assert code == 0, err


def test_another_directory_whose_vocabulary_cannot_be_checked_is_still_refused(key_checkpoint, key_data,  # noqa: F811
                                                                              tmp_path, capsys, monkeypatch):
    _, moved, elsewhere = training_folder(tmp_path, key_data, key_checkpoint)
    other = tmp_path / "other"
    shutil.copytree(key_data, other)
    monkeypatch.chdir(elsewhere)
    code, err = memory_main(["datastore", "build", "-c", moved, "--data", other, "--out", tmp_path / "store",
                             "--quiet"], capsys)
    one_line(code, err, r"--data .*other: cannot check that it holds the vocabulary of .*model\.pt")


@pytest.mark.parametrize("recorded,given,same", [("runs/demo/data/sent", "/x/runs/demo/data/sent", True),
                                                 ("./runs/demo/data/sent", "/x/runs/demo/data/sent", True),
                                                 ("runs/demo/data/sent", "/x/runs/other/data/sent", False),
                                                 ("../data/sent", "/x/data/sent", False),
                                                 ("/abs/data/sent", "/abs/data/sent", False)])
def test_which_paths_are_the_recorded_data(recorded, given, same, tmp_path):
    import types

    from reluformer_mt.checkpoints import is_recorded_data

    directory = tmp_path / given.lstrip("/")
    directory.mkdir(parents=True)
    cfg = types.SimpleNamespace(task=types.SimpleNamespace(data=recorded))
    assert is_recorded_data(directory, cfg) is same
