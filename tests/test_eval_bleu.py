"""s-BLEU / d-BLEU against the sacrebleu CLI on real docmt_ende files, fairseq-generate input,
<d> files, doc-id files, and sentence-count mismatches."""
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from reluformer_mt.cli.eval import main
from reluformer_mt.data.segments import SegmentInfo, write_segment_metadata
from reluformer_mt.evaluation.bleu import (bleu_from_files, corpus_dbleu, corpus_sbleu, pair_documents,
                                           read_docmt, read_fairseq_generate, sentences_from_segments)

DATA = Path(os.environ.get("RELUFORMER_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
DOCMT = DATA / "docmt_ende" / "IWSLT2017"  # CRLF line ends, 23 documents
needs_data = pytest.mark.skipif(not DOCMT.is_dir(), reason=f"shared data not found at {DOCMT} (set RELUFORMER_SHARED_DATA)")
SACREBLEU = Path(sys.executable).parent / "sacrebleu"


def perturb(sentence: str, k: int) -> str:
    """A deterministic imperfect 'translation': drop one word, swap two."""
    words = sentence.split()
    if len(words) > 3:
        del words[k % len(words)]
        words[0], words[1] = words[1], words[0]
    return " ".join(words)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """Reference docs (<d> file), perturbed hypothesis docs, and flat files for the CLI."""
    tmp = tmp_path_factory.mktemp("bleu")
    ref_path = DOCMT / "concatenated_en2de_test_de.txt"
    ref_docs = read_docmt(ref_path)
    hyp_docs = {d: [perturb(s, k) for k, s in enumerate(sents)] for d, sents in ref_docs.items()}
    files = {}
    for name, lines in {"ref.sent": [s for v in ref_docs.values() for s in v],
                        "hyp.sent": [s for v in hyp_docs.values() for s in v],
                        "ref.doc": [" ".join(v) for v in ref_docs.values()],
                        "hyp.doc": [" ".join(v) for v in hyp_docs.values()],
                        "hyp.d": [x for v in hyp_docs.values() for x in ["<d>"] + v],
                        "ids": [d for d, v in ref_docs.items() for _ in v]}.items():
            files[name] = tmp / name
            files[name].write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return tmp, ref_path, ref_docs, hyp_docs, files


def sacrebleu_cli(ref, hyps):
    out = subprocess.run([str(SACREBLEU), str(ref), "-i", *map(str, hyps), "-b", "-w", "6"],
                         capture_output=True, text=True, check=True).stdout.split()
    return [float(x) for x in out]


@needs_data
def test_sbleu_and_dbleu_equal_sacrebleu_cli(real):
    tmp, ref_path, ref_docs, hyp_docs, f = real
    cli_s, = sacrebleu_cli(f["ref.sent"], [f["hyp.sent"]])
    cli_d, = sacrebleu_cli(f["ref.doc"], [f["hyp.doc"]])
    s = corpus_sbleu([x for v in hyp_docs.values() for x in v], [x for v in ref_docs.values() for x in v])
    d = corpus_dbleu(list(hyp_docs.values()), list(ref_docs.values()))
    assert 20 < s.score < 90 and s.n_items == 2271 and d.n_items == 23
    assert round(s.score, 6) == pytest.approx(cli_s, abs=1e-6)
    assert round(d.score, 6) == pytest.approx(cli_d, abs=1e-6)
    assert s.signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    # the same from files: <d> hypothesis vs the CRLF <d> reference, and plain + doc ids
    for kw in ({"hyp": f["hyp.d"]}, {"hyp": f["hyp.sent"], "hyp_doc_ids": f["ids"]}):
        rep = bleu_from_files(ref=ref_path, **kw)
        assert round(rep["scores"]["sentence"].score, 6) == pytest.approx(cli_s, abs=1e-6)
        assert round(rep["scores"]["document"].score, 6) == pytest.approx(cli_d, abs=1e-6)
    # a plain hypothesis against a <d> reference: the reference's documents are not the hypothesis's
    # to guess (issue 33: an error, no longer a note); sentences alone need no documents
    with pytest.raises(ValueError, match=r"hyp.sent has no document boundaries but the other side has: .*--levels s"):
        bleu_from_files(f["hyp.sent"], ref_path)
    rep = bleu_from_files(f["hyp.sent"], ref_path, levels=("sentence",))
    assert round(rep["scores"]["sentence"].score, 6) == pytest.approx(cli_s, abs=1e-6) and "document" not in rep["scores"]


def to_pieces(text: str) -> str:
    """Fake SentencePiece output: '▁' word starts, long words cut in two pieces."""
    out = []
    for w in text.split():
        out += ["\u2581" + w[:3], w[3:]] if len(w) > 4 else ["\u2581" + w]
    return " ".join(out)


@needs_data
@pytest.mark.parametrize("post_processed", [False, True])
def test_fairseq_generate_with_segments(real, post_processed):
    tmp, ref_path, ref_docs, hyp_docs, _ = real
    segs, texts = [], []
    for d, sents in hyp_docs.items():  # segments of up to 7 sentences
        for first in range(0, len(sents), 7):
            part = sents[first:first + 7]
            segs.append(SegmentInfo(d, len(part), first))
            texts.append(" <sep> ".join(part))
    order = list(range(len(segs)))
    random.Random(0).shuffle(order)  # fairseq prints samples in batch order, not id order
    lines = ["2024-01-01 | INFO | fairseq_cli.generate | log line"]
    for i in order:
        h = texts[i] if post_processed else to_pieces(texts[i]).replace(" <sep> ", " \u2581<sep> ")
        lines += [f"S-{i}\tsource", f"T-{i}\t{texts[i]}", f"H-{i}\t-0.5\t{h}", f"H-{i}\t-0.9\tworse nbest", f"P-{i}\t-0.1 -0.2"]
    gen = tmp / f"gen{post_processed}.out"
    gen.write_text("\n".join(lines) + "\n", encoding="utf-8")
    seg_path = tmp / "test.segments.tsv"
    write_segment_metadata(seg_path, segs)

    samples = read_fairseq_generate(gen)
    assert samples[0].hypothesis.replace("<sep>", "").split() == texts[0].replace("<sep>", "").split()
    docs = sentences_from_segments({i: s.hypothesis for i, s in samples.items()}, segs)
    assert list(docs) == list(hyp_docs) and [len(v) for v in docs.values()] == [len(v) for v in hyp_docs.values()]
    rep = bleu_from_files(gen, ref_path, segments=seg_path, levels=("sentence", "document", "segment"))
    flat = bleu_from_files(tmp / "hyp.d", ref_path)
    assert rep["scores"]["sentence"].score == pytest.approx(flat["scores"]["sentence"].score, abs=1e-9)
    assert rep["scores"]["document"].score == pytest.approx(flat["scores"]["document"].score, abs=1e-9)
    assert rep["scores"]["segment"].n_items == len(segs)
    # the T lines as reference give the same segmentation and a perfect score
    assert bleu_from_files(gen, segments=seg_path, ref_from_generate=True)["scores"]["sentence"].score == pytest.approx(100)


def test_segment_sentence_mismatch_is_an_error():
    segs = [SegmentInfo("docA", 2, 0), SegmentInfo("docA", 1, 2), SegmentInfo("docB", 2, 0)]
    texts = {0: "a b <sep> c", 1: "d", 2: "e f g"}  # docB's segment lost its separator
    with pytest.raises(ValueError, match=r"document 'docB': segment 2 \(sentence 0\) splits into 1 sentences.*has 2"):
        sentences_from_segments(texts, segs)
    with pytest.raises(ValueError, match=r"no text for sample id\(s\) \[1\]"):
        sentences_from_segments({0: "a <sep> b", 2: "x <sep> y"}, segs)
    docs = sentences_from_segments(texts, segs, strict=False)
    assert docs == {"docA": ["a b", "c", "d"], "docB": ["e f g"]}


def test_document_mismatch_error_and_allow_mismatch(tmp_path, capsys):
    hyp = tmp_path / "hyp.txt"
    ref = tmp_path / "ref.txt"
    hyp.write_text("<d>\nthe cat sat .\non the mat .\n<d>\na dog barked loudly today .\n", encoding="utf-8")
    ref.write_text("<d>\nthe cat sat .\non the mat .\n<d>\na dog barked\nloudly today .\n", encoding="utf-8")
    with pytest.raises(ValueError, match="document '1': hypothesis has 1 sentences, reference has 2"):
        bleu_from_files(hyp, ref)
    rep = bleu_from_files(hyp, ref, allow_mismatch=True)
    assert set(rep["scores"]) == {"document"} and rep["mismatches"] == [{"doc_id": "1", "hyp_sentences": 1, "ref_sentences": 2}]
    assert rep["scores"]["document"].score == pytest.approx(100)
    assert main(["bleu", "--hyp", str(hyp), "--ref", str(ref)]) == 2
    assert "document '1': hypothesis has 1 sentences, reference has 2" in capsys.readouterr().err
    js = tmp_path / "r.json"
    assert main(["bleu", "--hyp", str(hyp), "--ref", str(ref), "--allow-mismatch", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "d-BLEU (documents)" in out and "signature: BLEU|nrefs:1" in out and "1 document differs" in out
    import json
    assert json.loads(js.read_text())["scores"]["document"]["score"] == pytest.approx(100)


def test_doc_pairing_and_bad_files(tmp_path):
    with pytest.raises(ValueError, match=r"document\(s\) \['x'\] of the hypothesis are not in the reference"):
        pair_documents({"x": ["a"]}, {"0": ["a"]})
    pairs, _ = pair_documents({"x": ["a"]}, {"0": ["b"]}, match="order")
    assert pairs == [("x", ["a"], ["b"])]
    bad = tmp_path / "bad.txt"
    bad.write_text("a\n<d>\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.txt:1: expected a <d> line to start the first document"):
        read_docmt(bad)
    ids = tmp_path / "ids"
    ids.write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match="has 3 lines but .*ids has 2 doc ids"):
        bleu_from_files(bad, bad, hyp_format="plain", hyp_doc_ids=ids)


@needs_data
def test_bom_or_zero_width_space_does_not_hide_a_marker(tmp_path):
    """The real reference's <d> file joined with `cat` to a copy that starts with a BOM and has
    a zero-width space before a marker: as many documents as the two files hold."""
    ref_path = DOCMT / "concatenated_en2de_test_de.txt"
    text = ref_path.read_text(encoding="utf-8")
    second = "\ufeff" + text.replace("\n<d>", "\n\u200b<d>", 1)
    joined = tmp_path / "joined.de"
    joined.write_text(text + second, encoding="utf-8")
    n = len(read_docmt(ref_path))
    docs = read_docmt(joined)
    assert len(docs) == 2 * n and not any("<d>" in s for v in docs.values() for s in v)
    bommed = tmp_path / "bom.de"
    bommed.write_text(second, encoding="utf-8")
    assert bleu_from_files(bommed, ref_path)["n_documents"] == n  # auto: a BOM before the first <d>


def test_empty_hypothesis_or_reference_is_a_one_line_error(tmp_path, capsys):
    empty, also_empty, ref = tmp_path / "empty.txt", tmp_path / "empty2.txt", tmp_path / "ref.txt"
    empty.write_text("")
    also_empty.write_text("")
    ref.write_text("a cat .\nthe dog .\n", encoding="utf-8")
    for hyp, r, pattern in ((empty, ref, r"hypothesis .*empty.txt has 0 lines but reference .*ref.txt has 2: the hypothesis file is empty"),
                            (ref, empty, r"reference .*empty.txt has 0: the reference file is empty"),
                            (empty, also_empty, r"nothing to score: hypothesis .*empty.txt and reference .*empty2.txt are both empty")):
        assert main(["bleu", "--hyp", str(hyp), "--ref", str(r)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().split("\n")) == 1 and "Traceback" not in err
        assert re.search(pattern, err), err
    markers = tmp_path / "markers.txt"
    markers.write_text("<d>\n<d>\n", encoding="utf-8")
    assert main(["bleu", "--hyp", str(markers), "--ref", str(markers)]) == 2
    assert "nothing to score" in capsys.readouterr().err
    # a --json that cannot be written stops before scoring
    assert main(["bleu", "--hyp", str(ref), "--ref", str(ref), "--json", str(tmp_path)]) == 2
    assert "--json " in (err := capsys.readouterr().err) and "is a directory, expected a file name" in err


# ---------------------------------------------------------------------------------------------- pipes (issue 25)

EVAL = Path(sys.executable).parent / "reluformer-eval"


def _small_files(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("the cat sat on a mat .\nthe dog barked loudly .\na bird sang .\n", encoding="utf-8")
    ref.write_text("the cat sat on the mat .\nthe dog barked loudly .\na bird sang today .\n", encoding="utf-8")
    return hyp, ref


def _cli(args, stdin=None):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([str(EVAL), "bleu", *map(str, args)], input=stdin, capture_output=True, text=True, env=env)


def test_bleu_reads_standard_input_and_pipes_like_sacrebleu(tmp_path):
    """``--hyp -`` and ``--hyp /dev/stdin`` are read once (the format detection must not consume
    the pipe), and ``-b`` prints the score alone, equal to the sacrebleu CLI's."""
    hyp, ref = _small_files(tmp_path)
    expected = sacrebleu_cli(ref, [hyp])[0]
    text = hyp.read_text(encoding="utf-8")
    for hyp_arg in ("-", "/dev/stdin"):
        run = _cli(["--hyp", hyp_arg, "--ref", ref, "-b", "-w", "2"], stdin=text)
        assert run.returncode == 0, run.stderr
        assert run.stdout.split() == [f"{expected:.2f}"], run.stdout
    run = _cli(["--hyp", hyp, "--ref", "-", "--score-only", "-w", "2"], stdin=ref.read_text(encoding="utf-8"))
    assert run.returncode == 0 and run.stdout.split() == [f"{expected:.2f}"], run.stderr
    # a stream's errors name the stream, not a temporary copy
    run = _cli(["--hyp", "-", "--hyp-format", "docmt", "--ref", ref], stdin="one line\n")
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "<stdin>:1: expected a <d> line to start the first document" in run.stderr, run.stderr


def test_bleu_from_files_reads_a_fifo_once(tmp_path):
    """A named pipe (as ``<(...)`` gives) holds its text once: detection and reading share one copy."""
    import threading

    hyp, ref = _small_files(tmp_path)
    fifo = tmp_path / "hyp.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(hyp.read_text(encoding="utf-8"), encoding="utf-8"))
    writer.start()
    report = bleu_from_files(fifo, ref)
    writer.join(timeout=10)
    assert report["scores"]["sentence"].score == pytest.approx(bleu_from_files(hyp, ref)["scores"]["sentence"].score)


def test_both_sides_on_standard_input_is_an_error(tmp_path):
    run = _cli(["--hyp", "-", "--ref", "-"], stdin="a\n")
    assert run.returncode == 2 and "only one input can be standard input ('-')" in run.stderr


def test_no_document_bleu_is_defined_without_document_boundaries(tmp_path, capsys):
    """Two plain files without doc ids: s-BLEU only, and no 'd-BLEU over 1 whole documents'."""
    hyp, ref = _small_files(tmp_path)
    assert main(["bleu", "--hyp", str(hyp), "--ref", str(ref)]) == 0
    out = capsys.readouterr().out
    assert "s-BLEU = corpus BLEU over 3 reference sentences" in out
    assert "d-BLEU" not in out.split("note:")[0] and "whole documents" not in out
    assert "note: no document boundaries on either side: d-BLEU skipped" in out
    ids = tmp_path / "ids.txt"
    ids.write_text("a\na\nb\n", encoding="utf-8")
    assert main(["bleu", "--hyp", str(hyp), "--ref", str(ref), "--hyp-doc-ids", str(ids), "--ref-doc-ids", str(ids),
                 "-b"]) == 0
    scores = capsys.readouterr().out.split()  # s-BLEU, then d-BLEU over the two documents
    assert len(scores) == 2 and all(0 < float(x) < 100 for x in scores)
def test_chrf_plus_plus_and_ter_equal_the_sacrebleu_cli_and_moses_detokenises(tmp_path, capsys):
    """chrF++ and TER equal ``sacrebleu -m chrf --chrf-word-order 2`` / ``-m ter`` on the same
    lines; --detokenize moses turns the bible's tokenised "vineyard ." into "vineyard." on both
    sides before scoring, and says so."""
    refs = ["The master of the vineyard said , \" Go ! \"", "He went away ; and they said nothing .",
            "It is a vineyard ( a small one ) .", "Why ? Because it 's late ."]
    hyps = ["The master of vineyard said , \" go ! \"", "He went ; they said nothing .",
            "It is vineyard ( small one ) .", "Why ? It 's late ."]
    ref, hyp = tmp_path / "ref", tmp_path / "hyp"
    ref.write_text("".join(x + "\n" for x in refs), encoding="utf-8")
    hyp.write_text("".join(x + "\n" for x in hyps), encoding="utf-8")

    def cli(*metric):
        out = subprocess.run([str(SACREBLEU), str(ref), "-i", str(hyp), "-b", "-w", "6", *metric],
                             capture_output=True, text=True, check=True).stdout
        return float(out.split()[0])

    report = bleu_from_files(hyp, ref, levels=("sentence",))
    assert report["chrf++"]["sentence"].score == pytest.approx(cli("-m", "chrf", "--chrf-word-order", "2"), abs=1e-5)
    assert report["ter"]["sentence"].score == pytest.approx(cli("-m", "ter"), abs=1e-5)
    assert report["chrf++"]["sentence"].name == "s-chrF++" and report["ter"]["sentence"].name == "s-TER"

    detok = bleu_from_files(hyp, ref, levels=("sentence",), detokenize="moses")
    from reluformer_mt.evaluation.bleu import moses_detokenize
    assert moses_detokenize(["the vineyard .", "he said , \" go ! \""]) == ["the vineyard.", 'he said, "go!"']
    plain_ref, plain_hyp = tmp_path / "ref.detok", tmp_path / "hyp.detok"
    plain_ref.write_text("".join(x + "\n" for x in moses_detokenize(refs)), encoding="utf-8")
    plain_hyp.write_text("".join(x + "\n" for x in moses_detokenize(hyps)), encoding="utf-8")
    assert detok["scores"]["sentence"].score == pytest.approx(sacrebleu_cli(plain_ref, [plain_hyp])[0], abs=1e-6)
    assert detok["scores"]["sentence"].score != pytest.approx(report["scores"]["sentence"].score, abs=1e-3)
    assert "Moses detokeniser" in detok["definition"] and "Moses" not in report["definition"]

    assert main(["bleu", "--hyp", str(hyp), "--ref", str(ref), "--levels", "s", "--detokenize", "moses",
                 "-m", "bleu", "chrf", "ter", "--chrf-word-order", "2"]) == 0
    out = capsys.readouterr().out
    assert "s-chrF++" in out and "s-TER" in out and "TER signature: TER|" in out and "detokenised with sacremoses" in out
