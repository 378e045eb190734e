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
    assert code == 1 and f"--spm-model {a_dictionary}: not a SentencePiece model" in err and err.count("\n") == 1, err


def test_attn_impl_that_does_not_apply_is_said(sentence_data, tmp_path, caplog):
    """softpick has a row normaliser: the fused kernel cannot run it, and training says so."""
    caplog.set_level(logging.WARNING)
    run_fairseq("train", tiny_train_args(sentence_data["bin"], tmp_path, arch="softpick_tiny", max_update=1,
                                         extra=["--attn-impl", "fused", "--disable-validation", "--no-save", "--cpu"]))
    notes = [r.getMessage() for r in caplog.records if "--attn-impl" in r.getMessage()]
    assert notes == ["--attn-impl fused does not apply to softpick (encoder, decoder, cross attention): "
                     "it runs the dense path"], notes
