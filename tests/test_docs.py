"""The documentation a user reaches from the README exists (issue 25): local links resolve, every
"docs/X.md" the code cites is in the project, METHODS.md has the sections the code cites, and the
licence and citation files are there and well-formed."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md")) + sorted((REPO / "docs" / "history").glob("*.md"))
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def anchors(page: Path) -> set:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", title)))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_local_links_resolve(page):
    broken = []
    for target, anchor in LINK.findall(page.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path = (page.parent / target).resolve()
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor[1:] not in anchors(path):
            broken.append(target + anchor)
    assert broken == [], f"{page.name}: broken links {broken}"


def test_cited_docs_exist_and_methods_has_the_cited_sections():
    cited = set()
    sections = set()
    for source in list((REPO / "reluformer_mt").rglob("*.py")) + list((REPO / "benchmarks").glob("*.py")):
        text = source.read_text(encoding="utf-8")
        cited.update(re.findall(r"docs/([A-Z_]+\.md)", text))
        sections.update(int(n) for n in re.findall(r"docs/METHODS\.md,? section (\d)", text))
    assert "METHODS.md" in cited
    assert [name for name in cited if not (REPO / "docs" / name).is_file()] == []
    headings = re.findall(r"^## (\d)\. ", (REPO / "docs" / "METHODS.md").read_text(encoding="utf-8"), re.M)
    assert sections and sections <= {int(h) for h in headings}


def test_methods_gives_a_formula_for_every_registered_family():
    from reluformer_mt.models.architectures import FAMILIES

    methods = (REPO / "docs" / "METHODS.md").read_text(encoding="utf-8")
    table = methods.split("## 1. Attention weight functions", 1)[1].split("### 1.1", 1)[0]
    assert [f for f in FAMILIES if f"| `{f}`" not in table and f"| `{f}` (" not in table] == []


def test_license_setup_and_citation():
    import yaml

    assert (REPO / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    assert re.search(r'license="MIT"', (REPO / "setup.py").read_text(encoding="utf-8"))
    citation = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))
    assert citation["cff-version"] == "1.2.0" and citation["license"] == "MIT" and citation["title"]
    assert {"Sparse Attention with Linear Units", "A Study on ReLU and Softmax in Transformer"} <= {
        r["title"] for r in citation["references"]}


def test_readme_keeps_a_marked_place_for_the_demo_table():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme.split("<!-- demo-table:begin", 1)[1].split("<!-- demo-table:end -->", 1)[0]
    assert table.count("\n|") >= 5


def test_readme_demo_table_is_generated_from_the_committed_summary():
    """One source for the demo's numbers: the README's block is readme_table's rendering of
    docs/benchmarks/demo_summary.json (the run's summary.json), digit for digit."""
    import json

    from reluformer_mt.experiments.readme_table import SUMMARY_COPY, block, readme_block

    summary = json.loads(SUMMARY_COPY.read_text(encoding="utf-8"))
    assert readme_block() == block(summary)
    # a changed number in the README fails the test
    changed = json.loads(json.dumps(summary))
    for family in changed["families"].values():
        family["modes"]["constrained"]["s_bleu"] += 1
    assert block(changed) != readme_block()


def test_docs_do_not_copy_the_demo_table():
    """The demo table lives in the README only; other docs link to it."""
    for page in ("REFERENCE_RUN.md", "TRANSLATION_MEMORY.md", "USAGE.md", "DESIGN.md"):
        text = (REPO / "docs" / page).read_text(encoding="utf-8")
        assert "| baseline: copy the nearest training verse |" not in text, page


def _checkout_state() -> str:
    import subprocess
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


def test_readme_table_prints_the_table_and_changes_no_file(tmp_path):
    """The documented command (`python -m reluformer_mt.experiments.readme_table summary.json`)
    prints the table of a run and leaves the checkout as it was; only --write rewrites README.md."""
    import json
    import subprocess
    import sys

    from reluformer_mt.experiments.readme_table import SUMMARY_COPY, render

    summary = json.loads(SUMMARY_COPY.read_text(encoding="utf-8"))
    for family in summary["families"].values():  # a run whose numbers differ from the README's
        family["modes"]["constrained"]["s_bleu"] += 1
    run_summary = tmp_path / "summary.json"
    run_summary.write_text(json.dumps(summary), encoding="utf-8")
    before = _checkout_state()
    readme_before = (REPO / "README.md").read_bytes()
    out = subprocess.run([sys.executable, "-m", "reluformer_mt.experiments.readme_table", str(run_summary)],
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == render(summary)
    assert _checkout_state() == before
    assert (REPO / "README.md").read_bytes() == readme_before


def test_readme_table_write_rewrites_the_readme_block(tmp_path, monkeypatch):
    import json

    from reluformer_mt.experiments import readme_table

    summary = json.loads(readme_table.SUMMARY_COPY.read_text(encoding="utf-8"))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n" + readme_table.BEGIN + " old -->\n| x |\n" + readme_table.END + "\nrest\n",
                      encoding="utf-8")
    copy = tmp_path / "docs" / "benchmarks" / "demo_summary.json"
    monkeypatch.setattr(readme_table, "README", readme)
    monkeypatch.setattr(readme_table, "SUMMARY_COPY", copy)
    monkeypatch.setattr(readme_table, "ROOT", tmp_path)
    assert readme_table.main([str(REPO / "docs" / "benchmarks" / "demo_summary.json"), "--write"]) == 0
    assert readme_table.readme_block(readme) == readme_table.block(summary)
    assert readme.read_text(encoding="utf-8").startswith("intro\n") and json.loads(copy.read_text()) == summary
