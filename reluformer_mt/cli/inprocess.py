"""Run fairseq's command-line tools inside this Python process.

A fairseq command spends 8-11 s importing; the demo, the sweep and the tests run several of them
in a row, so they call ``fairseq_cli.<tool>.cli_main()`` with ``sys.argv`` set instead.
"""
import contextlib
import importlib
import io
import sys
from typing import Sequence


def run_fairseq(tool: str, argv: Sequence, capture: bool = False) -> str:
    """``fairseq-<tool> argv...`` in this process; returns its standard output when ``capture``."""
    from fairseq import checkpoint_utils

    # fairseq keeps the best validation score of a process on this function attribute: a second
    # training run in the same process would never write a checkpoint_best.pt worse than the first's
    if tool == "train" and hasattr(checkpoint_utils.save_checkpoint, "best"):
        del checkpoint_utils.save_checkpoint.best
    cli = importlib.import_module(f"fairseq_cli.{tool}")
    old_argv = sys.argv
    sys.argv = [f"fairseq-{tool}"] + [str(a) for a in argv]
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer) if capture else contextlib.nullcontext():
            cli.cli_main()
    finally:
        sys.argv = old_argv
    return buffer.getvalue()
