"""Files the project loads, validated when they are opened: a kNN datastore whose arrays, index or
description were damaged or edited, an adaptive network file truncated or edited, bad values in
either blamed on the file (not on an option the user never gave), and option ranges checked
before any work. Each case through the command a user runs: one line, exit 2, naming the file or
option and what was expected."""
import json
import shutil

import numpy as np
import pytest

from test_hardening_issue34 import one_line
from test_translate import FAST, translate_main


@pytest.fixture(scope="module")
def datastore(doc_checkpoint, tmp_path_factory):
    """An exact datastore of the tiny document model over its training split."""
    from reluformer_mt.knn.datastore import build_datastore

    return build_datastore(doc_checkpoint, tmp_path_factory.mktemp("knn") / "store", progress=False).directory


def copy_of(datastore, tmp_path):
    target = tmp_path / "store"
    shutil.copytree(datastore, target)
    return target


def source_file(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("Thank you very much.\nI would like to tell you a story.\n", encoding="utf-8")
    return path


def translate_with(store, doc_checkpoint, tmp_path, capsys, *extra):
    out = tmp_path / "out.txt"
    code, err = translate_main(["--checkpoint", doc_checkpoint, "--input", source_file(tmp_path), "--output", out,
                                "--knn", store, *FAST, *extra], capsys)
    return code, err, out


def edit_meta(store, edit):
    meta = json.loads((store / "datastore.json").read_text())
    meta = edit(meta)
    (store / "datastore.json").write_text(json.dumps(meta))


def set_in(meta, path, value):
    *parents, last = path.split(".")
    node = meta
    for name in parents:
        node = node.setdefault(name, {})
    node[last] = value
    return meta


def test_the_datastore_opens_and_translates(datastore, doc_checkpoint, tmp_path, capsys):
    """The control: the untouched datastore translates (exit 0)."""
    code, err, out = translate_with(datastore, doc_checkpoint, tmp_path, capsys)
    assert code == 0, err
    assert len(out.read_text().splitlines()) == 2


def damage_values_beyond_the_vocabulary(store):
    values = np.load(store / "values.npy")
    values[3] = 1_000_000
    np.save(store / "values.npy", values)


def damage_keys_width(store):
    np.save(store / "keys.npy", np.load(store / "keys.npy")[:, :16])
    edit_meta(store, lambda m: set_in(m, "dim", 16))


def damage_keys_against_the_description(store):
    np.save(store / "keys.npy", np.load(store / "keys.npy")[:, :16])


def truncate_keys(store):
    data = (store / "keys.npy").read_bytes()
    (store / "keys.npy").write_bytes(data[:len(data) // 2])


def pickle_values(store):
    values = np.load(store / "values.npy")
    np.save(store / "values.npy", np.array(list(values), dtype=object), allow_pickle=True)


def random_index(store):
    (store / "index.faiss").write_bytes(np.random.default_rng(0).bytes(4096))
    edit_meta(store, lambda m: set_in(m, "index", {"kind": "ivf", "nprobe": 4}))


def index_of_another_kind(store):
    from reluformer_mt.knn.datastore import build_index

    build_index("hnsw", np.load(store / "keys.npy").astype(np.float32), store / "index.faiss")
    edit_meta(store, lambda m: set_in(m, "index", {"kind": "ivf", "nprobe": 4}))


DAMAGES = {
    # (damage, the one line expected)
    "values beyond the vocabulary": (damage_values_beyond_the_vocabulary,
                                     r"values\.npy: token id 1000000 outside the model's target dictionary of \d+ ids"),
    "a description that is a list": (lambda s: (s / "datastore.json").write_text("[1, 2]"),
                                     r"datastore\.json: expected a JSON object .*got list"),
    "keys of another width than the model's states": (damage_keys_width,
                                                      r"keys\.npy: keys of dim 16, the model's decoder states have 32"),
    "keys of another width than described": (damage_keys_against_the_description,
                                             r"keys\.npy: keys of width 16, datastore\.json says dim 32"),
    "truncated keys": (truncate_keys, r"keys\.npy: not a readable array of plain numbers \(.*\)"),
    "pickled values": (pickle_values, r"values\.npy: not a readable array of plain numbers \(.*\)"),
    "an index of random bytes": (random_index, r"index\.faiss: not a faiss index"),
    "an index of another kind": (index_of_another_kind,
                                 r"index\.faiss: a IndexHNSWFlat, but datastore\.json names a ivf index"),
    "an unknown index kind": (lambda s: edit_meta(s, lambda m: set_in(m, "index.kind", "flat")),
                              r"datastore\.json: index\.kind \"flat\": expected one of exact, hnsw, ivf"),
    "a bad nprobe": (lambda s: edit_meta(s, lambda m: set_in(m, "index", {"kind": "ivf", "nprobe": 0})),
                     r"datastore\.json: index\.nprobe 0: expected a positive integer"),
    "a size that is text": (lambda s: edit_meta(s, lambda m: set_in(m, "size", "many")),
                            r"datastore\.json: size \"many\": expected the number of entries"),
    "a tuned lambda out of range": (lambda s: edit_meta(s, lambda m: set_in(m, "tuned.full", {"lam": 3.0})),
                                    r"datastore\.json: tuned\.full\.lam: expected a share between 0 and 1, got 3\.0"),
    "a tuned k of text": (lambda s: edit_meta(s, lambda m: set_in(m, "tuned.full", {"k": "8"})),
                          r"datastore\.json: tuned\.full\.k: expected 1 to 2048 neighbours per step, got '8'"),
    "a tuned temperature of 0": (lambda s: edit_meta(s, lambda m: set_in(m, "tuned.full", {"temperature": 0})),
                                 r"datastore\.json: tuned\.full\.temperature: expected a positive number, got 0"),
}


@pytest.mark.parametrize("case", list(DAMAGES))
def test_a_damaged_datastore_is_one_line_naming_its_file(case, datastore, doc_checkpoint, tmp_path, capsys):
    """On main: tracebacks (an id beyond the vocabulary during beam search, a list, random index
    bytes, keys of another width), numpy's lines without the file, and bad tuned values blamed on
    --knn-lambda / --knn-k / --knn-temperature, options the user never gave."""
    damage, message = DAMAGES[case]
    store = copy_of(datastore, tmp_path)
    damage(store)
    code, err, out = translate_with(store, doc_checkpoint, tmp_path, capsys)
    one_line(code, err, message)
    assert str(store) in err and "--knn-" not in err
    assert not out.exists()  # refused when the datastore was opened, before decoding


# ---------------------------------------------------------------- the adaptive network's file

def adaptive_file(store, **config):
    """A real adaptive.npz beside ``store``, written by the tuner's own writer."""
    from reluformer_mt.knn.adaptive import MetaK, MetaKConfig

    meta = json.loads((store / "datastore.json").read_text())
    MetaK(MetaKConfig(k_max=8, **config)).save(store, meta["fingerprint"], report={})
    return store / "adaptive.npz"


def edit_header(path, edit):
    with np.load(path) as saved:
        arrays = {k: saved[k] for k in saved.files}
    header = edit(json.loads(str(arrays["header"])))
    arrays["header"] = np.array(json.dumps(header))
    with open(path, "wb") as f:
        np.savez(f, **arrays)


ADAPTIVE_DAMAGES = {
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:300]), r"adaptive\.npz: not an adaptive network file \(.*\)"),
    "not a zip": (lambda p: p.write_bytes(b"PK\x03\x04" + bytes(200)), r"adaptive\.npz: not an adaptive network file"),
    "a temperature of -1": (lambda p: edit_header(p, lambda h: set_in(h, "config.temperature", -1)),
                            r"adaptive\.npz: config\.temperature: expected a positive number, got -1"),
    "an unknown readout": (lambda p: edit_header(p, lambda h: set_in(h, "config.readout", "max")),
                           r"adaptive\.npz: config\.readout: got \"max\", expected one of softmax"),
    "a k_max of its weights": (lambda p: edit_header(p, lambda h: set_in(h, "config.k_max", 16)),
                               r"adaptive\.npz: its weights do not fit its config"),
    "a k_max of 0": (lambda p: edit_header(p, lambda h: set_in(h, "config.k_max", 0)),
                     r"adaptive\.npz: config\.k_max: expected a positive integer, got 0"),
    "a header that is a list": (lambda p: edit_header(p, lambda h: [h]), r"adaptive\.npz: its header is list"),
}


@pytest.mark.parametrize("case", list(ADAPTIVE_DAMAGES))
def test_a_damaged_adaptive_network_is_one_line_naming_its_file(case, datastore, doc_checkpoint, tmp_path, capsys):
    """On main: BadZipFile and load_state_dict tracebacks, a config's temperature blamed on
    --knn-temperature."""
    damage, message = ADAPTIVE_DAMAGES[case]
    store = copy_of(datastore, tmp_path)
    path = adaptive_file(store)
    damage(path)
    code, err, out = translate_with(store, doc_checkpoint, tmp_path, capsys, "--knn-adaptive")
    one_line(code, err, message)
    assert "--knn-temperature" not in err and not out.exists()


def test_an_intact_adaptive_network_translates(datastore, doc_checkpoint, tmp_path, capsys):
    store = copy_of(datastore, tmp_path)
    adaptive_file(store)
    code, err, out = translate_with(store, doc_checkpoint, tmp_path, capsys, "--knn-adaptive")
    assert code == 0, err


# ---------------------------------------------------------------- option ranges, before any work

def test_knn_k_beyond_its_maximum_is_refused_before_the_search(datastore, doc_checkpoint, tmp_path, capsys):
    """On main numpy tried to allocate 1.46 TiB for the search's result."""
    code, err, out = translate_with(datastore, doc_checkpoint, tmp_path, capsys, "--knn-k", "99999999999")
    one_line(code, err, r"--knn-k: expected 1 to 2048 neighbours per step, got 99999999999")
    assert not out.exists()


def memory_main(argv, capsys):
    from reluformer_mt.cli.memory import main

    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_datastore_build_with_max_tokens_below_the_longest_segment(doc_checkpoint, tmp_path, capsys):
    """On main fairseq's batching failed on an AssertionError."""
    out = tmp_path / "store"
    code, err = memory_main(["datastore", "build", "--checkpoint", doc_checkpoint, "--out", out, "--max-tokens", "20"],
                            capsys)
    errors = [line for line in err.splitlines() if "INFO:" not in line]  # fairseq's lines loading the split
    one_line(code, "\n".join(errors), r"--max-tokens 20: below the longest segment of train \(\d+ tokens\); give at least \d+")
    assert not (out / "datastore.json").exists()


def test_tune_with_a_negative_pieces_k_is_refused_before_the_grid(doc_checkpoint, tmp_path, capsys):
    """On main the refusal came after the grid, the adaptive training and a validation decode."""
    report = tmp_path / "tuned.json"
    code, err = memory_main(["tune", "--checkpoint", doc_checkpoint, "--pieces-k", "-1", "--json", report], capsys)
    one_line(code, err, r"--pieces-k: expected a positive integer, got -1")
    assert not report.exists()
