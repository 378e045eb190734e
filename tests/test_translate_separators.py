"""Separator-constrained decoding (reluformer_mt.guidance.separators): the masking rule on
hand-made prefixes, the row -> source mapping of the beam search, and real segments of 1 to 5
sentences through the tiny document checkpoint (beam 1 and 4), against free decoding."""
import math

import pytest
import torch

from helpers import needs_shared_data
from test_translate import FAST, real_docs, translate_main

EOS, SEP, VOCAB = 2, 5, 9
INF = -math.inf


def step_lprobs(rows):
    """Distinct finite log-probabilities, so any change shows."""
    return torch.log_softmax(torch.arange(rows * VOCAB, dtype=torch.float).view(rows, VOCAB) / 7, dim=-1)


# ---------------------------------------------------------------- the rule (no model)

def test_constrain_separators_on_hand_made_prefixes():
    from reluformer_mt.guidance.separators import constrain_separators

    prefix = torch.tensor([[EOS, 7, 6, 8],        # 0 separators, needs 2: no EOS, separator allowed
                           [EOS, 7, SEP, 6],      # 1 of 2: no EOS, separator allowed
                           [EOS, 7, 6, SEP],      # 1 of 1, just after it: no EOS (empty last sentence), no separator
                           [EOS, 7, SEP, 6],      # 1 of 1: EOS allowed, no more separators
                           [EOS, 7, 6, 8],        # 0 of 0 (a single sentence): EOS allowed, never a separator
                           [EOS, 7, 6, 8]])       # 0 of 3 at the generator's last step (only EOS finite): EOS kept
    required = torch.tensor([2, 2, 1, 1, 0, 3])
    lprobs = step_lprobs(6)
    lprobs[5, :EOS] = INF
    lprobs[5, EOS + 1:] = INF
    before = lprobs.clone()
    out = constrain_separators(lprobs, prefix, required, SEP, EOS)
    assert out is lprobs  # in place
    assert [bool(torch.isinf(lprobs[r, EOS])) for r in range(6)] == [True, True, True, False, False, False]
    assert [bool(torch.isinf(lprobs[r, SEP])) for r in range(6)] == [False, False, True, True, True, True]
    assert lprobs[5, EOS] == before[5, EOS]
    others = [v for v in range(VOCAB) if v not in (EOS, SEP)]
    assert torch.equal(lprobs[:, others], before[:, others])  # nothing else is touched
    # the first step (prefix = BOS only): a sentence cannot start with a separator
    first = step_lprobs(2)
    constrain_separators(first, torch.full((2, 1), EOS), torch.tensor([0, 4]), SEP, EOS)
    assert torch.isinf(first[:, SEP]).all() and torch.isinf(first[1, EOS]) and not torch.isinf(first[0, EOS])


def test_beam_search_looks_up_each_row_by_its_sentence_id():
    """Three sentences left in the batch (dataset ids 4, 0, 2: others finished), beam 2: rows 0-1
    belong to id 4, rows 2-3 to id 0, rows 4-5 to id 2 -- whatever their position."""
    from fairseq.search import BeamSearch

    from reluformer_mt.guidance import GuidedSearch
    from reluformer_mt.guidance.separators import SeparatorConstraint

    class TinyDict:
        def pad(self): return 1
        def unk(self): return 3
        def eos(self): return EOS
        def __len__(self): return VOCAB

    search = GuidedSearch(BeamSearch(TinyDict()), TinyDict(), [SeparatorConstraint(SEP, SEP)])
    search.required = torch.tensor([0, 9, 2, 9, 1])  # by dataset id
    prefix = torch.tensor([[EOS, 7, SEP, 6]] * 6)    # one separator in every row
    lprobs = step_lprobs(6).view(3, 2, VOCAB)
    scores = torch.zeros(3, 2, 3)
    search.step(3, lprobs, scores, prefix, torch.tensor([4, 0, 2]))
    flat = lprobs.view(6, VOCAB)
    # id 4 needs 1 (done: EOS ok, no separator), id 0 needs 0 (EOS ok, no separator), id 2 needs 2 (no EOS)
    assert [bool(torch.isinf(flat[r, EOS])) for r in range(6)] == [False, False, False, False, True, True]
    assert [bool(torch.isinf(flat[r, SEP])) for r in range(6)] == [True, True, True, True, False, False]


def test_bad_separators_option():
    from reluformer_mt.inference import DocumentTranslator, TranslationError

    with pytest.raises(TranslationError, match=r"--separators: expected one of constrained, free, got 'loose'"):
        DocumentTranslator("never-loaded.pt", separators="loose")


# ---------------------------------------------------------------- real segments, real generator

def eager_to_end(translator, monkeypatch):
    """The fixture model is untrained and never ends a sentence by itself; a large bonus on EOS and
    the separator makes it end one as soon as it may, so where a hypothesis puts its separators and
    its EOS is decided by the constraint alone (the model still picks every other token)."""
    ensemble = translator.generator.model
    forward = ensemble.forward_decoder
    bonus = torch.zeros(len(translator.tgt_dict))
    bonus[[translator.tgt_dict.eos(), translator.sep_tgt]] = 30.0

    def forward_decoder(*args, **kwargs):
        lprobs, attn = forward(*args, **kwargs)
        return torch.log_softmax(lprobs + bonus.to(lprobs), dim=-1), attn

    monkeypatch.setattr(ensemble, "forward_decoder", forward_decoder)


def short_sentences(translator, k):
    """``k`` real IWSLT2017 test sentences of at most 20 pieces, in order."""
    out = [s for d in real_docs(3) for s in d if 0 < len(translator.sp_src.encode(s)) <= 20]
    assert len(out) >= k
    return out[:k]


def fallbacks(t):
    return t.stats["fallbacks: segment retranslated as halves"] + t.stats["fallbacks: segment retranslated sentence by sentence"]


@needs_shared_data
@pytest.mark.parametrize("beam", [1, 4])
def test_segments_of_1_3_5_sentences_in_one_batch_keep_their_separators(doc_checkpoint, monkeypatch, beam):
    """One batch of three segments needing 0, 2 and 4 separators: they finish at different steps
    (the batch shrinks) and the collater reorders them by length, so a row looked up by position
    instead of by sentence id gets another segment's count and this fails."""
    from reluformer_mt.inference import DocumentTranslator

    t = DocumentTranslator(doc_checkpoint, beam=beam)
    assert t.separators == "constrained" and t.generator.search is t.search and t.search is not None
    eager_to_end(t, monkeypatch)
    s = short_sentences(t, 9)
    docs = [s[:1], s[1:4], s[4:9]]
    encoded = t._expand(t._encode(docs))[0]
    segments = t._segments(encoded)
    assert [len(seg.sentences) for seg in segments] == [1, 3, 5]
    sources = [t._source_ids(encoded, seg)[0] for seg in segments]
    assert len(t._batches([len(x) for x in sources])) == 1
    hyps = t.generate(sources)
    for seg, hyp in zip(segments, hyps):
        parts = t._split_hypothesis(hyp["tokens"])
        assert len(parts) == len(seg.sentences) and all(parts), (len(seg.sentences), hyp["tokens"].tolist())
        assert len(hyp["tokens"]) == 2 * len(seg.sentences) - 1 and not hyp["at_length_limit"]
    results = t.translate(docs)
    assert [[r.context for r in doc] for doc in results] == [[1], [3] * 3, [5] * 5]  # no sentence retranslated
    assert fallbacks(t) == 0 and "fallbacks: 0" in t.summary()

    # the same model without the constraint ends every segment at once: all multi-sentence segments fall back
    free = DocumentTranslator(doc_checkpoint, beam=beam, separators="free")
    eager_to_end(free, monkeypatch)
    free.translate(docs)
    assert free.stats["fallbacks: segment retranslated as halves"] == 2


@needs_shared_data
def test_real_documents_constrained_never_fall_back_below_the_length_limit(doc_checkpoint, monkeypatch):
    """Two real talks (segments of up to 128 tokens, 1 to many sentences each, batched together):
    with the model ending as soon as it may, every segment splits at once; with the untrained model
    as it is (it runs to the length limit), every fallback is one cut at the length limit."""
    from reluformer_mt.inference import DocumentTranslator

    docs = real_docs(2, max_sentences=25)
    t = DocumentTranslator(doc_checkpoint, beam=3)
    eager_to_end(t, monkeypatch)
    results = t.translate(docs)
    assert [len(r) for r in results] == [len(d) for d in docs]
    sizes = sorted({r.context for doc in results for r in doc})
    assert len(sizes) >= 3  # segments with different separator counts (TED sentences are long: 1 to 3 a segment)
    assert fallbacks(t) == 0 and t.stats["segments"] < sum(len(d) for d in docs)

    plain = DocumentTranslator(doc_checkpoint, beam=2, max_len_a=0, max_len_b=6)
    results = plain.translate(docs)
    assert [len(r) for r in results] == [len(d) for d in docs]
    assert fallbacks(plain) > 0 and fallbacks(plain) == plain.stats["fallbacks whose output reached the length limit"]
    assert "stray separators dropped from single-sentence outputs" not in plain.stats


@needs_shared_data
def test_free_is_the_plain_beam_search(doc_checkpoint):
    """--separators free decodes exactly as fairseq's own beam search, which is what the translator
    did before the option: same texts, scores and fallbacks as with a SequenceGenerator built by hand.
    Its search has no guidance parts, only each source's own length limit (here the same for all)."""
    from fairseq.search import BeamSearch
    from fairseq.sequence_generator import SequenceGenerator

    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.guidance import GuidedSearch

    docs = real_docs(2, max_sentences=12)
    free = DocumentTranslator(doc_checkpoint, beam=2, max_len_a=0, max_len_b=6, separators="free")
    assert type(free.generator.search) is GuidedSearch and free.search.parts == []
    assert type(free.search.inner) is BeamSearch  # fairseq's own, wrapped
    plain = DocumentTranslator(doc_checkpoint, beam=2, max_len_a=0, max_len_b=6, separators="free")
    plain.generator = SequenceGenerator([plain.model], plain.tgt_dict, beam_size=2, max_len_a=0, max_len_b=6)
    got, expected = free.translate(docs, scores=True), plain.translate(docs, scores=True)
    assert [[(r.text, r.score, r.context) for r in d] for d in got] == [[(r.text, r.score, r.context) for r in d] for d in expected]
    assert fallbacks(free) == fallbacks(plain) > 0


@needs_shared_data
def test_separators_option_through_the_cli(doc_checkpoint, tmp_path, capsys):
    src = tmp_path / "talk.en"
    src.write_text("\n".join(real_docs(1, max_sentences=4)[0]) + "\n", encoding="utf-8")
    for mode in ("free", "constrained"):
        rc, err = translate_main(["-c", doc_checkpoint, "-i", src, "-o", tmp_path / f"{mode}.de", "--separators", mode,
                                  *FAST], capsys)
        assert rc == 0, err
        assert f"segments of <= 128 tokens, {mode} separators" in err and "translated 1 document, 4 sentences" in err
    with pytest.raises(SystemExit) as e:
        translate_main(["-c", doc_checkpoint, "-i", src, "--separators", "loose"])
    assert e.value.code == 2 and "invalid choice: 'loose'" in capsys.readouterr().err
