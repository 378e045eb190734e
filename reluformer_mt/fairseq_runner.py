"""Run fairseq's command-line tools inside this Python process.

A fairseq command spends 8-11 s importing; the demo, the sweep and the tests run several of them
in a row, so they call ``fairseq_cli.<tool>.cli_main()`` with ``sys.argv`` set instead. Library
code below the experiments and the console scripts: it imports only :mod:`reluformer_mt.plugin`,
to register the plugin where fairseq's ``--user-dir`` would.
"""
import contextlib
import importlib
import io
import logging
import os
import sys
from typing import Sequence

from reluformer_mt.plugin import register


def _all_loggers():
    manager = logging.Logger.manager
    return [logging.getLogger()] + [l for l in manager.loggerDict.values() if isinstance(l, logging.Logger)]


def _close_new_file_handlers(before) -> None:
    """fairseq adds a FileHandler for --log-file and never removes it: the next run in this
    process would write into the previous run's log."""
    for log in _all_loggers():
        for handler in list(log.handlers):
            if isinstance(handler, logging.FileHandler) and (id(log), id(handler)) not in before:
                log.removeHandler(handler)
                handler.close()


def run_fairseq(tool: str, argv: Sequence, capture: bool = False) -> str:
    """``fairseq-<tool> argv...`` in this process; returns its standard output when ``capture``."""
    from fairseq import checkpoint_utils

    # fairseq skips a --user-dir whose package this process has imported already (for its data
    # or evaluation modules): register explicitly, as the user-dir import would
    if "--user-dir" in [str(a) for a in argv]:
        register()

    # fairseq's CLIs set the root logger to INFO with logging.basicConfig, which does nothing when
    # the host process (pytest, an application) configured logging first; the --log-file lines
    # are INFO records of fairseq's loggers, so give those loggers the CLI's level explicitly
    level = os.environ.get("LOGLEVEL", "INFO").upper()
    for name in ("fairseq", "fairseq_cli"):
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(level)

    # fairseq keeps the best validation score of a process on this function attribute: a second
    # training run in the same process would never write a checkpoint_best.pt worse than the first's
    if tool == "train" and hasattr(checkpoint_utils.save_checkpoint, "best"):
        del checkpoint_utils.save_checkpoint.best
    cli = importlib.import_module(f"fairseq_cli.{tool}")
    old_argv = sys.argv
    sys.argv = [f"fairseq-{tool}"] + [str(a) for a in argv]
    handlers_before = {(id(log), id(h)) for log in _all_loggers() for h in log.handlers}
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer) if capture else contextlib.nullcontext():
            cli.cli_main()
    finally:
        sys.argv = old_argv
        _close_new_file_handlers(handlers_before)
    return buffer.getvalue()
