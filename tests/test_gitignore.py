"""What the README's quickstart writes into the checkout is ignored by git: its data directory,
checkpoints, translation and averaged checkpoint (read from the README's commands)."""
import re
import shlex
import shutil
import subprocess

import pytest

from helpers import REPO

OUTPUT_OPTIONS = ("--out", "--save-dir", "--output", "-o")


def quickstart_outputs() -> list:
    """The paths the quickstart's commands write: the values of their output options, in the
    quickstart's code block and its inline `reluformer-...` commands."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quickstart on your own corpus", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", section, re.S) + re.findall(r"`(reluformer-[^`]*)`", section)
    outputs = []
    for text in commands:
        words = shlex.split(text.replace("\\\n", " "), comments=True)
        outputs += [words[k + 1] for k, word in enumerate(words[:-1]) if word in OUTPUT_OPTIONS]
    return outputs


def test_the_quickstart_outputs_are_found():
    outputs = quickstart_outputs()
    assert {"data-bin/ted.doc256", "checkpoints/ted", "test.de.txt", "avg.pt"} <= set(outputs), outputs


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout")
def test_git_ignores_what_the_quickstart_writes():
    for path in quickstart_outputs():
        run = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", "--no-index", path])
        assert run.returncode == 0, f"{path}: not in .gitignore"
