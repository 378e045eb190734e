import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
if os.environ.get("PYTEST_XDIST_WORKER"):
    # ``make test`` runs one pytest-xdist worker per core: one thread each, or two workers' thread
    # pools oversubscribe the cores (several-fold slower)
    os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("OMP_NUM_THREADS", "2")

from helpers import DOCMT, TINY_MODEL, read_docmt_pairs, run_fairseq, tiny_train_args  # noqa: E402
from reluformer_mt.plugin import register  # noqa: E402

register()  # the test session is an entry point: models, criterion, task and fairseq fixes


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group(name): tests pytest-xdist runs on one worker (--dist loadgroup)")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``make test``: ``--dist loadgroup``), the tests that read the tiny demo
    run (directly or through a fixture) go to one worker, so that the demo, the suite's longest
    fixture, runs once; and they go first, so that the other workers run the rest meanwhile."""
    demo = [item for item in items if "tiny_demo" in getattr(item, "fixturenames", ())]
    for item in demo:
        item.add_marker(pytest.mark.xdist_group("tiny_demo"))
    if config.getoption("dist", "no") == "loadgroup":
        grouped = set(demo)
        items[:] = demo + [item for item in items if item not in grouped]


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """A CLI run in-process calls logging.basicConfig(stream=sys.stderr) while pytest captures
    stderr: the handler outlives the capture file, and every later log line through it printed a
    "--- Logging error ---" traceback (thousands of lines in the tiny demo's log). Each test gets
    the root logger's handlers and level back as they were."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
        handler.close()  # a file handler's file; a stream handler leaves its stream open
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def sentence_data(tmp_path_factory):
    """A binarised en->de sentence-level directory from real IWSLT2017 dev pairs (word level).

    train: 300 pairs, valid: 37 pairs and test: 101 pairs (odd sizes on purpose: they are not
    multiples of fairseq's default --required-batch-size-multiple 8).
    """
    if not DOCMT.is_dir():
        pytest.skip(f"real data not found at {DOCMT}")
    root = tmp_path_factory.mktemp("sentence_data")
    raw = root / "raw"
    raw.mkdir()
    pairs = read_docmt_pairs(limit=438, max_words=25)
    splits = {"train": pairs[:300], "valid": pairs[300:337], "test": pairs[337:438]}
    for split, rows in splits.items():
        (raw / f"{split}.en").write_text("\n".join(en.lower() for en, _ in rows) + "\n", encoding="utf-8")
        (raw / f"{split}.de").write_text("\n".join(de.lower() for _, de in rows) + "\n", encoding="utf-8")
    bin_dir = root / "bin"
    run_fairseq("preprocess", [
        "--source-lang", "en", "--target-lang", "de",
        "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
        "--destdir", bin_dir, "--joined-dictionary", "--workers", "1", "--nwordssrc", "1500",
    ])
    return {"raw": raw, "bin": bin_dir, "sizes": {k: len(v) for k, v in splits.items()}}


@pytest.fixture(scope="session")
def trained_checkpoint(sentence_data, tmp_path_factory):
    """A tiny ReLUFormer trained for 30 updates on ``sentence_data``: path of checkpoint_last.pt."""
    save = tmp_path_factory.mktemp("trained_reluformer")
    run_fairseq("train", tiny_train_args(sentence_data["bin"], save, max_update=30, extra=["--disable-validation"]))
    return save / "checkpoint_last.pt"


# ------------------------------------------------------------------------------------------------
# Document-level fixtures (reluformer-prepare on real data, a tiny trained model). Shared by the
# translation tests and demos: keep them general.

IWSLT = DOCMT / "IWSLT2017"


def iwslt_files(split: str):
    """(en, de) paths of a real IWSLT2017 docmt file pair ('dev' or 'test'; '<d>' starts each talk)."""
    return IWSLT / f"concatenated_en2de_{split}_en.txt", IWSLT / f"concatenated_en2de_{split}_de.txt"


def prepare_iwslt_with_memory(out, spm_model, segment_tokens: int, memory_k: int = 4):
    """Six IWSLT2017 dev talks (test: the test talks) prepared with translation-memory neighbours
    (``reluformer-prepare --memory-k``) and a given SentencePiece model; returns ``out``."""
    from reluformer_mt.data.prepare import PrepareConfig
    from reluformer_mt.memory.neighbours import prepare_with_memory

    prepare_with_memory(PrepareConfig(out=str(out), fmt="docmt", src="en", tgt="de",
                                      train=[[str(p) for p in iwslt_files("dev")]],
                                      test=[[str(p) for p in iwslt_files("test")]], valid_from_train=1, limit_docs=6,
                                      segment_tokens=segment_tokens, spm_models=[str(spm_model)],
                                      joined_dictionary=True, progress=False, memory_k=memory_k))
    return out


@pytest.fixture(scope="session")
def prepared_doc_data(tmp_path_factory):
    """SentencePiece en->de directories prepared by ``reluformer_mt.data.prepare`` from real
    IWSLT2017 talks (TED, docmt format).

    Keys: ``doc`` (segments of <= 128 tokens, ``--task document_translation``), ``sent`` (its
    sentence-level twin, ``--task translation``, same SentencePiece model and dictionaries),
    ``segment_tokens`` (128), ``test_files`` ((en, de) paths of the real IWSLT2017 test set).
    train: 6 dev talks, valid: the last dev talk, test: 6 test talks; a joint 800-piece model
    and a joined dictionary (so ``--share-all-embeddings`` works). ``prepared.json`` gives the
    needed ``max_source_positions``/``max_target_positions`` (<= 256 for both).
    """
    if not IWSLT.is_dir():
        pytest.skip(f"real data not found at {IWSLT}")
    from reluformer_mt.data.prepare import PrepareConfig, prepare

    root = tmp_path_factory.mktemp("prepared_doc_data")
    base = dict(fmt="docmt", src="en", tgt="de", train=[[str(p) for p in iwslt_files("dev")]],
                test=[[str(p) for p in iwslt_files("test")]], valid_from_train=1, limit_docs=6,
                vocab_size=800, joined_dictionary=True, progress=False)
    doc, sent = root / "doc128", root / "sent"
    prepare(PrepareConfig(out=str(doc), segment_tokens=128, **base))
    prepare(PrepareConfig(out=str(sent), segment_tokens=0, spm_models=[str(doc / "spm.model")], **base))
    return {"doc": doc, "sent": sent, "segment_tokens": 128, "test_files": iwslt_files("test")}


TRAIN_FAST = ["--arch", "reluformer_tiny", *TINY_MODEL, "--share-all-embeddings",
              "--max-source-positions", "256", "--max-target-positions", "256",
              "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
              "--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "5",
              "--max-tokens", "1000", "--num-workers", "0", "--seed", "1", "--cpu",
              "--no-epoch-checkpoints", "--no-progress-bar", "--log-format", "simple"]


@pytest.fixture(scope="session")
def doc_checkpoint(prepared_doc_data, tmp_path_factory):
    """A tiny reluformer (reluformer_tiny, 1+1 layers of 32) trained 20 updates on
    ``prepared_doc_data['doc']`` with ``--task document_translation --eval-bleu`` and
    ``--best-checkpoint-metric s_bleu --maximize-best-checkpoint-metric``: path of
    checkpoint_best.pt (loading it with torch's default ``weights_only=True`` exercises the
    plugin's checkpoint allowlist). Validation runs once, at the end. The model is untrained for
    quality: outputs are junk and run to the length limit, so give generation a small
    ``max_len_b`` (e.g. ``--max-len-a 0 --max-len-b 6``) to keep tests fast. Its stored
    ``task.data`` points at the prepared directory, so translation finds the resources there.
    """
    from helpers import USER_DIR

    save = tmp_path_factory.mktemp("doc_checkpoint")
    run_fairseq("train", [
        prepared_doc_data["doc"], "--user-dir", USER_DIR, "--task", "document_translation", *TRAIN_FAST,
        "--max-update", "20", "--save-dir", save, "--validate-interval", "1000",
        "--eval-bleu", "--eval-bleu-args", '{"beam": 1, "max_len_a": 0, "max_len_b": 8}',
        "--best-checkpoint-metric", "s_bleu", "--maximize-best-checkpoint-metric",
    ])
    return save / "checkpoint_best.pt"



# ------------------------------------------------------------------------------------------------
# The demo at toy scale, run once for the tests that read its report (test_demo, test_html_report).

TINY_DEMO_FAMILIES = ("softmax", "reluformer", "softmax+tm")  # + a translation-memory family


@pytest.fixture(scope="session")
def tiny_demo(tmp_path_factory):
    """``reluformer-demo`` end to end at toy scale: softmax, reluformer and softmax with a
    translation memory (32-dim, 2+2 layers; two trained at a time),
    2 sentence-level then 4 document-level updates, one held-out chapter translated with beam 1.
    Returns {"out": the run folder (report in out/report), "code": the exit code, "stdout": what
    it printed (the stage lines, the table), "stderr": what it printed there}."""
    pytest.importorskip("bible_alignments")
    import contextlib
    import io

    from reluformer_mt.cli import demo

    out = tmp_path_factory.mktemp("tiny_demo") / "demo"
    printed, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
        code = demo.main(["--out", str(out), "--families", ",".join(TINY_DEMO_FAMILIES), "--sentence-updates", "2",
                          "--max-update", "4", "--validations", "1", "--embed-dim", "32", "--ffn-dim", "64",
                          "--layers", "2", "--eval-chapters", "1", "--beam", "1", "--vocab-size", "1000",
                          "--segment-tokens", "128", "--tm-k", "1"])
    return {"out": out, "code": code, "stdout": printed.getvalue(), "stderr": errors.getvalue()}
