"""Every decoding mode translates as it did when tests/data/decoding_regression.json was written,
bit for bit: texts, scores, alignments, n-best lists and the summary's counts of
reluformer-translate's modes (separators, sentence by sentence, ensembles, translation pieces,
kNN-MT with a corpus or per-input datastores, memory attention, and their combinations), and
fairseq-generate's hypotheses with and without the task's kNN-MT. A refactoring of the decoder
must leave them as they are; a change that means to change them regenerates the file
(``python tests/decoding_regression.py --write``, see there) and says why in its commit."""
import json

import pytest

from decoding_regression import EXPECTED, build_setup, decode_every_mode
from helpers import needs_shared_data


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    return decode_every_mode(build_setup(tmp_path_factory.mktemp("decoding_regression")))


@needs_shared_data
def test_every_decoding_mode_translates_as_before(outputs):
    expected = json.loads(EXPECTED.read_text(encoding="utf-8"))
    if outputs["fingerprints"] != expected["fingerprints"]:
        pytest.skip(f"the tiny models trained to other weights here ({outputs['fingerprints']}, stored: "
                    f"{expected['fingerprints']}: another CPU's or library's float arithmetic), so the stored "
                    "translations say nothing about this decoder; regenerate them before a change with "
                    "python tests/decoding_regression.py --write")
    assert sorted(outputs["translator"]) == sorted(expected["translator"])
    for mode, got in outputs["translator"].items():
        assert got == expected["translator"][mode], f"reluformer-translate, mode {mode!r}"
    for mode, got in outputs["generate"].items():
        assert got == expected["generate"][mode], f"{mode}"
