"""kNN-MT (issue 31): read-outs, datastores, decoding and the tuner, on real tiny models."""
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from reluformer_mt.knn.readout import knn_probabilities, mix_log_probs, neighbour_weights


def test_softmax_readout_is_knn_mt():
    """Khandelwal et al.: weights softmax(-d/T) over the k neighbours, summed per token, mass 1."""
    d = torch.tensor([[1.0, 2.0, 4.0]])
    values = torch.tensor([[3, 5, 3]])
    w, mass = neighbour_weights(d, "softmax", temperature=2.0)
    expected = torch.softmax(-d / 2.0, dim=1)
    assert torch.allclose(w, expected) and mass.item() == 1.0
    p = knn_probabilities(w, values, 8)
    assert p[0, 3] == pytest.approx(float(expected[0, 0] + expected[0, 2])) and p[0, 5] == pytest.approx(float(expected[0, 1]))
    assert p.sum().item() == pytest.approx(1.0)


def test_relu_readout_gives_no_mass_when_every_neighbour_is_beyond_the_radius():
    d = torch.tensor([[12.0, 15.0, 30.0], [0.0, 5.0, 20.0]])
    w, mass = neighbour_weights(d, "relu", radius=10.0)
    assert w[0].abs().sum() == 0 and mass[0] == 0  # all beyond tau: nothing from the datastore
    assert torch.allclose(w[1], torch.tensor([1.0, 0.5, 0.0]) / 1.5) and mass[1] == 1.0  # exact match: full lambda
    lprobs = torch.log_softmax(torch.randn(2, 6), dim=1)
    probs = knn_probabilities(w, torch.tensor([[1, 2, 3], [4, 4, 5]]), 6)
    mixed = mix_log_probs(lprobs, probs, mass, lam=0.7)
    assert torch.allclose(mixed[0], lprobs[0], atol=1e-6)  # row 0 unchanged
    expected = torch.log(0.7 * probs[1] + 0.3 * lprobs[1].exp())
    assert torch.allclose(mixed[1], expected, atol=1e-6)


def test_sparse_readouts_and_missing_neighbours():
    d = torch.tensor([[1.0, 1.1, 9.0], [float("inf")] * 3])
    for readout in ("sparsemax", "entmax15"):
        w, mass = neighbour_weights(d, readout, temperature=1.0)
        assert w[0].sum().item() == pytest.approx(1.0) and w[0, 2] == 0  # the far one gets exactly 0
        assert w[1].abs().sum() == 0 and mass[1] == 0  # nothing found: no kNN mass
    w, mass = neighbour_weights(d, "softmax", temperature=1.0)
    assert w[1].abs().sum() == 0 and mass[1] == 0


def test_mixing_keeps_ruled_out_tokens_ruled_out():
    lprobs = torch.log_softmax(torch.randn(1, 5), dim=1)
    lprobs[0, 2] = -math.inf  # e.g. EOS before the minimum length
    probs = torch.zeros(1, 5)
    probs[0, 2] = 1.0
    mixed = mix_log_probs(lprobs, probs, torch.ones(1), lam=0.9)
    assert torch.isneginf(mixed[0, 2]) and torch.isfinite(mixed[0, [0, 1, 3, 4]]).all()


def test_bad_readout_options_are_one_line_errors():
    from reluformer_mt.knn.readout import ReadoutError
    from reluformer_mt.knn.search import KnnOptions

    with pytest.raises(ReadoutError, match="--knn-readout"):
        neighbour_weights(torch.zeros(1, 2), "cosine")
    with pytest.raises(ReadoutError, match="--knn-lambda"):
        KnnOptions(lam=1.5).check()
    with pytest.raises(ReadoutError, match="--knn-k"):
        KnnOptions(k=0).check()


def test_per_input_datastores_search_only_the_sentence_being_written():
    """A row searches its own source's entries of the sentence it is writing; each neighbour
    carries its match's fuzzy score."""
    from reluformer_mt.knn.search import PerInputDatastores

    units = [[(torch.tensor([[0.0, 0.0], [1.0, 1.0]]), torch.tensor([7, 8]), torch.tensor([0.9, 0.9])),
              (torch.tensor([[1.0, 1.0]]), torch.tensor([6]), torch.tensor([0.4]))],
             [(torch.tensor([[5.0, 5.0]]), torch.tensor([9]), torch.tensor([0.5]))]]
    store = PerInputDatastores(units)
    state = torch.tensor([[0.9, 1.0]] * 3)
    d, v, trust = store.neighbours(state, torch.tensor([0, 0, 1]), k=2, sentences=torch.tensor([0, 1, 0]))
    assert v[0].tolist() == [8, 7] and d[0, 0].item() == pytest.approx(0.01) and trust[0].tolist() == pytest.approx([0.9, 0.9])
    assert v[1].tolist() == [6, -1] and trust[1, 0].item() == pytest.approx(0.4)  # sentence 2's only match
    assert v[2].tolist() == [9, -1] and math.isinf(d[2, 1].item())  # source 1 has one entry


def test_the_mass_of_per_input_neighbours_follows_their_matches_fuzzy_scores():
    from reluformer_mt.knn.search import KnnMixer, KnnOptions, PerInputDatastores

    class Recorder:
        def last_states(self, rows):
            return torch.zeros(rows, 2)

    lprobs = torch.log_softmax(torch.zeros(1, 10), dim=1)
    shares = []
    for fuzzy in (0.9, 0.3):
        mixer = KnnMixer(Recorder(), KnnOptions(k=1, lam=1.0))
        mixer.store = PerInputDatastores([[(torch.zeros(1, 2), torch.tensor([4]), torch.tensor([fuzzy]))]])
        mixed = mixer.mix(lprobs.clone(), torch.tensor([0]))
        shares.append(float(mixed[0, 4].exp()) - 0.1 * (1 - fuzzy))
    assert shares == pytest.approx([0.9, 0.3], abs=1e-5)  # lambda x the voting match's fuzzy score


# ------------------------------------------------------------------ on real tiny models

from test_translation_memory import TRAIN_TM  # noqa: E402  (the tiny memory model's training options)

TRAIN_TINY = [a if a != "4" else "6" for a in TRAIN_TM]  # 6 updates


@pytest.fixture(scope="module")
def knn_setup(prepared_doc_data, tmp_path_factory):
    """IWSLT talks prepared with memory neighbours, a tiny document model (no memory) and one with
    memory attention trained on them, and a datastore of the first over the training split."""
    from conftest import prepare_iwslt_with_memory
    from helpers import USER_DIR, run_fairseq

    from reluformer_mt.knn.datastore import build_datastore

    root = tmp_path_factory.mktemp("knn")
    data = prepare_iwslt_with_memory(root / "doc128", prepared_doc_data["doc"] / "spm.model", segment_tokens=128)
    checkpoints = {}
    for fusion in ("none", "attention"):
        save = root / fusion
        run_fairseq("train", [data, "--user-dir", USER_DIR, "--task", "document_translation", *TRAIN_TINY,
                              "--tm-fusion", fusion, "--tm-k", "1", "--save-dir", save])
        checkpoints[fusion] = save / "checkpoint_last.pt"
    store = build_datastore(checkpoints["none"], root / "store", progress=False)
    return {"data": data, "checkpoints": checkpoints, "store": store, "root": root}


def test_datastore_holds_every_training_target_token_with_its_state(knn_setup):
    from reluformer_mt.data.prepared import Prepared
    from reluformer_mt.knn.datastore import Datastore

    store = knn_setup["store"]
    prepared = Prepared.load(knn_setup["data"])
    train = prepared.splits["train"]
    # one entry per target token (separators included) and the </s> of every training segment
    assert store.size == train.target_tokens + train.segments
    assert store.keys.dtype == np.float16 and store.values.dtype == np.int32 and store.dim == 32
    again = Datastore.load(store.directory)
    # the nearest entry of a stored key is itself (distance ~0, float16 keys)
    d, v = again.search(np.asarray(again.keys[:5], dtype=np.float32), 1)
    assert (d[:, 0] < 1e-3).all() and (v[:, 0] == again.values[:5]).all()
    assert "entries of dim 32" in again.describe() and again.meta["bytes"] > 0


def test_each_entry_records_the_training_sentence_it_comes_from(knn_setup):
    """sentences.npy: the entries of training sentence i are consecutive and hold exactly its target
    tokens, then the separator (a segment's inner sentence) or </s> (its last one)."""
    from fairseq.data import Dictionary

    from reluformer_mt.knn.datastore import split_pairs

    store = knn_setup["store"]
    first, counts = store.sentence_entries()
    data = Path(knn_setup["data"])
    _, targets = split_pairs(data, "train", "en", "de", "<sep>")
    assert len(first) == len(targets) and counts.sum() == store.size and (counts > 0).all()
    tgt_dict = Dictionary.load(str(data / "dict.de.txt"))
    ends = {tgt_dict.index("<sep>"), tgt_dict.eos()}
    for i in range(len(targets)):
        tokens = store.values[first[i]:first[i] + counts[i]].tolist()
        assert tokens[:-1] == tgt_dict.encode_line(targets[i], add_if_not_exist=False, append_eos=False).tolist()
        assert tokens[-1] in ends


def test_a_search_restricted_to_the_matches_entries_is_exact_over_them(knn_setup):
    """RestrictedSearch: each sentence's neighbours are the nearest of its matches' entries (brute
    force over those entries), and a sentence without matches has none."""
    from reluformer_mt.knn.search import RestrictedSearch

    store = knn_setup["store"]
    first, counts = store.sentence_entries()
    matches = [[[3, 7, -1]], [[0], []]]  # source 0: one sentence; source 1: two, the second without matches
    search = RestrictedSearch(store, matches)
    g = torch.Generator().manual_seed(0)
    states = torch.randn(6, store.dim, generator=g)
    sources, sentences = torch.tensor([0, 0, 1, 1, 1, 1]), torch.tensor([0, 0, 0, 0, 1, 1])
    d, v, trust = search.neighbours(states, sources, 4, sentences)
    assert trust is None and (v[4:] == -1).all() and torch.isinf(d[4:]).all()
    for row, ids in ((0, [3, 7]), (2, [0])):
        at = np.concatenate([np.arange(first[i], first[i] + counts[i]) for i in ids])
        keys = torch.from_numpy(np.asarray(store.keys[at], dtype=np.float32))
        exact = ((keys - states[row]) ** 2).sum(1)
        nearest = torch.topk(exact, 4, largest=False)
        assert torch.allclose(d[row], nearest.values, rtol=1e-4, atol=1e-4)
        assert v[row].tolist() == store.values[at][nearest.indices.numpy()].tolist()


def test_per_input_datastores_can_read_their_keys_from_the_corpus_datastore(knn_setup, tmp_path):
    """--knn-memory-keys DATASTORE: RestrictedSearch with the matches' fuzzy scores trusts each entry as
    its match; the translator builds its per-input datastores from the datastore's entries (nothing
    force-decoded) and refuses, in one line, the option without --knn-memory and a memory of
    another corpus."""
    from reluformer_mt.inference import DocumentTranslator, TranslationError
    from reluformer_mt.guidance.knn import KnnMixture
    from reluformer_mt.knn.search import RestrictedSearch

    store = knn_setup["store"]
    first, counts = store.sentence_entries()
    search = RestrictedSearch(store, [[[3, 7]]], [[[0.9, 0.25]]])
    d, v, trust = search.neighbours(torch.randn(2, store.dim, generator=torch.Generator().manual_seed(1)),
                                    torch.tensor([0, 0]), int(counts[3] + counts[7]))
    assert sorted(set(trust.flatten().tolist())) == [0.25, pytest.approx(0.9)] and torch.isfinite(d).all()
    assert (trust == 0.9).sum() == 2 * counts[3]
    assert (trust == 0.25).sum() == 2 * counts[7]

    ckpt, directory = knn_setup["checkpoints"]["none"], store.directory
    plain = dict(beam=2, max_len_a=0, max_len_b=8)
    translator = DocumentTranslator(ckpt, knn_memory=True, knn_memory_keys=directory, knn_memory_k=2, **plain)
    assert len(translator.translate_text([["a b c", "d e"]])[0]) == 2
    part = translator.part(KnnMixture)
    assert isinstance(part.mixer.store, RestrictedSearch) and part.mixer.store.trusted and not part._entry_states
    assert translator.stats["knn: per-input datastore entries"] > 0 and "keys read from" in translator.describe()
    with pytest.raises(TranslationError, match=r"--knn-memory-keys .*: the keys of per-input datastores; give --knn-memory"):
        DocumentTranslator(ckpt, knn_memory_keys=directory, **plain)
    tsv = tmp_path / "other.tsv"
    tsv.write_text("a b c\tx y z\n", encoding="utf-8")
    with pytest.raises(TranslationError, match=r"--knn-memory-keys .*: the memory .* is not the corpus .* leave it out"):
        DocumentTranslator(ckpt, knn_memory=True, knn_memory_keys=directory, memory=str(tsv), **plain)


def test_translation_with_a_restricted_search_and_its_one_line_refusals(knn_setup, tmp_path):
    """--knn-restrict M: the translator searches each sentence's M matches' entries (its memory is the
    datastore's corpus); refused in one line with a memory of another corpus or a datastore that
    predates sentences.npy."""
    import shutil

    from reluformer_mt.inference import DocumentTranslator, TranslationError
    from reluformer_mt.guidance.knn import KnnMixture
    from reluformer_mt.knn.search import RestrictedSearch

    ckpt, store = knn_setup["checkpoints"]["none"], knn_setup["store"].directory
    plain = dict(beam=2, max_len_a=0, max_len_b=8)
    translator = DocumentTranslator(ckpt, knn=store, knn_restrict=2, **plain)
    out = translator.translate_text([["a b c", "d e"]])
    assert len(out[0]) == 2 and isinstance(translator.part(KnnMixture).mixer.store, RestrictedSearch)
    assert translator.stats["knn: restricted search entries"] > 0 and translator.stats["knn: beam steps"] > 0
    assert "entries of its 2 best memory matches" in translator.describe()
    tsv = tmp_path / "other.tsv"
    tsv.write_text("a b c\tx y z\n", encoding="utf-8")
    with pytest.raises(TranslationError, match=r"--knn-restrict 2: the memory .* is not the corpus"):
        DocumentTranslator(ckpt, knn=store, knn_restrict=2, memory=str(tsv), **plain)
    old = tmp_path / "old_store"
    shutil.copytree(store, old)
    (old / "sentences.npy").unlink()
    with pytest.raises(TranslationError, match=r"sentences\.npy: missing .* rebuild it"):
        DocumentTranslator(ckpt, knn=old, knn_restrict=2, **plain)
    assert DocumentTranslator(ckpt, knn=old, **plain).translate_text([["a b c"]])  # the whole datastore still works


def test_datastore_of_another_checkpoint_is_refused(knn_setup):
    from reluformer_mt.inference import DocumentTranslator, TranslationError

    with pytest.raises(TranslationError, match="built with the weights of .* rebuild it with this checkpoint"):
        DocumentTranslator(knn_setup["checkpoints"]["attention"], knn=knn_setup["store"].directory)


def test_knn_changes_translations_and_lambda_zero_does_not(knn_setup):
    """--knn with lambda 1 and a stored datastore changes the output (every family: here a plain
    document model); lambda 0 is the plain translation, bit for bit."""
    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.knn.search import KnnOptions
    from reluformer_mt.memory.tm import read_prepared

    test = read_prepared(knn_setup["data"], "test")
    documents = [test.sources[:4], test.sources[4:7]]
    ckpt, store = knn_setup["checkpoints"]["none"], knn_setup["store"].directory
    kwargs = dict(beam=2, max_len_a=0, max_len_b=10)
    plain = [[r.text for r in d] for d in DocumentTranslator(ckpt, **kwargs).translate(documents)]
    off = DocumentTranslator(ckpt, knn=store, **KnnOptions(lam=0.0).translator_options(), **kwargs)
    assert [[r.text for r in d] for d in off.translate(documents)] == plain
    on = DocumentTranslator(ckpt, knn=store, **KnnOptions(k=8, lam=0.9, temperature=1.0).translator_options(), **kwargs)
    guided = [[r.text for r in d] for d in on.translate(documents)]
    assert guided != plain
    assert on.stats["knn: beam steps"] > 0 and on.stats["knn: beam steps whose best token the neighbours changed"] > 0
    assert "kNN-MT: softmax read-out of k=8" in on.describe()
    assert "knn: beam steps whose best token" in on.summary()


def test_per_input_datastores_for_a_memory_model(knn_setup):
    """--knn-memory (SK-MT): each sentence's matches force-decoded into its own datastore, for a
    model trained with memory attention too; a relu read-out with a tiny radius gives no mass."""
    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.knn.search import KnnOptions
    from reluformer_mt.memory.tm import read_prepared

    test = read_prepared(knn_setup["data"], "test")
    documents = [test.sources[:5]]
    ckpt = knn_setup["checkpoints"]["attention"]
    kwargs = dict(beam=2, max_len_a=0, max_len_b=10)
    plain = [[r.text for r in d] for d in DocumentTranslator(ckpt, **kwargs).translate(documents)]
    far = DocumentTranslator(ckpt, knn_memory=True, **KnnOptions(readout="relu", radius=1e-9, lam=1.0).translator_options(), **kwargs)
    assert [[r.text for r in d] for d in far.translate(documents)] == plain
    assert far.stats["knn: beam steps with kNN mass"] == 0 and far.stats["knn: per-input datastore entries"] > 0
    near = DocumentTranslator(ckpt, knn_memory=True, knn_memory_k=4,
                              **KnnOptions(readout="relu", radius=1e6, lam=1.0, k=4).translator_options(), **kwargs)
    assert [[r.text for r in d] for d in near.translate(documents)] != plain
    assert near.stats["knn: beam steps with kNN mass"] > 0


def test_tuner_scores_the_grid_on_validation_only_and_refuses_leaks(knn_setup, tmp_path):
    from reluformer_mt.knn.datastore import DatastoreError, build_datastore
    from reluformer_mt.experiments.knn_tune import TuneError, TuneSettings, format_report, tune

    ckpt, store = knn_setup["checkpoints"]["none"], knn_setup["store"].directory
    with pytest.raises(TuneError, match="never reads the test split"):
        tune(ckpt, TuneSettings(datastore=store, split="test"), progress=lambda *_: None)
    report = tune(ckpt, TuneSettings(datastore=store, decode=False), progress=lambda *_: None)
    assert report["split"] == "valid" and report["tokens"] > 0
    assert report["leakage"]["datastore_overlap"] <= report["leakage"]["training_overlap"]
    for mode in ("full", "per_input"):
        rows = report["grid"][mode]
        assert {r["readout"] for r in rows} == {"softmax", "relu"} and len(rows) > 100
        best = min(rows, key=lambda r: r["nll"])
        assert best["nll"] <= report["model_nll"] + 1e-9  # lambda -> small recovers the model at worst
    # adaptive kNN-MT: a Meta-k network per read-out trained on the split, the better one beside the datastore
    adaptive = report["adaptive"]
    assert set(adaptive["by_readout"]) == {"softmax", "relu"} and math.isfinite(adaptive["kept"]["held_out_nll"])
    assert (store / "adaptive.npz").is_file() and "adaptive  relu" in format_report(report)
    from reluformer_mt.inference import DocumentTranslator, TranslationError
    from reluformer_mt.knn.adaptive import AdaptiveError, MetaK

    with pytest.raises(AdaptiveError, match="trained for the datastore of another checkpoint"):
        MetaK.load(store, "0" * 16)
    translator = DocumentTranslator(ckpt, knn=store, knn_adaptive=True, beam=2, max_len_a=0, max_len_b=10)
    translator.translate([["a b c", "d e"]])
    assert translator.stats["knn: beam steps"] > 0 and "adaptive kNN-MT" in translator.describe()
    with pytest.raises(TranslationError, match="--knn-adaptive: the Meta-k network is trained for a corpus datastore"):
        DocumentTranslator(ckpt, knn_memory=True, knn_adaptive=True)
    # a datastore built from the validation split holds it: refused
    leaky = build_datastore(ckpt, tmp_path / "leaky", split="valid", progress=False)
    with pytest.raises(DatastoreError, match="built from data containing the valid split; refused"):
        tune(ckpt, TuneSettings(datastore=leaky.directory, decode=False), progress=lambda *_: None)


def test_tuner_chooses_the_fastest_search_within_its_tolerance_and_the_translator_uses_it(knn_setup, tmp_path):
    """The tuner's search stage on real decodes of validation sentences (an IVF datastore): the
    exact search, fewer probes, the index searched every few steps, both together, each with its
    s-BLEU and sentences/s; the fastest within the tolerance is kept (a tolerance of 0: the exact
    search unless an approximation scores as well); datastore.json records it, the translator
    follows it unless told --knn-exact-search."""
    from reluformer_mt.experiments.knn_search_tune import datastore_values, format_search, tune_search
    from reluformer_mt.experiments.knn_tune import TuneError, TuneSettings, split_documents, tune, validation_bleu
    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.guidance.knn import KnnMixture
    from reluformer_mt.knn.continued import ContinuedSearch
    from reluformer_mt.knn.datastore import Datastore, build_datastore
    from reluformer_mt.knn.search import FullDatastore, KnnOptions

    ckpt = knn_setup["checkpoints"]["none"]
    with pytest.raises(TuneError, match="--search-tolerance: expected s-BLEU points >= 0"):
        tune(ckpt, TuneSettings(datastore=knn_setup["store"].directory, search_tolerance=-1), progress=lambda *_: None)
    store = build_datastore(ckpt, tmp_path / "ivf", index="ivf", progress=False)
    own = store.own_probe()
    assert own > 2  # there are fewer probes to try
    sources, references, _ = split_documents(knn_setup["data"], "valid")
    sources, references = [sources[0][:4]], [references[0][:4]]
    kwargs = dict(beam=2, max_len_a=0, max_len_b=10, knn=store.directory,
                  **KnnOptions(k=16, lam=0.9, temperature=1.0).translator_options())
    measured = {}

    def decode(name, search):  # each setting decoded once, both tolerances read the same measurement
        if name not in measured:
            measured[name] = validation_bleu(lambda: DocumentTranslator(ckpt, **kwargs, **search), sources, references)
        return measured[name]

    lines = []
    loose = tune_search(decode, "full", store, 4, 1e9, "knn full softmax", lines.append)
    table = loose["table"]
    every_row = {"knn_skip_confident": 1.0}  # no row skips unless the row says so (not a former tuning's)
    assert [r["options"] for r in table[:5]] == [
        {"knn_probe": own, "knn_search_every": 1, "knn_restrict": 0, **every_row},
        *({"knn_probe": p, "knn_search_every": 1, **every_row} for p in (own // 2, own // 4)),
        *({"knn_probe": own, "knn_search_every": n, **every_row} for n in (2, 4))]
    assert_skip_rows(table, 6)
    assert table[0]["exact"] and all(r["within_tolerance"] for r in table)
    assert all(r["sentences_per_s"] > 0 and r["s_bleu"] >= 0 for r in table)
    assert loose["chosen"] == max(table, key=lambda r: r["sentences_per_s"])["options"]
    assert any("search full: validation s-BLEU and speed" in line for line in lines)
    assert f"chosen: {loose['search']}" in "\n".join(format_search("full", loose))
    strict = tune_search(decode, "full", store, 4, 0.0, "knn full softmax", lambda *_: None)
    assert strict["exact"] or strict["s_bleu"] >= strict["exact_s_bleu"]
    assert strict["sentences_per_s"] == max(r["sentences_per_s"] for r in strict["table"] if r["within_tolerance"])
    values = datastore_values(loose, store)
    assert values["probe"] in (None, own // 2, own // 4) and values["search_every"] in (1, 2, 4)
    assert values["restrict"] == 0
    # the datastore is the memory's corpus: each of GRID_RESTRICT is decoded too, and a chosen
    # restriction is what datastore.json records and the translator then searches by
    from reluformer_mt.experiments.knn_search_tune import GRID_RESTRICT, restrictable

    assert restrictable(store, knn_setup["data"])
    restricted = tune_search(decode, "full", store, 4, 1e9, "knn full softmax", lambda *_: None, restrict=True)
    assert [r["options"] for r in restricted["table"][6:9]] == [{"knn_restrict": m, **every_row} for m in GRID_RESTRICT]
    assert all(r["search"].startswith("the entries of") for r in restricted["table"][6:9])
    assert_skip_rows(restricted["table"], 9)
    fastest = max(restricted["table"], key=lambda r: r["sentences_per_s"])["options"]
    assert datastore_values(restricted, store)["restrict"] == fastest.get("knn_restrict", 0)
    # per-input datastores: the batched search and, the datastore being the memory's corpus, their keys
    # read from it, each decoded and timed beside the force-decoded exact search
    per_input = dict(kwargs, knn=None, knn_memory=True, knn_memory_k=2)
    per_input_decodes = {}

    def decode_per_input(name, search):
        if name not in per_input_decodes:
            per_input_decodes[name] = validation_bleu(lambda: DocumentTranslator(ckpt, **per_input, **search),
                                                      sources, references)
        return per_input_decodes[name]

    rows = tune_search(decode_per_input, "per_input", store, 4, 1e9, "knn per_input softmax", lambda *_: None,
                       restrict=True)["table"]
    assert [r["options"] for r in rows[:3]] == [{"knn_batched_search": False, **every_row},
                                                {"knn_batched_search": True, **every_row},
                                                {"knn_memory_keys": str(store.directory), **every_row}]
    assert rows[2]["search"] == "keys read from the datastore" and rows[2]["s_bleu"] >= 0
    assert_skip_rows(rows, 3)
    Datastore.load(store.directory).set_tuned("full", {"k": 16, "restrict": 4})
    tuned = DocumentTranslator(ckpt, knn=store.directory, beam=2, max_len_a=0, max_len_b=6)
    assert tuned.part(KnnMixture).restrict == 4 and tuned.memory is not None
    assert DocumentTranslator(ckpt, knn=store.directory, knn_exact_search=True, beam=2).part(KnnMixture).restrict == 0

    # an approximate choice in datastore.json is applied; --knn-exact-search searches as built
    Datastore.load(store.directory).set_tuned("full", {"k": 16, "probe": 2, "search_every": 2})
    plain = dict(beam=2, max_len_a=0, max_len_b=6)
    approximate = DocumentTranslator(ckpt, knn=store.directory, **plain)
    mixer = approximate.part(KnnMixture).mixer
    assert isinstance(mixer.store, ContinuedSearch) and mixer.store.every == 2
    assert mixer.store.datastore.index().index.nprobe == 2
    approximate.translate([["a b c", "d e"]])
    assert approximate.stats["knn: beam steps that followed their neighbours (no index search)"] > 0
    exact = DocumentTranslator(ckpt, knn=store.directory, knn_exact_search=True, **plain).part(KnnMixture).mixer
    assert isinstance(exact.store, FullDatastore) and exact.store.datastore.index().index.nprobe == own


def assert_skip_rows(table, before: int) -> None:
    """After the ``before`` rows of the other settings, the fastest of them is decoded again with
    each of GRID_SKIP (none when it searches every N > 1 steps)."""
    from reluformer_mt.experiments.knn_search_tune import GRID_SKIP

    base = max(table[:before], key=lambda r: r["sentences_per_s"])
    expected = ([{**base["options"], "knn_skip_confident": p} for p in GRID_SKIP]
                if base["options"].get("knn_search_every", 1) == 1 else [])
    assert [r["options"] for r in table[before:]] == expected
    assert all(r["search"].endswith(f"skip p > {p:g}") for r, p in zip(table[before:], GRID_SKIP))


def test_skipping_is_judged_against_the_setting_it_skips_from(tmp_path):
    """A skipping setting must stay within the tolerance of the better of the exact search and the
    setting it skips from: keys read from the datastore that score 1.75 above the exact search must
    not give that gain away to a skipping that is faster but only within the tolerance of the exact
    search (the rule before tuner version 7 chose p > 0.5 here)."""
    from types import SimpleNamespace

    from reluformer_mt.experiments.knn_search_tune import format_search, tune_search

    measured = {  # decode name -> (validation s-BLEU, seconds), as a 97ad5bb run measured them
        "per beam row": (9.95, 10.0), "batched per sentence": (10.0, 8.0), "keys read from the datastore": (11.70, 5.0),
        "keys read from the datastore, skip p > 0.9": (11.50, 4.5),
        "keys read from the datastore, skip p > 0.7": (11.00, 4.0),
        "keys read from the datastore, skip p > 0.5": (10.52, 3.0)}
    store = SimpleNamespace(directory=tmp_path)
    result = tune_search(lambda name, search: measured[name.split(": ", 1)[1]], "per_input", store, 10, 0.5,
                         "knn per_input", lambda *_: None, restrict=True)
    assert result["search"] == "keys read from the datastore, skip p > 0.9"
    assert result["chosen"] == {"knn_skip_confident": 0.9, "knn_memory_keys": str(tmp_path)}
    by_search = {r["search"]: r for r in result["table"]}
    assert by_search["keys read from the datastore"]["reference"] == 9.95
    assert by_search["keys read from the datastore, skip p > 0.5"]["reference"] == 11.70
    assert [r["within_tolerance"] for r in result["table"]] == [True, True, True, True, False, False]
    lines = format_search("per_input", result)
    assert any("skip p > 0.5" in line and line.endswith("lost (vs 11.70)") for line in lines)
    # a base below the exact search: the skipping is judged against the exact search
    measured["keys read from the datastore"] = (9.80, 5.0)
    result = tune_search(lambda name, search: measured[name.split(": ", 1)[1]], "per_input", store, 10, 0.5,
                         "knn per_input", lambda *_: None, restrict=True)
    assert result["table"][-1]["reference"] == 9.95 and result["search"] == "keys read from the datastore, skip p > 0.5"


def test_confident_rows_skip_the_search_and_keep_the_model_distribution():
    """--knn-skip-confident P: a row whose best token is more probable than P keeps its scores bit for
    bit; the other rows are mixed exactly as they would be without skipping."""
    from reluformer_mt.knn.search import KnnMixer, KnnOptions, PerInputDatastores

    class Recorder:
        def __init__(self, states):
            self.states = states

        def last_states(self, rows):
            return self.states

    logits = torch.zeros(3, 10)
    logits[0, 2] = 8.0  # confident: p(2) ~ 0.997
    logits[2, 5] = 1.0
    lprobs = torch.log_softmax(logits, dim=1)
    states = torch.randn(3, 2, generator=torch.Generator().manual_seed(0))
    units = [[(torch.randn(5, 2, generator=torch.Generator().manual_seed(1)), torch.tensor([4, 4, 7, 1, 2]),
               torch.full((5,), 0.8))]]

    def mixer(skip):
        m = KnnMixer(Recorder(states), KnnOptions(k=3, lam=0.7))
        m.store, m.skip_confident = PerInputDatastores(units), skip
        return m

    every = mixer(1.0)
    everywhere = every.mix(lprobs.clone(), torch.zeros(3, dtype=torch.long))
    skipping = mixer(0.9)
    mixed = skipping.mix(lprobs.clone(), torch.zeros(3, dtype=torch.long))
    assert torch.equal(mixed[0], lprobs[0]) and not torch.equal(everywhere[0], lprobs[0])
    assert torch.allclose(mixed[1:], everywhere[1:], atol=1e-6)
    assert skipping.stats["knn: beam steps left to the model (confident)"] == 1
    assert skipping.stats["knn: beam steps"] == 3 == every.stats["knn: beam steps"]
    none = mixer(0.05)  # every row is more confident than 5 %: nothing searched
    assert torch.equal(none.mix(lprobs.clone(), torch.zeros(3, dtype=torch.long)), lprobs)
    assert none.stats["knn: beam steps left to the model (confident)"] == 3


def test_translation_skipping_confident_rows_and_its_one_line_refusals(knn_setup):
    """The translator's --knn-skip-confident: given, or as tuned in datastore.json (not under
    --knn-exact-search); out of range, without a datastore or with --knn-search-every, one line."""
    from reluformer_mt.inference import DocumentTranslator, TranslationError
    from reluformer_mt.guidance.knn import KnnMixture
    from reluformer_mt.knn.datastore import Datastore, DatastoreError

    ckpt, directory = knn_setup["checkpoints"]["none"], knn_setup["store"].directory
    plain = dict(beam=2, max_len_a=0, max_len_b=8)
    # every row's best token is more probable than 1e-6: no row searches, the plain translation
    translator = DocumentTranslator(ckpt, knn=directory, knn_skip_confident=1e-6, knn_lambda=1.0, **plain)
    assert translator.part(KnnMixture).mixer.skip_confident == 1e-6
    texts = [["a b c", "d e"]]
    assert translator.translate_text(texts) == DocumentTranslator(ckpt, **plain).translate_text(texts)
    assert 0 < translator.stats["knn: beam steps left to the model (confident)"] == translator.stats["knn: beam steps"]
    for bad in (0, 1.5):
        with pytest.raises(TranslationError, match=rf"--knn-skip-confident {bad}: expected a probability in \(0, 1\]"):
            DocumentTranslator(ckpt, knn=directory, knn_skip_confident=bad, **plain)
    with pytest.raises(TranslationError, match="--knn-skip-confident 0.5: .* with --knn DATASTORE or --knn-memory"):
        DocumentTranslator(ckpt, knn_skip_confident=0.5, **plain)
    with pytest.raises(TranslationError, match="--knn-skip-confident 0.5: a search every N steps .* --knn-search-every"):
        DocumentTranslator(ckpt, knn=directory, knn_skip_confident=0.5, knn_search_every=2, **plain)
    store = Datastore.load(directory)
    tuned = dict(store.meta.get("tuned", {}).get("full", {}))
    try:
        store.set_tuned("full", {"k": 16, "skip_confident": 0.7})
        assert DocumentTranslator(ckpt, knn=directory, **plain).part(KnnMixture).mixer.skip_confident == 0.7
        exact = DocumentTranslator(ckpt, knn=directory, knn_exact_search=True, **plain)
        assert exact.part(KnnMixture).mixer.skip_confident == 1.0
        store.set_tuned("full", {"k": 16, "skip_confident": 2})
        with pytest.raises(DatastoreError, match=r"tuned\.full\.skip_confident 2: expected a probability in \(0, 1\]"):
            Datastore.load(directory)
    finally:
        _restore(directory, tuned)


def _restore(directory, tuned) -> None:
    """Put the datastore's tuned values back as they were (other tests share it)."""
    import json

    path = Path(directory) / "datastore.json"
    meta = json.loads(path.read_text(encoding="utf-8"))
    if tuned:
        meta.setdefault("tuned", {})["full"] = tuned
    else:
        meta.get("tuned", {}).pop("full", None)
    path.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")


def test_fairseq_generate_with_a_datastore(knn_setup):
    """fairseq users: --knn-datastore on the task gives fairseq-generate kNN-MT; lambda 0 is plain."""
    from helpers import USER_DIR, run_fairseq

    ckpt, store = knn_setup["checkpoints"]["none"], knn_setup["store"].directory
    common = [knn_setup["data"], "--user-dir", USER_DIR, "--task", "document_translation", "--path", ckpt,
              "--gen-subset", "test", "--beam", "2", "--max-len-a", "0", "--max-len-b", "8", "--max-sentences", "8",
              "--cpu", "--no-progress-bar"]
    outputs = {}
    for name, extra in (("plain", []), ("off", ["--knn-datastore", store, "--knn-lambda", "0"]),
                        ("on", ["--knn-datastore", store, "--knn-lambda", "0.9", "--knn-temperature", "1"])):
        printed = run_fairseq("generate", common + extra, capture=True)
        outputs[name] = sorted(line for line in printed.splitlines() if line.startswith("H-"))
    assert outputs["plain"] and outputs["off"] == outputs["plain"] and outputs["on"] != outputs["plain"]


def test_translation_retrieves_the_matches_preparation_found(knn_setup):
    """One retrieval (issue 31): the memory lookup of the translator gives each test sentence the
    neighbours that preparation stored for it (same keys, same 128 reranked candidates)."""
    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.memory.neighbours import load_neighbours
    from reluformer_mt.memory.tm import read_prepared

    test = read_prepared(knn_setup["data"], "test")
    translator = DocumentTranslator(knn_setup["checkpoints"]["attention"], beam=1)
    ids, _ = translator.memory.lookup(test.sources, 4)
    prepared, _ = load_neighbours(knn_setup["data"], "test", 4)
    same = (ids[:, :2] == prepared[:, :2]).all(axis=1).mean()
    assert same >= 0.99, same


def test_an_entry_that_ended_its_sentence_votes_for_the_separator_while_sentences_remain():
    """Per-input entries are single sentences ending in </s>: inside a segment with sentences still
    to write, that vote goes to the separator (else to an EOS the constraint forbids)."""
    from reluformer_mt.knn.search import KnnMixer, KnnOptions

    class Store:
        def neighbours(self, states, sources, k, sentences=None):
            return torch.zeros(states.size(0), 1), torch.full((states.size(0), 1), 2), None  # an exact match voting EOS

    class Recorder:
        def last_states(self, rows):
            return torch.zeros(rows, 4)

    mixer = KnnMixer(Recorder(), KnnOptions(k=1, lam=1.0))
    mixer.store = Store()
    lprobs = torch.log_softmax(torch.zeros(2, 6), dim=1)
    mixed = mixer.mix(lprobs, torch.tensor([0, 0]), eos=2, eos_as=torch.tensor([5, 2]))
    assert mixed[0].argmax() == 5 and mixed[1].argmax() == 2


def test_lambda_one_keeps_every_token_possible():
    """With the neighbours' share at 1 the tokens they did not vote for would get -inf, and the
    separator constraint could then leave beam search no finite candidate (fairseq's assertion
    'N < N'); the model keeps a thousandth."""
    lprobs = torch.log_softmax(torch.zeros(1, 5), dim=1)
    probs = torch.zeros(1, 5)
    probs[0, 1] = 1.0
    mixed = mix_log_probs(lprobs, probs, torch.ones(1), lam=1.0)
    assert torch.isfinite(mixed).all() and mixed[0, 1].exp() > 0.99


# ------------------------------------------------------------------ adaptive kNN-MT (Zheng et al. 2021)

def test_distinct_counts_of_the_first_neighbours():
    from reluformer_mt.knn.adaptive import distinct_counts

    values = torch.tensor([[5, 5, 7, 5, 8], [1, 2, 3, 4, 5], [3, -1, -1, -1, -1]])
    assert distinct_counts(values).tolist() == [[1, 1, 2, 2, 3], [1, 2, 3, 4, 5], [1, 1, 1, 1, 1]]


def synthetic_steps(n=4000, k=16, seed=0):
    """Half the steps: the nearest entries are close and all store the reference, which the model
    finds unlikely; the other half: far entries storing other tokens, the model already right."""
    g = torch.Generator().manual_seed(seed)
    good = torch.arange(n) % 2 == 0
    refs = torch.randint(10, 100, (n,), generator=g)
    distances = torch.where(good.unsqueeze(1), torch.rand(n, k, generator=g) * 0.2, 5 + torch.rand(n, k, generator=g))
    distances = distances.sort(dim=1).values
    wrong = torch.randint(100, 200, (n, k), generator=g)
    values = torch.where(good.unsqueeze(1), refs.unsqueeze(1).expand(n, k), wrong)
    lp_ref = torch.where(good, torch.tensor(-6.0), torch.tensor(-0.05))
    examples = torch.arange(n) // 8  # segments of 8 tokens
    return distances, values, refs, lp_ref, examples, good


def test_meta_k_network_learns_when_to_trust_the_neighbours():
    from reluformer_mt.knn.adaptive import MetaKConfig, train_meta_k

    distances, values, refs, lp_ref, examples, good = synthetic_steps()
    config = MetaKConfig(k_max=16, readout="softmax", temperature=1.0, scale=1.0)
    net, report = train_meta_k(distances, values, refs, lp_ref, examples, config, steps=600)
    assert report["choices"] == [0, 1, 2, 4, 8, 16] and report["held_out_tokens"] > 0
    # the model alone: (6 + 0.05) / 2 nats; any single lambda pays on one half; the network on neither
    assert report["held_out_model_nll"] == pytest.approx(3.025, abs=0.01)
    assert report["held_out_nll"] < 0.3
    with torch.no_grad():
        w = net(distances, values)
    assert float(w[good, 0].mean()) < 0.1 and float(w[~good, 0].mean()) > 0.9


def test_adaptive_mixture_is_a_distribution_that_keeps_ruled_out_tokens_out():
    from reluformer_mt.knn.adaptive import MetaK, MetaKConfig, adaptive_mix

    torch.manual_seed(0)
    net = MetaK(MetaKConfig(k_max=4, readout="relu", radius=2.0)).eval()
    logits = torch.randn(3, 12)
    logits[:, 0] = float("-inf")  # a token the search ruled out
    lprobs = torch.log_softmax(logits, dim=1)
    distances = torch.tensor([[0.1, 0.5, 1.0, 3.0], [5.0, 6.0, 7.0, 8.0], [0.0, float("inf"), float("inf"), float("inf")]])
    values = torch.tensor([[3, 3, 4, 2], [5, 6, 7, 8], [9, -1, -1, -1]])
    mixed, share = adaptive_mix(lprobs, distances, values, net)
    assert share[1] == 0 and 0 < share[0] < 1  # row 2: no neighbour within the radius takes anything
    assert torch.allclose(mixed.exp().sum(1), torch.ones(3), atol=1e-5)
    assert torch.isneginf(mixed[:, 0]).all()
    # row 2: every neighbour beyond the radius: the relu read-out has no mass, the model's row comes back
    assert torch.allclose(mixed[1], lprobs[1], atol=1e-6)


def test_adaptive_mixture_equals_its_formula_choice_by_choice():
    """The mixture is computed regrouped (one scatter of the neighbours' combined weights): it must
    equal the module docstring's sum over the choices, each a dense distribution, in float64."""
    from reluformer_mt.knn.adaptive import MetaK, MetaKConfig, adaptive_mix, choice_distributions
    from reluformer_mt.knn.readout import knn_probabilities

    torch.manual_seed(3)
    for readout in ("softmax", "relu"):
        net = MetaK(MetaKConfig(k_max=32, readout=readout, temperature=2.0, radius=4.0)).eval()
        distances = torch.sort(torch.rand(20, 32) * 8, dim=1).values
        distances[4, 20:] = float("inf")
        values = torch.randint(0, 40, (20, 32))
        values[4, 20:] = -1
        lprobs = torch.log_softmax(torch.randn(20, 60), dim=1)
        lprobs[:, 5] = float("-inf")
        with torch.no_grad():
            choice = net(distances, values).double()
        p_model = lprobs.double().exp()
        expected = choice[:, :1] * p_model
        for j, (w, mass) in enumerate(choice_distributions(distances, values, net.config), start=1):
            p_knn = knn_probabilities(w.double(), values[:, :w.size(1)], 60)
            m = mass.double().unsqueeze(1)
            expected = expected + choice[:, j:j + 1] * (m * p_knn + (1 - m) * p_model)
        mixed, share = adaptive_mix(lprobs, distances, values, net)
        finite = torch.isfinite(lprobs)
        assert torch.allclose(mixed.double().exp()[finite], expected[finite], atol=1e-6, rtol=1e-5)
        assert torch.isneginf(mixed[:, 5]).all()


def test_distinct_counts_match_comparing_every_pair():
    from reluformer_mt.knn.adaptive import distinct_counts

    g = torch.Generator().manual_seed(0)
    values = torch.randint(0, 30, (50, 64), generator=g)
    values[7, 40:] = -1
    earlier = torch.triu(torch.ones(64, 64, dtype=torch.bool), diagonal=1)
    repeated = ((values.unsqueeze(2) == values.unsqueeze(1)) & earlier).any(dim=1)
    expected = torch.cumsum((~repeated & (values >= 0)).long(), 1).float()
    assert torch.equal(distinct_counts(values), expected)  # 64 neighbours: the scatter
    values[3, 5:] = -1
    expected = distinct_counts(values)
    assert torch.equal(distinct_counts(values[:, :16]), expected[:, :16])  # 16: the pairwise comparison


def test_knn_tables_render_every_mode_band_and_choice_of_a_report(tmp_path, capsys):
    """docs/history/KNN_MT.md's tables come from a demo report by experiments/knn_tables.py: every mode's
    s-BLEU, each band beside the copy of the match, fallbacks and seconds, the tuner's choices."""
    import json

    from reluformer_mt.experiments import knn_tables

    modes = {mode: {"s_bleu": 1.0 + i, "segments": 186, "fallbacks": i, "translate_seconds": 10.0 + i}
             for i, mode in enumerate(knn_tables.MODES)}
    modes["pieces"]["segments"] = 406  # decoded verse by verse
    chosen = {"pieces": {"pieces_weight": 10.0, "pieces_floor": 0.3, "pieces_length_cap": 1.5},
              "full": {"options": {"k": 256, "lam": 0.5, "temperature": 3.7, "radius": 3.7, "readout": "softmax",
                                   "adaptive": True}, "by_readout": {"softmax": 7.45, "relu": 6.69}, "adaptive_s_bleu": 8.65},
              "per_input": {"options": {"k": 64, "lam": 1.0, "temperature": 9.0, "radius": 2.5, "readout": "relu",
                                        "adaptive": False}, "by_readout": {"softmax": 11.25, "relu": 9.04}}}
    report = {"models": {"softmax": {"verses": 406, "modes": modes, "best_mode": "knn+pieces", "tuned": {"chosen": chosen},
                                     "bands": {"bands": [{"band": ">=90", "sentences": 3, "pieces": 70.0,
                                                          "copy of the match": 82.44}]}}},
              "baselines": {"nearest_verse": {"s_bleu": 16.38}}}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    assert knn_tables.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| softmax | 1.00 | 2.00 | 3.00 | 4.00 | 5.00 | 6.00 | knn+pieces |" in out
    assert "| baseline: nearest training verse | 16.38 |" in out
    assert "| softmax: >=90 | 3 |  |  | 70.00 |  |  |  | 82.44 |" in out
    assert "| softmax | 0/186, 10.0 s | 1/186, 11.0 s | 2/406, 12.0 s |" in out
    assert ("| softmax | 10 / 0.3 / verse by verse / 1.5x | adaptive (softmax, k <= 16, T 3.7) | 7.45 / 6.69 / 8.65 "
            "| relu, 64, 1, radius 2.5 | 11.25 / 9.04 |") in out
    path.write_text("[]")
    with pytest.raises(SystemExit):
        knn_tables.main([str(path)])
    assert "expected a demo report with 'models'" in capsys.readouterr().err
