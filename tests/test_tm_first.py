"""TM-first translation: a sentence whose best match scores >= the threshold is translated by the
match's target, the others by the model; the threshold tuned on validation, the demo's column."""
import pytest

from helpers import needs_shared_data
from reluformer_mt.memory.tm import memory_first

def test_memory_first_copies_only_matches_at_or_above_the_threshold():
    import numpy as np

    outputs, copies, scores = ["mt a", "mt b", "mt c"], ["tm a", None, "tm c"], [0.7, 0.99, float(np.float32(0.7))]
    assert memory_first(outputs, copies, scores, 0.7) == ["tm a", "mt b", "tm c"]  # float32 0.7 is >= 0.7
    assert memory_first(outputs, copies, scores, 0.71) == ["mt a", "mt b", "mt c"]
    assert memory_first(outputs, copies, scores, None) == outputs


def test_tm_first_and_match_score_options_are_checked_before_any_model_loads(capsys):
    from reluformer_mt.cli.translate import main
    from reluformer_mt.guidance import TranslationError
    from reluformer_mt.inference.options import MemoryOptions, TmFirstOptions, TranslatorOptions

    with pytest.raises(TranslationError, match=r"--tm-first 1.5: expected a match score between 0 and 1"):
        TmFirstOptions(1.5)
    with pytest.raises(TranslationError, match="--tm-first 0.8: the targets it copies come from the memory, which --memory none withholds"):
        TranslatorOptions.of(memory="none", tm_first=0.8)
    with pytest.raises(TranslationError, match="--match-score 'lemmas': expected one of words, chars"):
        MemoryOptions(match_score="lemmas")
    for argv, said in ((["--tm-first", "2"], "--tm-first"), (["--match-score", "lemmas"], "--match-score")):
        with pytest.raises(SystemExit) as exit_:
            main(["-c", "missing.pt", "-i", "missing.txt", *argv])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert said in err[-1]


def _far_sentence(translator, candidates):
    """The candidate whose best match scores lowest (a sentence the memory does not hold)."""
    _, scores = translator.memory.lookup(candidates, 1)
    return candidates[int(scores[:, 0].argmin())], float(scores[:, 0].min())


@needs_shared_data
def test_tm_first_outputs_the_match_above_the_threshold_and_the_model_below(doc_checkpoint, prepared_doc_data):
    from reluformer_mt.experiments.knn_tune import tune_tm_first
    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.memory.tm import read_prepared

    train, test = read_prepared(prepared_doc_data["doc"]), read_prepared(prepared_doc_data["doc"], "test")
    kwargs = dict(device="cpu", beam=2, max_len_a=0, max_len_b=8)
    first = DocumentTranslator(doc_checkpoint, tm_first=0.95, **kwargs)
    assert first.memory is not None and "TM-first: a match scoring >= 0.95 is the output" in first.describe()
    far, far_score = _far_sentence(first, test.sources[:40])
    assert far_score < 0.95
    documents = [[train.sources[3], far]]
    plain = DocumentTranslator(doc_checkpoint, **kwargs).translate(documents)[0]
    got = first.translate(documents)[0]
    assert got[0].text == train.targets[3] and got[0].match == (3, pytest.approx(1.0, abs=1e-5))
    assert got[1].text == plain[1].text  # below the threshold: the model's own output
    assert first.stats["TM-first: sentences translated by their match (score >= 0.95)"] == 1
    # a threshold above every match: the model's outputs everywhere
    never = DocumentTranslator(doc_checkpoint, tm_first=1.0, **kwargs).translate([[far]])[0]
    assert never[0].text == DocumentTranslator(doc_checkpoint, **kwargs).translate([[far]])[0][0].text

    # the tuner: references that the match's target fits choose a threshold that copies it, not 'off'
    references = [[train.targets[3], plain[1].text]]
    tuned = tune_tm_first(doc_checkpoint, dict(device="cpu", beam=2), documents, references,
                          {"plain": [r.text for r in plain]})
    row = tuned["by_decode"]["plain"]
    assert tuned["over"] == "plain" and tuned["threshold"] is not None and far_score < tuned["threshold"] <= 1.0
    assert tuned["s_bleu"] == max(row.values()) > row["off"]


def test_the_demos_tm_first_mode_copies_the_best_modes_matches_above_its_tuned_threshold():
    """The demo's TM-first column: the mode chosen on validation (here pieces), its test outputs with
    the matches at or above the threshold tuned over that mode's validation decode copied."""
    from reluformer_mt.evaluation.bleu import corpus_sbleu
    from reluformer_mt.experiments.demo_translate import best_validation_mode, tm_first_mode

    references = {"ch1": ["and jesus said to him go", "the word of god stays"], "ch2": ["nothing alike here"]}
    matches = [{"fuzzy": 0.92, "entry": 0, "copy": "and jesus said to him go"},
               {"fuzzy": 0.41, "entry": 4, "copy": "the word of god"},
               {"fuzzy": 0.6, "entry": 3, "copy": "nothing alike"}]
    pieces = {"s_bleu": 30.0, "d_bleu": 31.0, "fallbacks": 0, "segments": 2, "matches": matches,
              "hypotheses": {"ch1": ["jesus said go", "the word of god stays"], "ch2": ["nothing alike here"]}}
    results = {"constrained": {**pieces, "s_bleu": 20.0}, "pieces": pieces}
    tuned = {"decodes": [{"name": "plain", "s_bleu": 10.0}], "chosen": {
        "pieces": {"s_bleu": 12.0, "decode": "pieces w=5 floor=0"},
        "tm_first": {"match_score": "bm25-chars", "over": "pieces w=5 floor=0", "by_decode": {
            "plain": {"off": 10.0, "0.5": 11.0}, "pieces w=5 floor=0": {"off": 12.0, "0.5": 12.5, "0.9": 13.0}}}}}
    assert best_validation_mode(tuned, results) == "pieces"
    mode = tm_first_mode(tuned, results, "pieces", references)
    assert mode["hypotheses"] == {"ch1": ["and jesus said to him go", "the word of god stays"],
                                  "ch2": ["nothing alike here"]}  # 0.92 >= 0.9 copied, 0.41 and 0.6 not
    assert mode["tm_first"] == {"threshold": 0.9, "over": "pieces", "verses_copied": 1, "match_score": "bm25-chars"}
    assert mode["s_bleu"] == pytest.approx(corpus_sbleu(
        ["and jesus said to him go", "the word of god stays", "nothing alike here"],
        [v for d in references.values() for v in d]).score)
    # chosen as the family's best once it is translated: its validation s-BLEU beat the mode alone
    assert best_validation_mode(tuned, {**results, "tm-first": mode}) == "tm-first"
    # no threshold beat the decode alone: no TM-first column
    tuned["chosen"]["tm_first"]["by_decode"]["pieces w=5 floor=0"] = {"off": 12.0, "0.9": 11.0}
    assert tm_first_mode(tuned, results, "pieces", references) is None
