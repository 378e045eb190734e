"""reluformer-translate: input formats, one output sentence per input sentence on real
documents (segments, fallbacks, sentence-level checkpoints), stdin streaming, and bad input."""
import re
import shutil

import pytest
import torch

from helpers import needs_shared_data, run_subprocess
from reluformer_mt.inference.inputs import (DOC_MARKER, decode_lines, detect_format, parse_input, read_input,
                                            render)

# untrained tiny models never stop by themselves: short outputs keep the tests fast
FAST = ["--beam", "2", "--max-len-a", "0", "--max-len-b", "6", "--no-progress"]


def translate_main(argv, capsys=None):
    from reluformer_mt.cli.translate import main

    rc = main([str(a) for a in argv])
    if capsys is None:
        return rc, ""
    return rc, capsys.readouterr().err


def real_docs(n_docs, max_sentences=None):
    """The first ``n_docs`` talks of the real IWSLT2017 test set (English side), as sentence lists."""
    from conftest import iwslt_files

    parsed = read_input(iwslt_files("test")[0], fmt="docmt")
    return [d.sentences[:max_sentences] for d in parsed.documents[:n_docs]]


def write_docmt(path, docs):
    path.write_text("".join(f"{DOC_MARKER}\n" + "".join(s + "\n" for s in d) for d in docs), encoding="utf-8")


# ---------------------------------------------------------------- formats (no model)

def test_lines_format_keeps_blank_lines_and_empty_documents():
    lines = ["", "a b .", "c d .", "", "", "e f .", ""]
    parsed = parse_input(lines, "x", "lines")
    assert [d.sentences for d in parsed.documents] == [[], ["a b .", "c d ."], [], ["e f ."], []]
    assert render(parsed, [[s.upper() for s in d.sentences] for d in parsed.documents]) == [l.upper() for l in lines]
    assert parse_input([], "x", "lines").documents == []


def test_an_unknown_splitter_language_warns_only_where_text_is_split(caplog):
    """Greek (pysbd has no 'grc'): detecting the format of verse lines splits nothing, so no
    warning; raw input, which is split, says once that English rules split it."""
    verses = ["Ἐν ἀρχῇ ἦν ὁ λόγος, καὶ ὁ λόγος ἦν πρὸς τὸν θεόν.", "οὗτος ἦν ἐν ἀρχῇ πρὸς τὸν θεόν."]
    with caplog.at_level("WARNING"):
        assert parse_input(verses, "x", "auto", language="grc").fmt == "lines"
    assert "no sentence splitter" not in caplog.text
    with caplog.at_level("WARNING"):
        parse_input([" ".join(verses)], "x", "raw", language="grc")
    assert caplog.text.count("pysbd has no sentence splitter for 'grc'") == 1


def test_the_summary_counts_in_the_singular_and_lists_the_fuzzy_bands_in_order():
    from collections import Counter
    from types import SimpleNamespace

    from reluformer_mt.inference.translator import DocumentTranslator

    stats = Counter({"documents": 1, "sentences": 1, "segments": 1, "seconds": 2.0,
                     "fallbacks: segment retranslated as halves": 0,
                     "fallbacks: segment retranslated sentence by sentence": 0})
    for band, n in (("<50", 3), ("50-70", 2), ("70-90", 1), (">=90", 4)):
        stats[f"memory: units whose best match has fuzzy {band}"] = n
    lines = DocumentTranslator.summary(SimpleNamespace(stats=stats)).splitlines()
    assert lines[0].startswith("translated 1 document, 1 sentence in 1 segment in 2.0 s")
    assert [line.rsplit(" ", 1)[0].split()[-1] for line in lines[1:]] == ["<50:", "50-70:", "70-90:", ">=90:"]


def test_docmt_format_empty_document_and_errors():
    lines = ["<d>", "a .", "", "b .", "<d>", "<d>", "c ."]
    parsed = parse_input(lines, "x", "auto")
    assert parsed.fmt == "docmt" and [d.sentences for d in parsed.documents] == [["a .", "", "b ."], [], ["c ."]]
    assert render(parsed, [d.sentences for d in parsed.documents]) == lines
    with pytest.raises(ValueError, match=r"^x:1: expected a <d> line"):
        parse_input(["text", "<d>"], "x", "docmt")


def test_docids_format(tmp_path):
    (tmp_path / "ids").write_text("t1\nt1\nt2\n", encoding="utf-8")
    parsed = parse_input(["a .", "b .", "c ."], "x", "auto", doc_ids=tmp_path / "ids")
    assert parsed.fmt == "docids" and [(d.doc_id, d.sentences) for d in parsed.documents] == [("t1", ["a .", "b ."]), ("t2", ["c ."])]
    assert render(parsed, [d.sentences for d in parsed.documents]) == ["a .", "b .", "c ."]
    (tmp_path / "bad").write_text("t1\nt2\nt1\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad:3: document 't1' continues"):
        parse_input(["a", "b", "c"], "x", "docids", doc_ids=tmp_path / "bad")
    with pytest.raises(ValueError, match=r"has 2 lines but .*ids has 3"):
        parse_input(["a", "b"], "x", "docids", doc_ids=tmp_path / "ids")


def test_raw_format_splits_paragraphs_with_pysbd():
    lines = ["Mr. Smith went to Washington. He stayed there", "for two days.", "", "It rained. Nobody came."]
    assert detect_format(lines) == "lines"  # hard-wrapped text is not detected: --format raw
    talk = real_docs(1)[0]
    paragraphs = [" ".join(talk[i:i + 5]) for i in range(0, 15, 5)]  # real sentences, 5 a paragraph
    assert all(len(p.split()) >= 40 for p in paragraphs)
    assert detect_format([paragraphs[0], "", paragraphs[1], "", paragraphs[2]]) == "raw"
    assert detect_format(paragraphs[:2]) == "lines"  # two paragraphs are not "many": kept line by line
    assert detect_format(["It rained. Nobody came. We left.", "", "Who knew? Nobody did. We did!"]) == "lines"
    assert detect_format(["One sentence here.", "Two of them. Here.", "Three."]) == "lines"
    parsed = parse_input(lines, "x", "raw")
    assert parsed.fmt == "raw"
    assert parsed.documents[0].sentences == ["Mr. Smith went to Washington.", "He stayed there for two days.",
                                             "It rained.", "Nobody came."]
    assert parsed.documents[0].paragraphs == [2, 2]
    assert render(parsed, [["A.", "B.", "C.", "D."]]) == ["A. B.", "", "C. D."]
    assert render(parsed, [["1", "2", "3", "4"]], one_per_line=True) == ["1", "2", "", "3", "4"]
    marked = parse_input(["<d>", "One. Two.", "<d>", "<d>", "Three."], "x", "raw")
    assert [d.sentences for d in marked.documents] == [["One.", "Two."], [], ["Three."]]
    assert render(marked, [d.sentences for d in marked.documents]) == ["<d>", "One. Two.", "<d>", "<d>", "Three."]


def real_sentence_lines(before=0, after=1):
    """Consecutive lines of the real German IWSLT2017 dev file, one sentence (subtitle) a line,
    around the line 'Sie sagte: »Ehrenwort?« Ich sagte: »Ja.«' (pysbd finds three sentences in it
    and in the next line)."""
    from helpers import DOCMT

    lines = decode_lines((DOCMT / "IWSLT2017" / "concatenated_en2de_dev_de.txt").read_bytes(), "de")
    k = next(i for i, line in enumerate(lines) if "»Ehrenwort?«" in line)
    return lines[k - before: k + after + 1]


@needs_shared_data
def test_auto_keeps_real_sentence_lines_line_by_line():
    lines = real_sentence_lines()
    parsed = parse_input(lines, "talk.de", "auto", language="de")
    assert parsed.fmt == "lines" and parsed.documents[0].sentences == [l.strip() for l in lines]
    assert parsed.detected == "0 of 2 lines look like paragraphs (3+ sentences, 40+ words)"
    wider = real_sentence_lines(before=40, after=40)  # the talk around it: still lines
    assert detect_format(wider, "de") == "lines"


@needs_shared_data
def test_invisible_characters_do_not_hide_document_markers():
    """Two real talks in docmt files joined with `cat` (each file starts with a BOM), a zero-width
    space and no-break spaces around later markers: every marker still starts a document."""
    docs = real_docs(3, max_sentences=5)
    files = ["\ufeff" + "".join(f"{DOC_MARKER}\n" + "".join(s + "\n" for s in d) for d in part) for part in (docs[:1], docs[1:])]
    joined = files[0] + files[1].replace(f"\n{DOC_MARKER}\n", f"\n\u200b{DOC_MARKER}\u00a0\n")
    lines = decode_lines(joined.encode("utf-8"), "joined.txt")
    for fmt in ("auto", "docmt", "raw"):
        parsed = parse_input(lines, "joined.txt", fmt)
        assert len(parsed.documents) == 3, fmt
        assert not any(DOC_MARKER in s for d in parsed.documents for s in d.sentences), fmt
        assert "3 invisible characters (BOM, zero-width, no-break space) removed at line edges" in parsed.notes
    assert [d.sentences for d in parse_input(lines, "joined.txt", "docmt").documents] == docs


def test_invalid_utf8_names_the_line():
    with pytest.raises(ValueError, match=r"^in.txt:3: invalid UTF-8 \(byte 0xff at column 4\)"):
        decode_lines(b"ok\nfine\nabc\xff\n", "in.txt")
    assert decode_lines(b"\xef\xbb\xbfa\r\nb\n", "x") == ["a", "b"]


# ---------------------------------------------------------------- the fallback logic, exactly

class EchoGenerator:
    """Stands in for beam search: 'translates' a segment into its own source pieces (the
    dictionary is joined), but drops the separators -- a model whose separator output is
    wrong -- of every multi-sentence segment in the first round, and of the halves that start
    with an odd token id in the second."""

    def __init__(self, translator):
        self.t, self.round = translator, 0

    def __call__(self, sources, progress=None, matches=None, units=None, on_batch=None):
        self.round += 1
        out = []
        for src in sources:
            ids = src[:-1]
            if (ids == self.t.sep_src).any() and (self.round == 1 or int(ids[0]) % 2):
                ids = ids[ids != self.t.sep_src]
            out.append({"tokens": ids.clone(), "positional_scores": torch.full((len(ids) + 1,), -1.0), "attention": None})
        if on_batch is not None:  # one batch of every source (the translator counts its finished sentences)
            on_batch(list(range(len(out))), out)
        return out


@needs_shared_data
def test_fallback_halves_then_sentences_maps_every_sentence_back(doc_checkpoint, monkeypatch):
    from reluformer_mt.inference import DocumentTranslator

    t = DocumentTranslator(doc_checkpoint, device="cpu")
    monkeypatch.setattr(t, "generate", EchoGenerator(t))
    docs = real_docs(2, max_sentences=40) + [[]]
    docs[0][3] = ""  # an empty sentence inside a document
    docs[1][2] = "Separators <sep> are reserved."
    results = t.translate(docs, scores=True)
    assert [len(r) for r in results] == [len(d) for d in docs]
    for doc, res in zip(docs, results):
        for sentence, r in zip(doc, res):
            sentence = sentence.replace("<sep>", " ")
            expected = t.sp_tgt.decode_pieces(t.sp_src.encode(" ".join(sentence.split()), out_type=str)) if sentence else ""
            assert r.text == expected
    s = t.stats
    assert s["fallbacks: segment retranslated as halves"] > 0 and s["fallbacks: segment retranslated sentence by sentence"] > 0
    assert s["empty sentences"] == 1 and s["empty documents"] == 1 and "fallbacks:" in t.summary()
    assert s["separator tokens removed from the input"] == 1
    contexts = {r.context for res in results for r in res}
    assert {0, 1, 2} <= contexts


# ---------------------------------------------------------------- real documents through the CLI

@needs_shared_data
def test_real_test_documents_keep_every_sentence(doc_checkpoint, tmp_path, capsys):
    """Three real IWSLT2017 test talks (one document-level checkpoint with --eval-bleu metrics):
    line-for-line output, scores and word alignments in the same layout."""
    docs = real_docs(3, max_sentences=20)
    src = tmp_path / "talks.en"
    write_docmt(src, docs)
    out, scores, align = tmp_path / "talks.de", tmp_path / "talks.scores", tmp_path / "talks.align"
    rc, err = translate_main(["--checkpoint", doc_checkpoint, "-i", src, "-o", out, "--scores", scores,
                              "--alignments", align, "--device", "auto", *FAST], capsys)
    assert rc == 0, err
    in_lines = src.read_text(encoding="utf-8").split("\n")
    for path in (out, scores, align):
        lines = path.read_text(encoding="utf-8").split("\n")
        assert len(lines) == len(in_lines)
        assert [i for i, l in enumerate(lines) if l == DOC_MARKER] == [i for i, l in enumerate(in_lines) if l == DOC_MARKER]
    for s_line, a_line, o_line in zip(in_lines, align.read_text(encoding="utf-8").split("\n"), out.read_text(encoding="utf-8").split("\n")):
        if s_line in ("", DOC_MARKER):
            continue
        for pair in a_line.split():
            i, j = map(int, pair.split("-"))
            assert 0 <= i < len(s_line.split()) + 2 and 0 <= j < max(1, len(o_line.split())) + 2
    assert all(float(x) <= 0 for x in scores.read_text(encoding="utf-8").split() if x != DOC_MARKER)
    assert re.search(r"translated 3 documents, 60 sentences in \d+ segments", err)
    assert "segments of <= 128 tokens" in err and "input format: docmt (detected" in err


@pytest.fixture(scope="module")
def sent_checkpoint(doc_checkpoint, prepared_doc_data, tmp_path_factory):
    """A sentence-level checkpoint without a second training run: the document model's weights
    under ``--task translation`` on the sentence-level twin directory (which shares the
    dictionaries and SentencePiece model; its prepared.json says segment_tokens 0)."""
    state = torch.load(doc_checkpoint, map_location="cpu", weights_only=False)
    task = state["cfg"]["task"]
    for key in ("separator", "eval_bleu_spm"):  # document_translation's own options
        task.pop(key, None)
    task["_name"], task["data"], task["eval_bleu"] = "translation", str(prepared_doc_data["sent"]), False
    path = tmp_path_factory.mktemp("sent_checkpoint") / "checkpoint.pt"
    torch.save(state, path)
    return path


@needs_shared_data
def test_sentence_level_checkpoint_and_forced_fallback(sent_checkpoint, prepared_doc_data, tmp_path):
    """A sentence-level checkpoint translates sentence by sentence; forced to document segments
    with free decoding (it never saw a separator) it falls back and still gives one sentence per
    input sentence."""
    from reluformer_mt.inference import DocumentTranslator

    docs = real_docs(2, max_sentences=12)
    t = DocumentTranslator(sent_checkpoint, beam=1, max_len_a=0, max_len_b=6)
    res = t.translate(docs)
    assert [len(r) for r in res] == [len(d) for d in docs]
    assert t.stats["segments"] == sum(len(d) for d in docs) and "fallbacks: 0" in t.summary()
    forced = DocumentTranslator(sent_checkpoint, data=prepared_doc_data["sent"], beam=1, max_len_a=0, max_len_b=6,
                                segment_tokens=prepared_doc_data["segment_tokens"], separators="free")
    res = forced.translate(docs)
    assert [len(r) for r in res] == [len(d) for d in docs]
    assert forced.stats["segments"] < sum(len(d) for d in docs)
    assert forced.stats["fallbacks: segment retranslated as halves"] > 0


@needs_shared_data
def test_each_input_format_through_the_cli(doc_checkpoint, tmp_path, capsys):
    docs = real_docs(2, max_sentences=6)
    flat = [s for d in docs for s in d]
    # lines: blank line between documents, an empty document at the end
    (tmp_path / "a.txt").write_text("\n\n".join("\n".join(d) for d in docs) + "\n\n", encoding="utf-8")
    # docids
    (tmp_path / "b.txt").write_text("\n".join(flat) + "\n", encoding="utf-8")
    (tmp_path / "b.ids").write_text("".join(f"talk{k}\n" for k, d in enumerate(docs) for _ in d), encoding="utf-8")
    # raw: paragraphs of three sentences
    paragraphs = [" ".join(d[i:i + 3]) for d in docs for i in range(0, len(d), 3)]
    (tmp_path / "c.txt").write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    for name, extra, fmt in (("a.txt", [], "lines"), ("b.txt", ["--doc-ids", tmp_path / "b.ids"], "docids"),
                             ("c.txt", ["--format", "raw"], "raw")):
        out = tmp_path / (name + ".out")
        rc, err = translate_main(["-c", doc_checkpoint, "-i", tmp_path / name, "-o", out, *extra, *FAST], capsys)
        assert rc == 0, err
        in_lines = (tmp_path / name).read_text(encoding="utf-8").split("\n")
        out_lines = out.read_text(encoding="utf-8").split("\n")
        assert len(out_lines) == len(in_lines) and [bool(l) for l in out_lines[:-1]] == [bool(l) for l in in_lines[:-1]], name
        assert f"input format: {fmt}" in err
        if fmt == "lines":
            assert "translated 3 documents, 12 sentences" in err


@needs_shared_data
def test_console_script_streams_stdin_to_stdout(doc_checkpoint):
    docs = real_docs(2, max_sentences=4)
    text = "\n\n".join("\n".join(d) for d in docs) + "\n"
    proc = run_subprocess(["reluformer-translate", "--checkpoint", doc_checkpoint, "--threads", "1", *FAST],
                          input=text, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.split("\n")) == len(text.split("\n")) and proc.stdout.split("\n")[4] == ""
    assert "translated 2 documents, 8 sentences" in proc.stderr and "Traceback" not in proc.stderr


# ---------------------------------------------------------------- bad input

@needs_shared_data
def test_empty_input_and_long_sentences(doc_checkpoint, prepared_doc_data, tmp_path, capsys, monkeypatch):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    rc, err = translate_main(["-c", doc_checkpoint, "-o", tmp_path / "empty.out", *FAST], capsys)
    assert rc == 0 and (tmp_path / "empty.out").read_text() == "" and "translated 0 documents" in err

    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(prepared_doc_data["doc"] / "spm.model"))
    sentences = real_docs(1)[0]

    def joined(at_least):  # real sentences run together into one longer than ``at_least`` pieces
        k = 1
        while len(sp.encode(" ".join(sentences[:k]))) <= at_least:
            k += 1
        return " ".join(sentences[:k])

    long_one = joined(128)   # longer than the segment length: its own segment, with a warning
    assert len(sp.encode(long_one)) < 255
    too_long = joined(300)   # longer than the model's positions: translated in parts, with a warning
    src = tmp_path / "long.txt"
    src.write_text(f"{sentences[0]}\n{long_one}\n{too_long}\n{sentences[1]}\n", encoding="utf-8")
    rc, err = translate_main(["-c", doc_checkpoint, "-i", src, "-o", tmp_path / "long.out", "--format", "lines", *FAST], capsys)
    assert rc == 0, err
    assert len((tmp_path / "long.out").read_text(encoding="utf-8").split("\n")) == 5
    assert "sentences are longer than the segment length 128" in err
    assert "1 sentences are longer than the model's 256 source positions: each is translated in parts" in err
    assert "sentences split into parts to fit the model's positions: 1" in err and "truncated" not in err


@needs_shared_data
def test_sentence_longer_than_the_positions_is_translated_whole_in_parts(doc_checkpoint, monkeypatch):
    """A real raw-text 'sentence' of ~4 model lengths is cut near its middle, recursively, at
    punctuation or spaces, and every part translated: the echo translation gives back all of it."""
    from reluformer_mt.inference import DocumentTranslator

    t = DocumentTranslator(doc_checkpoint, device="cpu")
    monkeypatch.setattr(t, "generate", EchoGenerator(t))
    talk = real_docs(1)[0]
    k = 1
    while len(t.sp_src.encode(" ".join(talk[:k]))) <= 3.5 * (t.max_src - 1):
        k += 1
    long_line = " ".join(talk[:k])
    docs = [[talk[0], long_line, talk[1]]]
    res = t.translate(docs, scores=True, alignments=True)
    assert [len(r) for r in res] == [3]
    decode = lambda text: t.sp_tgt.decode_pieces(t.sp_src.encode(text, out_type=str))  # noqa: E731
    assert res[0][1].text == decode(long_line)  # nothing lost
    assert res[0][0].text == decode(talk[0]) and res[0][2].text == decode(talk[1])
    assert t.stats["sentences split into parts to fit the model's positions"] == 1
    assert t.stats["parts of split sentences"] >= 4 and res[0][1].score is not None
    assert "sentences split into parts to fit the model's positions: 1" in t.summary()
    # cuts fall between words, at sentence punctuation when there is some near the middle
    from reluformer_mt.inference.translator import split_near_middle

    left, right = split_near_middle(long_line)
    assert left + " " + right == long_line and left[-1] in ".?!:;\"')" and abs(len(left) - len(right)) < len(long_line) / 2
    assert split_near_middle("aaaa bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb") == ("aaaa", "b" * 58)


def test_beam_search_carries_the_attention_only_for_alignments(doc_checkpoint):
    """Without --alignments the decoder returns no alignment attention, so fairseq's beam search
    keeps no (rows, source, steps) buffer of it; the translations and scores are those of a search
    that keeps it, and --alignments still gets its links. fairseq's make_generation_fast_(need_attn)
    (fairseq-generate's --print-alignment) sets the same switch."""
    from reluformer_mt.inference import DocumentTranslator

    t = DocumentTranslator(doc_checkpoint, device="cpu", beam=2, max_len_a=0, max_len_b=6)
    docs = real_docs(2, max_sentences=4)
    seen = []
    step = t.task.inference_step

    def record(generator, models, sample, **kwargs):
        hypos = step(generator, models, sample, **kwargs)
        seen.append(all(h["attention"] is not None and h["attention"].numel() > 0 for row in hypos for h in row))
        return hypos
    t.task.inference_step = record
    plain = t.translate(docs, scores=True)
    assert seen and not any(seen) and not t.model.decoder.search_alignment
    seen.clear()
    aligned = t.translate(docs, scores=True, alignments=True)
    assert seen and all(seen) and t.model.decoder.search_alignment
    assert [[r.text for r in d] for d in plain] == [[r.text for r in d] for d in aligned]
    assert [r.score for d in plain for r in d] == pytest.approx([r.score for d in aligned for r in d], abs=1e-5)
    assert any(r.alignment for d in aligned for r in d) and not any(r.alignment for d in plain for r in d)
    t.model.decoder.make_generation_fast_(need_attn=False)
    assert not t.model.decoder.search_alignment
    t.model.decoder.make_generation_fast_(need_attn="hard")
    assert t.model.decoder.search_alignment


def one_line_error(err, pattern):
    lines = [l for l in err.strip().split("\n") if l.startswith("reluformer-translate: error:")]
    assert len(lines) == 1 and re.search(pattern, lines[0]), err
    assert "Traceback" not in err


@needs_shared_data
def test_bad_input_and_bad_checkpoints_are_one_line_errors(doc_checkpoint, prepared_doc_data, tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"Hello there.\nsecond \xc3\x28 line\n")
    rc, err = translate_main(["-c", doc_checkpoint, "-i", bad], capsys)
    assert rc == 2
    one_line_error(err, r"bad.txt:2: invalid UTF-8")

    good = tmp_path / "good.txt"
    good.write_text("Hello there.\n", encoding="utf-8")
    rc, err = translate_main(["-c", tmp_path / "nope.pt", "-i", good], capsys)
    assert rc == 2
    one_line_error(err, r"nope.pt: checkpoint not found")

    def rewrite(name, edit):
        s = torch.load(doc_checkpoint, map_location="cpu", weights_only=False)
        edit(s)
        d = tmp_path / name
        d.mkdir()
        torch.save(s, d / "checkpoint.pt")
        return d / "checkpoint.pt"

    def set_arch(s):
        model = s["cfg"]["model"]
        for key in ("arch", "_name"):
            if isinstance(model, dict):
                model[key] = "mystery_arch"
            else:
                setattr(model, key, "mystery_arch")

    rc, err = translate_main(["-c", rewrite("arch", set_arch), "-i", good], capsys)
    assert rc == 2
    one_line_error(err, r"architecture 'mystery_arch' is not known")

    def lose_data(s):
        s["cfg"]["task"]["data"] = str(tmp_path / "gone")

    moved = rewrite("nodata", lose_data)
    rc, err = translate_main(["-c", moved, "-i", good], capsys)
    assert rc == 2
    one_line_error(err, r"cannot find its resources: missing the dictionaries and prepared.json .*gone\); give --data DIR")
    for name in ("dict.en.txt", "dict.de.txt", "prepared.json", "spm.model"):  # resources beside the checkpoint
        shutil.copy(prepared_doc_data["doc"] / name, moved.parent)
    rc, err = translate_main(["-c", moved, "-i", good, "-o", tmp_path / "good.out", *FAST], capsys)
    assert rc == 0 and f"resources from {moved.parent}," in err
    assert len((tmp_path / "good.out").read_text(encoding="utf-8").split("\n")) == 2

    # dictionaries and prepared.json without the SentencePiece model
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("dict.en.txt", "dict.de.txt", "prepared.json"):
        shutil.copy(prepared_doc_data["doc"] / name, plain)
    rc, err = translate_main(["-c", doc_checkpoint, "--data", plain, "-i", good], capsys)
    assert rc == 2
    one_line_error(err, r"resources found in .*plain but missing the SentencePiece model .*plain/spm.model")
    (plain / "prepared.json").unlink()
    rc, err = translate_main(["-c", doc_checkpoint, "--data", plain, "-i", good], capsys)
    assert rc == 2
    one_line_error(err, r"cannot find its resources: missing the dictionaries and prepared.json")
    # the --eval-bleu checkpoint loads with torch's default weights_only=True (the plugin's allowlist)
    assert torch.load(doc_checkpoint, map_location="cpu", weights_only=True)["cfg"]["checkpoint"]["best_checkpoint_metric"] == "s_bleu"


def test_side_outputs_must_be_other_files(tmp_path, capsys):
    """--scores/--alignments equal to --output, --input or each other (resolved: './a/../x', a
    symlink) stop before anything is written -- the checkpoint is not even loaded."""
    src, out = tmp_path / "talk.en", tmp_path / "talk.de"
    src.write_text("Hello there.\n", encoding="utf-8")
    out.write_text("an earlier translation\n", encoding="utf-8")
    (tmp_path / "link.de").symlink_to(out)
    (tmp_path / "a").mkdir()
    cases = [(["--scores", tmp_path / "a" / ".." / "talk.de"], r"--scores .*: the same file as --output .*talk.de"),
             (["--alignments", tmp_path / "link.de"], r"--alignments .*link.de: the same file as --output"),
             (["--alignments", src], r"--alignments .*talk.en: the same file as the input --input"),
             (["--scores", tmp_path / "s", "--alignments", tmp_path / "s"], r"--alignments .*s: the same file as --scores")]
    for extra, pattern in cases:
        rc, err = translate_main(["-c", tmp_path / "never-loaded.pt", "-i", src, "-o", out, *extra], capsys)
        assert rc == 2
        one_line_error(err, pattern)
    assert out.read_text(encoding="utf-8") == "an earlier translation\n" and not (tmp_path / "s").exists()


def test_bad_options_and_unwritable_outputs_are_one_line_errors(tmp_path, capsys):
    from reluformer_mt.cli.translate import main

    src = tmp_path / "in.txt"
    src.write_text("Hello there.\n", encoding="utf-8")
    for option, value in (("--max-len-a", "-1"), ("--max-len-b", "-3"), ("--max-len-a", "nan")):
        with pytest.raises(SystemExit) as e:
            main(["-c", "x.pt", "-i", str(src), option, value])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {option}: expected " in err and "Traceback" not in err
    for out, pattern in ((tmp_path, r"--output .*: is a directory, expected a file name"),
                         (tmp_path / "no" / "out.txt", r"--output .*out.txt: folder .*no does not exist"),
                         (src / "out.txt", r"--output .*in.txt/out.txt: .*in.txt is a file, expected a folder")):
        rc, err = translate_main(["-c", tmp_path / "never-loaded.pt", "-i", src, "-o", out], capsys)
        assert rc == 2
        one_line_error(err, pattern)


@needs_shared_data
def test_disk_full_and_detected_format_through_the_cli(doc_checkpoint, tmp_path, capsys):
    """A full disk (/dev/full) is a one-line error naming the file; real one-sentence-per-line
    lines stay line by line under --format auto, and the summary says what was detected."""
    src = tmp_path / "talk.de"
    src.write_text("\n".join(real_sentence_lines()) + "\n", encoding="utf-8")
    rc, err = translate_main(["-c", doc_checkpoint, "-i", src, "-o", "/dev/full", "--language", "de", *FAST], capsys)
    assert rc == 2
    one_line_error(err, r"cannot write /dev/full: No space left on device")
    out = tmp_path / "talk.en"
    rc, err = translate_main(["-c", doc_checkpoint, "-i", src, "-o", out, "--language", "de", *FAST], capsys)
    assert rc == 0, err
    assert len(out.read_text(encoding="utf-8").split("\n")) == 3
    assert "translated 1 document, 2 sentences" in err
    assert "input format: lines (detected: 0 of 2 lines look like paragraphs" in err
