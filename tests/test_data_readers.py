"""Readers, segmentation round trips and the bad-input list of the data-preparation issue."""
import os
from pathlib import Path

import pytest

from reluformer_mt.data.readers import (Report, normalise_space, read_corpus, read_docids, read_doclines, read_docmt,
                                        read_lines, read_mteval_xml, read_plain)
from reluformer_mt.data.segmentation import greedy_segments, parse_segment_tokens, segment_document
from reluformer_mt.data.batching import length_batches
from reluformer_mt.data.segments import SegmentInfo, join_sentences, segments_to_documents, split_segment

SHARED = Path(os.environ.get("RELUFORMER_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
DOCMT = SHARED / "docmt_ende"
needs_shared = pytest.mark.skipif(not DOCMT.is_dir(), reason=f"shared data not found at {SHARED} (set RELUFORMER_SHARED_DATA)")
DOCMT_FILES = [(c, s) for c in ("IWSLT2017", "NC-2016", "Europarl7") for s in ("dev", "test")]


def docmt_pair(corpus, split):
    return DOCMT / corpus / f"concatenated_en2de_{split}_en.txt", DOCMT / corpus / f"concatenated_en2de_{split}_de.txt"


def write(path, text, encoding="utf-8"):
    path = Path(path)
    path.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return path


# ---------------------------------------------------------------- real data

@needs_shared
@pytest.mark.parametrize("corpus,split", DOCMT_FILES)
def test_segment_round_trip_all_docmt_files(corpus, split):
    docs = read_docmt(*docmt_pair(corpus, split), Report())
    assert docs
    for n in (128, 512, 2048):
        for d in docs:
            src_len = [len(s.split()) for s in d.src]
            tgt_len = [len(t.split()) for t in d.tgt]
            ranges = greedy_segments(src_len, tgt_len, n)
            back_src, back_tgt = [], []
            for a, b in ranges:
                if b - a > 1:  # only a single over-long sentence may exceed N
                    assert max(sum(src_len[a:b]), sum(tgt_len[a:b])) + (b - a - 1) <= n
                back_src += split_segment(join_sentences(d.src[a:b]), expected=b - a)
                back_tgt += split_segment(join_sentences(d.tgt[a:b]), expected=b - a)
            assert back_src == d.src and back_tgt == d.tgt, (corpus, split, n, d.doc_id)


@needs_shared
def test_docmt_iwslt_test_equals_mteval_xml():
    report = Report()
    docmt = read_docmt(*docmt_pair("IWSLT2017", "test"), report)
    x = SHARED / "iwslt17_ted_test"
    xml = read_mteval_xml([x / "en-de/IWSLT17.TED.tst2016.en-de.en.xml", x / "en-de/IWSLT17.TED.tst2017.en-de.en.xml"],
                          [x / "de-en/IWSLT17.TED.tst2016.de-en.de.xml", x / "de-en/IWSLT17.TED.tst2017.de-en.de.xml"], report)
    assert len(docmt) == len(xml) == 23
    assert [len(d.src) for d in docmt] == [len(d.src) for d in xml]
    assert sum(len(d.src) for d in xml) == 2271
    for a, b in zip(docmt, xml):
        assert [normalise_space(s) for s in a.src] == [normalise_space(s) for s in b.src]
        assert [normalise_space(t) for t in a.tgt] == [normalise_space(t) for t in b.tgt]
    assert report.repaired["CRLF line end normalised to LF"] == 2 * 2294
    assert not report.skipped


# ---------------------------------------------------------------- segmentation

def test_greedy_segments_and_sentence_level():
    assert greedy_segments([3, 3, 3], [2, 2, 2], 7) == [(0, 2), (2, 3)]  # 3+1+3 = 7 fits, +1+3 does not
    assert greedy_segments([3, 3, 3], [2, 2, 2], 0) == [(0, 1), (1, 2), (2, 3)]
    # the longer side decides
    assert greedy_segments([1, 1], [5, 5], 10) == [(0, 1), (1, 2)]
    assert parse_segment_tokens("sentence") == 0 and parse_segment_tokens("512") == 512
    with pytest.raises(ValueError, match="segment length"):
        parse_segment_tokens("big")


def test_overlong_sentence_is_its_own_segment_and_counted():
    src = [["a"] * 2, ["b"] * 9, ["c"] * 2]
    tgt = [["x"] * 2, ["y"] * 3, ["z"] * 2]
    s, t, infos, over = segment_document("d", src, tgt, 5)
    assert over == 1
    assert [i.n_sentences for i in infos] == [1, 1, 1]
    assert segments_to_documents(s, infos)["d"] == [" ".join(x) for x in src]


# ---------------------------------------------------------------- bad input

def test_line_count_mismatch_names_both_files(tmp_path):
    a = write(tmp_path / "a.en", "<d>\none\ntwo\n")
    b = write(tmp_path / "a.de", "<d>\neins\n")
    with pytest.raises(ValueError, match=r"a\.en has 3 lines but .*a\.de has 2"):
        read_docmt(a, b, Report())


def test_doc_markers_on_different_lines(tmp_path):
    a = write(tmp_path / "a.en", "<d>\none\n<d>\ntwo\n")
    b = write(tmp_path / "a.de", "<d>\neins\nzwei\n<d>\n")
    with pytest.raises(ValueError, match=r"<d> on line 3 of .*a\.en but not of .*a\.de"):
        read_docmt(a, b, Report())


def test_empty_sentence_on_one_side_is_skipped_and_counted(tmp_path):
    a = write(tmp_path / "a.en", "<d>\none\n\nthree\n")
    b = write(tmp_path / "a.de", "<d>\neins\nzwei\ndrei\n")
    report = Report()
    docs = read_docmt(a, b, report)
    assert docs[0].src == ["one", "three"] and docs[0].tgt == ["eins", "drei"]
    assert report.skipped["sentence empty on one side (pair dropped)"] == 1
    assert "a.en:3" in report.summary()


def test_invalid_utf8_names_file_and_line(tmp_path):
    a = write(tmp_path / "a.en", b"<d>\nfine\nbad \xff byte\n")
    b = write(tmp_path / "a.de", "<d>\ngut\nschlecht\n")
    with pytest.raises(ValueError, match=r"a\.en:3: invalid UTF-8"):
        read_docmt(a, b, Report())


def test_bom_and_crlf_are_normalised_and_counted(tmp_path):
    a = write(tmp_path / "a.en", "\ufeff<d>\r\none\r\ntwo\r\n")
    b = write(tmp_path / "a.de", "<d>\neins\nzwei\n")
    report = Report()
    docs = read_docmt(a, b, report)
    assert docs[0].src == ["one", "two"]
    assert report.repaired["byte-order mark removed"] == 1
    assert report.repaired["CRLF line end normalised to LF"] == 3


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.en: file not found"):
        read_lines(tmp_path / "nope.en", Report())
    with pytest.raises(FileNotFoundError, match="missing.xml"):
        read_mteval_xml([tmp_path / "missing.xml"], [tmp_path / "missing.xml"], Report())


def _xml(docs):
    body = "".join(f'<doc docid="{d}">' + "".join(f'<seg id="{i}"> {t} </seg>' for i, t in segs) + "</doc>" for d, segs in docs)
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<mteval><srcset>{body}</srcset></mteval>\n'


def test_xml_talk_on_one_side_only_is_skipped_and_counted(tmp_path):
    src = write(tmp_path / "s.xml", _xml([("1", [(1, "a"), (2, "b &amp; c")]), ("2", [(1, "only here")])]))
    tgt = write(tmp_path / "t.xml", _xml([("1", [(1, "x"), (2, "y")]), ("3", [(1, "z")])]))
    report = Report()
    docs = read_mteval_xml([src], [tgt], report)
    assert [d.doc_id for d in docs] == ["1"] and docs[0].src == ["a", "b & c"]
    assert report.skipped["talk present on the source side only"] == 1
    assert report.skipped["talk present on the target side only"] == 1


def test_xml_segment_on_one_side_only_is_skipped_and_counted(tmp_path):
    src = write(tmp_path / "s.xml", _xml([("1", [(1, "a"), (2, "b")])]))
    tgt = write(tmp_path / "t.xml", _xml([("1", [(1, "x")])]))
    report = Report()
    docs = read_mteval_xml([src], [tgt], report)
    assert docs[0].src == ["a"] and report.skipped["segment present on the source side only"] == 1


def test_doclines_sentence_count_mismatch(tmp_path):
    a = write(tmp_path / "a.en", "one <sep> two\nthree\n")
    b = write(tmp_path / "a.de", "eins <sep> zwei\ndrei <sep> vier\n")
    with pytest.raises(ValueError, match=r"line 2: .*a\.en has 1 sentences but .*a\.de has 2"):
        read_doclines(a, b, Report())


def test_docids_and_plain_formats(tmp_path):
    a = write(tmp_path / "c.en", "a\nb\nc\n")
    b = write(tmp_path / "c.de", "x\ny\nz\n")
    ids = write(tmp_path / "c.ids", "t1\nt1\nt2\n")
    docs = read_docids(a, b, ids, Report())
    assert [(d.doc_id, d.src) for d in docs] == [("t1", ["a", "b"]), ("t2", ["c"])]
    write(tmp_path / "bad.ids", "t1\nt2\nt1\n")
    with pytest.raises(ValueError, match="contiguous"):
        read_docids(a, b, tmp_path / "bad.ids", Report())
    assert len(read_plain(a, b, Report())) == 3
    assert len(read_corpus("plain-onedoc", [str(a), str(b)], Report())[0].src) == 3
    with pytest.raises(ValueError, match="takes 3 files"):
        read_corpus("docids", [str(a), str(b)], Report())


def test_separator_inside_a_sentence_is_refused(tmp_path):
    a = write(tmp_path / "a.en", "<d>\nuses <sep> literally\n")
    b = write(tmp_path / "a.de", "<d>\nok\n")
    with pytest.raises(ValueError, match=r"a\.en:2: sentence contains the separator"):
        read_docmt(a, b, Report())


@needs_shared
def test_bom_and_invisible_characters_do_not_hide_markers(tmp_path):
    """Real talks in two docmt files joined with `cat` (each file starts with a BOM), a zero-width
    space and a no-break space around later markers: documents stay apart, counted repairs."""
    src_lines = read_lines(docmt_pair("IWSLT2017", "test")[0], Report())
    tgt_lines = read_lines(docmt_pair("IWSLT2017", "test")[1], Report())
    starts = [i for i, line in enumerate(src_lines) if line == "<d>"][:4]

    def joined(lines):  # cat of two files (talks 1-2 and 3), both saved with a BOM
        first, second = lines[starts[0]:starts[2]], lines[starts[2]:starts[3]]
        second = ["\u200b<d>\u00a0" if line == "<d>" else line for line in second[:1]] + second[1:]
        return "\ufeff" + "\n".join(first) + "\n\ufeff" + "\n".join(second) + "\n"

    a, b = write(tmp_path / "a.en", joined(src_lines)), write(tmp_path / "a.de", joined(tgt_lines))
    report = Report()
    docs = read_docmt(a, b, report)
    expected = read_docmt(*docmt_pair("IWSLT2017", "test"), Report())[:3]
    assert [(d.src, d.tgt) for d in docs] == [(d.src, d.tgt) for d in expected]
    assert report.repaired["byte-order mark removed"] == 2  # at offset 0 of each joined file
    # the BOM of the second file and the zero-width and no-break spaces, on both sides
    assert report.repaired["invisible characters around <d> lines removed (BOM, zero-width, no-break space)"] == 6


def test_invisible_characters_at_sentence_edges_are_counted(tmp_path):
    a = write(tmp_path / "a.en", "one\n\u200btwo\u00a0\n")
    b = write(tmp_path / "a.de", "eins\nzwei\u2060\n")
    report = Report()
    docs = read_plain(a, b, report, one_document=True)
    assert docs[0].src == ["one", "two"] and docs[0].tgt == ["eins", "zwei"]
    assert report.repaired["invisible characters at sentence edges removed (BOM, zero-width, no-break space)"] == 3


def test_segments_to_documents_policies_for_a_wrong_sentence_count():
    infos = [SegmentInfo("a", 2, 0), SegmentInfo("b", 1, 0), SegmentInfo("a", 1, 2)]
    assert segments_to_documents(["x <sep> y", "z", "w"], infos) == {"a": ["x", "y", "w"], "b": ["z"]}
    wrong = ["x", "z", "w <sep> v"]
    with pytest.raises(ValueError, match=r"document 'a': segment 0 \(sentence 0\) splits into 1 sentences.*has 2"):
        segments_to_documents(wrong, infos)
    assert segments_to_documents(wrong, infos, on_mismatch="keep") == {"a": ["x", "w", "v"], "b": ["z"]}
    assert segments_to_documents(wrong, infos, on_mismatch="fit") == {"a": ["x", "", "w v"], "b": ["z"]}
    with pytest.raises(ValueError, match="segments of a document must be in order"):
        segments_to_documents(["w", "x <sep> y"], [infos[2], infos[0]])


def test_length_batches_longest_first_within_the_token_budget():
    assert length_batches([3, 9, 3, 5], max_tokens=10) == [[1], [3, 0], [2]]
    assert length_batches([2, 2, 2], max_tokens=100, max_items=2) == [[0, 1], [2]]
    assert length_batches([50], max_tokens=10) == [[0]]  # too long: its own batch, never dropped


def test_one_docmt_reader_for_prepare_translate_and_eval(tmp_path):
    """Issue 21: one reader, one detection, one name. A blank line before the first <d> is dropped
    (and reported) by every tool; text there is the same one-line error in every tool."""
    from reluformer_mt.data.documents import FORMAT
    from reluformer_mt.evaluation import bleu
    from reluformer_mt.inference.inputs import parse_input

    a = write(tmp_path / "a.en", "\n<d>\none\ntwo\n<d>\nthree\n")
    b = write(tmp_path / "a.de", "\n<d>\neins\nzwei\n<d>\ndrei\n")
    report = Report()
    prepared = read_docmt(a, b, report)
    translated = parse_input(a.read_text(encoding="utf-8").splitlines(), "a.en", "auto", None, "en")
    evaluated = bleu.read_docmt(a)
    assert FORMAT == "docmt" and translated.fmt == FORMAT and bleu.detect_format(a) == FORMAT
    assert [d.src for d in prepared] == [d.sentences for d in translated.documents] == list(evaluated.values())
    assert report.skipped["blank line before the first <d>"] == 2  # one per side
    assert translated.notes[0] == "blank line 1 before the first <d> dropped"
    bad = write(tmp_path / "bad.en", "text\n<d>\none\n")
    for read in (lambda: read_docmt(bad, bad, Report()), lambda: bleu.read_docmt(bad),
                 lambda: parse_input(bad.read_text(encoding="utf-8").splitlines(), str(bad), FORMAT, None, "en")):
        with pytest.raises(ValueError, match=r"bad\.en:1: expected a <d> line to start the first document"):
            read()
