"""End to end: prepare sentence- and document-level directories from real data, re-run skipping,
train a few updates with fairseq-train --user-dir reluformer_mt, and the task's refusals."""
import json
import logging
import os
import sys
from pathlib import Path

import pytest

from reluformer_mt.data.prepare import PrepareConfig, prepare
from reluformer_mt.data.segments import SEPARATOR, read_segment_metadata, split_segment

SHARED = Path(os.environ.get("RELUFORMER_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
NC = SHARED / "docmt_ende" / "NC-2016"
pytestmark = pytest.mark.skipif(not NC.is_dir(), reason=f"shared data not found at {SHARED} (set RELUFORMER_SHARED_DATA)")
USER_DIR = str(Path(__file__).resolve().parents[1] / "reluformer_mt")


def nc(split):
    return [str(NC / f"concatenated_en2de_{split}_en.txt"), str(NC / f"concatenated_en2de_{split}_de.txt")]


def small_config(out, **kw):
    # NC dev: last 3 documents held out as valid, then the first 12 documents of each split
    base = dict(out=str(out), fmt="docmt", src="en", tgt="de", train=[nc("dev")], test=[nc("test")],
                valid_from_train=3, limit_docs=12, vocab_size=600, joined_dictionary=True, progress=False)
    base.update(kw)
    return PrepareConfig(**base)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("prep")
    doc = root / "doc128"
    prepare(small_config(doc, segment_tokens=128))
    sent = root / "sent"
    prepare(small_config(sent, segment_tokens="sentence", spm_models=[str(doc / "spm.model")]))
    return doc, sent


def test_prepared_directory_contents(prepared):
    doc, sent = prepared
    m = json.loads((doc / "prepared.json").read_text())
    assert m["src_lang"] == "en" and m["tgt_lang"] == "de" and m["segment_tokens"] == 128
    assert m["separator"] == SEPARATOR and (doc / m["spm_model"]).is_file()
    assert m["max_source_positions"] <= 129 or m["warnings"]
    for split in ("train", "valid", "test"):
        assert (doc / f"{split}.en-de.en.bin").is_file() and (doc / f"{split}.segments.tsv").is_file()
    # the separator is one entry of both dictionaries, and both directories share the dictionary
    assert any(line.split()[0] == SEPARATOR for line in (doc / "dict.en.txt").read_text().splitlines())
    assert (doc / "dict.de.txt").read_text() == (sent / "dict.de.txt").read_text()
    infos = read_segment_metadata(sent / "train.segments.tsv")
    assert all(i.n_sentences == 1 for i in infos)
    assert json.loads((sent / "prepared.json").read_text())["level"] == "sentence"
    # the one reader: sentence level is None; the reused model (one string 'SRC,TGT' or a list) is joint
    from reluformer_mt.data.prepared import Prepared

    p_doc, p_sent = Prepared.load(doc), Prepared.load(sent)
    assert (p_doc.segment_tokens, p_sent.segment_tokens, p_sent.level) == (128, None, "sentence")
    assert p_doc.splits["train"].segments == len(read_segment_metadata(doc / "train.segments.tsv"))
    assert p_doc.positions == max(m["max_source_positions"], m["max_target_positions"])
    sp_src, sp_tgt = p_sent.sentencepiece()
    assert sp_src is sp_tgt and sp_src.piece_to_id(SEPARATOR) != sp_src.unk_id()


def test_segments_split_back_into_the_encoded_sentences(prepared):
    import sentencepiece as spm

    from reluformer_mt.data.readers import Report, read_docmt

    doc, _ = prepared
    sp = spm.SentencePieceProcessor(model_file=str(doc / "spm.model"))
    docs = read_docmt(*nc("test"), Report())[:12]
    infos = read_segment_metadata(doc / "test.segments.tsv")
    lines = (doc / "text" / "test.de").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == len(infos)
    by_doc = {}
    for line, info in zip(lines, infos):
        assert info.first_sentence == len(by_doc.get(info.doc_id, []))
        by_doc.setdefault(info.doc_id, []).extend(sp.decode_pieces(p.split()) for p in split_segment(line, expected=info.n_sentences))
    for d in docs:
        assert by_doc[d.doc_id] == [sp.decode_pieces(sp.encode(t, out_type=str)) for t in d.tgt]


def test_rerun_skips_changed_options_refused_force_redoes(prepared, capsys):
    doc, _ = prepared
    prepare(small_config(doc, segment_tokens=128))
    out = capsys.readouterr().out
    assert out.count("already done with these options, skipping") == 3
    assert "== prepare summary ==" in out and "train: documents in: 12" in out and "CRLF line end normalised" in out
    with pytest.raises(ValueError, match=r"step 'encode' was done with other options.*segment_tokens.*--force"):
        prepare(small_config(doc, segment_tokens=100))


def test_overlong_sentences_are_warned_and_counted(tmp_path):
    report = prepare(small_config(tmp_path / "tiny", segment_tokens=12, limit_docs=3))
    key = "sentence longer than N=12 tokens, kept as its own segment"
    assert report.warnings[key] > 0
    m = json.loads((tmp_path / "tiny" / "prepared.json").read_text())
    assert m["warnings"][key] == report.warnings[key]


def test_cli_errors_are_one_line(tmp_path, capsys):
    from reluformer_mt.cli.prepare import main

    assert main(["--train", str(tmp_path / "x.en"), str(tmp_path / "x.de"), "--valid-from-train", "1", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "x.en: file not found" in err and "Traceback" not in err


TINY = ["--arch", "reluformer_tiny", "--criterion", "reluformer_cross_entropy", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
        "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--max-update", "2", "--max-tokens", "2000",
        "--num-workers", "0", "--no-save", "--optimizer", "adam", "--lr", "0.001", "--cpu", "--seed", "1",
        "--no-progress-bar", "--log-format", "simple"]


def fairseq_train(monkeypatch, argv):
    from reluformer_mt.fairseq_runner import run_fairseq

    run_fairseq("train", argv)


def test_sentence_level_directory_trains(prepared, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    _, sent = prepared
    fairseq_train(monkeypatch, [str(sent), "--user-dir", USER_DIR, "--task", "translation", "--disable-validation"] + TINY)
    assert "done training" in caplog.text


def test_document_level_directory_trains_with_doc_bleu(prepared, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    doc, _ = prepared
    fairseq_train(monkeypatch, [str(doc), "--user-dir", USER_DIR, "--task", "document_translation",
                                "--max-source-positions", "256", "--max-target-positions", "256",
                                "--eval-bleu", "--eval-bleu-args", '{"beam": 1, "max_len_a": 0, "max_len_b": 8}'] + TINY)
    assert "d_bleu" in caplog.text and "s_bleu" in caplog.text and "done training" in caplog.text


def test_document_task_refuses_too_long_segments(prepared, monkeypatch):
    doc, _ = prepared
    with pytest.raises(ValueError, match=r"valid: example \d+ \(document .*sentences .*\) has \d+ source / \d+ target tokens.*--max-source-positions"):
        fairseq_train(monkeypatch, [str(doc), "--user-dir", USER_DIR, "--task", "document_translation",
                                    "--max-source-positions", "20", "--max-target-positions", "20"] + TINY)


def test_bleu_function_perfect_and_mismatch():
    from reluformer_mt.data.segments import SegmentInfo
    from reluformer_mt.tasks.document_translation import sentence_and_document_bleu

    infos = [SegmentInfo("d1", 2, 0), SegmentInfo("d1", 1, 2), SegmentInfo("d2", 1, 0)]
    refs = {0: "the cat sat on the mat <sep> it was happy today", 1: "then it slept on the sofa all day", 2: "a different document entirely here"}
    s, d, mis = sentence_and_document_bleu(dict(refs), refs, infos)
    assert s == pytest.approx(100.0) and d == pytest.approx(100.0) and mis == 0
    hyps = {**refs, 0: "the cat sat on the mat it was happy today"}  # separator lost
    s, d, mis = sentence_and_document_bleu(hyps, refs, infos)
    assert mis == 1 and s < 100.0 and d == pytest.approx(100.0)


def test_force_with_another_input_removes_the_old_outputs(tmp_path, capsys):
    """--force with another input leaves no split, dictionary or SentencePiece model of the old
    run behind; files the run did not write (and an input inside --out) are kept."""
    out = tmp_path / "p"
    prepare(small_config(out, limit_docs=2, src="de", tgt="en", train=[nc("dev")[::-1]], test=[nc("test")[::-1]]))
    assert (out / "test.de-en.de.bin").is_file() and (out / "dict.de.txt").is_file()
    (out / "notes.txt").write_text("mine\n")
    prepare(small_config(out, limit_docs=2, test=[], force=True))  # en->de, no test split
    names = sorted(p.name for p in out.iterdir())
    assert not [n for n in names if n.startswith("test.") or ".de-en." in n]
    assert not list((out / "text").glob("test.*")) and (out / "notes.txt").read_text() == "mine\n"
    assert "--force: removed" in capsys.readouterr().out
    m = json.loads((out / "prepared.json").read_text())
    assert set(m["splits"]) == {"train", "valid"} and m["src_lang"] == "en"
    # the SentencePiece model reused from inside --out is an input: never deleted
    prepare(small_config(out, limit_docs=2, test=[], force=True, spm_models=[str(out / "spm.model")]))
    assert (out / "spm.model").is_file() and (out / "train.en-de.en.bin").is_file()


def test_cli_out_file_vocab_size_and_disk_full_are_one_line(tmp_path, capsys, monkeypatch):
    from reluformer_mt.cli.prepare import main

    args = ["--train", *nc("dev"), "--valid-from-train", "1", "--limit-docs", "2"]
    for bad in (["--vocab-size", "0"], ["--vocab-size", "-5"], ["--workers", "0"], ["--limit-docs", "-1"]):
        with pytest.raises(SystemExit) as e:
            main([*args, *bad, "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"argument {bad[0]}: expected " in err and "Traceback" not in err
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for out, says in ((a_file, "is a file, expected a folder"), (a_file / "sub", f"lies under the file {a_file}")):
        assert main([*args, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"reluformer-prepare: error: --out {out}: {says}") and err.count("\n") == 1

    import reluformer_mt.data.prepare as prep

    def disk_full(path, segments):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(prep, "write_segment_metadata", disk_full)
    assert main([*args, "--vocab-size", "600", "--no-progress", "--out", str(tmp_path / "full")]) == 2
    err = capsys.readouterr().err.strip().split("\n")[-1]
    assert err == f"reluformer-prepare: error: cannot write {tmp_path / 'full' / 'train.segments.tsv'}: No space left on device"
