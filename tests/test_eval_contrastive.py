"""Contrastive evaluation (ContraPro, DiscEvalMT), CXMI and chrF on real data with the tiny
document-level model of ``conftest.doc_checkpoint`` (20 updates on IWSLT2017 TED: a weak model,
the pipeline is what is checked)."""
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from helpers import SHARED_DATA
from reluformer_mt.cli.eval import main
from reluformer_mt.evaluation import contrastive, extract
from reluformer_mt.evaluation.bleu import bleu_from_files, read_docmt

CONTRAPRO = SHARED_DATA / "contrapro_ctx1"
DISCEVAL = SHARED_DATA / "bawden_enfr"
IWSLT_TEST_DE = SHARED_DATA / "docmt_ende" / "IWSLT2017" / "concatenated_en2de_test_de.txt"
needs_suites = pytest.mark.skipif(not (CONTRAPRO.is_dir() and DISCEVAL.is_dir()),
                                  reason=f"contrastive suites not found in {SHARED_DATA}")


def run_cli(argv, capsys):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def loaded(doc_checkpoint):
    return extract.load_checkpoint(doc_checkpoint)


# ---------------------------------------------------------------------------------------------- suites

@needs_suites
def test_contrapro_pronoun_rule_gives_the_published_balance():
    examples = contrastive.read_contrapro(CONTRAPRO)
    assert len(examples) == 12000
    assert Counter(e.categories["pronoun"] for e in examples) == {"er": 4000, "sie": 4000, "es": 4000}
    assert Counter(len(e.candidates) for e in examples) == {3: 11969, 4: 31}
    assert contrastive.contrapro_pronoun("Ich habe ihm gesagt, dass es so ist.",
                                         ["Ich habe ihr gesagt, dass sie so ist.", "Ich habe ihm gesagt, dass er so ist."]) == "es"


@needs_suites
def test_discevalmt_pairs_follow_the_json():
    ex = contrastive.read_discevalmt(DISCEVAL)
    assert Counter(e.set for e in ex) == {"anaphora": 200, "lexical_choice": 200}
    first = ex[0]
    assert first.candidates == ["Ils seront bientôt pleins de nouveaux résidents.",
                                "Elles seront bientôt pleines de nouveaux résidents."]
    assert first.categories == {"antecedent": "m.pl", "correctness": "correct"}
    assert Counter(e.categories["correctness"] for e in ex if e.set == "anaphora") == {"correct": 100, "semi-correct": 100}


# ---------------------------------------------------------------------------------------------- scoring

@needs_suites
def test_requests_put_context_and_separator_where_training_does(loaded):
    scorer = contrastive.ForcedScorer(loaded)
    eos, sep = loaded.tgt_dict.eos(), scorer.sep_tgt
    with_ctx = scorer.text_request("It was red.", "Es war rot.", "I saw the car.", "Ich sah das Auto.")
    alone = scorer.text_request("It was red.", "Es war rot.")
    assert alone.prefix == () and alone.tgt == with_ctx.tgt and alone.tgt[-1] == eos
    assert with_ctx.prefix[-1] == sep and sep not in alone.src and scorer.sep_src in with_ctx.src
    assert with_ctx.src[-len(alone.src):] == alone.src
    # a score does not depend on what else is in the batch (padding, other candidates)
    other = scorer.text_request("A much longer sentence that pads the whole batch a lot more.", "Ein viel längerer Satz.")
    together = scorer.score([with_ctx, alone, other])
    for r in (with_ctx, alone):
        assert scorer.score([r])[r] == pytest.approx(together[r], abs=1e-4)
    assert together[with_ctx] < 0 and together[alone] < 0


@needs_suites
def test_discevalmt_without_context_is_exactly_50_percent(doc_checkpoint, tmp_path, capsys):
    """The full 200 + 200 pairs (about 2 s): every current sentence comes in mirrored pairs, so a
    model that cannot see the context gets exactly one of each right."""
    out_json = tmp_path / "disc.json"
    rc, out, err = run_cli(["contrastive", "--checkpoint", doc_checkpoint, "--suite", "discevalmt",
                            "--suite-dir", DISCEVAL, "--context", "none", "--json", out_json, "--any-languages"], capsys)
    assert rc == 0, err
    assert "the languages do not match; scored anyway" in out  # an en-de model on the en-fr suite
    report = json.loads(out_json.read_text())
    for name in ("anaphora", "lexical_choice"):
        entry = report["sets"][name]
        assert (entry["examples"], entry["correct"], entry["accuracy"], entry["ties"]) == (200, 100, 50.0, 0)
        assert entry["chance"] == 50.0
    assert "no-context check, anaphora: 50.00 % = 50 % exactly" in out
    assert "type=disambig" in out and "antecedent=f.sg" in out

    # sum vs mean, as documented: they disagree only between candidates of different lengths, and
    # then the mean prefers the longer, less probable candidate
    flips = [r for r in report["examples"] if r["correct"]["sum"] != r["correct"]["mean"]]
    assert flips and sum(e["flipped_by_other_score"] for e in report["sets"].values()) == len(flips)
    for r in flips:
        (lp_a, lp_b), (n_a, n_b) = r["logprob"], r["tokens"]
        sum_pick, mean_pick = (0 if lp_a > lp_b else 1), (0 if lp_a / n_a > lp_b / n_b else 1)
        assert sum_pick != mean_pick
        assert r["tokens"][mean_pick] > r["tokens"][sum_pick] and r["logprob"][mean_pick] < r["logprob"][sum_pick]


@needs_suites
def test_a_checkpoint_of_another_language_pair_is_a_one_line_error(doc_checkpoint, capsys):
    """The en-de test model on the en-fr DiscEvalMT: say that the languages differ, not a length error."""
    rc, out, err = run_cli(["contrastive", "--checkpoint", doc_checkpoint, "--suite", "discevalmt",
                            "--suite-dir", DISCEVAL, "--limit", "2"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "--suite discevalmt is en->fr, but" in err and "translates en->de: the languages do not match" in err


def test_sum_and_mean_on_a_constructed_case():
    """Correct: 3 tokens, log p = -3.0 (mean -1.0); contrastive: 8 tokens, log p = -6.0 (mean -0.75)."""
    logprobs, tokens = [-3.0, -6.0], [3, 8]
    by = {s: [contrastive.candidate_score(lp, n, s) for lp, n in zip(logprobs, tokens)] for s in ("sum", "mean")}
    assert contrastive.is_correct(by["sum"]) and not contrastive.is_correct(by["mean"])
    assert not contrastive.is_correct([-2.0, -2.0, -5.0])  # a tie with a contrastive candidate is wrong


@needs_suites
def test_contrapro_with_context_reports_each_pronoun(doc_checkpoint, capsys):
    rc, out, err = run_cli(["contrastive", "--checkpoint", doc_checkpoint, "--suite", "contrapro", "--suite-dir",
                            CONTRAPRO, "--context", "previous", "--limit", "600", "--score", "mean"], capsys)
    assert rc == 0, err
    assert "accuracy % (mean)" in out and "accuracy % (sum)" in out
    for pronoun in ("er", "sie", "es"):
        assert f"pronoun={pronoun}" in out
    row = next(line for line in out.splitlines() if line.startswith("contrapro "))
    assert row.split()[1] == "600"


def test_cxmi_is_finite_on_a_prepared_split(doc_checkpoint, prepared_doc_data, tmp_path, capsys):
    out_json = tmp_path / "cxmi.json"
    rc, out, err = run_cli(["cxmi", "--checkpoint", doc_checkpoint, "--data", prepared_doc_data["doc"],
                            "--split", "valid", "--bootstrap", "200", "--json", out_json], capsys)
    assert rc == 0, err
    report = json.loads(out_json.read_text())
    valid = json.loads((prepared_doc_data["doc"] / "prepared.json").read_text())["splits"]["valid"]
    # every sentence but the first of each document, less those whose context does not fit
    assert report["sentences"] + report["skipped_too_long"] == valid["sentences"] - valid["documents"]
    for key in ("per_sentence", "per_token"):
        e = report[key]
        assert all(v is not None for v in (e["cxmi"], e["std_error"], *e["bootstrap_95"]))
        assert e["bootstrap_95"][0] <= e["cxmi"] <= e["bootstrap_95"][1] and e["std_error"] > 0
    assert "baseline (no context use)" in out


# ---------------------------------------------------------------------------------------------- bad inputs

def _copy(src: Path, dst: Path, names) -> Path:
    dst.mkdir()
    for name in names:
        shutil.copy(src / name, dst / name)
    return dst


def _small_contrapro(tmp_path: Path, groups: str) -> Path:
    d = tmp_path / "contrapro"
    d.mkdir(parents=True)
    for name in ("en.txt", "de.txt"):
        lines = (CONTRAPRO / name).read_text(encoding="utf-8").splitlines()[:9]
        (d / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    (d / "sentence_groups.txt").write_text(groups, encoding="utf-8")
    return d


@needs_suites
def test_bad_suites_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "never-loaded.pt").write_bytes(b"")  # there (checked first), never loaded: the suite fails before

    def error(suite, suite_dir):
        rc, _, err = run_cli(["contrastive", "--checkpoint", tmp_path / "never-loaded.pt", "--suite", suite,
                              "--suite-dir", suite_dir], capsys)
        assert rc == 2 and len(err.strip().splitlines()) == 1  # an input error (reluformer_mt.cli.checks)
        return err

    names = [p.name for p in DISCEVAL.iterdir() if p.name.startswith(("anaphora", "lexical"))]
    missing = _copy(DISCEVAL, tmp_path / "missing", [n for n in names if n != "lexical-choice.json"])
    assert "lexical-choice.json: suite file not found" in error("discevalmt", missing)

    short = _copy(DISCEVAL, tmp_path / "short", names)
    lines = (short / "anaphora.prev.fr").read_text(encoding="utf-8").splitlines()
    (short / "anaphora.prev.fr").write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    assert "anaphora.prev.fr has 399 lines but" in error("discevalmt", short)

    edited = _copy(DISCEVAL, tmp_path / "edited", names)
    lines = (edited / "lexical_choice.current.fr").read_text(encoding="utf-8").splitlines()
    lines[6] = "Une autre phrase."
    (edited / "lexical_choice.current.fr").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert "lexical_choice.current.fr:7: does not match pair 4 of" in error("discevalmt", edited)

    out_of_range = _small_contrapro(tmp_path / "a", "0\n3\n40\n9\n")
    assert "sentence_groups.txt:3: line index 40 is out of range (the suite has 9 lines)" in error("contrapro", out_of_range)
    no_end = _small_contrapro(tmp_path / "b", "0\n3\n6\n")
    assert "expected group starts from 0 and the end 9" in error("contrapro", no_end)
    ok = _small_contrapro(tmp_path / "c", "0\n3\n6\n9\n")
    (ok / "de.txt").write_text((ok / "de.txt").read_text(encoding="utf-8").replace(" <SEP> ", " ", 1), encoding="utf-8")
    assert "de.txt:1: expected 'context <SEP> sentence'" in error("contrapro", ok)
    assert "suite directory not found" in error("contrapro", tmp_path / "nowhere")


# ---------------------------------------------------------------------------------------------- chrF

@pytest.mark.skipif(not IWSLT_TEST_DE.is_file(), reason=f"{IWSLT_TEST_DE} not found")
def test_document_chrf_equals_the_sacrebleu_cli(tmp_path, capsys):
    docs = read_docmt(IWSLT_TEST_DE)
    hyp = {d: [" ".join(s.split()[1:]) for s in sents] for d, sents in docs.items()}  # drop each first word
    files = {"ref.d": [x for v in docs.values() for x in ["<d>"] + v], "hyp.d": [x for v in hyp.values() for x in ["<d>"] + v],
             "ref.doc": [" ".join(v) for v in docs.values()], "hyp.doc": [" ".join(v) for v in hyp.values()],
             "ref.sent": [s for v in docs.values() for s in v], "hyp.sent": [s for v in hyp.values() for s in v]}
    for name, lines in files.items():
        (tmp_path / name).write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    sacrebleu = Path(sys.executable).parent / "sacrebleu"

    def cli(level):
        return float(subprocess.run([str(sacrebleu), str(tmp_path / f"ref.{level}"), "-i", str(tmp_path / f"hyp.{level}"),
                                     "-m", "chrf", "-b", "-w", "6"], capture_output=True, text=True, check=True).stdout)

    report = bleu_from_files(tmp_path / "hyp.d", tmp_path / "ref.d")
    assert report["chrf"]["document"].score == pytest.approx(cli("doc"), abs=1e-5)
    assert report["chrf"]["sentence"].score == pytest.approx(cli("sent"), abs=1e-5)
    assert report["chrf"]["document"].n_items == len(docs)
    out_json = tmp_path / "bleu.json"
    rc, out, err = run_cli(["bleu", "--hyp", tmp_path / "hyp.d", "--ref", tmp_path / "ref.d", "-m", "bleu", "chrf",
                            "--json", out_json], capsys)
    assert rc == 0, err
    assert "d-chrF" in out and "chrF signature: chrF2|" in out
    assert json.loads(out_json.read_text())["chrf"]["document"]["name"] == "d-chrF"
