"""AER on hand-computed cases, bad input, and the diagonal baseline on the real gold sets."""
import math
import os
import re
from pathlib import Path

import pytest

from reluformer_mt.cli.eval import main
from reluformer_mt.evaluation.aer import (check_ranges, corpus_aer, diagonal_alignment, parse_links, read_gold,
                                          read_gold_naacl, read_lengths, read_predictions)

DATA = Path(os.environ.get("RELUFORMER_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data not found at {DATA} (set RELUFORMER_SHARED_DATA)")


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def test_hand_computed_both_bases(tmp_path):
    # S = {(0,0), (2,2)}, P = S + {(1,1)}; A = {(0,0), (1,1), (1,2)}
    # |A∩S| = 1, |A∩P| = 2 -> precision 2/3, recall 1/2, AER = 1 - 3/5
    pred = read_predictions(write(tmp_path, "pred", "0-0 1-1 1-2\n"))
    for base, text in ((1, "1-1 2p2 3-3\n"), (0, "0-0 1p1 2-2\n")):
        gold = read_gold(write(tmp_path, f"gold{base}", text), base=base)
        assert gold[0][0] == {(0, 0), (2, 2)} and gold[0][1] == {(0, 0), (1, 1), (2, 2)}
        r = corpus_aer(pred, gold)
        assert (r.precision, r.recall) == pytest.approx((2 / 3, 1 / 2))
        assert r.aer == pytest.approx(0.4)


def test_corpus_level_sums_counts():
    gold = [({(0, 0), (2, 2)}, {(0, 0), (1, 1), (2, 2)}), ({(0, 1)}, {(0, 1)})]
    r = corpus_aer([{(0, 0), (1, 1), (1, 2)}, set()], gold)
    assert (r.n_predicted, r.n_sure, r.a_and_s, r.a_and_p) == (3, 3, 1, 2)
    assert (r.precision, r.recall, r.aer) == pytest.approx((2 / 3, 1 / 3, 0.5))


def test_possible_mark_option_and_sure_wins():
    sure, possible = parse_links("1-1 2P2 1P1", base=1, possible_mark="P")
    assert sure == {(0, 0)} and possible == {(1, 1)}  # 1P1 is also sure: counted as sure only
    with pytest.raises(ValueError, match="malformed link '2p2'"):
        parse_links("2p2", base=1, possible_mark="P")


def test_empty_sets_are_nan_or_defined():
    r = corpus_aer([set(), set()], [(set(), set()), (set(), set())])
    assert math.isnan(r.precision) and math.isnan(r.recall) and math.isnan(r.aer)
    r = corpus_aer([set()], [({(0, 0)}, {(0, 0)})])  # nothing predicted against gold links
    assert math.isnan(r.precision) and r.recall == 0.0 and r.aer == 1.0
    r = corpus_aer([{(0, 0)}], [(set(), {(0, 0)})])  # only possible gold links
    assert r.precision == 1.0 and math.isnan(r.recall) and r.aer == 0.0


def test_malformed_link_names_file_line_token(tmp_path):
    path = write(tmp_path, "gold", "1-1\n1-2 3_4\n")
    with pytest.raises(ValueError, match=r"gold:2: malformed link '3_4'"):
        read_gold(path)
    with pytest.raises(ValueError, match=r"pred:1: malformed link '0p1'"):
        read_predictions(write(tmp_path, "pred", "0p1\n"))
    with pytest.raises(ValueError, match="index 0 but the index base is 1"):
        read_gold(write(tmp_path, "g0", "0-1\n"), base=1)


def test_out_of_range_names_file_and_line(tmp_path):
    lengths = read_lengths(write(tmp_path, "st", "a b ||| x y z\nc ||| w\n"))
    assert lengths == [(2, 3), (1, 1)]
    check_ranges([{(1, 2)}, {(0, 0)}], lengths, "pred")
    with pytest.raises(ValueError, match=r"pred:2: link 1-2 out of range: the sentence has 1 source and 1 target"):
        check_ranges([{(1, 2)}, {(0, 1)}], lengths, "pred", base=1)


def test_cli_missing_gold_line_and_mismatch(tmp_path, capsys):
    gold = write(tmp_path, "gold", "1-1\n")
    pred = write(tmp_path, "pred", "0-0\n0-0\n")
    assert main(["aer", "--gold", gold, "--gold-base", "1", "--pred", pred]) == 2
    err = capsys.readouterr().err
    assert "gold has 1 sentences but" in err and "pred has 2" in err
    st = write(tmp_path, "st", "a ||| b\n")
    assert main(["aer", "--gold", write(tmp_path, "g2", "1-1\n"), "--gold-base", "1", "--pred", write(tmp_path, "p2", "0-3\n"),
                 "--lengths", st]) == 2
    assert "p2:1: link 0-3 out of range" in capsys.readouterr().err


def test_naacl_reader(tmp_path):
    path = write(tmp_path, "ref.wa", "1 0 0 S\n1 1 2 P\n3 2 1\n")
    gold = read_gold_naacl(path, 3)
    assert gold == [({(0, 0)}, {(0, 0), (1, 2)}), (set(), set()), ({(2, 1)}, {(2, 1)})]
    with pytest.raises(ValueError, match="sentence id 4 out of range"):
        read_gold_naacl(write(tmp_path, "bad.wa", "4 0 0 S\n"), 3)


@needs_data
def test_diagonal_baseline_on_real_gold(tmp_path, capsys):
    # awesome-align Hansards en-fr: 1-based with possible links; ranges checked with the tokens
    aw = DATA / "gold_align_awesome"
    js = tmp_path / "enfr.json"
    assert main(["aer", "--gold", str(aw / "enfr.gold"), "--gold-base", "1", "--baseline", "diagonal",
                 "--lengths", str(aw / "enfr.src-tgt"), "--json", str(js)]) == 0
    import json
    r = json.loads(js.read_text())["result"]
    assert (r["n_sentences"], r["n_sure"], r["n_possible"]) == (447, 4038, 17438)
    assert r["aer"] == pytest.approx(0.53844, abs=1e-4)
    # jaen counts U+3000 as a token: splitting on all whitespace would put 6 links out of range
    lengths = read_lengths(aw / "jaen.src-tgt")
    check_ranges([p for _, p in read_gold(aw / "jaen.gold")], lengths, "jaen.gold", base=1)
    # Biçici de-en: 0-based; the pharaoh and NAACL files agree; line 63 holds an out-of-range link
    bi = DATA / "gold_align_deen_bicici"
    lengths = read_lengths(bi / "test.de", bi / "test.en")
    pred = [diagonal_alignment(ns, nt) for ns, nt in lengths]
    gold = read_gold(bi / "de-en.wa", base=0)
    assert gold == read_gold_naacl(bi / "de-en.ref.wa", 100)
    r = corpus_aer(pred, gold)
    assert (r.n_sure, round(r.aer, 4)) == (1233, 0.6710)
    with pytest.raises(ValueError, match=r"de-en.wa:63: link 12-16 out of range"):
        check_ranges([p for _, p in gold], lengths, bi / "de-en.wa")


@needs_data
def test_gold_base_is_required_and_the_other_base_is_warned(tmp_path, capsys):
    aw, bi = DATA / "gold_align_awesome", DATA / "gold_align_deen_bicici"
    with pytest.raises(SystemExit) as e:  # never guessed
        main(["aer", "--gold", str(aw / "enfr.gold"), "--baseline", "diagonal", "--lengths", str(aw / "enfr.src-tgt")])
    assert e.value.code == 2 and "the following arguments are required: --gold-base" in capsys.readouterr().err
    warning = "reluformer-eval aer: warning: --gold-base 0, but "
    # the 1-based Hansards gold read as 0-based: with lengths (last words at index = length) ...
    assert main(["aer", "--gold", str(aw / "enfr.gold"), "--gold-base", "0", "--baseline", "diagonal",
                 "--lengths", str(aw / "enfr.src-tgt"), "--unchecked-gold"]) == 0
    err = capsys.readouterr().err
    assert re.search(warning + r"\d+ of \d+ linked sentences have a link at index = sentence length.*looks 1-based; "
                     r"check --gold-base", err)
    # ... and without them (no link uses index 0)
    pred = write(tmp_path, "pred", "\n".join("0-0" for _ in range(447)) + "\n")
    assert main(["aer", "--gold", str(aw / "enfr.gold"), "--gold-base", "0", "--pred", pred]) == 0
    assert warning + "no link of 447 linked sentences uses index 0" in capsys.readouterr().err
    # read as 1-based it is quiet; Biçici's 0-based gold (one out-of-range link on line 63) too
    assert main(["aer", "--gold", str(aw / "enfr.gold"), "--gold-base", "1", "--pred", pred]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["aer", "--gold", str(bi / "de-en.wa"), "--gold-base", "0", "--baseline", "diagonal",
                 "--src", str(bi / "test.de"), "--tgt", str(bi / "test.en"), "--unchecked-gold"]) == 0
    assert "warning" not in capsys.readouterr().err
    # Biçici's gold read as 1-based: index 0 is an error that names the likely cause
    assert main(["aer", "--gold", str(bi / "de-en.wa"), "--gold-base", "1", "--pred", pred]) == 2
    assert "has index 0 but the index base is 1 (is the file 0-based?)" in capsys.readouterr().err
