"""The translation memory: TMX/TSV readers, retrieval against the exact fuzzy best, no leakage,
both fusions trained for a few updates and translated with a memory (real IWSLT2017 talks)."""
import numpy as np
import pytest
import torch

from helpers import USER_DIR, run_fairseq
from reluformer_mt.guidance.memory_reading import MemoryReading
from reluformer_mt.memory.tm import (Retriever, TranslationMemoryError, band_of, fuzzy_score, read_memory, read_prepared,
                                     read_tmx, read_tsv, recall_at_k)

TMX = """<?xml version="1.0" encoding="UTF-8"?>
<tmx version="1.4"><header srclang="en-US" datatype="plaintext" segtype="sentence" adminlang="en" o-tmf="x" creationtool="t" creationtoolversion="1"/>
<body>
<tu><tuv xml:lang="en-US"><seg>Click <bpt i="1">&lt;b&gt;</bpt>Save<ept i="1">&lt;/b&gt;</ept> now.</seg></tuv>
    <tuv xml:lang="de-DE"><seg>Klicken Sie <bpt i="1">&lt;b&gt;</bpt>Speichern<ept i="1">&lt;/b&gt;</ept>.</seg></tuv></tu>
<tu><tuv xml:lang="EN"><seg>Hello <ph x="1">{0}</ph>world</seg></tuv><tuv xml:lang="fr"><seg>Bonjour</seg></tuv></tu>
<tu><tuv xml:lang="en"><seg>   </seg></tuv><tuv xml:lang="de"><seg>leer</seg></tuv></tu>
<tu><tuv xml:lang="en"><seg>Good <hi type="b">morning</hi></seg></tuv><tuv xml:lang="de_AT"><seg>Guten Morgen</seg></tuv></tu>
</body></tmx>
"""


def test_tmx_inline_codes_region_subtags_and_skipped_units(tmp_path):
    path = tmp_path / "tm.tmx"
    path.write_text(TMX, encoding="utf-8")
    entries = read_tmx(path, "en", "de")
    assert entries.sources == ["Click Save now.", "Good morning"]
    assert entries.targets == ["Klicken Sie Speichern.", "Guten Morgen"]
    assert entries.skipped == {"units without both en and de": 1, "units with an empty segment": 1}
    assert "2 entries" in entries.summary()


def test_tmx_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.tmx"
    bad.write_text(TMX.replace("</tu>\n<tu><tuv xml:lang=\"EN\">", "\n<tu><tuv xml:lang=\"EN\">", 1), encoding="utf-8")
    with pytest.raises(TranslationMemoryError, match=r"bad\.tmx: line \d+: malformed TMX"):
        read_tmx(bad, "en", "de")
    with pytest.raises(TranslationMemoryError, match=r"no translation unit with both en and ja .*languages found: de, en, fr"):
        read_tmx(tmp_path.joinpath("ok.tmx").write_text(TMX) and tmp_path / "ok.tmx", "en", "ja")
    with pytest.raises(TranslationMemoryError, match="expected a <tmx> document"):
        read_tmx(tmp_path.joinpath("x.tmx").write_text("<html/>") and tmp_path / "x.tmx", "en", "de")


def test_tsv_reader(tmp_path):
    path = tmp_path / "tm.tsv"
    path.write_text("a b\tx y\n\nc\t\nd\te\n", encoding="utf-8")
    entries = read_tsv(path)
    assert (entries.sources, entries.targets) == (["a b", "d"], ["x y", "e"])
    assert entries.skipped == {"blank lines": 1, "lines with an empty side": 1}
    path.write_text("a\tb\nc\td\te\n", encoding="utf-8")
    with pytest.raises(TranslationMemoryError, match=r"tm\.tsv: line 2: expected 2 tab-separated columns .* got 3"):
        read_tsv(path)
    with pytest.raises(TranslationMemoryError, match="expected a prepared directory, a .tmx or a .tsv file"):
        read_memory(tmp_path / "tm.json", "en", "de")


def test_fuzzy_score_and_bands():
    assert fuzzy_score("a b c d".split(), "a b c d".split()) == 1.0
    assert fuzzy_score("a b c d".split(), "a x c d".split()) == 0.75
    assert fuzzy_score([], "a".split()) == 0.0
    assert [band_of(s) for s in (0.1, 0.5, 0.75, 0.95, 1.0)] == ["<50", "50-70", "70-90", ">=90", ">=90"]


def test_batched_fuzzy_scores_equal_the_pairwise_score():
    """The retriever's rerank scores all candidates in one call: the same values, bit for bit (a
    different rounding would reorder ties and change which match a sentence gets)."""
    import random

    from reluformer_mt.memory.tm import fuzzy_scores

    rng = random.Random(0)
    sentences = [[rng.choice("a b c d e f g".split()) for _ in range(rng.randint(0, 12))] for _ in range(200)]
    for query in sentences[:20]:
        assert fuzzy_scores(query, sentences).tolist() == [fuzzy_score(query, s) for s in sentences]
    assert fuzzy_scores(["a"], []).tolist() == []


@pytest.fixture(scope="module")
def memory_data(prepared_doc_data, tmp_path_factory):
    """The doc-level IWSLT directory prepared again with --memory-k 4 (the fixture's SentencePiece model)."""
    from conftest import prepare_iwslt_with_memory

    return prepare_iwslt_with_memory(tmp_path_factory.mktemp("tm") / "doc128", prepared_doc_data["doc"] / "spm.model",
                                     segment_tokens=128)


def test_neighbours_in_the_prepared_directory_never_leak(memory_data):
    from reluformer_mt.data.prepared import Prepared
    from reluformer_mt.memory.neighbours import load_neighbours

    prepared = Prepared.load(memory_data)
    train = read_prepared(memory_data, "train")
    assert prepared.memory["k"] == 4 and prepared.memory["entries"] == len(train) == prepared.splits["train"].sentences
    ids, scores = load_neighbours(memory_data, "train", 4)
    assert ids.shape == (len(train), 4) and (ids[:, 0] >= 0).all()
    assert not (ids == np.arange(len(train))[:, None]).any(), "a training sentence retrieved itself"
    assert (np.diff(scores, axis=1) <= 1e-6).all(), "matches are not ranked best first"
    for split in ("valid", "test"):
        split_ids, _ = load_neighbours(memory_data, split, 2)
        assert split_ids.shape == (prepared.splits[split].sentences, 2)
        assert split_ids.max() < len(train)  # entries are training sentences only
    with pytest.raises(TranslationMemoryError, match="holds 4 neighbours per sentence"):
        load_neighbours(memory_data, "train", 5)


def test_retrieval_recall_against_the_exact_fuzzy_best(memory_data):
    """Queries that are training sentences with one word changed (a 'fuzzy match' situation):
    the retrieved top-1 has the exact best fuzzy score (from scoring the whole memory)."""
    train = read_prepared(memory_data, "train")
    rows = [i for i, s in enumerate(train.sources) if len(s.split()) >= 6][:100]
    queries = []
    for i in rows:
        words = train.sources[i].split()
        words[len(words) // 2] = "zebra"
        queries.append(" ".join(words))
    retriever = Retriever(train)
    ids, scores = retriever.search(queries, 4)
    best = retriever.exact_best(queries)
    assert (best >= 0.5).all()
    recall = recall_at_k(scores, best, ks=(1, 4))
    assert recall["recall@1"] >= 0.95, recall
    # a training query finds itself unless excluded (leave-one-out)
    own, _ = retriever.search(train.sources[:20], 1)
    assert (own[:, 0] == np.arange(20)).mean() >= 0.9
    loo, _ = retriever.search(train.sources[:20], 1, exclude=np.arange(20))
    assert not (loo[:, 0] == np.arange(20)).any()


TRAIN_TM = ["--arch", "reluformer_tiny", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
            "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
            "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings",
            "--max-source-positions", "1024", "--max-target-positions", "256",
            "--criterion", "reluformer_cross_entropy", "--optimizer", "adam", "--lr", "3e-3",
            "--max-tokens", "1500", "--num-workers", "0", "--seed", "1", "--cpu", "--disable-validation",
            "--no-epoch-checkpoints", "--no-progress-bar", "--max-update", "4"]


@pytest.mark.parametrize("fusion", ["concat", "attention"])
def test_fusion_trains_and_translates_with_a_memory(fusion, memory_data, tmp_path):
    from reluformer_mt.inference import DocumentTranslator

    save = tmp_path / "ckpt"
    run_fairseq("train", [memory_data, "--user-dir", USER_DIR, "--task", "document_translation", *TRAIN_TM,
                          "--tm-fusion", fusion, "--tm-k", "2", "--save-dir", save])
    test = read_prepared(memory_data, "test")
    documents = [test.sources[:5], test.sources[5:8]]
    translator = DocumentTranslator(save / "checkpoint_last.pt", beam=2, max_len_a=0, max_len_b=6)
    assert translator.memory is not None and translator.memory.k == 2
    reading = translator.part(MemoryReading)  # memory reading is a part: it gives the model its matches
    assert reading is not None and reading.memory_k == 2 and translator.guidance[0] is reading
    fed = []
    original_inputs = reading.inputs
    reading.inputs = lambda dataset, batch: fed.append(len(batch.sources)) or original_inputs(dataset, batch)
    results = translator.translate(documents)
    assert fed and sum(fed) >= 2  # every generate call's sources went through it
    source = translator.src_dict.encode_line(" ".join(translator.sp_src.encode(test.sources[0], out_type=str)),
                                             add_if_not_exist=False, append_eos=True).long()
    assert len(translator.generate([source])) == 1  # neither units nor matches given: the model reads no memory
    assert [len(d) for d in results] == [5, 3]
    assert all(r.match is not None and 0.0 <= r.match[1] <= 1.0 for d in results for r in d)
    assert sum(v for k, v in translator.stats.items() if k.startswith("memory:")) == 8
    # another memory: a TSV file; its matches are its own entries
    tsv = tmp_path / "tm.tsv"
    tsv.write_text("".join(f"{s}\tTM{i}\n" for i, s in enumerate(test.sources[:8])), encoding="utf-8")
    with_tsv = DocumentTranslator(save / "checkpoint_last.pt", beam=2, max_len_a=0, max_len_b=6, memory=str(tsv))
    out = with_tsv.translate(documents)
    assert [r.match[0] for r in out[0]] == [0, 1, 2, 3, 4] and out[0][0].match[1] == pytest.approx(1.0)
    assert with_tsv.memory.target(out[1][0].match[0]) == "TM5"


def test_memory_attention_reads_the_memory(memory_data, tmp_path):
    """With --tm-fusion attention, the decoder output depends on the memory tokens (and on
    nothing else when they are absent); beam search reorders the memory with the sentences."""
    from fairseq import checkpoint_utils

    save = tmp_path / "ckpt"
    run_fairseq("train", [memory_data, "--user-dir", USER_DIR, "--task", "document_translation", *TRAIN_TM,
                          "--tm-fusion", "attention", "--tm-k", "1", "--tm-attn-fn", "softmax", "--save-dir", save])
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(save / "checkpoint_last.pt")])
    model = models[0].eval()
    assert all("tm_reader" in layer._modules for layer in model.decoder.layers)
    assert model.decoder.layers[0].tm_reader.attn.fn == "softmax"
    src = torch.tensor([[5, 6, 7, 2]])
    prev = torch.tensor([[2, 8, 9]])
    memory_a, memory_b = torch.tensor([[0, 10, 11, 12]]), torch.tensor([[0, 20, 21, 1]])
    with torch.no_grad():
        out_a = model(src, torch.tensor([4]), prev, memory_tokens=memory_a)[0]
        out_b = model(src, torch.tensor([4]), prev, memory_tokens=memory_b)[0]
        out_a2 = model(src, torch.tensor([4]), prev, memory_tokens=memory_a)[0]
    assert not torch.allclose(out_a, out_b)
    assert torch.equal(out_a, out_a2)


def test_bad_memory_options(memory_data, tmp_path, prepared_doc_data):
    with pytest.raises(ValueError, match="--tm-fusion: got 'bogus'"):
        run_fairseq("train", [memory_data, "--user-dir", USER_DIR, "--task", "document_translation", *TRAIN_TM,
                              "--tm-fusion", "bogus", "--save-dir", tmp_path / "x"])
    with pytest.raises(ValueError, match="no translation-memory neighbours"):
        run_fairseq("train", [prepared_doc_data["doc"], "--user-dir", USER_DIR, "--task", "document_translation",
                              *TRAIN_TM, "--tm-fusion", "concat", "--save-dir", tmp_path / "y"])


def direct_log_copy(logits, copy):
    """The copy distribution by its formula, in float64: log((1 - c) softmax + c * scattered weights)."""
    steps = logits.size(1)
    w = copy["weights"][:, -steps:].double()
    keep = torch.ones_like(copy["tokens"], dtype=torch.bool)
    for t in copy["ignore"]:
        keep &= copy["tokens"].ne(t)
    w = w * keep.unsqueeze(1)
    mass = w.sum(-1, keepdim=True)
    c = torch.sigmoid(copy["gate_logit"][:, -steps:].double()) * mass.gt(0)
    scattered = torch.zeros_like(logits, dtype=torch.float64).scatter_add_(
        2, copy["tokens"].unsqueeze(1).expand(-1, steps, -1), w / mass.clamp_min(1e-30))
    return torch.log((1 - c) * torch.softmax(logits.double(), -1) + c * scattered)


def test_copy_distribution_in_log_space_matches_its_formula_and_gradients():
    from reluformer_mt.memory.tm_attention import copy_probabilities

    torch.manual_seed(0)
    B, T, M, V, pad, bos = 3, 5, 7, 11, 1, 0
    tokens = torch.tensor([[0, 4, 5, 4, 4, 1, 1], [0, 6, 7, 8, 0, 6, 9], [0, 1, 1, 1, 1, 1, 1]])  # repeats, padding
    weights = torch.rand(B, T, M)
    weights[0, 2] = 0  # a ReLU row that reads nothing: no copy
    weights[1, 3, 1:] = 0  # a row reading only the entry marker: no copy either
    logits = torch.randn(B, T, V, requires_grad=True)
    weights.requires_grad_(True)
    gate_logit = torch.randn(B, T, 1, requires_grad=True)
    copy = {"weights": weights, "tokens": tokens, "gate_logit": gate_logit, "ignore": (pad, bos)}
    ours = copy_probabilities(logits, copy, log_probs=True)
    reference = direct_log_copy(logits, copy)
    assert torch.allclose(ours.double(), reference, atol=1e-5)
    assert torch.allclose(copy_probabilities(logits, copy, log_probs=False).double(), reference.exp(), atol=1e-6)
    target = torch.randint(0, V, (B, T, 1))
    target[0, :, 0] = 4  # a token held by three slots: its gradient counted once
    for loss_of in (lambda lp: -lp.gather(2, target).sum(), lambda lp: -lp.sum()):  # nll and label smoothing's sum
        grads = torch.autograd.grad(loss_of(copy_probabilities(logits, copy, log_probs=True)), (logits, weights, gate_logit))
        expected = torch.autograd.grad(loss_of(direct_log_copy(logits, copy)), (logits, weights, gate_logit))
        for g, e in zip(grads, expected):
            assert torch.allclose(g.double(), e.double(), atol=1e-4)


def test_copy_step_from_each_sentences_table_matches_the_formula():
    """Issue 32: a decoding step's copy distribution from the table of each sentence's memory (made
    once per segment, beams of a sentence adjacent) equals the formula and the general path, within
    1e-5: tokens held by several slots, padding, entry markers, a row reading nothing, a row reading
    only an entry marker, a sentence whose memory is all padding."""
    from reluformer_mt.memory.tm_attention import copy_probabilities, sentence_copy_table

    torch.manual_seed(0)
    beams, M, V, pad, bos = 3, 7, 11, 1, 0
    sentences = torch.tensor([[0, 4, 5, 4, 4, 1, 1], [0, 6, 7, 8, 0, 6, 9], [1, 1, 1, 1, 1, 1, 1]])
    columns, column_tokens = sentence_copy_table(sentences, (pad, bos))
    assert columns[0].tolist() == [M, 1, 2, 1, 1, M, M] and column_tokens[0].tolist() == [pad, 4, 5, pad, pad, pad, pad]
    assert columns[2].tolist() == [M] * M
    B = sentences.size(0) * beams
    weights = torch.rand(B, 1, M)
    weights[1] = 0  # a ReLU row that reads nothing: no copy
    weights[4, 0, 1:] = 0  # a row reading only the entry marker: no copy either
    copy = {"weights": weights, "gate_logit": torch.randn(B, 1, 1), "ignore": (pad, bos),
            "table": (sentences, columns, column_tokens)}
    logits = torch.randn(B, 1, V)
    rows = dict(copy, tokens=sentences.repeat_interleave(beams, 0), table=None)
    with torch.no_grad():
        step = copy_probabilities(logits, copy, log_probs=True)
        general = copy_probabilities(logits, rows, log_probs=True)
        probabilities = copy_probabilities(logits, copy, log_probs=False)  # the table's rows repeated
    reference = direct_log_copy(logits, rows)
    assert torch.allclose(step.double(), reference, atol=1e-5) and torch.allclose(step, general, atol=1e-5)
    assert torch.allclose(probabilities.double(), reference.exp(), atol=1e-6)


def test_translation_pieces_bonus_by_hand():
    """Zhang et al. 2018's bonus: every n-gram (n <= max n) a next token completes earns the best
    fuzzy score of the matches holding it, while the hypothesis holds fewer copies of the token
    than the matches do; excluded tokens end pieces."""
    from reluformer_mt.guidance.piece_table import add_piece_bonus, sentence_pieces

    sep = 9
    pieces = sentence_pieces([(torch.tensor([4, 5, 6, sep, 7]), 0.5), (torch.tensor([4, 5, 8, 4]), 0.25)],
                             exclude=(sep,), max_n=3)
    assert len(pieces) == 12  # 4 5 6 7 8 | 4-5 5-6 5-8 8-4 | 4-5-6 4-5-8 5-8-4; 6-7 is cut by the separator
    assert pieces.cap[4] == 2 and pieces.cap[5] == 1 and pieces.expected_length == 4
    lprobs = torch.zeros(3, 12)
    prefix = torch.tensor([[2, 4, 5], [2, 4, 4], [2, 6, 7]])  # BOS first, as fairseq's prefixes
    add_piece_bonus(lprobs, prefix, [pieces, pieces, None], weight=2.0)
    # row 0 after "4 5": 6 = unigram 0.5 + bigram 5-6 0.5 + trigram 4-5-6 0.5; 8 = 0.25 * 3; 5 used up
    assert lprobs[0, 6] == pytest.approx(2 * 1.5) and lprobs[0, 8] == pytest.approx(2 * 0.75)
    assert lprobs[0, 7] == pytest.approx(2 * 0.5) and lprobs[0, 4] == pytest.approx(2 * 0.5) and lprobs[0, 5] == 0
    # row 1 after "4 4": 4 is used up; 5 = unigram + bigram 4-5
    assert lprobs[1, 4] == 0 and lprobs[1, 5] == pytest.approx(2 * 1.0)
    assert lprobs[2].abs().sum() == 0  # no pieces: no bonus
    assert add_piece_bonus(torch.zeros(1, 12), prefix[:1], [pieces], weight=0.0).abs().sum() == 0


def test_translation_pieces_follow_the_sentence_being_written():
    """In a segment, a hypothesis is rewarded only by the pieces of the sentence it is writing (its
    separators so far), caps count that sentence's tokens, no bonus past the sentence's expected
    length, and matches below the fuzzy floor give no pieces (issue 32)."""
    from reluformer_mt.guidance.piece_table import add_piece_bonus, sentence_pieces

    sep = 9
    first = sentence_pieces([(torch.tensor([4, 5]), 0.8)], exclude=(sep,), max_n=2)
    second = sentence_pieces([(torch.tensor([6, 7, 4]), 0.6), (torch.tensor([10]), 0.1)], exclude=(sep,), max_n=2,
                             floor=0.5)
    assert 10 not in second.cap  # the 0.1-fuzzy match is below the floor
    assert sentence_pieces([(torch.tensor([10]), 0.1)], floor=0.5) is None
    rows = []
    for p in ([2, 4], [2, 4, 5, sep], [2, 4, 5, sep, 6, 7, 4], [2, 4, 5]):
        lp = torch.zeros(1, 12)
        add_piece_bonus(lp, torch.tensor([p]), [[first, second]], weight=1.0, separator=sep)
        rows.append(lp[0])
    assert rows[0][5] == pytest.approx(1.6) and rows[0][6] == 0  # sentence 1: only its pieces (unigram + bigram 4-5)
    assert rows[1][6] == pytest.approx(0.6) and rows[1][4] == pytest.approx(0.6) and rows[1][5] == 0  # sentence 2
    assert rows[2].abs().sum() == 0  # sentence 2 reached its expected length (3 tokens)
    assert rows[3].abs().sum() == 0  # sentence 1 reached its expected length (2 tokens)


def test_a_sentence_at_its_length_cap_can_only_end():
    """--pieces-length-cap F: a row whose sentence is F x its expected length long keeps only the
    separator and EOS possible (their scores as they were); shorter rows and rows without pieces
    are untouched; the part counts the rows it ended."""
    from reluformer_mt.guidance.piece_table import PieceTable, sentence_pieces

    sep, eos = 9, 2
    first = sentence_pieces([(torch.tensor([4, 5]), 0.8)], exclude=(sep,), max_n=2)  # expected length 2
    table = PieceTable([[first], None], 12, separator=sep)
    prefix = torch.tensor([[2, 4, 5, 6], [2, 4, 5, 6], [2, 6, 6, 6]])  # BOS first; rows 0-1 wrote 3 tokens
    lprobs = torch.log_softmax(torch.randn(3, 12, generator=torch.Generator().manual_seed(0)), dim=1)
    before = lprobs.clone()
    assert table.add_bonus(lprobs, prefix, torch.tensor([0, 0, 1]), 1.0, length_cap=1.5, ends=(eos, sep)) == 2
    for row in (0, 1):  # 3 tokens >= 1.5 x 2: only EOS and the separator stay possible
        assert torch.isinf(lprobs[row, [0, 1, 3, 4, 5, 6, 7, 8, 10, 11]]).all()
        assert lprobs[row, eos] == before[row, eos] and lprobs[row, sep] == before[row, sep]
    assert torch.equal(lprobs[2], before[2])  # no pieces: no cap
    lprobs = before.clone()
    assert table.add_bonus(lprobs, prefix, torch.tensor([0, 0, 1]), 1.0, length_cap=2.0, ends=(eos, sep)) == 0
    assert torch.isfinite(lprobs).all()


def test_translation_pieces_expected_length_follows_the_source():
    """Issue 32: no bonus past the source's expected length: given the sentence's source length
    and each match's, the expected length is the longest a match's length ratio predicts, never
    more than the longest match."""
    from reluformer_mt.guidance.piece_table import sentence_pieces

    matches = [(torch.tensor([4, 5, 6, 7, 8, 9, 10, 11]), 0.6, 4), (torch.tensor([4, 5, 6]), 0.5, 3)]
    assert sentence_pieces(matches).expected_length == 8  # no source lengths: the longest match
    assert sentence_pieces(matches, source_length=2).expected_length == 4  # 8 tokens for 4 words: 2 per word
    assert sentence_pieces(matches, source_length=100).expected_length == 8
    assert sentence_pieces(matches, floor=0.55, source_length=1).expected_length == 2
    # tokens not kept (--pieces-aligned) end a piece but still count for the cap and the length
    kept = sentence_pieces([(torch.tensor([4, 5, 6, 4]), 0.6, 4, [True, True, False, True])], max_n=2)
    assert set(kept.best) == {(4,), (5,), (4, 5)} and kept.cap[6] == 1 and kept.cap[4] == 2
    assert kept.expected_length == 4


def _piece_bonus_by_rule(prefix, units, vocab, separator):
    """The bonus of one row, straight from the rule (the reference for the batched table): the
    pieces of the sentence being written; each n-gram the token completes adds its weight; none
    for a token used up to its cap or once the sentence reaches its expected length."""
    history = [int(t) for t in prefix[1:]]
    sentence = history.count(separator) if separator is not None else 0
    unit = units[min(sentence, len(units) - 1)]
    current = history[len(history) - history[::-1].index(separator):] if separator in history else history
    bonus = torch.zeros(vocab)
    if unit is None or (unit.expected_length is not None and len(current) >= unit.expected_length):
        return bonus
    for token in range(vocab):
        if current.count(token) >= unit.cap.get(token, 0):
            continue
        for n in range(1, unit.max_n + 1):
            if n - 1 <= len(history):
                gram = tuple(history[len(history) - (n - 1):]) + (token,) if n > 1 else (token,)
                bonus[token] += unit.best.get(gram, 0.0)
    return bonus


@pytest.mark.parametrize("slot_map", ["dense", "searched"])
def test_translation_pieces_table_matches_the_rule_on_random_segments(slot_map, monkeypatch):
    """The sparse table (slots per sentence, one scatter per step) gives every row the bonus the
    rule gives, for random matches, floors, max n, prefixes that cross separators, and sources
    without pieces; with the caps' (unit, token) -> slot map and without it (a batch whose units x
    vocabulary exceed ``DENSE_LIMIT``: the slots are searched)."""
    from reluformer_mt.guidance.piece_table import PieceTable, add_piece_bonus, sentence_pieces

    if slot_map == "searched":
        monkeypatch.setattr(PieceTable, "DENSE_LIMIT", 0)

    gen = torch.Generator().manual_seed(3)
    vocab, sep = 30, 3
    sources, prefixes = [], []
    for _ in range(12):
        sentences = []
        for _ in range(int(torch.randint(1, 4, (1,), generator=gen))):
            entries = [(torch.randint(4, 16, (int(torch.randint(1, 9, (1,), generator=gen)),), generator=gen),
                        float(torch.rand(1, generator=gen))) for _ in range(3)]
            sentences.append(sentence_pieces(entries, exclude=(sep,), max_n=int(torch.randint(1, 5, (1,), generator=gen)),
                                             floor=0.3))
        sources.append(sentences if len(sentences) > 1 else sentences[0])
        body = torch.randint(4, 16, (7,), generator=gen)
        body[torch.rand(7, generator=gen) < 0.2] = sep
        prefixes.append(torch.cat([torch.tensor([2]), body]))
    sources[0] = None
    for steps in (1, 2, 4, 8):
        prefix = torch.stack(prefixes)[:, :steps]
        lprobs = torch.randn(len(sources), vocab)
        expected = lprobs.clone()
        add_piece_bonus(lprobs, prefix, sources, weight=1.5, separator=sep)
        for row, units in enumerate(sources):
            units = units if isinstance(units, list) else [units]
            expected[row] += 1.5 * _piece_bonus_by_rule(prefix[row], units, vocab, sep)
        assert torch.allclose(lprobs, expected, atol=1e-5), steps
    assert add_piece_bonus(torch.zeros(2, vocab), prefix[:2], [None, [None, None]], 1.0, sep).abs().sum() == 0


def test_translation_pieces_guide_models_with_and_without_memory(memory_data, tmp_path):
    """--pieces-weight: the memory's pieces change the output of a model trained with memory
    attention and of one trained without memory; weight 0 is the plain translation."""
    from reluformer_mt.inference import DocumentTranslator, TranslationError

    test = read_prepared(memory_data, "test")
    documents = [test.sources[:4], test.sources[4:7]]
    for fusion in ("attention", "none"):
        save = tmp_path / fusion
        run_fairseq("train", [memory_data, "--user-dir", USER_DIR, "--task", "document_translation", *TRAIN_TM,
                              "--tm-fusion", fusion, "--tm-k", "1", "--save-dir", save])
        kwargs = dict(beam=2, max_len_a=0, max_len_b=12)
        plain = DocumentTranslator(save / "checkpoint_last.pt", **kwargs).translate(documents)
        off = DocumentTranslator(save / "checkpoint_last.pt", pieces_weight=0.0, **kwargs).translate(documents)
        guided_tr = DocumentTranslator(save / "checkpoint_last.pt", pieces_weight=20.0, pieces_k=2, **kwargs)
        guided = guided_tr.translate(documents)
        assert [r.text for d in off for r in d] == [r.text for d in plain for r in d]
        assert [r.text for d in guided for r in d] != [r.text for d in plain for r in d]
        assert all(r.match is not None for d in guided for r in d) and "translation pieces" in guided_tr.describe()
        # a strong bonus makes the output share more words with the matches' targets
        matched = [guided_tr.memory.target(r.match[0]).split() for d in guided for r in d]

        def overlap(results):
            return sum(len(set(r.text.split()) & set(m)) for r, m in zip([r for d in results for r in d], matched))
        assert overlap(guided) > overlap(plain)
    # --pieces-aligned (Zhang et al.'s pieces): only target words the memory's eflomal links tie to
    # source words the sentence shares with the match; an entry matched by its own source keeps
    # its aligned words, one sharing no word keeps nothing
    aligned = DocumentTranslator(tmp_path / "none" / "checkpoint_last.pt", pieces_weight=20.0, pieces_k=2,
                                 pieces_aligned=True, beam=2, max_len_a=0, max_len_b=12)
    assert len(aligned.translate(documents)) == 2
    from reluformer_mt.guidance import SourceBatch
    from reluformer_mt.guidance.pieces import PiecesOptions, TranslationPiecesGuide

    guide = aligned.part(TranslationPiecesGuide)
    entries = aligned.memory.entries
    own = guide.aligned_tokens(entries.sources[0].split(), 0, aligned.memory.tokens[0])
    assert len(own) == len(aligned.memory.tokens[0]) and 0 < sum(own) <= len(own)
    assert not any(guide.aligned_tokens(["zzz-not-a-word"], 0, aligned.memory.tokens[0]))
    # the part passes the alignment on: each sentence's aligned pieces are a subset of all
    # its pieces, and some sentence loses pieces
    batch = SourceBatch([], None, aligned._matches, aligned._unit_words)
    keys = [(0, i) for i in range(len(documents[0]))]
    only_aligned = [guide.sentence_pieces(batch, key) for key in keys]
    guide.options = PiecesOptions(weight=20.0, k=2)
    every = [guide.sentence_pieces(batch, key) for key in keys]
    assert all(set(a.best) <= set(e.best) for a, e in zip(only_aligned, every) if a is not None)
    assert sum(len(a.best) for a in only_aligned if a is not None) < sum(len(e.best) for e in every if e is not None)
    with pytest.raises(TranslationError, match="--pieces-aligned: only with translation pieces"):
        DocumentTranslator(tmp_path / "none" / "checkpoint_last.pt", pieces_aligned=True)
    # --pieces-length-cap: at 1x the expected length every sentence is made to end where it is that long
    capped = DocumentTranslator(tmp_path / "none" / "checkpoint_last.pt", pieces_weight=20.0, pieces_k=2,
                                pieces_length_cap=1.0, beam=2, max_len_a=0, max_len_b=60)
    assert len(capped.translate(documents)) == 2 and "sentences ended at 1x" in capped.describe()
    assert capped.stats["pieces: beam steps made to end their sentence (--pieces-length-cap)"] > 0
    for bad, message in ((0.5, "expected 0 \\(off\\) or a factor >= 1 of the expected length, got 0.5"),
                         (float("inf"), "expected 0 \\(off\\) or a factor >= 1")):
        with pytest.raises(TranslationError, match=f"--pieces-length-cap: {message}"):
            DocumentTranslator(tmp_path / "none" / "checkpoint_last.pt", pieces_weight=1.0, pieces_length_cap=bad)
    with pytest.raises(TranslationError, match="--pieces-length-cap: only with translation pieces"):
        DocumentTranslator(tmp_path / "none" / "checkpoint_last.pt", pieces_length_cap=1.5)
    with pytest.raises(TranslationError, match="cannot read one; --pieces-weight"):
        DocumentTranslator(tmp_path / "none" / "checkpoint_last.pt", memory=str(memory_data))
    with pytest.raises(TranslationError, match="--pieces-weight: expected a finite number >= 0, got -1"):
        DocumentTranslator(tmp_path / "none" / "checkpoint_last.pt", pieces_weight=-1)


@pytest.mark.parametrize("reader_fn", ["softmax", "relu"])
def test_memory_attention_decodes_the_same_with_the_cache(reader_fn, memory_data, tmp_path, monkeypatch):
    """Issue 32: beam search over a memory-attention model gives the same hypotheses and scores
    when the memory's keys and values are cached across steps and beams (and the memory is
    reordered as an index) as when every step recomputes the whole decoder from the memory's
    states, gathered in the beams' order (fairseq's decoding without incremental state). Two
    decoder layers (two readers), the copy distribution on; softmax readers run fairseq's
    attention at the first step and their direct step over the cached keys after it, ReLU readers
    our own; the copy reads each sentence's table of its memory after the first step. With the
    float32 cache (--memory-cache float32); the float16 one, the default, gives the scores up to its
    rounding."""
    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.memory import fused, tm_attention
    from reluformer_mt.memory.tm_attention import MemoryReader

    save = tmp_path / "ckpt"
    args = [a if a != "4" else "30" for a in TRAIN_TM]  # 30 updates: hypotheses of several lengths
    args[args.index("--decoder-layers") + 1] = "2"
    run_fairseq("train", [memory_data, "--user-dir", USER_DIR, "--task", "document_translation", *args,
                          "--tm-fusion", "attention", "--tm-k", "2", "--tm-attn-fn", reader_fn, "--save-dir", save])
    test = read_prepared(memory_data, "test")
    documents = [test.sources[:6], test.sources[6:9], test.sources[9:10]]
    translator = DocumentTranslator(save / "checkpoint_last.pt", beam=3, max_len_a=0.5, max_len_b=4,
                                    memory_cache="float32")
    assert [layer.tm_reader.attn.fn for layer in translator.model.decoder.layers] == [reader_fn] * 2
    direct = {"reader steps": 0, "copy steps": 0}  # the cached paths ran: softmax readers' direct step, the copy table

    def counting(name, function):
        def counted(*a, **k):
            direct[name] += 1
            return function(*a, **k)
        return counted

    monkeypatch.setattr(MemoryReader, "_cached_softmax_step", counting("reader steps", MemoryReader._cached_softmax_step))
    monkeypatch.setattr(tm_attention, "_log_copy_step", counting("copy steps", tm_attention._log_copy_step))
    cached = translator.translate(documents, scores=True)
    assert direct["copy steps"] > 0 and (direct["reader steps"] > 0) == (reader_fn == "softmax"), direct
    half = DocumentTranslator(save / "checkpoint_last.pt", beam=3, max_len_a=0.5, max_len_b=4)  # float16, the default
    half_results = half.translate(documents, scores=True)
    for kept, reader in ((torch.float32, translator.model.decoder.layers[0].tm_reader),
                         (torch.float16, half.model.decoder.layers[0].tm_reader)):
        assert reader.step_cache_dtype == kept
        if reader_fn == "softmax" and fused.available(torch.zeros(1)):  # the kernel read the cache in that precision
            assert reader._laid_out[1][0].dtype == kept
    pairs = [(a, b) for d, e in zip(cached, half_results) for a, b in zip(d, e)]
    assert sum(a.text == b.text for a, b in pairs) >= 0.8 * len(pairs)
    assert all(abs(a.score - b.score) < 1e-2 for a, b in pairs if a.text == b.text)
    lengths = []
    original = translator.generate

    def generate_recording(*a, **k):
        hyps = original(*a, **k)
        lengths.extend(len(h["tokens"]) for h in hyps)
        return hyps

    translator.generate = generate_recording
    translator.generator.model.has_incremental = False  # every step runs the whole decoder
    uncached = translator.translate(documents, scores=True)
    assert len(set(lengths)) > 1, lengths  # sentences finished at different steps: the batch shrank
    assert [[r.text for r in d] for d in cached] == [[r.text for r in d] for d in uncached]
    assert [r.score for d in cached for r in d] == pytest.approx([r.score for d in uncached for r in d], abs=1e-5)

    # and against the model without any incremental state or reordering: each hypothesis of a batch
    # (sentences finishing at different steps, beams reordered) rescored alone by a full forward
    # pass with its own memory gives the scores beam search reported
    translator.generator.model.has_incremental = True
    translator.generate = original
    sentences = test.sources[10:16]
    sources = [translator.src_dict.encode_line(" ".join(translator.sp_src.encode(s, out_type=str)), add_if_not_exist=False,
                                               append_eos=True).long() for s in sentences]
    ids, _ = translator.memory.lookup(sentences)
    matches = [translator.memory.tokens_of([row]) for row in ids]
    hyps = translator.generate(sources, matches=matches)
    model, eos = translator.model, translator.tgt_dict.eos()
    with torch.no_grad():
        for src, match, hyp in zip(sources, matches, hyps):
            target = torch.cat([hyp["tokens"], torch.tensor([eos])])
            prev = torch.cat([torch.tensor([eos]), hyp["tokens"]])
            out = model(src[None], torch.tensor([len(src)]), prev[None], memory_tokens=match[None])
            lprobs = model.get_normalized_probs(out, log_probs=True)[0]
            rescored = lprobs.gather(1, target[:, None])[:, 0]
            assert torch.allclose(rescored, hyp["positional_scores"], atol=1e-4), (rescored, hyp["positional_scores"])


def test_translation_memory_benchmark_prints_every_translation_row(memory_data, tmp_path, capsys):
    """benchmarks/translation_memory.py's translation rows on tiny models: the memory model with and
    without its matches, the twin with and without translation pieces (also without the
    equal-work step row), and the step row's ratio."""
    import importlib.util
    import json

    from helpers import REPO

    spec = importlib.util.spec_from_file_location("tm_bench", REPO / "benchmarks" / "translation_memory.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for fusion in ("attention", "none"):
        run_fairseq("train", [memory_data, "--user-dir", USER_DIR, "--task", "document_translation", *TRAIN_TM,
                              "--tm-fusion", fusion, "--tm-k", "1", "--save-dir", tmp_path / fusion])
    common = ["--data", str(memory_data), "--checkpoint", str(tmp_path / "attention" / "checkpoint_last.pt"),
              "--twin", str(tmp_path / "none" / "checkpoint_last.pt"), "--sizes", "", "--no-retrieval",
              "--sentences", "4", "--repeats", "1", "--clock", "cpu"]
    bench.main(common + ["--step-count", "0"])
    summary = capsys.readouterr().out.split("SUMMARY ")[1]
    assert "translation with/without matches" in summary and "translation time with/without translation pieces" in summary
    assert "time per beam row" in summary and "decoding step" not in summary
    bench.main(common + ["--step-count", "2", "--json", str(tmp_path / "r.json")])
    summary = capsys.readouterr().out.split("SUMMARY ")[1]
    assert "decoding step with/without matches at equal work" in summary
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["decoding_step"]["steps"] == 2 and report["translation"]["with memory"]["decoder_steps_per_pass"] > 0
    # every translation row says how long its outputs came out against the references (in words)
    assert summary.count("output/reference words") == 2
    for row in ("with memory", "same model, no matches", "twin without memory", "twin with translation pieces"):
        assert 0 < report["translation"][row]["length_ratio"] < 10, row
