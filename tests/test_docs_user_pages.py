"""The user docs say what to run and what you get; the history of the measurements lives apart in
docs/history/. No user page (README.md, data/README.md, docs/*.md) names an issue number, and PERFORMANCE.md stays
short enough to read."""
import re

from helpers import REPO

USER_PAGES = [REPO / "README.md", REPO / "data" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# "issue 14", "issue #32", "issues 31 and 32", "#32" in prose
ISSUE = re.compile(r"\bissues? #?\d+|(?<![\w&/#])#\d{1,4}\b", re.I)
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
LINK_TARGET = re.compile(r"\]\([^)]*\)")


def prose(text: str) -> str:
    """The page without code (fenced blocks, inline code) and link targets (anchors are GitHub's)."""
    return LINK_TARGET.sub("]()", CODE.sub("", text))


def test_user_pages_name_no_issue_number():
    found = [f"{page.relative_to(REPO)}: {m.group(0)!r}" for page in USER_PAGES
             for m in ISSUE.finditer(prose(page.read_text(encoding="utf-8")))]
    assert found == []


def test_the_issue_pattern_can_fail_and_spares_code_and_anchors():
    assert ISSUE.search(prose("measured against the targets of issue 14, then"))
    assert ISSUE.search(prose("as #32 asked")) and ISSUE.search(prose("Issues 31 and 32"))
    assert not ISSUE.search(prose("see [there](history/X.md#the-targets-of-issue-14) and `--seed #12`"))
    assert not ISSUE.search(prose("```\nfor s in 2 3; do # issue 5\n```\n colour &#32; (x)"))


def test_history_lives_apart_and_the_user_pages_link_it():
    assert (REPO / "docs" / "history" / "PERFORMANCE.md").is_file()
    assert "history/PERFORMANCE.md" in (REPO / "docs" / "PERFORMANCE.md").read_text(encoding="utf-8")


def test_performance_page_stays_short():
    lines = (REPO / "docs" / "PERFORMANCE.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"docs/PERFORMANCE.md has {lines} lines: move measurement history to docs/history/"


def test_no_anchor_file_name_or_internal_path_names_an_issue_or_a_machine():
    """Anchors, file names and paths count too (code and links included): an issue number in a
    link's anchor or a test file's name, or a folder of the machine a measurement ran on."""
    named = re.compile(r"issue[-_ ]?\d+|/work/|/home/|/root/", re.I)
    found = [f"{page.relative_to(REPO)}: {m.group(0)!r}" for page in USER_PAGES
             for m in named.finditer(re.sub(r"github\.com/[\w./-]*/issues/\d+", "", page.read_text(encoding="utf-8")))]
    assert found == []
    assert sorted(p.name for p in (REPO / "tests").glob("*issue*")) == []


def test_user_pages_state_no_internal_target():
    """What was measured, not the project's internal goals ("target <= 1.3: missed")."""
    target = re.compile(r"\btargets? *(?:<=|>=|≤|≥|asks|is met|are met|met\b)|the project aims|\*\*missed\*\*|: missed\b"
                        r"|not reached", re.I)
    found = [f"{page.relative_to(REPO)}: {m.group(0)!r}" for page in USER_PAGES
             for m in target.finditer(prose(page.read_text(encoding="utf-8")))]
    assert found == []
    assert target.search("x1.71 (target <= 1.3: missed)") and target.search("the 3 points the project aims for")
