"""docs/PYTHON_API.md's (and the README's) examples run as written (issue 33): every ```python block, in order,
in one fresh Python process that never calls register() before the translator, with the tests'
tiny document checkpoint at the page's path and small real files under the page's names."""
import re
import shutil
import subprocess
import sys

from helpers import REPO, needs_shared_data
from test_translate import real_docs, write_docmt

PAGE = REPO / "docs" / "PYTHON_API.md"


def code_blocks(text: str):
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


@needs_shared_data
def test_every_python_block_of_the_page_runs_as_written(doc_checkpoint, tmp_path):
    blocks = code_blocks(PAGE.read_text(encoding="utf-8"))
    assert len(blocks) >= 6
    (tmp_path / "checkpoints" / "ted").mkdir(parents=True)
    shutil.copy(doc_checkpoint, tmp_path / "checkpoints" / "ted" / "checkpoint_best.pt")
    docs = real_docs(2, max_sentences=2)
    write_docmt(tmp_path / "talks.en", docs)
    from conftest import iwslt_files
    from reluformer_mt.inference.inputs import read_input

    german = [d.sentences[:2] for d in read_input(iwslt_files("test")[1], fmt="docmt").documents[:2]]
    write_docmt(tmp_path / "talks.de", german)
    write_docmt(tmp_path / "talks.de.hyp", [[" ".join(s.split()[1:]) for s in d] for d in german])
    (tmp_path / "test.gold.align").write_text("0-0 1-1 2p2\n0-1 1-0\n", encoding="utf-8")
    (tmp_path / "pred.align").write_text("0-0 1-1\n0-1 2-2\n", encoding="utf-8")
    # the page's blocks share one namespace (later blocks use ``translator``), like a notebook
    script = "\n".join(f"print('=== block {k}')\n{block}" for k, block in enumerate(blocks))
    # no max_len change: the page's defaults as written (the untrained model runs to the length limit)
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "not registered" not in run.stderr and "SentenceResult(" not in out  # results print as text
    first = out.split("=== block 1")[0].splitlines()
    texts = eval(first[1])  # the translate_text line: a list of documents of strings
    assert [len(d) for d in texts] == [2, 2] and all(isinstance(t, str) and t for d in texts for t in d)
    assert texts[0][0] in first  # print(sentence) prints the text itself
    assert "s-BLEU = " in out and "d-BLEU (documents) = " in out
    # the README's example too (the quickstart's last step)
    readme = code_blocks((REPO / "README.md").read_text(encoding="utf-8"))
    assert len(readme) == 1 and "DocumentTranslator" in readme[0]
    run = subprocess.run([sys.executable, "-c", readme[0]], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    printed = eval(run.stdout.strip().splitlines()[-1])
    assert len(printed) == 1 and len(printed[0]) == 2 and all(isinstance(t, str) for t in printed[0])


def documented_signature(page_text: str, name: str):
    """(positional parameters, {keyword: default}) of the page's `` `NAME(...)` `` line."""
    import ast

    text = re.search(rf"`{name}\((.*?)\)`", page_text, flags=re.S).group(1)
    call = ast.parse(f"f({' '.join(text.split())})", mode="eval").body
    # a **catch-all (k.arg None) is no parameter with a default
    return [a.id for a in call.args], {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg is not None}


def test_the_pages_documenttranslator_signature_is_the_codes():
    """Whatever DocumentTranslator's parameters are, the page lists each with its default
    (its **renamed catch-all of old names aside)."""
    import inspect

    from reluformer_mt.inference.translator import DocumentTranslator

    params = [p for p in inspect.signature(DocumentTranslator.__init__).parameters.values()
              if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    positional, keywords = documented_signature(PAGE.read_text(encoding="utf-8"), "DocumentTranslator")
    assert positional == [p.name for p in params if p.default is p.empty]
    assert keywords == {p.name: p.default for p in params if p.default is not p.empty}
    assert list(keywords) == [p.name for p in params if p.default is not p.empty]  # in the code's order
