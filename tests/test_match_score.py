"""The match scores: character-level and sparse (TF-IDF, BM25) scores, where an inflected form costs
characters, not a whole word, so the retriever finds the verse a word-level fuzzy score ranks below
a stranger; the retrieval study judges each score by its match targets beside the nearest-verse
baseline."""
import pytest

from reluformer_mt.memory.tm import MemoryEntries, Retriever, TranslationMemoryError, fuzzy_scores, match_units


def test_chars_score_sees_through_inflection_where_words_do_not():
    query = "και ειπεν αυτοις ο ιησους"
    inflected = "και ειπεν αυτω ο ιησου"  # two inflected forms: two whole words apart
    stranger = "και ειπεν ουτος ο ανθρωπος"  # two other words
    words = fuzzy_scores(match_units(query), [match_units(inflected), match_units(stranger)])
    chars = fuzzy_scores(match_units(query, "chars"), [match_units(inflected, "chars"), match_units(stranger, "chars")],
                         "chars")
    assert words[0] == words[1]  # the word score cannot tell them apart
    assert chars[0] > chars[1]
    entries = MemoryEntries([stranger, inflected, "αλλο τι παντελως", "ετερον ουδεν ομοιον"],
                            ["the man", "he said to him", "x", "y"], "toy")
    retriever = Retriever(entries, dim=3, candidates=4, score="chars")
    ids, scores = retriever.search([query], 2)
    assert ids[0, 0] == 1 and scores[0, 0] > scores[0, 1]
    assert retriever.exact_best([query])[0] == pytest.approx(scores[0, 0])
    # the same keys reranked by words: the tie keeps the MIPS order, the character score does not matter
    assert retriever.rescored("words").search([query], 2)[1][0, 0] == pytest.approx(words.max())
    with pytest.raises(TranslationMemoryError, match="match score 'lemmas': expected one of words, chars"):
        Retriever(entries, dim=3, score="lemmas")


TRAIN_SRC = ["και ειπεν αυτω ο ιησους υπαγε", "και ειπεν ουτος ο ανθρωπος", "αλλο τι παντελως ετερον",
             "ετερον ουδεν ομοιον αλλω", "ο λογος του θεου μενει"]
TRAIN_TGT = ["and jesus said to him go", "and this man said", "something else entirely", "nothing alike",
             "the word of god stays"]


def toy_retriever(score: str) -> Retriever:
    return Retriever(MemoryEntries(TRAIN_SRC, TRAIN_TGT, "toy"), dim=3, candidates=5, score=score)


@pytest.mark.parametrize("score", ["tfidf-words", "tfidf-chars", "bm25-words", "bm25-chars", "bm25-chars>chars"])
def test_sparse_scores_give_an_identical_source_1_and_rank_the_whole_memory(score):
    retriever = toy_retriever(score)
    ids, scores = retriever.search(TRAIN_SRC, 3)
    assert ids[:, 0].tolist() == list(range(len(TRAIN_SRC)))
    assert scores[:, 0] == pytest.approx(1.0, abs=1e-5)
    assert ((scores >= 0) & (scores <= 1)).all() and (scores[:, 0] >= scores[:, 1]).all()
    # leave-one-out: a training sentence never retrieves itself
    left_out, _ = retriever.search(TRAIN_SRC, 2, exclude=list(range(len(TRAIN_SRC))))
    assert all(i not in row for i, row in enumerate(left_out.tolist()))
    assert retriever.exact_best(TRAIN_SRC[:2], exclude=[0, 1]).tolist() == pytest.approx(
        retriever.search(TRAIN_SRC[:2], 1, exclude=[0, 1])[1][:, 0].tolist())


def test_bm25_over_character_ngrams_finds_the_inflected_verse_word_tfidf_misses():
    from reluformer_mt.evaluation.baselines import nearest_verse_translations

    query = "ο λογον του θεον μενειν"  # every content word inflected: no word in common with verse 4
    found = toy_retriever("bm25-chars").search([query], 1)[0][0, 0]
    assert TRAIN_TGT[found] == "the word of god stays"
    # the nearest-verse baseline is TF-IDF over words: the same choice as the tfidf-words score
    query2 = "και ειπεν ο ιησους"
    assert TRAIN_TGT[toy_retriever("tfidf-words").search([query2], 1)[0][0, 0]] == \
        nearest_verse_translations(TRAIN_SRC, TRAIN_TGT, [query2])[0]


def test_a_pieces_score_without_a_sentencepiece_model_is_one_line():
    with pytest.raises(TranslationMemoryError, match="match score 'bm25-pieces': needs a SentencePiece model"):
        toy_retriever("bm25-pieces")
    with pytest.raises(TranslationMemoryError, match="match score 'bm25': expected one of words, chars"):
        toy_retriever("bm25")


def test_retrieval_study_judges_each_setting_beside_the_baseline(tmp_path, capsys):
    from reluformer_mt.experiments import retrieval_study

    train_src = ["και ειπεν αυτω ο ιησου", "και ειπεν ουτος ο ανθρωπος", "αλλο τι παντελως", "ετερον ουδεν ομοιον"]
    train_tgt = ["and jesus said to him", "and this man said", "something else", "nothing alike"]
    for name, lines in (("train.words.grc", train_src), ("train.words.en", train_tgt),
                        ("valid.words.grc", ["και ειπεν αυτοις ο ιησους"]), ("valid.words.en", ["and jesus said to them"])):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = retrieval_study.run_study(tmp_path, candidates=4)
    rows = result["rows"]
    from reluformer_mt.memory.tm import MATCH_SCORES

    # every score but those over SentencePiece pieces (the directory has no spm.model), and no rerank
    assert set(rows) == {"nearest verse (baseline)", "memory: mips"} | {
        f"memory: {s}" for s in MATCH_SCORES if "pieces" not in s}
    assert [b["sentences"] for b in result["bands"]["bm25-chars"]][-1] == 1  # the bands of the default score
    assert rows["memory: tfidf-words"]["chrf"] == pytest.approx(rows["nearest verse (baseline)"]["chrf"])
    # chars finds the inflected verse: its row is the chrF of copying that verse's target
    assert rows["memory: chars"]["chrf"] == pytest.approx(
        retrieval_study.judge(["and jesus said to him"], ["and jesus said to them"])["chrf"])
    assert rows["memory: chars"]["chrf"] >= rows["memory: words"]["chrf"]
    assert rows["memory: chars"]["ms_per_sentence"] >= 0
    assert retrieval_study.main([str(tmp_path), "--split", "test"]) == 2  # no test files: one line, exit 2
    assert "test.words.grc: no such file" in capsys.readouterr().err


def test_a_memory_files_targets_are_encoded_when_retrieved_as_before(prepared_doc_data):
    """EntryTokens gives each entry the ids encode_entries gave the whole memory at once, but
    encodes only the entries read (a 100,000-unit TMX encoded whole held its pieces at once)."""
    import sentencepiece as spm
    from fairseq.data import Dictionary

    from reluformer_mt.memory.tm_data import EntryTokens, encode_entries

    doc = prepared_doc_data["doc"]
    sp = spm.SentencePieceProcessor(model_file=str(doc / "spm.model"))
    dictionary = Dictionary.load(str(next(doc.glob("dict.*.txt"))))
    targets = ["Thank you very much.", "This is a talk about ideas.", "", "Danke schön."]
    whole = encode_entries([" ".join(p) for p in sp.encode(targets, out_type=str)], dictionary)
    lazy = EntryTokens(targets, sp, dictionary)
    assert len(lazy) == 4 and not lazy._done
    assert lazy[1].tolist() == whole[1].tolist() and set(lazy._done) == {1}
    assert all(lazy[i].tolist() == whole[i].tolist() for i in range(4))
    with pytest.raises(IndexError, match="memory entry 4 of 4"):
        lazy[4]
