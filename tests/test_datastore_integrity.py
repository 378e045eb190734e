"""A kNN-MT datastore's build and load against what can silently go wrong: outputs that are links
(to a checkpoint), a killed build's shard edited in place (same dtype and shape) or its plan.json
damaged, the data directory prepared again after the build, keys that hold NaN or inf. Each is a
one-line refusal naming the file, a counted repair, or the clean build's arrays."""
import json
import shutil

import numpy as np
import pytest
import torch

from test_hardening_outputs_and_rekeying import one_line
from test_hardening_loading import memory_main, source_file
from test_translate import FAST, translate_main


@pytest.fixture(scope="module")
def datastore(doc_checkpoint, tmp_path_factory):
    from reluformer_mt.knn.datastore import build_datastore

    return build_datastore(doc_checkpoint, tmp_path_factory.mktemp("knn") / "store", progress=False).directory


def build_argv(checkpoint, out, *extra):
    return ["datastore", "build", "--checkpoint", checkpoint, "--out", out, "--quiet", *extra]


def errors_of(err):
    return "\n".join(line for line in err.splitlines() if "INFO:" not in line)  # fairseq's lines loading the split


# ---------------------------------------------------------------- outputs that are links

def test_a_leftover_shard_linked_to_a_checkpoint_copy_is_refused(doc_checkpoint, tmp_path, capsys):
    """The shard was recomputed and written through the link, over the checkpoint copy."""
    copy = tmp_path / "copy.pt"
    shutil.copy(doc_checkpoint, copy)
    out = tmp_path / "store"
    (out / "shards").mkdir(parents=True)
    (out / "shards" / "00000.npz").symlink_to(copy)
    code, err = memory_main(build_argv(doc_checkpoint, out), capsys)
    one_line(code, errors_of(err), r"--out .*store: shards/00000\.npz is a symbolic link \(to .*copy\.pt\); .*remove it")
    assert copy.read_bytes() == doc_checkpoint.read_bytes()


def test_force_into_a_folder_whose_keys_link_to_a_checkpoint_is_refused(doc_checkpoint, datastore, tmp_path, capsys):
    copy = tmp_path / "copy.pt"
    shutil.copy(doc_checkpoint, copy)
    out = tmp_path / "store"
    shutil.copytree(datastore, out)
    (out / "keys.npy").unlink()
    (out / "keys.npy").symlink_to(copy)
    code, err = memory_main(build_argv(doc_checkpoint, out, "--force"), capsys)
    one_line(code, errors_of(err), r"keys\.npy is a symbolic link \(to .*copy\.pt\)")
    assert copy.read_bytes() == doc_checkpoint.read_bytes()


def test_tune_into_a_datastore_whose_adaptive_file_links_to_a_checkpoint_is_refused(doc_checkpoint, datastore,
                                                                                      tmp_path, capsys):
    """The tuner writes adaptive.npz and datastore.json into the datastore's folder: not through a link."""
    copy = tmp_path / "copy.pt"
    shutil.copy(doc_checkpoint, copy)
    store = tmp_path / "store"
    shutil.copytree(datastore, store)
    (store / "adaptive.npz").symlink_to(copy)
    code, err = memory_main(["tune", "--checkpoint", doc_checkpoint, "--knn", store, "--no-decode"], capsys)
    one_line(code, errors_of(err), r"--knn .*store: adaptive\.npz is a symbolic link \(to .*copy\.pt\)")
    assert copy.read_bytes() == doc_checkpoint.read_bytes()


# ---------------------------------------------------------------- a killed build's shards

def killed_build(doc_checkpoint, out, monkeypatch):
    """A build with one batch per shard stopped after its shards were written (before the index)."""
    from reluformer_mt.knn import datastore as ds

    monkeypatch.setattr(ds, "SHARD_BATCHES", 1)

    def killed(*args):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(ds, "build_index", killed)
        with pytest.raises(KeyboardInterrupt):
            ds.build_datastore(doc_checkpoint, out, progress=False)
    assert len(list((out / "shards").glob("*.npz"))) >= 2
    return ds


def test_a_shard_with_zeroed_keys_is_computed_again(doc_checkpoint, datastore, tmp_path, monkeypatch):
    """Keys zeroed in place (the same dtype and shape, the other arrays kept) used to be trusted."""
    out = tmp_path / "store"
    ds = killed_build(doc_checkpoint, out, monkeypatch)
    shard = out / "shards" / "00000.npz"
    with np.load(shard) as saved:
        arrays = {name: saved[name] for name in saved.files}
    arrays["keys"] = np.zeros_like(arrays["keys"])
    np.savez(shard, **arrays)
    shards = len(list((out / "shards").glob("*.npz")))
    rebuilt = ds.build_datastore(doc_checkpoint, out, progress=False)
    assert np.array_equal(np.load(out / "keys.npy"), np.load(datastore / "keys.npy"))
    assert rebuilt.meta["resumed_shards"] == shards - 1  # the others were trusted


def test_a_damaged_plan_is_a_counted_restart(doc_checkpoint, datastore, tmp_path, monkeypatch, caplog):
    """A plan.json that is not JSON was a one-line error naming no file; the shards of a plan that
    cannot be read are computed again (said in the log, naming it)."""
    out = tmp_path / "store"
    ds = killed_build(doc_checkpoint, out, monkeypatch)
    (out / "shards" / "plan.json").write_bytes(b"\xff{ truncated")
    with caplog.at_level("WARNING"):
        rebuilt = ds.build_datastore(doc_checkpoint, out, progress=False)
    assert rebuilt.meta["resumed_shards"] == 0
    assert any("plan.json: unreadable" in r.getMessage() for r in caplog.records)
    assert np.array_equal(np.load(out / "keys.npy"), np.load(datastore / "keys.npy"))


# ---------------------------------------------------------------- NaN and inf keys

def test_nan_keys_are_refused_at_load_and_counted_by_info(doc_checkpoint, datastore, tmp_path, capsys):
    store = tmp_path / "store"
    shutil.copytree(datastore, store)
    keys = np.load(store / "keys.npy")
    keys[3, 0], keys[7, 5] = np.nan, np.inf
    np.save(store / "keys.npy", keys)
    code, err = translate_main(["--checkpoint", doc_checkpoint, "--input", source_file(tmp_path), "--output",
                                tmp_path / "out.txt", "--knn", store, *FAST], capsys)
    one_line(code, err, r"keys\.npy: 2 of [\d,]+ keys hold NaN or inf; rebuild it .*--drop-nonfinite")
    assert not (tmp_path / "out.txt").exists()


def test_info_says_how_many_keys_are_not_finite(datastore, tmp_path, capsys):
    from reluformer_mt.cli.memory import main

    store = tmp_path / "store"
    shutil.copytree(datastore, store)
    keys = np.load(store / "keys.npy")
    keys[1, 1] = np.nan
    np.save(store / "keys.npy", keys)
    assert main(["datastore", "info", str(store)]) == 0
    assert "keys: 1 of" in capsys.readouterr().out
    assert main(["datastore", "info", str(datastore)]) == 0
    assert "keys: all finite" in capsys.readouterr().out


def overflowing_checkpoint(doc_checkpoint, path):
    """The checkpoint with one channel of the decoder's last layer norm (the states' last operation
    in this post-norm model) scaled so that some states exceed float16's +-65504 there (inf keys)."""
    state = torch.load(doc_checkpoint, map_location="cpu", weights_only=False)
    last = max(name for name in state["model"] if name.endswith("final_layer_norm.weight") and "decoder." in name)
    state["model"][last][0] = 4e4
    torch.save(state, path)
    return path


def test_keys_beyond_float16_are_refused_or_dropped_at_build(doc_checkpoint, tmp_path, capsys):
    """An IVF index over them failed with a bare faiss error; an exact one was built over inf keys."""
    checkpoint = overflowing_checkpoint(doc_checkpoint, tmp_path / "wide.pt")
    out = tmp_path / "store"
    code, err = memory_main(build_argv(checkpoint, out, "--index", "ivf"), capsys)
    one_line(code, errors_of(err), r"[\d,]+ of [\d,]+ decoder states of train hold NaN or inf .*--drop-nonfinite")
    assert not (out / "datastore.json").exists() and (out / "shards").is_dir()  # the rerun resumes
    from reluformer_mt.knn.datastore import Datastore, build_datastore

    store = build_datastore(checkpoint, out, progress=False, drop_nonfinite=True)
    assert 0 < store.meta["dropped_nonfinite"] and store.meta["resumed_shards"] >= 1
    assert Datastore.load(out).nonfinite_keys() == 0 and np.isfinite(np.load(out / "keys.npy")).all()


# ---------------------------------------------------------------- data prepared again after the build

def test_data_prepared_again_in_another_order_is_refused_with_knn_restrict(doc_checkpoint, prepared_doc_data,
                                                                          tmp_path, capsys):
    """The same path, the same number of sentences, another order: each sentence searched other
    sentences' entries (memory entry i was no longer the datastore's sentence i)."""
    from reluformer_mt.knn.datastore import build_datastore

    data = tmp_path / "data"
    shutil.copytree(prepared_doc_data["doc"], data)
    store = build_datastore(doc_checkpoint, tmp_path / "store", data=data, progress=False).directory
    argv = ["--checkpoint", doc_checkpoint, "--data", data, "--input", source_file(tmp_path), "--output",
            tmp_path / "out.txt", "--knn", store, "--knn-restrict", "2", *FAST]
    assert translate_main(argv, capsys)[0] == 0  # the control: the data as built
    for lang in ("en", "de"):  # prepared again: the segments in another order
        path = data / "text" / f"train.{lang}"
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        path.write_text("".join(lines[1:] + lines[:1]), encoding="utf-8")
    code, err = translate_main(argv, capsys)
    one_line(code, err, r"text/train\.\{en,de\}: [\d,]+ of [\d,]+ sentence pairs differ from .*pairs\.npy .*rebuild")
