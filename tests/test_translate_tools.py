"""reluformer-translate as users know such tools (issue 33): it streams through a pipe, writes
n-best lists, ensembles checkpoints, checks every option and the input before the model loads,
and its options are the Python API's parameters with the same defaults."""
import inspect
import os
import queue
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from helpers import needs_shared_data, run_subprocess
from test_translate import FAST, real_docs, translate_main, one_line_error, write_docmt

pytestmark = needs_shared_data


def _reader(stream):
    """Lines of ``stream`` in a queue, read by a thread (so a test can wait with a timeout)."""
    lines = queue.Queue()

    def read():
        for line in iter(stream.readline, ""):
            lines.put(line)
        lines.put(None)
    threading.Thread(target=read, daemon=True).start()
    return lines


def test_a_pipe_gets_each_document_before_the_input_ends(doc_checkpoint, tmp_path):
    """The first document's translation comes out of the pipe while the input is still open,
    and the whole output equals the output of the same input read from a file."""
    docs = real_docs(3, max_sentences=3)
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.Popen([str(bin_dir / "reluformer-translate"), "-c", str(doc_checkpoint), "--threads", "1", *FAST],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out = _reader(proc.stdout)
        # docmt: the next <d> line ends the first document
        proc.stdin.write("<d>\n" + "".join(s + "\n" for s in docs[0]) + "<d>\n")
        proc.stdin.flush()
        first = [out.get(timeout=240) for _ in range(1 + len(docs[0]))]
        assert proc.poll() is None  # still running: its input is open
        assert first[0] == "<d>\n" and all(line.strip() for line in first[1:])
        proc.stdin.write("".join(s + "\n" for s in docs[1]) + "<d>\n" + "".join(s + "\n" for s in docs[2]))
        proc.stdin.close()
        rest = []
        while (line := out.get(timeout=240)) is not None:
            rest.append(line)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        proc.kill()
    write_docmt(tmp_path / "in.txt", docs)
    rc, _ = translate_main(["-c", doc_checkpoint, "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt", "--threads", "1", *FAST])
    assert rc == 0
    assert "".join(first + rest) == (tmp_path / "out.txt").read_text(encoding="utf-8")


def test_a_piped_lines_input_keeps_its_layout(doc_checkpoint, tmp_path):
    """The lines format through a pipe: documents end at blank lines, empty documents and a final
    blank line are kept, exactly as from a file."""
    docs = real_docs(2, max_sentences=2)
    text = "\n" + "\n".join(docs[0]) + "\n\n\n" + "\n".join(docs[1]) + "\n\n"
    piped = run_subprocess(["reluformer-translate", "-c", doc_checkpoint, "--threads", "1", *FAST], input=text, timeout=300)
    assert piped.returncode == 0, piped.stderr
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    rc, _ = translate_main(["-c", doc_checkpoint, "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt", "--threads", "1", *FAST])
    assert rc == 0 and piped.stdout == (tmp_path / "out.txt").read_text(encoding="utf-8")
    assert piped.stdout.split("\n")[0] == "" and piped.stdout.split("\n")[3:5] == ["", ""]
    assert "translated 5 documents, 4 sentences" in piped.stderr


def test_nbest_lists_with_scores(doc_checkpoint, tmp_path, capsys):
    from reluformer_mt.inference import DocumentTranslator

    docs = real_docs(2, max_sentences=3)
    opts = dict(device="cpu", beam=3, max_len_a=0, max_len_b=6)
    one = DocumentTranslator(doc_checkpoint, **opts).translate(docs, scores=True)
    three = DocumentTranslator(doc_checkpoint, nbest=3, **opts).translate(docs)
    for a, b in zip((r for d in one for r in d), (r for d in three for r in d)):
        assert (a.text, a.score) == (b.text, b.score)  # the best is the 1-best, to the bit
        assert len(b.alternatives) == 2 and all(alt.score is not None for alt in b.alternatives)
    write_docmt(tmp_path / "in.txt", docs)
    rc, err = translate_main(["-c", doc_checkpoint, "-i", tmp_path / "in.txt", "-o", tmp_path / "nbest.txt",
                              "--nbest", "3", "--beam", "3", "--max-len-a", "0", "--max-len-b", "6", "--no-progress"], capsys)
    assert rc == 0, err
    rows = [line.split(" ||| ") for line in (tmp_path / "nbest.txt").read_text(encoding="utf-8").splitlines()]
    n = sum(len(d) for d in docs)
    assert [int(r[0]) for r in rows] == [k for k in range(n) for _ in range(3)]
    best = [r for d in one for r in d]
    assert [r[1] for r in rows[::3]] == [r.text for r in best]
    assert [float(r[2]) for r in rows[::3]] == pytest.approx([r.score for r in best], abs=1e-4)
    rc, err = translate_main(["-c", doc_checkpoint, "-i", tmp_path / "in.txt", "--nbest", "5", "--beam", "4"], capsys)
    assert rc == 2
    one_line_error(err, r"--nbest 5: expected 1 <= N <= --beam \(4\)")


def test_ensembles_average_the_checkpoints(doc_checkpoint, sentence_data, trained_checkpoint, tmp_path, capsys):
    from fairseq.sequence_generator import EnsembleModel

    from reluformer_mt.inference import DocumentTranslator

    docs = real_docs(2, max_sentences=3)
    opts = dict(device="cpu", beam=2, max_len_a=0, max_len_b=6)
    state = torch.load(doc_checkpoint, map_location="cpu", weights_only=False)
    torch.manual_seed(0)
    for key, value in state["model"].items():  # another model over the same vocabulary
        if value.is_floating_point() and value.dim() == 2:
            value.add_(0.5 * torch.randn_like(value))
    other = tmp_path / "other.pt"
    torch.save(state, other)
    single = DocumentTranslator(doc_checkpoint, **opts).translate(docs, scores=True)
    twice = DocumentTranslator([doc_checkpoint, doc_checkpoint], **opts).translate(docs, scores=True)
    assert [r.text for d in twice for r in d] == [r.text for d in single for r in d]
    assert [r.score for d in twice for r in d] == pytest.approx([r.score for d in single for r in d], abs=1e-4)
    pair = DocumentTranslator([doc_checkpoint, other], **opts)
    assert isinstance(pair.generator.model, EnsembleModel) and len(pair.generator.model.models) == 2
    assert "ensemble of 2 checkpoints" in pair.describe()
    mixed = pair.translate(docs, scores=True)
    alone = DocumentTranslator(other, **opts).translate(docs, scores=True)
    mixed_scores = [r.score for d in mixed for r in d]
    assert mixed_scores != [r.score for d in single for r in d] and mixed_scores != [r.score for d in alone for r in d]
    # the CLI: --checkpoint A B
    write_docmt(tmp_path / "in.txt", docs)
    rc, err = translate_main(["-c", doc_checkpoint, other, "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt", *FAST],
                             capsys)
    assert rc == 0 and "ensemble of 2 checkpoints" in err
    # a checkpoint over other dictionaries (the word-level sentence model) is refused by name
    rc, err = translate_main(["-c", doc_checkpoint, trained_checkpoint, "-i", tmp_path / "in.txt", *FAST], capsys)
    assert rc == 2
    one_line_error(err, rf"--checkpoint {trained_checkpoint}: its source dictionary .*differ.* one vocabulary")


def test_option_and_input_checks_come_before_the_model_loads(doc_checkpoint, tmp_path, capsys):
    """Each is one line on stderr and the model never loads (its description line is printed
    after loading)."""
    good = tmp_path / "good.txt"
    good.write_text("Hello there.\n", encoding="utf-8")
    cases = [
        (["--format", "docids"], r"--format docids needs --doc-ids FILE"),
        (["--format", "raw", "--language", "xx"], r"--language xx: no sentence splitter for this language; known: am, ar, .*, en, .*zh"),
        (["--fp16"], r"--fp16: half precision is for CUDA only"),
        (["--bf16", "--device", "cpu"], r"--bf16: half precision is for CUDA only"),
        (["--nbest", "0"], r"--nbest 0: expected 1 <= N"),
    ]
    for extra, pattern in cases:
        rc, err = translate_main(["-c", doc_checkpoint, "-i", good, *extra], capsys)
        assert rc == 2, err
        one_line_error(err, pattern)
        assert "reluformer-translate: checkpoint" not in err  # the model did not load
    bad = tmp_path / "bad.txt"
    bad.write_text("text before a marker\n<d>\nHello.\n", encoding="utf-8")
    rc, err = translate_main(["-c", doc_checkpoint, "-i", bad, "--format", "docmt"], capsys)
    assert rc == 2 and "reluformer-translate: checkpoint" not in err
    one_line_error(err, r"bad.txt:1: expected a <d> line")
    from reluformer_mt.inference import DocumentTranslator, TranslationError

    with pytest.raises(TranslationError, match=r"--fp16: half precision is for CUDA only"):
        DocumentTranslator(doc_checkpoint, device="cpu", fp16=True)


def test_the_command_line_takes_the_python_api_names_and_defaults():
    """One declaration: every field of DocumentTranslator's option groups is, under its keyword
    name, the option of the same name with the same default; the constructor takes the groups and
    those keywords."""
    from reluformer_mt.cli.translate import build_parser
    from reluformer_mt.inference import DocumentTranslator
    from reluformer_mt.inference.options import flat_defaults

    parser = build_parser()
    options = {a.dest: a for a in parser._actions}
    for name, default in flat_defaults().items():
        assert name in options, f"DocumentTranslator({name}=...) has no --{name.replace('_', '-')}"
        assert options[name].default == default, name
        assert f"--{name.replace('_', '-')}" in options[name].option_strings
    params = inspect.signature(DocumentTranslator.__init__).parameters
    assert list(params) == ["self", "checkpoint", "data", "guidance", "quiet", "options"]  # the groups: **options


def test_old_pieces_names_still_work_with_a_warning(doc_checkpoint):
    from reluformer_mt.inference import DocumentTranslator

    with pytest.warns(DeprecationWarning, match=r"piece_k=\.\.\.\) is now pieces_k"):
        t = DocumentTranslator(doc_checkpoint, device="cpu", piece_k=3)
    assert t.pieces.k == 3
    with pytest.raises(TypeError, match="unexpected keyword argument 'beams'"):
        DocumentTranslator(doc_checkpoint, beams=3)


def test_reluformer_average_the_last_checkpoints(doc_checkpoint, tmp_path):
    """Three checkpoints of one model (the trained one and two with other weights, named as
    --save-interval-updates names them): --last 2 averages the two newest, element by element,
    and the result translates."""
    run = tmp_path / "run"
    run.mkdir()
    base = torch.load(doc_checkpoint, map_location="cpu", weights_only=False)
    weights = []
    for k, (epoch, update) in enumerate([(1, 5), (1, 10), (2, 15)]):
        state = torch.load(doc_checkpoint, map_location="cpu", weights_only=False)
        torch.manual_seed(k)
        for value in state["model"].values():
            if value.is_floating_point():
                value.add_(0.1 * torch.randn_like(value))
        state["optimizer_history"][-1]["num_updates"] = update
        torch.save(state, run / f"checkpoint_{epoch}_{update}.pt")
        weights.append(state["model"])
    (run / "checkpoint_last.pt").write_bytes((run / "checkpoint_2_15.pt").read_bytes())  # a copy: not counted
    proc = run_subprocess(["reluformer-average", "--dir", run, "--last", "2", "--output", tmp_path / "avg.pt"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "2 checkpoints" in proc.stderr and "checkpoint_1_10.pt" in proc.stderr and "checkpoint_1_5.pt" not in proc.stderr
    averaged = torch.load(tmp_path / "avg.pt", map_location="cpu", weights_only=False)
    for key, value in averaged["model"].items():
        if value.is_floating_point():
            expected = ((weights[1][key].double() + weights[2][key].double()) / 2).to(value.dtype)
            assert torch.equal(value, expected), key
    assert averaged["optimizer_history"][-1]["num_updates"] == 15 and "last_optimizer_state" not in averaged
    assert set(averaged["model"]) == set(base["model"])
    (tmp_path / "in.txt").write_text("Hello there.\n", encoding="utf-8")
    rc, _ = translate_main(["-c", tmp_path / "avg.pt", "--data", base["cfg"]["task"]["data"],
                            "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt", *FAST])
    assert rc == 0 and (tmp_path / "out.txt").read_text(encoding="utf-8").strip()
    # too few checkpoints, and an output that is an input: one line each
    proc = run_subprocess(["reluformer-average", "--dir", run, "--last", "4", "--output", tmp_path / "avg4.pt"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--last 4 asks for 4 checkpoints but it holds 3" in proc.stderr
    proc = run_subprocess(["reluformer-average", "--inputs", run / "checkpoint_1_5.pt", "--output", run / "checkpoint_1_5.pt"])
    assert proc.returncode == 2 and "the same file as the input --inputs" in proc.stderr


def test_every_device_option_defaults_to_auto():
    """One --device default everywhere (issue 33): translate, the model-loading eval
    subcommands, memory rekey, demo and study."""
    import argparse

    from reluformer_mt.cli import demo, eval as eval_cli, memory, study, translate

    def devices(parser, where):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from devices(sub, f"{where} {name}")
            elif action.dest == "device":
                yield where, action.default

    found = []
    for module, prog in ((translate, "reluformer-translate"), (eval_cli, "reluformer-eval"), (memory, "reluformer-memory"),
                         (demo, "reluformer-demo"), (study, "reluformer-study")):
        found += list(devices(module.build_parser(), prog))
    assert {where for where, _ in found} >= {"reluformer-translate", "reluformer-eval align", "reluformer-eval attn-stats",
                                             "reluformer-eval contrastive", "reluformer-eval cxmi", "reluformer-eval memory",
                                             "reluformer-memory rekey", "reluformer-demo", "reluformer-study"}
    assert all(default == "auto" for _, default in found), found


def test_a_pipe_and_a_file_give_the_same_bytes_with_fallbacks(doc_checkpoint, tmp_path):
    """Five talks of different lengths, the output length limit growing with the source (a > 0),
    an untrained model that runs into it (so segments fall back to halves and single sentences):
    a file batches segments across talks, a pipe translates talk by talk, and fairseq's generator
    takes one limit per batch from its longest source, so a segment's output (and whether it fell
    back) depended on the segments batched with it. Each source now has its own limit."""
    docs = [d[:n] for d, n in zip(real_docs(5), (14, 3, 9, 1, 6))]
    write_docmt(tmp_path / "in.txt", docs)
    search = ["--beam", "2", "--max-len-a", "0.6", "--max-len-b", "2", "--no-progress", "--threads", "1"]
    piped = run_subprocess(["reluformer-translate", "-c", doc_checkpoint, *search],
                           input=(tmp_path / "in.txt").read_text(encoding="utf-8"), timeout=300)
    assert piped.returncode == 0, piped.stderr[-2000:]
    rc, _ = translate_main(["-c", doc_checkpoint, "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt", *search])
    assert rc == 0
    fallbacks = int(re.search(r"fallbacks: ([\d,]+)", piped.stderr).group(1).replace(",", ""))
    assert fallbacks > 0, piped.stderr
    assert piped.stdout == (tmp_path / "out.txt").read_text(encoding="utf-8")


def test_a_documents_translation_does_not_depend_on_its_batch(doc_checkpoint):
    """The Python API: documents translated together, one at a time, or one segment per batch
    give the same results (the length limit is each source's own, not its batch's)."""
    from reluformer_mt.inference import DocumentTranslator

    docs = [d[:n] for d, n in zip(real_docs(3), (8, 2, 5))]
    search = dict(beam=2, max_len_a=0.6, max_len_b=2, device="cpu")
    together = DocumentTranslator(doc_checkpoint, **search)
    alone = DocumentTranslator(doc_checkpoint, batch_size=1, **search)
    expected = together.translate_text(docs)
    assert [alone.translate_text([d])[0] for d in docs] == expected
    assert together.stats["fallbacks: segment retranslated as halves"] > 0
