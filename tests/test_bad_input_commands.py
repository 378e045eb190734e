"""Bad input through the commands a user runs (issue 23): reluformer-eval's numbers and
tokenizers, a --spm-model that is no SentencePiece model, an --attn-impl that does not apply,
an old checkpoint through translate and eval. Each case: exit code and one line."""
import logging

import pytest

from helpers import run_fairseq, tiny_train_args
from reluformer_mt.cli import eval as eval_cli
from test_translate import FAST, translate_main


def eval_main(argv, capsys):
    """(exit code, stderr) of reluformer-eval, whether argparse exits or main returns."""
    try:
        code = eval_cli.main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


# ---------------------------------------------------------------- class 6: smaller

@pytest.mark.parametrize("argv,says", [
    (["cxmi", "--checkpoint", "x.pt", "--bootstrap", "0"], "argument --bootstrap: expected a positive integer, got '0'"),
    (["cxmi", "--checkpoint", "x.pt", "--bootstrap", "-1"], "argument --bootstrap: expected a positive integer, got '-1'"),
    (["cxmi", "--checkpoint", "x.pt", "--context-sentences", "0"],
     "argument --context-sentences: expected a positive integer, got '0'"),
    (["cxmi", "--checkpoint", "x.pt", "--limit-docs", "-2"], "argument --limit-docs: expected a positive integer, got '-2'"),
    (["contrastive", "--checkpoint", "x.pt", "--suite", "contrapro", "--suite-dir", ".", "--batch-size", "0"],
     "argument --batch-size: expected a positive integer, got '0'"),
    (["attn-stats", "--checkpoint", "x.pt", "--top-percent", "0"],
     "argument --top-percent: expected a percentage in (0, 100], got '0'"),
    (["memory", "--checkpoint", "x.pt", "--data", ".", "--top-percent", "1,x"],
     "argument --top-percent: expected a comma list of percentages in (0, 100], got '1,x'"),
    (["bleu", "--hyp", "h.txt", "--ref", "r.txt", "--tokenize", "bogus"], "argument --tokenize: invalid choice: 'bogus'"),
])
def test_eval_numbers_and_tokenizer_are_one_line(argv, says, capsys):
    code, err = eval_main(argv, capsys)
    assert code == 2 and says in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"reluformer-eval {argv[0]}: error: "), err


@pytest.fixture
def a_dictionary(prepared_doc_data, tmp_path):
    """A fairseq dictionary where a SentencePiece model belongs."""
    return prepared_doc_data["doc"] / "dict.en.txt"


def test_spm_model_that_is_a_dictionary_names_the_file(doc_checkpoint, a_dictionary, tmp_path, capsys):
    src = tmp_path / "in.en"
    src.write_text("Hello world.\n", encoding="utf-8")
    rc, err = translate_main(["-c", doc_checkpoint, "-i", src, "-o", tmp_path / "out.de", "--spm-model", a_dictionary,
                              *FAST], capsys)
    assert rc == 2 and err.count("\n") == 1 and "ModelProto" not in err, err
    assert f"--spm-model {a_dictionary}: not a SentencePiece model" in err, err
    code, err = eval_main(["cxmi", "--checkpoint", doc_checkpoint, "--spm-model", a_dictionary, "--no-progress"], capsys)
    assert code == 2 and f"--spm-model {a_dictionary}: not a SentencePiece model" in err and err.count("\n") == 1, err


def test_attn_impl_that_does_not_apply_is_said(sentence_data, tmp_path, caplog):
    """softpick has a row normaliser: the fused kernel cannot run it, and training says so."""
    caplog.set_level(logging.WARNING)
    run_fairseq("train", tiny_train_args(sentence_data["bin"], tmp_path, arch="softpick_tiny", max_update=1,
                                         extra=["--attn-impl", "fused", "--disable-validation", "--no-save", "--cpu"]))
    notes = [r.getMessage() for r in caplog.records if "--attn-impl" in r.getMessage()]
    assert notes == ["--attn-impl fused does not apply to softpick (encoder, decoder, cross attention): "
                     "it runs the dense path"], notes


# ---------------------------------------------------------------- class 2: look-alikes of the separator

LOOKALIKES = ["\uff1csep\uff1e", "\ufe64sep\ufe65", "\uff1c\uff53\uff45\uff50\uff1e"]  # full-width, small form, all full-width


def test_spm_normalises_the_lookalikes_into_the_separator(prepared_doc_data):
    """The premise: the raw-string check cannot see them; only the pieces do."""
    from reluformer_mt.data.spm import load_spm, repair_separator_lookalikes

    sp = load_spm(prepared_doc_data["doc"] / "spm.model")
    texts = [f"Yes {s} no." for s in LOOKALIKES] + ["plain text", "a \uff1c\uff1csep\uff1esep\uff1e b"]
    pieces = sp.encode(texts, out_type=str)
    assert all("<sep>" in p for p in pieces[:3]) and all("<sep>" not in t for t in texts)
    repaired = repair_separator_lookalikes(sp, texts, pieces)
    assert repaired == [(0, 1), (1, 1), (2, 1), (4, 1)]
    assert not any("<sep>" in p for p in pieces) and texts[0] == "Yes no." and texts[3] == "plain text"
    assert pieces == sp.encode(texts, out_type=str)


def test_translate_repairs_and_counts_lookalikes(doc_checkpoint, tmp_path, capsys):
    sentences = ["Thank you very much.", f"This is a {LOOKALIKES[0]} test.", f"{LOOKALIKES[1]} And the end."]
    src = tmp_path / "talk.en"
    src.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    out = tmp_path / "talk.de"
    rc, err = translate_main(["-c", doc_checkpoint, "-i", src, "-o", out, "--format", "lines", *FAST], capsys)
    assert rc == 0, err
    assert len(out.read_text(encoding="utf-8").splitlines()) == 3
    assert "2 look-alikes of '<sep>' in the input" in err and "separator look-alikes in the input replaced by spaces: 2" in err


def test_forced_scoring_repairs_and_counts_lookalikes(doc_checkpoint):
    """contrastive and cxmi put the separator between context and sentence themselves."""
    from reluformer_mt.evaluation import extract
    from reluformer_mt.evaluation.contrastive import ForcedScorer

    scorer = ForcedScorer(extract.load_checkpoint(str(doc_checkpoint)))
    ids = scorer._ids(f"It is a {LOOKALIKES[0]} pen.", "src")
    assert scorer.sep_src not in ids and scorer.separators_replaced == 1
    assert ids == scorer._ids("It is a pen.", "src")


def test_prepare_repairs_and_counts_lookalikes(prepared_doc_data, tmp_path):
    """A training sentence with a look-alike: every segment still has one separator fewer than
    sentences, and the report counts the repair."""
    from conftest import iwslt_files
    from reluformer_mt.data.prepare import PrepareConfig, prepare
    from reluformer_mt.data.segments import read_segment_metadata

    en, de = ([line for line in p.read_text(encoding="utf-8").splitlines() if line != "<d>"][:40]
              for p in iwslt_files("test"))
    en[3] = en[3] + f" {LOOKALIKES[0]} x"
    de[5] = f"{LOOKALIKES[1]} " + de[5]
    files = [tmp_path / "in.en", tmp_path / "in.de"]
    for f, lines in zip(files, (en, de)):  # two documents: 30 sentences to train, 10 to validate
        f.write_text("<d>\n" + "\n".join(lines[:30]) + "\n<d>\n" + "\n".join(lines[30:]) + "\n", encoding="utf-8")
    out = tmp_path / "prep"
    report = prepare(PrepareConfig(out=str(out), fmt="docmt", src="en", tgt="de", train=[[str(f) for f in files]],
                                   valid_from_train=1,
                                   segment_tokens=256, spm_models=[str(prepared_doc_data["doc"] / "spm.model")],
                                   joined_dictionary=True, progress=False))
    infos = read_segment_metadata(out / "train.segments.tsv")
    for lang in ("en", "de"):
        lines = (out / "text" / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        assert [line.split().count("<sep>") for line in lines] == [i.n_sentences - 1 for i in infos], lang
    assert "(SentencePiece normalises it into the separator) replaced by a space: 2" in report.summary()
    assert max(i.n_sentences for i in infos) > 2  # segments of several sentences


# ---------------------------------------------------------------- class 4: the checkpoint upgrade, through the commands

@pytest.fixture
def old_gamma_checkpoint(doc_checkpoint, tmp_path):
    """The tiny document model as a checkpoint from before gamma was kept as log(gamma): a
    learned gamma per head, stored as ``gamma`` (0.5 and 2.0) in every attention sublayer."""
    import torch

    state = torch.load(doc_checkpoint, map_location="cpu", weights_only=False)
    model_cfg = state["cfg"]["model"]  # fairseq keeps a model's argparse options as a Namespace
    if isinstance(model_cfg, dict):
        model_cfg["relu_gamma_mode"] = "head"
    else:
        model_cfg.relu_gamma_mode = "head"
    modules = ("encoder.layers.0.self_attn", "decoder.layers.0.self_attn", "decoder.layers.0.encoder_attn")
    for name in modules:
        assert f"{name}.log_gamma" not in state["model"] and f"{name}.q_proj.weight" in state["model"]
        state["model"][f"{name}.gamma"] = torch.tensor([0.5, 2.0])
    path = tmp_path / "old_gamma.pt"
    torch.save(state, path)
    return path, modules


def test_old_gamma_checkpoint_loads_in_translate_and_eval(old_gamma_checkpoint, prepared_doc_data, tmp_path, capsys):
    import torch

    from reluformer_mt.evaluation import extract

    path, modules = old_gamma_checkpoint
    src = tmp_path / "in.en"
    src.write_text("Thank you.\nThat is all.\n", encoding="utf-8")
    rc, err = translate_main(["-c", path, "--data", prepared_doc_data["doc"], "-i", src, "-o", tmp_path / "out.de", *FAST],
                             capsys)
    assert rc == 0, err
    code, err = eval_main(["cxmi", "--checkpoint", path, "--data", prepared_doc_data["doc"], "--split", "valid",
                           "--limit-docs", "1", "--bootstrap", "10", "--no-progress"], capsys)
    assert code == 0, err
    model = extract.load_checkpoint(str(path), str(prepared_doc_data["doc"])).model
    learned = dict(model.named_parameters())
    for name in modules:
        torch.testing.assert_close(learned[f"{name}.log_gamma"].exp(), torch.tensor([0.5, 2.0]))


def test_old_gamma_checkpoint_with_a_negative_gamma_is_one_line(old_gamma_checkpoint, prepared_doc_data, tmp_path, capsys):
    import torch

    path, modules = old_gamma_checkpoint
    state = torch.load(path, map_location="cpu", weights_only=False)
    state["model"][f"{modules[0]}.gamma"] = torch.tensor([-0.5, 2.0])
    torch.save(state, path)
    src = tmp_path / "in.en"
    src.write_text("Thank you.\n", encoding="utf-8")
    rc, err = translate_main(["-c", path, "--data", prepared_doc_data["doc"], "-i", src, *FAST], capsys)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{modules[0]}.gamma: a learned ReLUFormer gamma must be > 0" in err, err


def test_old_gamma_checkpoint_whose_header_says_fixed_is_one_line(old_gamma_checkpoint, prepared_doc_data, tmp_path,
                                                                   capsys):
    """Issue 34: a learned gamma under a header with a fixed gamma was dropped in the upgrade (exit 0,
    other scores); the header and the weights disagree, so the command stops in one line."""
    import torch

    path, modules = old_gamma_checkpoint
    state = torch.load(path, map_location="cpu", weights_only=False)
    model_cfg = state["cfg"]["model"]
    if isinstance(model_cfg, dict):
        model_cfg["relu_gamma_mode"] = "fixed"
    else:
        model_cfg.relu_gamma_mode = "fixed"
    torch.save(state, path)
    src = tmp_path / "in.en"
    src.write_text("Thank you.\n", encoding="utf-8")
    rc, err = translate_main(["-c", path, "--data", prepared_doc_data["doc"], "-i", src, *FAST], capsys)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "gamma: the checkpoint holds a learned ReLUFormer gamma [0.5, 2.0] but its header says --relu-gamma-mode fixed" \
        in err, err
