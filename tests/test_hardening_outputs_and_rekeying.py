"""Hostile inputs and faults, through the commands: writing options that name an input
or another output, report folders with files of another shape, translate options that cannot
work together, a write error naming the right file, reports written whole or not at all, and a
re-keying killed half-way (translation and training refuse the directory)."""
import json
import re
import shutil

import numpy as np
import pytest

from test_bad_input_commands import eval_main
from test_learned_keys import key_checkpoint, key_data, loaded  # noqa: F401 (fixtures)
from test_translate import FAST, translate_main


def one_line(code, err, message):
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(message, err), err


# ---------------------------------------------------------------- outputs that are inputs or other outputs

def bleu_files(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("a b c d\ne f g\n", encoding="utf-8")
    ref.write_text("a b c d\ne f h\n", encoding="utf-8")
    return hyp, ref


def test_eval_json_and_html_on_one_file_is_refused(tmp_path, capsys):
    """On main --json r.json --html r.json replaced the JSON with the page."""
    hyp, ref = bleu_files(tmp_path)
    report = tmp_path / "r.json"
    code, err = eval_main(["bleu", "--hyp", hyp, "--ref", ref, "--levels", "s", "--json", report, "--html", report], capsys)
    one_line(code, err, r"--html .*r\.json: the same file as --json")
    assert not report.exists()


def test_eval_html_on_the_hypotheses_is_refused(tmp_path, capsys):
    """On main --html pointed at the hypothesis file overwrote it."""
    hyp, ref = bleu_files(tmp_path)
    before = hyp.read_bytes()
    code, err = eval_main(["bleu", "--hyp", hyp, "--ref", ref, "--levels", "s", "--html", hyp], capsys)
    one_line(code, err, r"--html .*hyp\.txt: the same file as the input --hyp")
    assert hyp.read_bytes() == before


def report_folder(tmp_path, **files):
    folder = tmp_path / "report"
    folder.mkdir()
    for name, content in files.items():
        path = folder / name.replace("_json", ".json")
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(json.dumps(content))
    return folder


def test_report_output_on_its_own_input_is_refused(tmp_path, capsys):
    folder = report_folder(tmp_path, table_json={"headers": ["system", "BLEU"], "rows": [["a", 1.0]]})
    before = (folder / "table.json").read_bytes()
    code, err = eval_main(["report", "--dir", folder, "--output", folder / "table.json"], capsys)
    one_line(code, err, r"--output .*table\.json: the same file as the input --dir")
    assert (folder / "table.json").read_bytes() == before


@pytest.mark.parametrize("files, message", [
    (dict(table_json={"headers": ["x"]}), r"table\.json: no 'rows'"),
    (dict(report_json=[1, 2]), r"report\.json: expected a JSON object, got a list"),
    (dict(metrics_json={"systems": {}, "definition": "d"}), r"metrics\.json: no 'bootstrap'"),
    (dict(metrics_json={"systems": {}, "definition": "d", "bootstrap": {"systems": {}}}),
     r"metrics\.json: 'bootstrap' needs"),
    (dict(report_json=b'{"a": "\xff"}'), r"report\.json: byte 7: not UTF-8"),
    (dict(), r"report: no report files"),
])
def test_report_folder_with_files_of_another_shape_is_one_line(tmp_path, capsys, files, message):
    """On main: KeyError / AttributeError tracebacks, a UnicodeDecodeError naming no file, and a
    page with only links for an empty folder."""
    folder = report_folder(tmp_path, **files)
    code, err = eval_main(["report", "--dir", folder], capsys)
    one_line(code, err, message)
    assert not (folder / "index.html").exists()


def test_reports_are_written_whole_or_not_at_all(tmp_path):
    """A report that fails half-way (here a value JSON cannot hold, after a thousand that it can)
    leaves the previous file as it was; on main it was left truncated."""
    from reluformer_mt.evaluation.reports import write_json

    path = tmp_path / "r.json"
    write_json(path, {"score": 1.0}, command="first")
    with pytest.raises(TypeError):
        write_json(path, {"a": list(range(1000)), "z": {1, 2}}, command="second")
    assert json.loads(path.read_text())["command"] == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left behind


# ---------------------------------------------------------------- translate

@pytest.mark.parametrize("extra, message", [
    (["--pieces-weight", "1e300"], r"--pieces-weight: .*expected a number in \[0, 10000\], got '1e300'"),
    (["--pieces-weight", "10", "--memory", "none"], r"--pieces-weight 10: translation pieces come from the memory, "
                                                    r"which --memory none withholds"),
    (["--memory", "none", "--memory-matches", "m.tsv"], r"--memory-matches: --memory none withholds the matches"),
])
def test_translate_options_that_cannot_work_together(doc_checkpoint, prepared_doc_data, tmp_path, capsys, extra, message):
    """On main: an AssertionError in fairseq's beam search, pieces silently off, and an error
    blaming the checkpoint."""
    src = tmp_path / "in.en"
    src.write_text("Thank you.\n", encoding="utf-8")
    argv = ["-c", doc_checkpoint, "--data", prepared_doc_data["doc"], "-i", src, "-o", tmp_path / "out.de", *FAST]
    try:
        code, err = translate_main(argv + [tmp_path / e if e == "m.tsv" else e for e in extra], capsys)
    except SystemExit as e:
        code, err = e.code, capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and re.search(message, err), err


def test_translate_write_error_names_the_file_that_failed(doc_checkpoint, prepared_doc_data, tmp_path, capsys):
    """On main a full disk under --memory-matches said 'cannot write out.de' (the close's flush
    failed outside the guard of that file)."""
    src = tmp_path / "in.en"
    src.write_text("Thank you.\n", encoding="utf-8")
    code, err = translate_main(["-c", doc_checkpoint, "--data", prepared_doc_data["doc"], "-i", src,
                                "-o", tmp_path / "out.de", "--scores", "/dev/full", "--quiet", *FAST], capsys)
    one_line(code, err, r"cannot write /dev/full")


# ---------------------------------------------------------------- rekey

def test_a_killed_rekey_leaves_a_directory_that_translation_refuses(key_checkpoint, key_data, tmp_path,  # noqa: F811
                                                                    monkeypatch):
    """On main a killed rekey left the training neighbours rewritten while prepared.json still said
    TF-IDF, and nothing marked the directory: training and translation mixed the two. They refuse
    it until the rekey is re-run, which completes it."""
    from reluformer_mt.memory.maintenance import rekey as rekey_lib
    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.memory.neighbours import load_neighbours
    from reluformer_mt.memory.tm import TranslationMemoryError

    data = tmp_path / "data"
    shutil.copytree(key_data, data)
    m = loaded(key_checkpoint, data)
    real, calls = rekey_lib.neighbours_from_keys, []

    def killed_after_the_first_split(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as SIGINT, between the training split and the next
        return real(*args, **kwargs)

    monkeypatch.setattr(rekey_lib, "neighbours_from_keys", killed_after_the_first_split)
    with pytest.raises(KeyboardInterrupt):
        rekey_lib.rekey(data, m.model, m.task.source_dictionary, progress=False)
    with pytest.raises(TranslationMemoryError, match=r"REWRITING: .*memory was left half rewritten "
                                                     r"\(reluformer-memory rekey"):
        DocumentTranslator(key_checkpoint, data=data, beam=1, max_len_a=0, max_len_b=4)
    with pytest.raises(TranslationMemoryError, match="half rewritten"):
        load_neighbours(data, "train", 2)
    monkeypatch.setattr(rekey_lib, "neighbours_from_keys", real)
    rekey_lib.rekey(data, m.model, m.task.source_dictionary, progress=False)  # the rerun completes it
    assert load_neighbours(data, "train", 2)[0].shape[1] == 2


def test_rekey_options_are_checked_before_the_neighbours_change(key_checkpoint, key_data, tmp_path,  # noqa: F811
                                                                 capsys):
    """On main --json nodir/r.json failed after rewriting the neighbours; --max-tokens 0 was accepted."""
    from reluformer_mt.cli.memory import main

    data = tmp_path / "data"
    shutil.copytree(key_data, data)
    before = np.load(data / "memory" / "train.ids.npy")
    for extra, message in ((["--json", tmp_path / "nodir" / "r.json"], r"--json .*r\.json: folder .*nodir does not exist"),
                           (["--json", data / "prepared.json"], r"--json .*prepared\.json: the same file as the input"),
                           (["--max-tokens", "0"], r"--max-tokens: .*expected a positive integer, got '0'")):
        try:
            code = main([str(a) for a in ["rekey", "-c", key_checkpoint, "--data", data, "--quiet", *extra]])
        except SystemExit as e:
            code = e.code
        one_line(code, capsys.readouterr().err, message)
        assert np.array_equal(np.load(data / "memory" / "train.ids.npy"), before)
        assert not (data / "memory" / "REWRITING").exists()


# ---------------------------------------------------------------- prepare

def test_refused_prepare_rerun_with_another_memory_k_keeps_the_memory_entry(key_data, tmp_path):  # noqa: F811
    """On main the refusal came after prepare() had rewritten prepared.json without its memory entry."""
    from conftest import prepare_iwslt_with_memory
    from reluformer_mt.data.prepared import Prepared

    data = tmp_path / "data"
    shutil.copytree(key_data, data)
    spm = data / "spm.model"
    before = Prepared.load(data).memory
    with pytest.raises(ValueError, match=r"step 'memory' was done with --memory-k 4 \(changed: k\); pass --force"):
        prepare_iwslt_with_memory(data, spm, segment_tokens=0, memory_k=6)
    assert Prepared.load(data).memory == before


# ---------------------------------------------------------------- tm_study

@pytest.mark.parametrize("argv, message", [
    (["--ks", "abc"], r"--ks: expected a comma list of positive integers, got 'abc'"),
    (["--ks", "0"], r"--ks: expected a comma list of positive integers, got '0'"),
    (["--updates", "-5"], r"--updates: expected a positive integer, got '-5'"),
    (["--updates", "0"], r"--updates: expected a positive integer, got '0'"),
])
def test_tm_study_numbers_are_one_line(argv, message, tmp_path, capsys):
    """On main: a ValueError traceback for 'abc', a run for k = 0, a row for -5 updates and a run
    without end for 0 (fairseq's 'no limit')."""
    from reluformer_mt.cli import tm_study

    with pytest.raises(SystemExit) as e:
        tm_study.main(argv + ["--out", str(tmp_path / "out")])
    one_line(e.value.code, capsys.readouterr().err, message)
    assert not (tmp_path / "out").exists()


def test_bleu_tokenizer_without_its_package_is_one_line(tmp_path, capsys):
    """On main `--tokenize ja-mecab` without MeCab was sacreBLEU's RuntimeError, a traceback."""
    pytest.importorskip("sacrebleu")
    try:
        import MeCab  # noqa: F401
        pytest.skip("MeCab is installed here")
    except ImportError:
        pass
    hyp, ref = bleu_files(tmp_path)
    code, err = eval_main(["bleu", "--hyp", hyp, "--ref", ref, "--levels", "s", "--tokenize", "ja-mecab"], capsys)
    one_line(code, err, r"--tokenize ja-mecab: its extra dependencies are not installed \(.*pip install sacrebleu\[ja\]\)")
