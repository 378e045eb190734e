"""``reluformer-eval bleu`` as a drop-in for the sacrebleu command (issue 33): the same call
shapes give the same numbers as sacreBLEU 2's own command line on real IWSLT2017 sentences."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import DOCMT, needs_shared_data

EVAL = Path(sys.executable).parent / "reluformer-eval"
SACREBLEU = Path(sys.executable).parent / "sacrebleu"
pytestmark = needs_shared_data


def run(cmd, stdin=None):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([str(c) for c in cmd], input=stdin, capture_output=True, text=True, env=env, timeout=300)


def numbers(text):
    """The numbers of sacrebleu -b output (one number, or a JSON-like list for several metrics)."""
    return [float(x) for x in text.replace("[", " ").replace("]", " ").replace(",", " ").split()]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Real German reference sentences (IWSLT2017 test), a second reference and two systems
    that drop or swap words, 300 sentences each; plus <d> versions of the first system and reference."""
    tmp = tmp_path_factory.mktemp("sacrebleu")
    lines = [l.strip() for l in (DOCMT / "IWSLT2017" / "concatenated_en2de_test_de.txt").read_text(encoding="utf-8").splitlines()]
    refs = [l for l in lines if l and l != "<d>"][:300]

    def drop(s, k):
        w = s.split()
        return " ".join(w[:k % max(len(w), 1)] + w[k % max(len(w), 1) + 1:])

    def swap(s):
        w = s.split()
        return " ".join(w[1:2] + w[:1] + w[2:]) if len(w) > 2 else s
    out = {"ref": refs, "ref2": [swap(r) for r in refs], "sys1": [drop(r, k) for k, r in enumerate(refs)],
           "sys2": [swap(drop(r, k + 1)) for k, r in enumerate(refs)]}
    for name, rows in out.items():
        (tmp / name).write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    (tmp / "sys1.d").write_text("<d>\n" + "".join(r + "\n" for r in out["sys1"][:150]) + "<d>\n"
                                + "".join(r + "\n" for r in out["sys1"][150:]), encoding="utf-8")
    return tmp


def test_cat_hyp_into_eval_bleu_ref_b_prints_sacrebleus_one_number(files):
    hyp = (files / "sys1").read_text(encoding="utf-8")
    ours = run([EVAL, "bleu", files / "ref", "-b"], stdin=hyp)
    theirs = run([SACREBLEU, files / "ref", "-b"], stdin=hyp)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == theirs.stdout and len(ours.stdout.split()) == 1  # the same text: one number, width 1
    # messages go to stderr: here the one note (the default --levels s,d; plain files have no documents)
    assert ours.stderr == "reluformer-eval bleu: note: <stdin>: no document boundaries on either side: d-BLEU skipped\n"


def test_metrics_width_references_and_json_like_sacrebleu(files, tmp_path):
    ours = run([EVAL, "bleu", files / "ref", "-i", files / "sys1", "-m", "bleu", "chrf", "ter", "-b", "-w", "4",
                "--json", tmp_path / "out.json"])
    theirs = run([SACREBLEU, files / "ref", "-i", files / "sys1", "-m", "bleu", "chrf", "ter", "-b", "-w", "4"])
    assert ours.returncode == 0, ours.stderr
    assert numbers(ours.stdout) == numbers(theirs.stdout) and len(numbers(ours.stdout)) == 3
    assert "report written to" in ours.stderr and "report written" not in ours.stdout  # stdout: the scores only
    assert json.loads((tmp_path / "out.json").read_text())["scores"]["sentence"]["score"] == pytest.approx(numbers(ours.stdout)[0], abs=1e-4)
    # several references
    ours = run([EVAL, "bleu", files / "ref", files / "ref2", "-i", files / "sys1", "-m", "bleu", "chrf", "-b", "-w", "4"])
    theirs = run([SACREBLEU, files / "ref", files / "ref2", "-i", files / "sys1", "-m", "bleu", "chrf", "-b", "-w", "4"])
    assert ours.returncode == 0, ours.stderr
    assert numbers(ours.stdout) == numbers(theirs.stdout)
    single = run([EVAL, "bleu", files / "ref", "-i", files / "sys1", "-b", "-w", "4"])
    assert numbers(single.stdout)[0] != numbers(ours.stdout)[0]  # the second reference counts
    # the full report says how many references, with sacreBLEU's signature
    full = run([EVAL, "bleu", files / "ref", files / "ref2", "-i", files / "sys1"])
    assert "2 references" in full.stdout and "nrefs:2" in full.stdout


def test_paired_bootstrap_is_sacrebleus(files, tmp_path):
    # (sacreBLEU 2.6's -f json fails on chrF's numpy numbers, so the comparison is BLEU's; chrF goes the same way)
    args = ["-i", files / "sys1", files / "sys2", "--paired-bs", "--paired-bs-n", "200"]
    ours = run([EVAL, "bleu", files / "ref", *args, "-m", "bleu", "chrf", "--json", tmp_path / "paired.json"])
    theirs = run([SACREBLEU, files / "ref", *args, "-m", "bleu", "-f", "json"])
    assert ours.returncode == 0 and theirs.returncode == 0, ours.stderr + theirs.stderr
    expected = json.loads(theirs.stdout)
    got = json.loads((tmp_path / "paired.json").read_text())["paired_bootstrap"]["sentence"]["systems"]
    assert len(got) == 2 == len(expected)
    for mine, sacre in zip(got, expected):
        assert mine["chrF2"]["score"] > 0 and mine["chrF2"]["ci"] > 0
        for metric, key in (("BLEU", "BLEU"),):
            assert mine[metric]["score"] == pytest.approx(sacre[key]["score"], abs=1e-9)
            assert mine[metric]["mean"] == pytest.approx(sacre[key]["mean"], abs=1e-9)
            assert mine[metric]["ci"] == pytest.approx(sacre[key]["ci"], abs=1e-9)
            assert mine[metric]["p_value"] == sacre[key]["p_value"]
    assert "paired bootstrap resampling (200 resamples, sacreBLEU) over sentences" in ours.stdout
    # one system cannot be compared
    one = run([EVAL, "bleu", files / "ref", "-i", files / "sys1", "--paired-bs"])
    assert one.returncode == 2 and "needs two or more" not in one.stdout and "give two or more -i files" in one.stderr


def test_errors_name_the_files(files, tmp_path):
    missing = run([EVAL, "bleu", tmp_path / "nope.txt", "-i", files / "sys1"])
    assert missing.returncode == 2 and missing.stderr == f"reluformer-eval bleu: error: {tmp_path / 'nope.txt'}: file not found\n"
    short = tmp_path / "short"
    short.write_text("one line\n", encoding="utf-8")
    mismatch = run([EVAL, "bleu", files / "ref", "-i", short])
    assert mismatch.returncode == 2 and mismatch.stderr.count("\n") == 1
    assert f"hypothesis {short} has 1 sentences, reference {files / 'ref'} has 300" in mismatch.stderr
    # a <d> hypothesis against a plain reference: no guessed documents
    guessed = run([EVAL, "bleu", files / "ref", "-i", files / "sys1.d"])
    assert guessed.returncode == 2 and f"{files / 'ref'} has no document boundaries but the other side has" in guessed.stderr
    sentences = run([EVAL, "bleu", files / "ref", "-i", files / "sys1.d", "--levels", "s", "-b"])
    plain = run([EVAL, "bleu", files / "ref", "-i", files / "sys1", "-b"])
    assert sentences.returncode == 0 and sentences.stdout == plain.stdout
    none = run([EVAL, "bleu"], stdin="a\n")
    assert none.returncode == 2 and "give the reference file(s)" in none.stderr
