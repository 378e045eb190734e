"""What one command writes, the next reads as the same thing: reluformer-translate's output for
several documents (the lines layout: a blank line between documents) is scored by
reluformer-eval bleu over those documents, as the same text with <d> lines is."""
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_subprocess

FAST = ["--beam", "2", "--max-len-a", "0", "--max-len-b", "6", "--no-progress"]


def talks(side: int, n_docs: int = 3, n_sentences: int = 4):
    from conftest import iwslt_files
    from reluformer_mt.inference.inputs import read_input

    path = iwslt_files("test")[side]
    if not path.is_file():
        pytest.skip(f"real data not found at {path}")
    return [d.sentences[:n_sentences] for d in read_input(path, fmt="docmt").documents[:n_docs]]


def write_lines(path: Path, docs) -> Path:
    path.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    return path


def write_docmt(path: Path, docs) -> Path:
    path.write_text("".join("<d>\n" + "".join(s + "\n" for s in d) for d in docs), encoding="utf-8")
    return path


def documents_of_lines(path: Path):
    text = path.read_text(encoding="utf-8").rstrip("\n")
    return [block.split("\n") for block in text.split("\n\n")]


def bleu(*argv):
    from reluformer_mt.evaluation.bleu import bleu_from_files

    return bleu_from_files(*argv)


def test_translate_lines_output_of_several_documents_is_scored_as_those_documents(doc_checkpoint, tmp_path):
    from reluformer_mt.cli.translate import main as translate

    source, reference = write_lines(tmp_path / "talks.en", talks(0)), write_lines(tmp_path / "talks.de", talks(1))
    out = tmp_path / "talks.hyp.de"
    assert translate([str(a) for a in ["-c", doc_checkpoint, "-i", source, "-o", out, "--format", "lines", *FAST]]) == 0
    hyp_docs = documents_of_lines(out)
    assert [len(d) for d in hyp_docs] == [4, 4, 4]  # the layout kept: 3 documents, a blank line between

    report = bleu(out, reference)
    as_docmt = bleu(write_docmt(tmp_path / "hyp.docmt", hyp_docs), write_docmt(tmp_path / "ref.docmt", talks(1)))
    assert (report["n_documents"], report["n_sentences"]) == (3, 12)
    for level in ("sentence", "document"):
        assert report["scores"][level].score == as_docmt["scores"][level].score, level
    assert any("read as documents separated by blank lines" in n for n in report["notes"])
    # a <d> reference pairs with the lines hypothesis document by document too
    mixed = bleu(out, tmp_path / "ref.docmt")
    assert mixed["scores"]["document"].score == as_docmt["scores"]["document"].score

    # the docs' pipe, `reluformer-translate ... < doc | reluformer-eval bleu ref -b`: s-BLEU, then d-BLEU
    bin_dir = Path(sys.executable).parent
    piped = subprocess.run(f"{bin_dir}/reluformer-translate -c {doc_checkpoint} -f lines {' '.join(FAST)} < {source}"
                           f" | {bin_dir}/reluformer-eval bleu {reference} -b -w 4", shell=True, capture_output=True,
                           text=True, timeout=600)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.split() == [f"{report['scores'][lv].score:.4f}" for lv in ("sentence", "document")]


def test_a_flat_reference_scores_the_sentences_of_a_lines_hypothesis(tmp_path):
    """A reference without document boundaries (one sentence a line): the hypothesis's blank lines
    are its document separators when its other lines are the reference's sentences; s-BLEU is
    scored, d-BLEU is an error naming what to give (documents on one side are no evidence for the
    other's)."""
    hyp = write_lines(tmp_path / "hyp", [["a b c d", "e f g h"], ["i j k l"]])
    flat_ref = tmp_path / "ref"
    flat_ref.write_text("a b c d\ne f g x\ni j k l\n", encoding="utf-8")
    report = bleu(hyp, flat_ref, "auto", "auto", None, None, None, "<sep>", "auto", False, ("sentence",))
    assert report["n_sentences"] == 3 and report["scores"]["sentence"].score > 0
    proc = run_subprocess(["reluformer-eval", "bleu", flat_ref, "-i", hyp])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "no document boundaries" in proc.stderr and "a blank line between documents" in proc.stderr
    # an empty hypothesis line where the counts match is an empty sentence, as sacreBLEU reads it
    hyp.write_text("a b c d\n\ni j k l\n", encoding="utf-8")
    assert bleu(hyp, flat_ref)["n_sentences"] == 3
