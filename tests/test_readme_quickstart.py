"""The README's quickstart as written: its training command (step 2) keeps the checkpoints that
its averaging example (`reluformer-average --dir checkpoints/ted --last 5`) averages. The test
trains a tiny model with the README's options, the update counts scaled down, and runs the
documented command on what that training wrote."""
import re
import shlex

import pytest

from helpers import REPO, TINY_MODEL, USER_DIR, needs_shared_data, run_fairseq, run_subprocess

pytestmark = needs_shared_data
README = (REPO / "README.md").read_text(encoding="utf-8")


def readme_command(program: str) -> list:
    """The words of the README's first `program ...` command (backslash continuations joined)."""
    text = re.search(rf"^{re.escape(program)} .*?(?<!\\)$", README, re.S | re.M).group(0)
    return shlex.split(text.replace("\\\n", " "))


def option(words: list, name: str) -> str:
    return words[words.index(name) + 1]


def test_the_averaging_example_works_on_what_the_quickstart_trains(prepared_doc_data, tmp_path):
    train = readme_command("fairseq-train")
    average = shlex.split(re.search(r"`(reluformer-average --dir checkpoints/ted [^`]*)`", README).group(1))
    save_dir, last = option(train, "--save-dir"), int(option(average, "--last"))
    assert option(average, "--dir") == save_dir
    # the README's numbers keep enough checkpoints: scaled down below by one factor
    max_update, every = int(option(train, "--max-update")), int(option(train, "--save-interval-updates"))
    assert int(option(train, "--keep-interval-updates")) >= last and max_update // every > last
    scale = every // 2
    argv = [str(prepared_doc_data["doc"])] + train[2:]  # the README's data directory replaced
    for name, value in (("--save-dir", tmp_path / save_dir), ("--user-dir", USER_DIR),
                        ("--max-update", max_update // scale), ("--save-interval-updates", every // scale),
                        ("--warmup-updates", 2)):
        argv[argv.index(name) + 1] = str(value)
    run_fairseq("train", argv + TINY_MODEL + ["--num-workers", "0", "--no-progress-bar", "--disable-validation"])

    average[average.index("--dir") + 1] = str(tmp_path / save_dir)
    average[average.index("-o") + 1] = str(tmp_path / "avg.pt")
    proc = run_subprocess(average, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"{last} checkpoints" in proc.stderr and (tmp_path / "avg.pt").is_file()
