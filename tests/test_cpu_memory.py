"""``reluformer_mt.cpu_memory``: malloc keeps freed blocks for the next training step (issue 22)."""
import os
import platform
import subprocess
import sys

import pytest

from helpers import REPO

ASK = "from reluformer_mt.cpu_memory import keep_freed_memory as k; print(k(), k())"


def ask(env_value=None):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RELUFORMER_KEEP_FREED_MEMORY", None)
    if env_value is not None:
        env["RELUFORMER_KEEP_FREED_MEMORY"] = env_value
    done = subprocess.run([sys.executable, "-c", ASK], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")
def test_thresholds_are_set_once_and_the_variable_turns_it_off():
    assert ask() == ["True", "True"]
    assert ask("0") == ["False", "False"]
