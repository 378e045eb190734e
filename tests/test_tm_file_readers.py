"""Translation-memory files as real tools write them: TSV in UTF-16 and with byte-order
marks, a bad byte's exact line, TMX streamed in constant memory, placeholders between words,
repeated and conflicting pairs, a <tuv> without <seg>, float32 scores on the band boundaries,
and leakage: a test sentence planted in the memory is reported, and the stored ids are rows of
the training split's file."""
import shutil
import tracemalloc

import numpy as np
import pytest

from reluformer_mt.memory.tm import (TranslationMemoryError, band_of, fuzzy_score, fuzzy_words, read_memory,
                                     read_prepared, read_tmx, read_tsv)

HEADER = ('<?xml version="1.0" encoding="UTF-8"?>\n<tmx version="1.4"><header srclang="en" datatype="plaintext" '
          'segtype="sentence" adminlang="en" o-tmf="x" creationtool="t" creationtoolversion="1"/>\n<body>\n')


def tu(en, de):
    return f'<tu><tuv xml:lang="en"><seg>{en}</seg></tuv><tuv xml:lang="de"><seg>{de}</seg></tuv></tu>\n'


# ---------------------------------------------------------------- TSV

@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-8-sig"])
def test_tsv_in_utf16_and_with_a_bom_reads_clean_entries(tmp_path, encoding):
    """What spreadsheet tools export as "Unicode text" (on main: UnboundLocalError; with a UTF-8
    BOM the first source kept '\\ufeff' and could never match)."""
    path = tmp_path / "tm.tsv"
    path.write_text("a b\tx y\r\nStraße\tstreet\r\n", encoding=encoding)
    entries = read_tsv(path)
    assert entries.sources == ["a b", "Straße"] and entries.targets == ["x y", "street"]


def test_tsv_bad_byte_is_reported_on_its_own_line(tmp_path):
    """Decoded in chunks, main named line 4674 for a bad byte on line 5000."""
    path = tmp_path / "tm.tsv"
    lines = [f"source {i}\ttarget {i}\n".encode() for i in range(1, 6001)]
    lines[4999] = b"source \xff 5000\ttarget\n"
    path.write_bytes(b"".join(lines))
    with pytest.raises(TranslationMemoryError, match=r"tm\.tsv: line 5000: not UTF-8"):
        read_tsv(path)
    path.write_bytes("a\tb\n".encode("utf-16") + b"\x00\xd8")  # a lone surrogate at the end
    with pytest.raises(TranslationMemoryError, match=r"line \d+: not UTF-16"):
        read_tsv(path)


def test_tsv_repeated_pairs_are_kept_once_with_a_count(tmp_path):
    path = tmp_path / "tm.tsv"
    path.write_text("a\tx\nb\ty\na\tx\na\tz\nb\tw\nb\tw\n", encoding="utf-8")
    entries = read_tsv(path)
    # a: x twice, z once -> x; b: y once, w twice -> w
    assert entries.sources == ["a", "b"] and entries.targets == ["x", "w"] and entries.counts == [2, 2]
    summary = entries.summary()
    assert "3 repeated pairs merged" not in summary  # pairs: (a,x) x2, (b,w) x2 -> 2 merged
    assert "2 repeated pairs merged (counted)" in summary
    assert "2 sources with conflicting targets (kept the most frequent, ties the last; 2 entries" in summary


def test_conflict_ties_keep_the_most_recent(tmp_path):
    path = tmp_path / "tm.tsv"
    path.write_text("a\tx\na\ty\n", encoding="utf-8")
    assert read_tsv(path).targets == ["y"]


# ---------------------------------------------------------------- TMX

def test_placeholders_separate_words_and_can_keep_their_text(tmp_path):
    """On main `Value<ph>{0}</ph>here` became `Valuehere`."""
    path = tmp_path / "tm.tmx"
    path.write_text(HEADER + tu('Value<ph x="1">{0}</ph>here and <bpt i="1">&lt;b&gt;</bpt>bold<ept i="1">&lt;/b&gt;</ept>ly',
                                "Wert<ph x='1'>{0}</ph>hier") + "</body></tmx>\n", encoding="utf-8")
    entries = read_tmx(path, "en", "de")
    assert entries.sources == ["Value here and boldly"] and entries.targets == ["Wert hier"]
    entries = read_tmx(path, "en", "de", placeholders="text")
    assert entries.sources == ["Value {0} here and boldly"]
    with pytest.raises(TranslationMemoryError, match="--tmx-placeholders: got 'keep'"):
        read_tmx(path, "en", "de", placeholders="keep")


def test_tmx_duplicates_variants_and_tuv_without_seg_are_counted(tmp_path):
    path = tmp_path / "tm.tmx"
    body = (tu("one", "eins") + tu("one", "eins") + tu("one", "ein")
            + '<tu><tuv xml:lang="en"><seg>two</seg></tuv><tuv xml:lang="en"><seg>zwo</seg></tuv>'
              '<tuv xml:lang="de"><seg>zwei</seg></tuv></tu>\n'
            + '<tu><tuv xml:lang="en"><seg>three</seg></tuv><tuv xml:lang="de"><note>x</note></tuv></tu>\n')
    path.write_text(HEADER + body + "</body></tmx>\n", encoding="utf-8")
    entries = read_tmx(path, "en", "de")
    assert entries.sources == ["one", "two"] and entries.targets == ["eins", "zwei"] and entries.counts == [2, 1]
    assert entries.skipped == {"units with a en or de <tuv> without <seg>": 1}  # not "without both en and de"
    summary = entries.summary()
    assert "1 units with a second variant of one language (the first kept)" in summary
    assert "1 repeated pairs merged" in summary and "1 sources with conflicting targets" in summary


def test_tmx_is_streamed_in_constant_memory(tmp_path):
    """The parser appended every <tu> to <body>, which root.clear() had detached but not emptied:
    peak memory grew with the file. Units in other languages (skipped: nothing of them is kept)
    show the XML tree alone: 4x the units now cost the same peak."""
    def peak(units, name):
        path = tmp_path / name
        with open(path, "w", encoding="utf-8") as f:
            f.write(HEADER + tu("kept", "behalten"))
            for i in range(units):
                f.write(f'<tu><tuv xml:lang="en"><seg>source sentence number {i} with some words</seg></tuv>'
                        f'<tuv xml:lang="fr"><seg>phrase numéro {i} avec des mots</seg></tuv></tu>\n')
            f.write("</body></tmx>\n")
        tracemalloc.start()
        entries = read_tmx(path, "en", "de")
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(entries) == 1 and entries.skipped == {"units without both en and de": units}
        return top

    small, large = peak(5000, "small.tmx"), peak(20000, "large.tmx")
    assert large < 1.2 * small, f"peak {small} -> {large} bytes: grows with the file"


def test_read_memory_passes_placeholders(tmp_path):
    path = tmp_path / "tm.tmx"
    path.write_text(HEADER + tu("a<ph>X</ph>b", "c") + "</body></tmx>\n", encoding="utf-8")
    assert read_memory(path, "en", "de", placeholders="text").sources == ["a X b"]


# ---------------------------------------------------------------- bands

def test_exact_band_boundaries_survive_float32():
    """1 edit in 10 words is 0.9 exactly; stored as float32 (0.89999998) it fell into 70-90."""
    score = fuzzy_score("a b c d e f g h i j".split(), "a b c d e f g h i x".split())
    assert band_of(float(np.float32(score))) == ">=90"
    assert band_of(float(np.float32(0.7))) == "70-90" and band_of(float(np.float32(0.5))) == "50-70"
    assert band_of(float(np.float32(0.69999))) == "50-70"


# ---------------------------------------------------------------- leakage

def test_a_test_sentence_planted_in_the_memory_is_reported(memory_data, tmp_path, capsys):
    """A valid/test source that is also a training source: build_neighbours reports it (count and
    sentence numbers), and every stored id is a row of the training split's file (the stored
    score is the fuzzy score against that row's source), not merely an index in range."""
    from reluformer_mt.data.prepared import Prepared
    from reluformer_mt.memory.neighbours import build_neighbours, load_neighbours

    directory = tmp_path / "planted"
    shutil.copytree(memory_data, directory)
    prepared = Prepared.load(directory)
    text = directory / "text"
    for lang in (prepared.src_lang, prepared.tgt_lang):
        test_line = (text / f"test.{lang}").read_text(encoding="utf-8").splitlines()[0]
        train = (text / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        train[-1] = test_line  # the last training segment becomes the first test segment
        (text / f"train.{lang}").write_text("\n".join(train) + "\n", encoding="utf-8")
    test_sources = read_prepared(directory, "test").sources
    train_entries = read_prepared(directory, "train")
    info = build_neighbours(directory, k=2, progress=True, match_score="words")  # the word scores checked below
    planted = info["sources_also_in_memory"]["test"]
    assert planted["sentences"] >= 1 and planted["first"][0] == 1
    assert "test sentence(s) have a source identical to a training entry's" in capsys.readouterr().out
    assert "sources_also_in_memory" in Prepared.load(directory).memory
    ids, scores = load_neighbours(directory, "test", 2)
    assert train_entries.sources[ids[0, 0]] == test_sources[0] and scores[0, 0] == 1.0
    for row in range(0, len(test_sources), 7):
        for j in range(2):
            expected = fuzzy_score(fuzzy_words(test_sources[row]), fuzzy_words(train_entries.sources[ids[row, j]]))
            assert abs(scores[row, j] - expected) < 1e-6


@pytest.fixture(scope="module")
def memory_data(prepared_doc_data, tmp_path_factory):
    from conftest import prepare_iwslt_with_memory

    return prepare_iwslt_with_memory(tmp_path_factory.mktemp("tm34") / "doc128", prepared_doc_data["doc"] / "spm.model",
                                     segment_tokens=128)
