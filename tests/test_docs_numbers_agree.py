"""Numbers that more than one page quotes, or that a page's prose quotes from its own table, agree:
the README's demo table and its prose, the demo run's kNN-MT tables and their prose
(docs/history/KNN_MT.md), the set-up time of the README and docs/DESIGN.md."""
import json
import re

import pytest

from helpers import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
KNN_MT = (REPO / "docs" / "history" / "KNN_MT.md").read_text(encoding="utf-8")
DESIGN = (REPO / "docs" / "DESIGN.md").read_text(encoding="utf-8")
SUMMARY = json.loads((REPO / "docs" / "benchmarks" / "demo_summary.json").read_text(encoding="utf-8"))
FAMILIES = list(SUMMARY["families"])
BAND_COLUMNS = ("constrained", "sentence", "pieces", "knn", "knn-memory", "knn+pieces", "copy")


def one_line(text: str) -> str:
    return " ".join(text.split())


def span(values, digits: int = 2) -> str:
    """``low-high`` of ``values`` as a page writes a range."""
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def mode(family: str, name: str) -> float:
    return SUMMARY["families"][family]["modes"][name]["s_bleu"]


def band_table() -> dict:
    """{(family, band): {column: value}} of the demo run's table by fuzzy band (history/KNN_MT.md)."""
    rows = {}
    for family, band, cells in re.findall(r"^\| ([\w+]+): ([<>=\d-]+|all) \| (.*) \|$", KNN_MT, re.M):
        values = [float(c) for c in cells.split(" | ")]
        rows[(family, band)] = dict(zip(("verses",) + BAND_COLUMNS, values))
    return rows


def run_table() -> dict:
    """{family: [fallbacks and seconds of each mode]} of the demo run's table of fallbacks and time."""
    rows = {}
    for family, cells in re.findall(r"^\| ([\w+]+) \| (\d+/\d+, [\d.]+ s \|.*) \|$", KNN_MT, re.M):
        rows[family] = [(int(f), float(s)) for f, s in re.findall(r"(\d+)/\d+, ([\d.]+) s", cells)]
    return rows


def test_knn_mt_rows_over_all_verses_are_the_readmes():
    rows = band_table()
    assert {f for f, _ in rows} == set(FAMILIES)
    for family in FAMILIES:
        for column in BAND_COLUMNS[:-1]:
            assert rows[(family, "all")][column] == mode(family, column), (family, column)


def test_readme_prose_quotes_its_table():
    text = one_line(README)
    chosen = [mode(f, SUMMARY["families"][f]["best_mode"]) for f in FAMILIES]
    assert f"scores {span(chosen)}," in text
    base = SUMMARY["baselines"]
    assert f"copying the memory's best match ({base['tm_copy']['s_bleu']:.2f})" in text
    assert f"the nearest training verse ({base['nearest_verse']['s_bleu']:.2f})" in text
    gains = [c - mode(f, "constrained") for c, f in zip(chosen, FAMILIES)]
    assert f"every family gains {min(gains):.0f}-{max(gains):.0f} s-BLEU" in text
    for name, quoted in (("knn", "kNN-MT alone adds {} s-BLEU"), ("knn-memory", "and {} (per-input datastores")):
        added = [mode(f, name) - mode(f, "constrained") for f in FAMILIES]
        assert quoted.format(span(added, 1)) in text, name


def test_knn_mt_prose_quotes_its_band_table():
    rows, text = band_table(), one_line(KNN_MT)
    copy = rows[(FAMILIES[0], "50-70")]["copy"]
    above = [rows[(f, "50-70")]["knn+pieces"] for f in FAMILIES if rows[(f, "50-70")]["knn+pieces"] > copy]
    below = [rows[(f, "50-70")]["knn+pieces"] for f in FAMILIES if rows[(f, "50-70")]["knn+pieces"] <= copy]
    assert f"{span(above)} against {copy:.2f}" in text and all(f"{v:.2f}" in text for v in below)
    assert f"kNN-MT with pieces writes {span([rows[(f, '<50')]['knn+pieces'] for f in FAMILIES])} against" in text
    assert f"writes {span([rows[(f, '50-70')]['knn'] for f in FAMILIES])} at 50-70 %" in text


def test_knn_mt_prose_quotes_its_fallback_and_time_table():
    runs, text = run_table(), one_line(KNN_MT)
    assert set(runs) == set(FAMILIES)
    plain = [f for f in FAMILIES if "+" not in f]  # the families whose decoder reads no matches
    for column, name in ((3, "kNN-MT decodes in"), (4, "per-input kNN-MT in")):
        assert f"{name} {span([runs[f][column][1] for f in plain], 1)} s" in text, name
    assert f"in {runs['softmax+tm'][3][1]:.1f} and {runs['softmax+tm'][4][1]:.1f} s" in text
    with_pieces = [runs[f][k][0] for f in FAMILIES for k in (2, 5)]
    assert max(with_pieces) <= 1 and "at most one segment falls back" in text


@pytest.mark.parametrize("page", ["README.md", "docs/DESIGN.md"])
def test_one_set_up_time(page):
    """The README's measured set-up time (its demo run) and every 'about N minutes' of it agree."""
    measured = float(re.search(r"after ([\d.]+) min of set-up", one_line(README)).group(1))
    text = one_line((REPO / page).read_text(encoding="utf-8"))
    quoted = re.findall(r"about (\d+(?:-\d+)?) minutes (?:on a 2-core machine|for the whole `make setup`)", text)
    assert quoted and all(q == f"{measured:.0f}" for q in quoted), quoted


FAMILIES_PAGE = (REPO / "docs" / "FAMILIES.md").read_text(encoding="utf-8")
NAMES = {"reluformer": "ReLUFormer", "rela": "ReLA", "softmax": "softmax"}


def length_table(title: str) -> dict:
    """{family: {length: cell text}} of FAMILIES.md's length-study table titled ``title``."""
    block = FAMILIES_PAGE.split(f"**{title}**", 1)[1].split("\n\n", 2)[1]
    rows = [line.strip("|").split("|") for line in block.splitlines()[2:]]
    lengths = ("verses", "128 tokens", "512 tokens", "whole chapters")
    return {cells[0].strip(): dict(zip(lengths, (c.strip() for c in cells[1:]))) for cells in rows}


def test_readme_quotes_the_length_studys_seed_spread():
    """The README's seed spread of the 128-token cells and its gaps are FAMILIES.md's."""
    text = one_line(README)
    order = ("softmax", "reluformer", "rela")
    for title, quoted in (("s-BLEU (document translator)", "s-BLEU {} {}, {} {}, {} {};"),
                          ("s-BLEU (verse by verse)", "verse by verse {} / {} / {};"),
                          ("AER head average", "AER head average {} / {} / {}.")):
        cells = length_table(title)
        values = [cells[f]["128 tokens"] for f in order]
        names = [NAMES[f] for f in order]
        expected = quoted.format(*[x for pair in zip(names, values) for x in pair]) if "{} {}" in quoted \
            else quoted.format(*values)
        assert expected in text, expected
    gaps = length_table("s-BLEU (document translator)")
    assert f"({gaps['reluformer − softmax']['128 tokens'].split()[0].replace('-', '−')} and " \
           f"{gaps['rela − softmax']['128 tokens'].split()[0].replace('-', '−')} s-BLEU)" in text


def test_readme_quotes_the_tuning_budget_and_best_trials():
    rows = dict(re.findall(r"^\| (\w+) \| (\d+ of \d+ \| \d+ \| [\d.]+ \| [\d.]+) \|", FAMILIES_PAGE, re.M))
    trials, updates, _, best = zip(*(rows[f].split(" | ") for f in ("softmax", "rela", "reluformer")))
    assert len(set(trials)) == 1 and len(set(updates)) == 1
    text = one_line(README)
    assert f"({trials[0].split()[0]} trials of {int(updates[0]):,} updates each" in text
    assert f"best valid s-BLEU {best[0]}, against ReLA {best[1]} and ReLUFormer {best[2]}" in text
