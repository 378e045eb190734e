"""EMAT's learned keys for the translation memory (reluformer_mt.memory.learned_keys, memory.maintenance.rekey):
keys, the in-batch retrieval loss, positives, re-keying without leakage, the refresh during
training and bad input; tiny models trained a few updates on real IWSLT2017 talks."""
import json
import logging
import shutil

import numpy as np
import pytest
import torch

from helpers import USER_DIR, run_fairseq
from test_translation_memory import TRAIN_TM


@pytest.fixture(scope="module")
def key_data(prepared_doc_data, tmp_path_factory):
    """The sentence-level IWSLT directory prepared again with --memory-k 4 (every example is one
    sentence, so every one can take part in the key loss)."""
    from conftest import prepare_iwslt_with_memory

    return prepare_iwslt_with_memory(tmp_path_factory.mktemp("keys") / "sent", prepared_doc_data["doc"] / "spm.model",
                                     segment_tokens=0)


def train(data, save, *extra, updates=4):
    argv = [data, "--user-dir", USER_DIR, "--task", "document_translation", *TRAIN_TM, "--tm-fusion", "attention",
            "--tm-k", "2", "--save-dir", save, *extra]
    argv[argv.index("--max-update") + 1] = str(updates)
    run_fairseq("train", argv)
    return save / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def key_checkpoint(key_data, tmp_path_factory):
    return train(key_data, tmp_path_factory.mktemp("key_ckpt"), "--tm-key-loss", "1", "--tm-key-dim", "16")


def loaded(checkpoint, data):
    from reluformer_mt.checkpoints import load_model

    return load_model(checkpoint, data)


def test_positives_are_the_best_target_match_among_the_candidates(key_data):
    from reluformer_mt.memory.learned_keys import positives_of
    from reluformer_mt.memory.neighbours import load_neighbours
    from reluformer_mt.memory.tm import fuzzy_score, fuzzy_words, read_prepared

    positives = positives_of(key_data)
    ids, _ = load_neighbours(key_data, "train", 4)
    train = read_prepared(key_data, "train")
    assert (positives >= 0).mean() > 0.9
    for i in np.nonzero(positives >= 0)[0][:200]:
        assert positives[i] in ids[i] and positives[i] != i
        ref = fuzzy_words(train.targets[i])
        best = max(fuzzy_score(ref, fuzzy_words(train.targets[c])) for c in ids[i] if c >= 0)
        assert fuzzy_score(ref, fuzzy_words(train.targets[positives[i]])) == best
    stored = key_data / "memory" / "train.positive.npy"
    assert json.loads((key_data / "memory" / "train.positive.json").read_text())["from"] == "train.ids.npy"
    before = stored.stat().st_mtime_ns
    assert np.array_equal(positives_of(key_data), positives) and stored.stat().st_mtime_ns == before  # stored once


def test_keys_are_unit_norm_deterministic_and_independent_of_batching(key_checkpoint, key_data):
    from reluformer_mt.memory.learned_keys import encode_keys
    from reluformer_mt.memory.maintenance.rekey import source_tokens

    model = loaded(key_checkpoint, key_data).model
    assert model.encoder.tm_key_proj.out_features == 16 and model.encoder.tm_key_layers == 1
    sources = source_tokens(key_data, "train", model.encoder.dictionary)[:300]
    model.train()
    keys = encode_keys(model, sources)
    assert model.training  # the mode is given back
    assert keys.shape == (300, 16) and np.allclose(np.linalg.norm(keys, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(keys, encode_keys(model, sources))  # no dropout: the same keys twice
    small_batches = encode_keys(model, sources, max_tokens=64)  # other padding, same keys
    assert np.allclose(keys, small_batches, atol=1e-5)
    assert len(np.unique(keys.round(4), axis=0)) > 250  # sentences get distinct keys


def test_key_loss_is_finite_and_trains_the_encoder(key_checkpoint, key_data):
    from reluformer_mt.memory.learned_keys import in_batch_key_loss

    m = loaded(key_checkpoint, key_data)
    m.task.load_dataset("train")
    dataset = m.task.datasets["train"]
    batch = dataset.collater([dataset[i] for i in range(16)])
    assert batch["tm_positive"].shape[0] == 16 and (batch["tm_positive_ids"] >= 0).sum() >= 12
    model = m.model.train()
    loss, n, hits = in_batch_key_loss(model, batch, 0.05)
    assert torch.isfinite(loss) and loss > 0 and n == int((batch["tm_positive_ids"] >= 0).sum()) and 0 <= hits <= n
    loss.backward()
    assert model.encoder.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    assert model.encoder.embed_tokens.weight.grad.abs().sum() > 0
    assert model.encoder.tm_key_proj.weight.grad.abs().sum() > 0
    assert model.decoder.layers[0].fc1.weight.grad is None  # the decoder is not in the key path


def test_key_loss_is_logged_and_zero_weight_is_off(key_data, tmp_path, caplog):
    from fairseq import checkpoint_utils

    def params(path):
        return checkpoint_utils.load_checkpoint_to_cpu(str(path))["model"]

    with caplog.at_level(logging.INFO):
        on = train(key_data, tmp_path / "on", "--tm-key-loss", "1", "--log-interval", "1", "--log-format", "json")
    assert '"train_inner_tm_key_loss"' in caplog.text or '"tm_key_loss"' in caplog.text
    default = params(train(key_data, tmp_path / "default"))
    zero = params(train(key_data, tmp_path / "zero", "--tm-key-loss", "0"))
    assert not any("tm_key_proj" in name for name in default)
    assert default.keys() == zero.keys() and all(torch.equal(default[n], zero[n]) for n in default)
    with_loss = params(on)
    assert "encoder.tm_key_proj.weight" in with_loss
    assert not torch.equal(with_loss["encoder.layers.0.fc1.weight"], default["encoder.layers.0.fc1.weight"])


def test_rekey_never_leaks_and_reports_both_keys(key_checkpoint, key_data, tmp_path):
    from reluformer_mt.data.prepared import Prepared
    from reluformer_mt.memory.learned_keys import positives_of
    from reluformer_mt.memory.neighbours import load_neighbours
    from reluformer_mt.memory.maintenance.rekey import rekey

    data = tmp_path / "data"
    shutil.copytree(key_data, data)
    positives = positives_of(data)
    tfidf_ids, _ = load_neighbours(data, "train", 4)
    m = loaded(key_checkpoint, data)
    for rerank in ("none", "fuzzy"):
        report = rekey(data, m.model, m.task.source_dictionary, rerank=rerank, progress=False)
        prepared = Prepared.load(data)
        n_train = prepared.splits["train"].sentences
        ids, scores = load_neighbours(data, "train", 4)
        assert ids.shape == (n_train, 4) and (ids[:, 0] >= 0).all()
        assert not (ids == np.arange(n_train)[:, None]).any(), "a training sentence retrieved itself"
        for split in ("valid", "test"):
            split_ids, _ = load_neighbours(data, split, 4)
            assert 0 <= split_ids.min() and split_ids.max() < n_train  # only training entries
            for keys in ("learned", "tfidf"):
                assert 0 <= report["splits"][split][keys]["copy_top1_sbleu"] <= 100
                assert 0 <= report["splits"][split][keys]["recall@1"] <= 1
        assert prepared.memory["keys"].startswith("learned-enc1-mean-proj16") and rerank in prepared.memory["keys"]
    assert (np.diff(scores, axis=1) <= 1e-6).all()  # the last run reranked by fuzzy match: best first
    assert not np.array_equal(ids, tfidf_ids)  # other keys, other neighbours
    # the TF-IDF neighbours stay beside them, and the positives still come from those
    assert np.array_equal(np.load(data / "memory" / "train.ids.tfidf.npy"), tfidf_ids)
    assert np.array_equal(positives_of(data), positives)


def test_refresh_replaces_the_matches_when_the_model_changed(key_checkpoint, key_data, tmp_path, caplog):
    m = loaded(key_checkpoint, key_data)
    task, model = m.task, m.model
    task.load_dataset("train")
    task.load_dataset("valid")
    dataset, valid = task.datasets["train"], task.datasets["valid"]
    prepared, prepared_valid = list(dataset.matches), list(valid.matches)
    task.refresh_matches(model)
    first = list(dataset.matches)
    assert any(not torch.equal(a, b) for a, b in zip(prepared, first))
    assert any(not torch.equal(a, b) for a, b in zip(prepared_valid, valid.matches))  # every loaded split
    task.refresh_matches(model)  # the same model: the same matches
    assert all(torch.equal(a, b) for a, b in zip(first, dataset.matches))
    with torch.no_grad():
        model.encoder.tm_key_proj.weight.add_(torch.randn_like(model.encoder.tm_key_proj.weight))
    task.refresh_matches(model)
    assert any(not torch.equal(a, b) for a, b in zip(first, dataset.matches))
    # and in training: begin_epoch re-keys every N epochs
    with caplog.at_level(logging.INFO):
        train(key_data, tmp_path / "refresh", "--tm-key-loss", "1", "--tm-refresh-epochs", "1", "--max-epoch", "2",
              updates=1000)
    assert "re-keyed the memory with the model's keys: train:" in caplog.text


def test_translation_retrieves_with_the_keys_the_model_was_trained_on(key_checkpoint, key_data, tmp_path):
    """A TF-IDF-keyed directory gives TF-IDF retrieval; after re-keying (or with a model trained
    with --tm-refresh-epochs) the translator retrieves with the model's keys, never the sentence
    itself from a memory without it."""
    from reluformer_mt.memory.maintenance.rekey import rekey
    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.memory.learned_keys import LearnedRetriever
    from reluformer_mt.memory.tm import read_prepared

    test = read_prepared(key_data, "test")
    documents = [test.sources[:3]]
    tfidf = DocumentTranslator(key_checkpoint, data=key_data, beam=1, max_len_a=0, max_len_b=4)
    assert tfidf.memory.keys == "tfidf"
    data = tmp_path / "data"
    shutil.copytree(key_data, data)
    m = loaded(key_checkpoint, data)
    rekey(data, m.model, m.task.source_dictionary, rerank="none", progress=False)
    learned = DocumentTranslator(key_checkpoint, data=data, beam=1, max_len_a=0, max_len_b=4)
    assert learned.memory.keys == "learned" and isinstance(learned.memory.retriever, LearnedRetriever)
    assert "(learned keys)" in learned.describe()
    ids, _ = learned.memory.lookup(test.sources)
    stored = np.load(data / "memory" / "test.ids.npy")[:, :ids.shape[1]]
    assert (ids == stored).mean() > 0.95  # the same retrieval as the re-keyed neighbours (same keys, pure MIPS)
    assert [len(d) for d in learned.translate(documents)] == [3]


@pytest.mark.parametrize("extra, message", [
    (["--tm-key-loss", "-1"], "--tm-key-loss: got -1.0, expected a finite weight >= 0"),
    (["--tm-key-temperature", "0"], "--tm-key-temperature: got 0.0, expected a number > 0"),
    (["--tm-refresh-epochs", "-2"], "--tm-refresh-epochs: got -2, expected >= 0"),
    (["--tm-key-loss", "1", "--tm-key-layers", "3"], "--tm-key-layers: got 3, expected 0 <= L <= --encoder-layers"),
])
def test_bad_key_options(key_data, tmp_path, extra, message):
    with pytest.raises(ValueError, match=message):
        train(key_data, tmp_path / "x", *extra)


def test_key_loss_needs_memory_attention(key_data, tmp_path):
    argv = [key_data, "--user-dir", USER_DIR, "--task", "document_translation", *TRAIN_TM, "--tm-fusion", "concat",
            "--tm-key-loss", "1", "--save-dir", tmp_path / "x"]
    with pytest.raises(ValueError, match="--tm-key-loss 1.0: needs --tm-fusion attention"):
        run_fairseq("train", argv)


def test_rekey_command_bad_input_is_one_line(key_checkpoint, key_data, prepared_doc_data, tmp_path, capsys):
    from reluformer_mt.cli.memory import main

    cases = [(["rekey", "-c", tmp_path / "none.pt", "--data", key_data], "--checkpoint .*none.pt: not found"),
             (["rekey", "-c", key_checkpoint, "--data", tmp_path], "no prepared.json"),
             (["rekey", "-c", key_checkpoint, "--data", prepared_doc_data["sent"]], "no translation-memory neighbours"),
             (["rekey", "-c", key_checkpoint, "--data", key_data, "--rerank", "x"], "invalid choice: 'x'")]
    for argv, message in cases:
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("reluformer-memory") and len(err.strip().splitlines()) == 1, err
        assert __import__("re").search(message, err), err


def test_rekey_command_prints_the_comparison(key_checkpoint, key_data, tmp_path, capsys):
    from reluformer_mt.cli.memory import main

    data = tmp_path / "data"
    shutil.copytree(key_data, data)
    assert main(["rekey", "-c", str(key_checkpoint), "--data", str(data), "--quiet", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "keys: learned-enc1" in out and "copy s-BLEU" in out
    assert [line.split()[:2] for line in out.splitlines()[2:]] == [[s, k] for s in ("train", "valid", "test")
                                                                   for k in ("learned", "tfidf")]
    assert json.loads((tmp_path / "r.json").read_text())["splits"]["test"]["learned"]["copy_top1_sbleu"] >= 0
