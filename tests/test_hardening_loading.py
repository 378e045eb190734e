"""Files the project loads, validated when they are opened: a kNN datastore whose arrays, index or
description were damaged or edited, an adaptive network file truncated or edited, bad values in
either blamed on the file (not on an option the user never gave), and option ranges checked
before any work. Each case through the command a user runs: one line, exit 2, naming the file or
option and what was expected."""
import json
import shutil

import numpy as np
import pytest

from test_hardening_outputs_and_rekeying import one_line
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
    "a tuned probe of 0": (lambda s: edit_meta(s, lambda m: set_in(m, "tuned.full", {"probe": 0})),
                           r"datastore\.json: tuned\.full\.probe 0: expected a positive integer or null"),
    "a tuned search interval of text": (lambda s: edit_meta(s, lambda m: set_in(m, "tuned.full", {"search_every": "2"})),
                                        r"datastore\.json: tuned\.full\.search_every \"2\": expected a positive integer"),
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


def truncate_pairs(store):
    data = (store / "pairs.npy").read_bytes()
    (store / "pairs.npy").write_bytes(data[:len(data) // 2])


PAIRS_DAMAGES = {
    "truncated": (truncate_pairs, r"pairs\.npy: not a readable array of plain numbers \(.*\)"),
    "pickled": (lambda s: np.save(s / "pairs.npy", np.array([1, "x"], dtype=object), allow_pickle=True),
                r"pairs\.npy: not a readable array of plain numbers \(.*\)"),
    "floats": (lambda s: np.save(s / "pairs.npy", np.load(s / "pairs.npy").astype(np.float64)),
               r"pairs\.npy: expected a 1-d array of unsigned integers, got float64"),
    "another count": (lambda s: np.save(s / "pairs.npy", np.load(s / "pairs.npy")[:-3]),
                      r"pairs\.npy: (\d+) sentence-pair hashes, datastore\.json says the entries come from \d+ sentences"),
}


@pytest.mark.parametrize("case", list(PAIRS_DAMAGES))
def test_a_damaged_pairs_file_is_one_line_before_the_tuning(case, datastore, doc_checkpoint, tmp_path, capsys):
    """On main the tuner's leakage check read pairs.npy unchecked: numpy's traceback for a truncated
    or pickled file, and a file of another datastore compared without a word."""
    damage, message = PAIRS_DAMAGES[case]
    store = copy_of(datastore, tmp_path)
    damage(store)
    report = tmp_path / "tuned.json"
    code, err = memory_main(["tune", "--checkpoint", doc_checkpoint, "--knn", store, "--no-decode", "--device", "cpu",
                             "--json", report], capsys)
    errors = [line for line in err.splitlines() if "INFO:" not in line]
    one_line(code, "\n".join(errors), message)
    assert str(store) in err and not report.exists()


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


# ---------------------------------------------------------------- demo summaries: seeds and readme_table

def demo_run(folder, seed, summary):
    """A finished demo run's report files, with ``summary`` as its summary.json."""
    report = folder / "report"
    report.mkdir(parents=True, exist_ok=True)
    (report / "summary.json").write_text(json.dumps(summary))
    (report / "report.json").write_text(json.dumps({"options": {"seed": seed}}))
    return folder


def good_summary(s_bleu=5.0):
    return {"families": {"softmax": {"s_bleu": s_bleu, "d_bleu": 2 * s_bleu, "aer_head_average": 0.7,
                                     "modes": {"constrained": {"s_bleu": s_bleu, "d_bleu": 2 * s_bleu}}},
                         "reluformer": {"s_bleu": s_bleu - 1, "d_bleu": 2 * s_bleu - 2, "aer_head_average": 0.75}},
            "baselines": {"nearest_verse": {"s_bleu": 16.38, "d_bleu": 22.21}}}


def lacking_a_column():
    summary = good_summary()
    del summary["families"]["reluformer"]["d_bleu"]
    return summary


def with_a_string_score():
    summary = good_summary()
    summary["families"]["softmax"]["modes"]["constrained"]["s_bleu"] = "5.0"
    return summary


BAD_SUMMARIES = {
    "a list": ([1, 2], r"summary\.json: the whole file: expected a JSON object, got \[1, 2\]"),
    "an empty object": ({}, r"summary\.json: families: expected an object of the families' scores, got null"),
    "a family without its d-BLEU": (lacking_a_column(), r"summary\.json: families\.reluformer: no d_bleu; expected "
                                                        r"the scores s_bleu, d_bleu, aer_head_average of every family"),
    "a score that is text": (with_a_string_score(),
                             r"summary\.json: families\.softmax\.modes\.constrained\.s_bleu: expected a number, got \"5\.0\""),
}


def seeds_main(argv, capsys):
    from reluformer_mt.experiments import seeds

    code = seeds.main([str(a) for a in argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", list(BAD_SUMMARIES))
def test_seeds_and_readme_table_refuse_a_bad_summary_in_one_line(case, tmp_path, capsys, monkeypatch):
    """On main: tracebacks (KeyError, TypeError in the mean, AttributeError on a list)."""
    from reluformer_mt.experiments import readme_table

    summary, message = BAD_SUMMARIES[case]
    runs = [demo_run(tmp_path / "a", 1, good_summary()), demo_run(tmp_path / "b", 2, summary)]
    code, err = seeds_main([*runs, "--report-dir", tmp_path / "out"], capsys)
    one_line(code, err, message)
    assert str(runs[1]) in err and not (tmp_path / "out").exists()

    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- demo-table:begin -->\n<!-- demo-table:end -->\n")
    monkeypatch.setattr(readme_table, "README", readme)
    monkeypatch.setattr(readme_table, "SUMMARY_COPY", tmp_path / "copy.json")
    code = readme_table.main([str(runs[1] / "report" / "summary.json")])
    one_line(code, capsys.readouterr().err, message)
    assert readme.read_text() == "x\n<!-- demo-table:begin -->\n<!-- demo-table:end -->\n"


def test_a_good_summary_still_makes_the_seed_report_and_the_table(tmp_path, capsys, monkeypatch):
    from reluformer_mt.experiments import readme_table

    runs = [demo_run(tmp_path / "a", 1, good_summary()), demo_run(tmp_path / "b", 2, good_summary(5.5))]
    code, err = seeds_main(runs, capsys)
    assert code == 0, err
    assert (runs[0] / "report" / "seeds.json").is_file()
    monkeypatch.setattr(readme_table, "ROOT", tmp_path)
    monkeypatch.setattr(readme_table, "README", tmp_path / "README.md")
    monkeypatch.setattr(readme_table, "SUMMARY_COPY", tmp_path / "copy.json")
    (tmp_path / "README.md").write_text("<!-- demo-table:begin -->\n<!-- demo-table:end -->\n")
    assert readme_table.main([str(runs[0] / "report" / "summary.json"), "--write"]) == 0
    assert "| softmax | **5.00** |" in (tmp_path / "README.md").read_text()


@pytest.mark.skipif(not __import__("os").path.isdir("/sys"), reason="needs /sys, a folder no one may write")
def test_seeds_report_dir_in_a_read_only_folder_is_one_line(tmp_path, capsys):
    """On main: a PermissionError traceback."""
    runs = [demo_run(tmp_path / "a", 1, good_summary()), demo_run(tmp_path / "b", 2, good_summary(5.5))]
    code, err = seeds_main([*runs, "--report-dir", "/sys/seeds-report"], capsys)
    one_line(code, err, r"--report-dir /sys/seeds-report: cannot write /sys/seeds-report \(Operation not permitted\)")


README_WRITE = """\
import sys
from pathlib import Path
from reluformer_mt.experiments import readme_table
readme_table.README, readme_table.SUMMARY_COPY = Path(sys.argv[1]), Path(sys.argv[2])
sys.exit(readme_table.main([sys.argv[3], "--write"]))
"""


def test_readme_table_write_that_fails_is_one_line(tmp_path):
    """A README.md that cannot be written (a full disk here: files limited to 16 KiB; read-only
    alike), a summary copy that cannot be written and a README without the table's markers: on
    main an OSError / ValueError traceback. The README is left as it was."""
    import subprocess
    import sys

    from test_hardening_commands import with_file_size_limit

    summary = demo_run(tmp_path / "run", 1, good_summary()) / "report" / "summary.json"
    readme = tmp_path / "README.md"
    original = "# title\n" + "filler line\n" * 3000 + "<!-- demo-table:begin -->\n<!-- demo-table:end -->\n"
    readme.write_text(original)

    def write(readme_path, copy_path, limit=None):
        return subprocess.run([sys.executable, "-c", README_WRITE, str(readme_path), str(copy_path), str(summary)],
                              capture_output=True, text=True, timeout=120,
                              preexec_fn=with_file_size_limit(limit) if limit else None)

    done = write(readme, tmp_path / "copy.json", limit=16 * 1024)
    one_line(done.returncode, done.stderr, rf"readme_table: error: cannot write {readme} \(File too large\)")
    assert readme.read_text() == original and not list(tmp_path.glob(".README.md*"))
    done = write(readme, "/sys/demo_summary.json")
    one_line(done.returncode, done.stderr, r"readme_table: error: cannot write /sys/demo_summary\.json \(")
    unmarked = tmp_path / "UNMARKED.md"
    unmarked.write_text("# no table here\n")
    done = write(unmarked, tmp_path / "copy2.json")
    one_line(done.returncode, done.stderr, rf"readme_table: error: {unmarked}: no demo table to rewrite; expected a "
                                           r"block from '<!-- demo-table:begin' to '<!-- demo-table:end -->'")
    assert unmarked.read_text() == "# no table here\n" and not (tmp_path / "copy2.json").exists()


# ---------------------------------------------------------------- reluformer-eval bleu, gpu_check.sh --wheels

def bleu_files(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("a b c d\ne f g\n", encoding="utf-8")
    ref.write_text("a b c d\ne f h\n", encoding="utf-8")
    return hyp, ref


def test_eval_bleu_option_and_input_errors_are_one_line(tmp_path, capsys):
    """On main: -w -1 gave "Format specifier missing precision", a reference folder "file not found"."""
    from test_bad_input_commands import eval_main

    hyp, ref = bleu_files(tmp_path)
    try:
        code, err = eval_main(["bleu", "--hyp", hyp, "--ref", ref, "--levels", "s", "-w", "-1"], capsys)
    except SystemExit as e:
        code, err = e.code, capsys.readouterr().err
    one_line(code, err, r"-w/--width: .*an integer >= 0")
    code, err = eval_main(["bleu", "--hyp", hyp, "--ref", tmp_path, "--levels", "s"], capsys)
    one_line(code, err, rf"{tmp_path}: a directory, expected a text file")
    code, err = eval_main(["bleu", "--hyp", hyp, "--ref", ref, "--levels", "s", "-w", "3"], capsys)
    assert code == 0, err


def test_eval_bleu_flores200_offline_says_the_tokenizer_needs_a_download(tmp_path, capsys, monkeypatch):
    """On main: "cannot write an output file". The download is refused here as offline."""
    import urllib.request
    from pathlib import Path

    from test_bad_input_commands import eval_main

    from sacrebleu.tokenizers import tokenizer_spm

    # no model cached: sacreBLEU downloads it (its folder was read from $SACREBLEU when it was imported)
    monkeypatch.setattr(tokenizer_spm, "SACREBLEU_DIR", str(tmp_path / "sacrebleu-cache"))

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.setattr(urllib.request, "urlretrieve", offline)
    hyp, ref = bleu_files(tmp_path)
    code, err = eval_main(["bleu", "--hyp", hyp, "--ref", ref, "--levels", "s", "--tokenize", "flores200"], capsys)
    one_line(code, err, r"--tokenize flores200: sacreBLEU downloads its SentencePiece model on first use and could not")
    assert "cannot write" not in err and not any(Path(tmp_path / "sacrebleu-cache").rglob("*.model"))


def test_gpu_check_wheels_relative_to_the_callers_folder(tmp_path):
    """On main the script changed into the checkout first: --wheels wheels was 'no such folder'."""
    import subprocess
    import sys

    from helpers import REPO

    folder = tmp_path / "wheels"
    folder.mkdir()
    (folder / "x-1.0-py3-none-any.whl").write_bytes(b"x")
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--dry-run", "--wheels", "wheels"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env=dict(__import__("os").environ, PYTHON=sys.executable))
    assert done.returncode == 0, done.stderr
    assert "wheel folder: 1 wheels" in done.stdout, done.stdout


# ---------------------------------------------------------------- the memory's neighbour files

from test_learned_keys import key_data  # noqa: E402,F401 (fixture: a directory prepared with --memory-k 4)


def neighbours_copy(key_data, tmp_path):  # noqa: F811
    data = tmp_path / "data"
    shutil.copytree(key_data, data)
    return data, data / "memory" / "train.ids.npy", data / "memory" / "train.scores.npy"


def entries_of(data):
    return json.loads((data / "prepared.json").read_text())["memory"]["entries"]


NEIGHBOUR_DAMAGES = {
    # (damage of (ids path, scores path, entries), the error expected)
    "an id beyond the memory": (lambda ids, scores, n: np.save(ids, np.full_like(np.load(ids), n)),
                                r"train\.ids\.npy: entry id (\d+), expected -1 for none or one of the memory's \1 entries"),
    "an id below -1": (lambda ids, scores, n: np.save(ids, np.full_like(np.load(ids), -7)),
                       r"train\.ids\.npy: entry id -7, expected -1 for none or one of the memory's"),
    "float ids": (lambda ids, scores, n: np.save(ids, np.load(ids).astype(np.float32)),
                  r"train\.ids\.npy: expected a 2-d array of integers, got float32"),
    "truncated ids": (lambda ids, scores, n: ids.write_bytes(ids.read_bytes()[:200]),
                      r"train\.ids\.npy: not a readable array of plain numbers"),
    "pickled scores": (lambda ids, scores, n: np.save(scores, np.array([[0.5, "x"]], dtype=object), allow_pickle=True),
                       r"train\.scores\.npy: not a readable array of plain numbers"),
    "rows of another split": (lambda ids, scores, n: (np.save(ids, np.load(ids)[:-2]), np.save(scores, np.load(scores)[:-2])),
                              r"train\.ids\.npy: shape \(\d+, 4\), expected \(\d+, 4\) \(the split's sentences"),
    "scores of another shape": (lambda ids, scores, n: np.save(scores, np.load(scores)[:, :2]),
                                r"train\.scores\.npy: shape \(\d+, 2\), expected that of train\.ids\.npy"),
}


@pytest.mark.parametrize("case", list(NEIGHBOUR_DAMAGES))
def test_damaged_neighbour_files_are_one_line_naming_the_file(case, key_data, tmp_path):  # noqa: F811
    """On main the neighbours were read unchecked: an id beyond the memory was an IndexError when the
    training examples were built (or silently another entry's target), numpy's lines named no file."""
    from reluformer_mt.memory.neighbours import load_neighbours
    from reluformer_mt.memory.tm import TranslationMemoryError

    data, ids, scores = neighbours_copy(key_data, tmp_path)
    damage, message = NEIGHBOUR_DAMAGES[case]
    damage(ids, scores, entries_of(data))
    with pytest.raises(TranslationMemoryError, match=message) as raised:
        load_neighbours(data, "train", 2)
    assert str(data / "memory") in str(raised.value) and "\n" not in str(raised.value)


def test_the_key_loss_positives_refuse_neighbours_beyond_the_memory(key_data, tmp_path):  # noqa: F811
    """The key loss's positives index the memory's targets with the TF-IDF neighbours: on main an
    IndexError."""
    from reluformer_mt.memory.learned_keys import positives_of
    from reluformer_mt.memory.tm import TranslationMemoryError

    data, ids, _ = neighbours_copy(key_data, tmp_path)
    for name in ("train.positive.npy", "train.positive.json"):
        (data / "memory" / name).unlink(missing_ok=True)
    np.save(ids, np.full_like(np.load(ids), entries_of(data) + 5))
    with pytest.raises(TranslationMemoryError, match=r"train\.ids\.npy: entry id \d+, expected -1 for none or one of"):
        positives_of(data)
    assert load_ok(key_data)


def load_ok(key_data):  # noqa: F811
    """The control: the untouched directory's neighbours load."""
    from reluformer_mt.memory.neighbours import load_neighbours

    ids, scores = load_neighbours(key_data, "train", 2)
    return ids.shape == scores.shape and ids.shape[1] == 2


def test_a_damaged_shard_of_a_killed_build_is_computed_again(doc_checkpoint, datastore, tmp_path, monkeypatch):
    """A killed datastore build leaves shards a rerun resumes from; one that was truncated or
    edited (another dtype) used to be read as it was. It is computed again: the rerun's arrays
    equal a clean build's."""
    import json

    import numpy as np

    from reluformer_mt.knn import datastore as ds

    monkeypatch.setattr(ds, "SHARD_BATCHES", 1)  # several shards from the tiny split
    out = tmp_path / "store"
    clean = ds.build_datastore(doc_checkpoint, tmp_path / "clean", progress=False)
    shards = out / "shards"
    shards.mkdir(parents=True)
    source = json.loads((clean.directory / "datastore.json").read_text())
    # what a killed first run left: two shards, one of the wrong dtype, one truncated
    np.savez(shards / "00000.npz", keys=np.zeros((3, source["dim"]), dtype=np.float32), values=np.zeros(3, np.int32))
    (shards / "00001.npz").write_bytes(b"PK\x03\x04 truncated")
    rebuilt = ds.build_datastore(doc_checkpoint, out, progress=False)
    assert np.array_equal(np.load(out / "keys.npy"), np.load(clean.directory / "keys.npy"))
    assert np.array_equal(np.load(out / "values.npy"), np.load(clean.directory / "values.npy"))
    assert rebuilt.meta["resumed_shards"] == 0 and not shards.exists()
