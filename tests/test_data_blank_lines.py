"""reluformer-prepare reads the layout reluformer-translate writes and reluformer-eval reads: one
sentence a line, a blank line between documents (``--format lines``)."""
import json
import os
from pathlib import Path

import pytest

from reluformer_mt.data.readers import Report, read_corpus, read_docmt
from reluformer_mt.inference.inputs import InputDocument, ParsedInput, parse_input, render

SHARED = Path(os.environ.get("RELUFORMER_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
NC = SHARED / "docmt_ende" / "NC-2016"
needs_shared = pytest.mark.skipif(not NC.is_dir(), reason=f"shared data not found at {SHARED} (set RELUFORMER_SHARED_DATA)")


def write_as_translate_does(path, documents):
    """``documents`` (lists of sentences) in reluformer-translate's ``lines`` output layout."""
    parsed = ParsedInput("lines", [InputDocument(f"d.{k}", list(d)) for k, d in enumerate(documents)])
    path.write_text("".join(line + "\n" for line in render(parsed, [list(d) for d in documents])), encoding="utf-8")
    return path


def test_prepare_reads_what_translate_writes(tmp_path):
    src_docs = [["One.", "Two."], ["Three."], ["Four.", "Five.", "Six."]]
    tgt_docs = [["Eins.", "Zwei."], ["Drei."], ["Vier.", "Fünf.", "Sechs."]]
    src = write_as_translate_does(tmp_path / "a.en", src_docs)
    tgt = write_as_translate_does(tmp_path / "a.de", tgt_docs)
    assert src.read_text(encoding="utf-8") == "One.\nTwo.\n\nThree.\n\nFour.\nFive.\nSix.\n"
    docs = read_corpus("lines", [str(src), str(tgt)], Report())
    assert [d.src for d in docs] == src_docs and [d.tgt for d in docs] == tgt_docs
    # the documents translate itself reads from the same file
    assert [d.sentences for d in parse_input(src.read_text(encoding="utf-8").splitlines(), "a.en", "lines").documents] == src_docs


def test_empty_documents_are_skipped_and_counted(tmp_path):
    src = tmp_path / "a.en"
    tgt = tmp_path / "a.de"
    src.write_text("\nOne.\n\n\nTwo.\n", encoding="utf-8")
    tgt.write_text("\nEins.\n\n\nZwei.\n", encoding="utf-8")
    report = Report()
    docs = read_corpus("lines", [str(src), str(tgt)], report)
    assert [(d.doc_id, d.src) for d in docs] == [("a.1", ["One."]), ("a.3", ["Two."])]
    assert report.skipped["document without sentences"] == 2


def test_a_blank_line_on_one_side_only_is_a_one_line_error(tmp_path):
    src = tmp_path / "a.en"
    tgt = tmp_path / "a.de"
    src.write_text("One.\n\nTwo.\n", encoding="utf-8")
    tgt.write_text("Eins.\nZwei.\nDrei.\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"^line 2 is blank in .*a\.en but not in .*a\.de; documents must end on the same lines$"):
        read_corpus("lines", [str(src), str(tgt)], Report())


@needs_shared
def test_a_prepare_round_trip_of_translates_layout(tmp_path, capsys):
    """Real News Commentary documents written in translate's layout and prepared with
    ``reluformer-prepare --format lines``: the same documents as the docmt original, prepared."""
    from reluformer_mt.cli.prepare import main

    pair = [NC / f"concatenated_en2de_dev_{side}.txt" for side in ("en", "de")]
    original = read_docmt(*pair, Report())[:8]
    src = write_as_translate_does(tmp_path / "nc.en", [d.src for d in original])
    tgt = write_as_translate_does(tmp_path / "nc.de", [d.tgt for d in original])
    docs = read_corpus("lines", [str(src), str(tgt)], Report())
    assert [(d.src, d.tgt) for d in docs] == [(d.src, d.tgt) for d in original]
    out = tmp_path / "bin"
    rc = main(["--format", "lines", "--train", str(src), str(tgt), "--valid-from-train", "2", "--vocab-size", "600",
               "--segment-tokens", "128", "--joined-dictionary", "--no-progress", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err[-2000:]
    prepared = json.loads((out / "prepared.json").read_text(encoding="utf-8"))
    assert prepared["format"] == "lines"
    splits = prepared["splits"]
    assert (splits["train"]["documents"], splits["valid"]["documents"]) == (6, 2)
    assert splits["train"]["sentences"] + splits["valid"]["sentences"] == sum(len(d.src) for d in original)
    assert (out / "train.en-de.en.bin").is_file() and (out / "valid.en-de.en.bin").is_file()
