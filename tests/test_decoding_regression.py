"""Every decoding mode translates as it did when tests/data/decoding_regression.json was written,
bit for bit: texts, scores, alignments, n-best lists and the summary's counts of
reluformer-translate's modes (separators, sentence by sentence, ensembles, translation pieces,
kNN-MT with a corpus or per-input datastores, memory attention, and their combinations), and
fairseq-generate's hypotheses with and without the task's kNN-MT. A refactoring of the decoder
must leave them as they are; a change that means to change them regenerates the file
(``python tests/decoding_regression.py --write``, see there) and says why in its commit.

The stored outputs only speak for a host whose float arithmetic trains the same tiny models (else
every mode is skipped) and builds the same corpus datastore (else the modes that read it are)."""
import json

import pytest

from decoding_regression import EXPECTED, build_setup, decode_every_mode
from helpers import needs_shared_data

REGENERATE = "regenerate them before a change with python tests/decoding_regression.py --write"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    return decode_every_mode(build_setup(tmp_path_factory.mktemp("decoding_regression")))


@pytest.fixture(scope="module")
def expected(outputs):
    stored = json.loads(EXPECTED.read_text(encoding="utf-8"))
    if outputs["fingerprints"] != stored["fingerprints"]:
        pytest.skip(f"the tiny models trained to other weights here ({outputs['fingerprints']}, stored: "
                    f"{stored['fingerprints']}: another CPU's or library's float arithmetic), so the stored "
                    f"translations say nothing about this decoder; {REGENERATE}")
    return stored


def compare(outputs, expected, modes) -> None:
    for part, label in (("translator", "reluformer-translate, mode "), ("generate", "")):
        for mode, got in outputs[part].items():
            if mode in modes:
                assert got == expected[part][mode], f"{label}{mode!r}"


@needs_shared_data
def test_every_decoding_mode_is_in_the_stored_outputs(outputs, expected):
    for part in ("translator", "generate"):
        assert sorted(outputs[part]) == sorted(expected[part])
    assert outputs["datastore modes"] == expected["datastore modes"]


@needs_shared_data
def test_decoding_modes_without_the_corpus_datastore_translate_as_before(outputs, expected):
    every = set(outputs["translator"]) | set(outputs["generate"])
    modes = every - set(outputs["datastore modes"])
    assert "plain" in modes and "knn per-input" in modes
    compare(outputs, expected, modes)


@needs_shared_data
def test_decoding_modes_with_the_corpus_datastore_translate_as_before(outputs, expected):
    if outputs["datastore fingerprint"] != expected["datastore fingerprint"]:
        pytest.skip(f"the same weights built another datastore here ({outputs['datastore fingerprint']}, stored: "
                    f"{expected['datastore fingerprint']}: another CPU's float arithmetic), so the stored kNN-MT "
                    f"translations say nothing about this decoder; {REGENERATE}")
    assert "knn full datastore" in outputs["datastore modes"]
    compare(outputs, expected, set(outputs["datastore modes"]))
