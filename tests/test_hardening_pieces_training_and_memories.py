"""Hostile inputs beside those of test_hardening_outputs_and_rekeying.py: translation pieces
for a plain fairseq model, resumes and reruns of fairseq-train, --attn-impl triton off CUDA, a
document directory without a split's segment metadata, a memory prepared with another
SentencePiece model, TER on lines that are whole talks, memory matches longer than the model's
positions, write errors naming their file, and a TMX memory's placeholders on the command line."""
import json
import re
import shutil

import pytest
import torch

from helpers import USER_DIR, run_fairseq, tiny_train_args
from test_bad_input_commands import eval_main
from test_hardening_outputs_and_rekeying import one_line
from test_learned_keys import key_checkpoint, key_data  # noqa: F401 (fixtures)
from test_tm_file_readers import HEADER, tu
from test_translate import FAST, translate_main


def source_file(tmp_path, text="Thank you very much.\nI would like to tell you a story.\n"):
    src = tmp_path / "in.en"
    src.write_text(text, encoding="utf-8")
    return src


# ---------------------------------------------------------------- case 1: pieces for a plain fairseq model

@pytest.fixture(scope="module")
def plain_checkpoint(prepared_doc_data, tmp_path_factory):
    """fairseq's own `transformer` on the sentence-level twin (--task translation, no plugin option
    in its header): 2 updates."""
    save = tmp_path_factory.mktemp("plain")
    args = tiny_train_args(prepared_doc_data["sent"], save, arch="transformer", max_update=2,
                           extra=["--disable-validation", "--cpu"])
    args[args.index("reluformer_cross_entropy")] = "label_smoothed_cross_entropy"
    run_fairseq("train", args)
    return save / "checkpoint_last.pt"


@pytest.mark.parametrize("memory", [None, "tsv"])
def test_pieces_guide_a_plain_fairseq_transformer(plain_checkpoint, tmp_path, capsys, memory):
    """On main: ConfigAttributeError: Key 'tm_k' not in 'TranslationConfig' (a traceback)."""
    extra = []
    if memory == "tsv":
        tsv = tmp_path / "tm.tsv"
        tsv.write_text("Thank you very much.\tVielen Dank.\n", encoding="utf-8")
        extra = ["--memory", tsv]
    matches = tmp_path / "matches.tsv"
    code, err = translate_main(["-c", plain_checkpoint, "-i", source_file(tmp_path), "-o", tmp_path / "out.de",
                                "--pieces-weight", "2", "--memory-matches", matches, *extra, *FAST], capsys)
    assert code == 0 and "Traceback" not in err, err
    assert "translation pieces" in err, err
    first = matches.read_text(encoding="utf-8").splitlines()[0].split("\t")
    assert float(first[0]) > 0.9 and (memory is None or first[2] == "Vielen Dank."), first


# ---------------------------------------------------------------- case 19: TMX placeholders from the command line

@pytest.mark.parametrize("mode, target", [("space", "Vielen Dank hier."), ("text", "Vielen Dank {0} hier.")])
def test_tmx_placeholders_option_of_translate(doc_checkpoint, prepared_doc_data, tmp_path, capsys, mode, target):
    tmx = tmp_path / "tm.tmx"
    tmx.write_text(HEADER + tu("Thank you very much.", "Vielen Dank<ph x='1'>{0}</ph>hier.") + "</body></tmx>\n",
                   encoding="utf-8")
    matches = tmp_path / "matches.tsv"
    code, err = translate_main(["-c", doc_checkpoint, "--data", prepared_doc_data["doc"], "-i", source_file(tmp_path),
                                "-o", tmp_path / "out.de", "--memory", tmx, "--pieces-weight", "1",
                                "--memory-matches", matches, "--tmx-placeholders", mode, "--quiet", *FAST], capsys)
    assert code == 0, err
    assert matches.read_text(encoding="utf-8").splitlines()[0].split("\t")[2] == target


# ---------------------------------------------------------------- case 16: a write error names its file

@pytest.mark.parametrize("option", ["--json", "--html"])
def test_eval_write_error_names_the_file(tmp_path, capsys, option):
    """On main: 'cannot write None: No space left on device' (the flush of a file object names no file)."""
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("a b c\n", encoding="utf-8")
    code, err = eval_main(["bleu", "--hyp", hyp, "--ref", hyp, "--levels", "s", option, "/dev/full"], capsys)
    one_line(code, err, r"error: cannot write /dev/full: No space left on device")


def test_atomic_writes_name_the_file_they_were_asked_for(tmp_path):
    """rekey --json, prepare's stamps and the reports write through replace_atomically: a failed
    write there named no file ('cannot write None' in reluformer-memory)."""
    import errno

    from reluformer_mt.cli.checks import write_error
    from reluformer_mt.data.textfiles import replace_atomically

    def full(f):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as e:
        replace_atomically(tmp_path / "r.json", full)
    assert write_error(e.value) == f"cannot write {tmp_path / 'r.json'}: No space left on device"
    assert list(tmp_path.iterdir()) == []  # nor a temporary file left behind
    # the commands that print the error itself (reluformer-study, readme_table) read it whole: on
    # main a ' -> None' trailed it (the second file name set to None is printed)
    assert str(e.value) == f"[Errno {errno.ENOSPC}] No space left on device: '{tmp_path / 'r.json'}'"

    (tmp_path / "d.json").mkdir()  # a folder where the file should go: opened as it is, refused
    with pytest.raises(IsADirectoryError) as e:
        replace_atomically(tmp_path / "d.json", lambda f: f.write(b"x"))
    assert str(e.value) == f"[Errno {errno.EISDIR}] Is a directory: '{tmp_path / 'd.json'}'"


# ---------------------------------------------------------------- cases 3, 8, 17, 6: fairseq-train

def test_rerun_of_a_finished_run_trains_no_update_more(sentence_data, tmp_path):
    """On main the rerun trained update 3 of a --max-update 2 run (fairseq checks the limit only
    after an update)."""
    args = tiny_train_args(sentence_data["bin"], tmp_path, max_update=2, extra=["--disable-validation", "--cpu"])

    def updates():
        return torch.load(tmp_path / "checkpoint_last.pt", weights_only=False)["optimizer_history"][-1]["num_updates"]

    run_fairseq("train", args)
    assert updates() == 2
    run_fairseq("train", args)
    assert updates() == 2


def test_resume_without_the_memory_options_names_them(key_checkpoint, key_data, tmp_path):  # noqa: F811
    """On main: fairseq's 'Cannot load model parameters ...; please ensure that the architectures
    match' (a traceback naming no option)."""
    from reluformer_mt.fairseq_compat import FairseqInputError, one_line_error
    from test_translation_memory import TRAIN_TM

    shutil.copy(key_checkpoint, tmp_path / "checkpoint_last.pt")
    argv = [key_data, "--user-dir", USER_DIR, "--task", "document_translation", *TRAIN_TM, "--save-dir", tmp_path]
    argv[argv.index("--max-update") + 1] = "6"
    with pytest.raises(FairseqInputError) as e:
        run_fairseq("train", argv)
    line = one_line_error(e.value)
    assert line.startswith(f"--save-dir checkpoint {tmp_path / 'checkpoint_last.pt'}: trained with "
                           "--tm-fusion attention (this run: none)"), line
    assert "give the options it was trained with" in line and "\n" not in line


def test_document_task_without_a_split_metadata_is_one_line(prepared_doc_data, tmp_path):
    """On main: a FileNotFoundError without errno, which fairseq-train printed as a traceback."""
    from conftest import TRAIN_FAST
    from reluformer_mt.fairseq_compat import one_line_error
    from reluformer_mt.tasks.document_translation import DocumentDataError

    data = tmp_path / "data"
    shutil.copytree(prepared_doc_data["doc"], data)
    (data / "valid.segments.tsv").unlink()
    with pytest.raises(DocumentDataError) as e:
        run_fairseq("train", [data, "--user-dir", USER_DIR, "--task", "document_translation", *TRAIN_FAST,
                              "--max-update", "1", "--save-dir", tmp_path / "save"])
    assert one_line_error(e.value).startswith(f"{data / 'valid.segments.tsv'}: missing; --task document_translation "
                                              "needs the segment metadata"), one_line_error(e.value)
    assert not (tmp_path / "save" / "checkpoint_last.pt").exists()


def test_train_with_attn_impl_triton_on_the_cpu_is_refused_first(sentence_data, tmp_path):
    """On main: RuntimeError in the first forward (a traceback)."""
    from reluformer_mt.fairseq_compat import FairseqInputError

    with pytest.raises(FairseqInputError, match=r"^--attn-impl triton: the Triton kernel trains on CUDA GPUs only "
                                                r"\(--cpu is given\); use --attn-impl auto"):
        run_fairseq("train", tiny_train_args(sentence_data["bin"], tmp_path / "save", max_update=1,
                                             extra=["--disable-validation", "--cpu", "--attn-impl", "triton"]))
    assert not (tmp_path / "save").exists()


@pytest.fixture
def triton_checkpoint(doc_checkpoint, tmp_path):
    """doc_checkpoint whose header says --attn-impl triton (as trained on a GPU)."""
    state = torch.load(doc_checkpoint, weights_only=False)
    model = state["cfg"]["model"]
    if isinstance(model, dict) or hasattr(model, "keys"):
        model["attn_impl"] = "triton"
    else:
        model.attn_impl = "triton"
    path = tmp_path / "triton.pt"
    torch.save(state, path)
    return path


def test_a_triton_checkpoint_runs_the_default_route_off_cuda(triton_checkpoint, prepared_doc_data, tmp_path, capsys):
    """On main: translate and eval cxmi died with a RuntimeError traceback in the first forward."""
    code, err = translate_main(["-c", triton_checkpoint, "--data", prepared_doc_data["doc"], "-i", source_file(tmp_path),
                                "-o", tmp_path / "out.de", *FAST], capsys)
    assert code == 0, err
    assert f"{triton_checkpoint} was trained with --attn-impl triton, which runs on CUDA only: on cpu its attention " \
           "runs the default route" in err, err
    code, err = eval_main(["cxmi", "--checkpoint", triton_checkpoint, "--data", prepared_doc_data["doc"], "--limit-docs",
                           "1", "--bootstrap", "10", "--no-progress"], capsys)
    assert code == 0 and "Traceback" not in err, err


# ---------------------------------------------------------------- case 9: a memory prepared with another SentencePiece model

@pytest.fixture(scope="module")
def other_spm_memory(tmp_path_factory):
    """Sentence-level IWSLT talks prepared with neighbours and a SentencePiece model of their own
    (800 pieces like the fixtures' model, trained on other talks: another model, same size)."""
    from conftest import iwslt_files
    from reluformer_mt.data.prepare import PrepareConfig
    from reluformer_mt.memory.neighbours import prepare_with_memory

    out = tmp_path_factory.mktemp("other_spm") / "sent"
    prepare_with_memory(PrepareConfig(out=str(out), fmt="docmt", src="en", tgt="de",
                                      train=[[str(p) for p in iwslt_files("test")]], valid_from_train=1, limit_docs=4,
                                      segment_tokens=0, vocab_size=800, joined_dictionary=True, progress=False,
                                      memory_k=2))
    return out


@pytest.mark.parametrize("reader", ["pieces", "attention"])
def test_translate_refuses_a_memory_of_another_sentencepiece_model(reader, other_spm_memory, doc_checkpoint,
                                                                   prepared_doc_data, key_checkpoint, key_data,  # noqa: F811
                                                                   tmp_path, capsys):
    """On main both were accepted: 13.6 % of the memory's pieces became <unk> (or other tokens)."""
    checkpoint, data, extra = ((doc_checkpoint, prepared_doc_data["doc"], ["--pieces-weight", "1"]) if reader == "pieces"
                               else (key_checkpoint, key_data, []))
    code, err = translate_main(["-c", checkpoint, "--data", data, "-i", source_file(tmp_path), "-o", tmp_path / "o.de",
                                "--memory", other_spm_memory, *extra, *FAST], capsys)
    one_line(code, err, rf"--memory {re.escape(str(other_spm_memory))}: prepared with another SentencePiece model "
                        rf"than {re.escape(str(data))} \(.*spm\.model is not the source model")
    assert not (tmp_path / "o.de").exists()


def test_rekey_refuses_a_directory_of_another_sentencepiece_model(other_spm_memory, key_checkpoint, key_data,  # noqa: F811
                                                                  tmp_path, capsys):
    import numpy as np

    from reluformer_mt.cli.memory import main

    data = tmp_path / "data"
    shutil.copytree(other_spm_memory, data)
    before = np.load(data / "memory" / "train.ids.npy")
    code = main([str(a) for a in ["rekey", "-c", key_checkpoint, "--data", data, "--quiet"]])
    one_line(code, capsys.readouterr().err, rf"--data {re.escape(str(data))}: its .*source SentencePiece model and "
                                            rf"target SentencePiece model differ from the checkpoint "
                                            rf"{re.escape(str(key_checkpoint))}'s")
    assert np.array_equal(np.load(data / "memory" / "train.ids.npy"), before)


# ---------------------------------------------------------------- case 12: TER on lines that are whole talks

def test_ter_on_whole_talks_skips_the_shift_search_and_says_so(tmp_path, capsys):
    """On main every line went through TER's shift search: 134 s for one 3,000-word line (the
    audit's talks: 354 s), where its edit distance alone takes 0.35 s."""
    import time

    from reluformer_mt.cli import eval as eval_cli

    words = [f"w{i % 997}" for i in range(3000)]
    hyp_words = [w for i, w in enumerate(words) if i % 10] + ["extra"] * 5
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text(" ".join(hyp_words) + "\nthe cat sat on the mat\n", encoding="utf-8")
    ref.write_text(" ".join(words) + "\nthe cat sat on a mat\n", encoding="utf-8")
    started = time.time()
    code = eval_cli.main([str(a) for a in ["bleu", "--hyp", hyp, "--ref", ref, "--levels", "s", "-m", "bleu", "ter",
                                           "--json", tmp_path / "r.json"]])
    out = capsys.readouterr().out
    assert code == 0 and time.time() - started < 60
    assert "note: s-TER: 1 of 2 sentences have more than 300 words: scored without TER's shift search" in out, out
    ter = json.loads((tmp_path / "r.json").read_text())["ter"]["sentence"]
    assert ter["unshifted"] == 1 and ter["max_words"] == 300
    assert ter["score"] == pytest.approx(100 * (300 + 5 + 1) / (3000 + 6), abs=0.01)  # deletions, insertions, 1 sub


def test_ter_of_sentences_is_sacrebleus(tmp_path):
    from sacrebleu.metrics import TER

    from reluformer_mt.evaluation.bleu import corpus_ter

    hyps, refs = ["a b c d e f", "the cat sat on the mat"], ["a c b d e g", "on the mat the cat sat"]
    result = corpus_ter(hyps, refs, "sentence")
    assert result.unshifted == 0 and result.score == TER().corpus_score(hyps, [refs]).score


# ---------------------------------------------------------------- case 15: long matches, a k beyond the memory

def test_a_match_longer_than_the_model_positions_is_cut_and_counted(key_checkpoint, key_data, tmp_path,  # noqa: F811
                                                                    capsys, monkeypatch):
    """On main a 3,000-word entry reached the 1,024-position memory encoder uncut and uncounted."""
    from reluformer_mt.tasks.document_translation import DocumentTranslationTask

    tsv = tmp_path / "tm.tsv"
    tsv.write_text("Thank you very much.\t" + " ".join(["Vielen Dank, meine Damen und Herren."] * 500) + "\n"
                   "A story.\tEine Geschichte.\n", encoding="utf-8")
    fed, real = [], DocumentTranslationTask.dataset_with_matches

    def spy(self, dataset, matches):  # what the model is given
        fed.extend(len(m) for m in matches)
        return real(self, dataset, matches)

    monkeypatch.setattr(DocumentTranslationTask, "dataset_with_matches", spy)
    code, err = translate_main(["-c", key_checkpoint, "--data", key_data, "-i", source_file(tmp_path, "Thank you very much.\n"),
                                "-o", tmp_path / "o.de", "--memory", tsv, *FAST], capsys)
    assert code == 0, err
    assert "memory: segments whose matches were cut to the model's 1024 positions: 1" in err, err
    assert fed and max(fed) == 1024


def test_memory_k_beyond_the_memory_is_said(prepared_doc_data, tmp_path, caplog):
    """On main --memory-k 5000 over 127 entries was accepted without a word."""
    import logging

    from conftest import prepare_iwslt_with_memory
    from reluformer_mt.data.prepared import Prepared

    caplog.set_level(logging.WARNING)
    out = prepare_iwslt_with_memory(tmp_path / "d", prepared_doc_data["doc"] / "spm.model", segment_tokens=0, memory_k=600)
    memory = Prepared.load(out).memory
    assert memory["note"].startswith(f"--memory-k 600: the memory has {memory['entries']} entries, so a sentence gets "
                                     f"at most {memory['entries']} neighbours"), memory
    assert any("--memory-k 600: the memory has" in r.getMessage() for r in caplog.records)
