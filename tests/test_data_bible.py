"""The bible-alignments corpus: counts, gold links in range, chapter split."""
import pytest

pytest.importorskip("bible_alignments")

from reluformer_mt.data.bible import read_bible, split_by_chapter, write_gold  # noqa: E402
from reluformer_mt.data.readers import Report  # noqa: E402


@pytest.fixture(scope="module")
def bible():
    report = Report()
    return read_bible(report), report


def test_bible_counts(bible):
    docs, report = bible
    # 7,939 SBLGNT verses and 7,940 BSB source-verses; 7,936 have both (Rom 16:24-27, 2 Cor 13:14,
    # 3 John 1:15 and Rev 12:18 are split differently between the editions)
    assert report.counts["bible verses"] == 7936 == sum(len(d.src) for d in docs)
    assert report.counts["bible chapters"] == 260 == len(docs)
    assert report.counts["bible gold links"] == 189_473
    assert report.skipped["bible verse with source words only"] == 3
    assert report.skipped["bible verse with target words only"] == 4
    assert report.skipped["bible link crossing verses"] == 400


def test_bible_links_in_range(bible):
    docs, _ = bible
    for d in docs:
        for s, t, links in zip(d.src, d.tgt, d.links):
            ns, nt = len(s.split()), len(t.split())
            assert all(0 <= i < ns and 0 <= j < nt for i, j in links), d.doc_id
    first = docs[0]
    assert first.doc_id == "40001" and first.sentence_ids[0] == "40001001"
    assert first.src[0].split()[0] == "Βίβλος" and first.tgt[0].startswith("This is the record")
    assert (0, 0) in first.links[0]


def test_bible_chapter_split_is_deterministic_and_held_out(bible, tmp_path):
    docs, _ = bible
    a, b = split_by_chapter(docs), split_by_chapter(list(docs))
    assert {k: [d.doc_id for d in v] for k, v in a.items()} == {k: [d.doc_id for d in v] for k, v in b.items()}
    ids = {k: {d.doc_id for d in v} for k, v in a.items()}
    assert len(ids["valid"]) == len(ids["test"]) == 13 and len(ids["train"]) == 234
    assert not (ids["train"] & ids["valid"]) and not (ids["train"] & ids["test"]) and not (ids["valid"] & ids["test"])
    n = write_gold(a["valid"], tmp_path, "valid", "grc", "en")
    gold = (tmp_path / "valid.gold.align").read_text(encoding="utf-8").split("\n")[:-1]
    words = (tmp_path / "valid.words.en").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(gold) == len(words) == sum(len(d.src) for d in a["valid"])
    assert n == sum(len(line.split()) for line in gold)
