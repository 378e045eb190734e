"""The model's options in fairseq's namespace: each part's options (attention, memories, learned
keys) default to None on the command line, so that a checkpoint's stored values are kept, and get
their defaults here when the model is built. Imports nothing of the package."""
from typing import Dict, Optional


def fill_unset(args, defaults: Dict[str, object], overrides: Optional[Dict[str, object]] = None) -> None:
    """Give each option of ``defaults`` that ``args`` leaves unset (None) its value in ``overrides``
    (an architecture's), else its default."""
    overrides = overrides or {}
    for name, default in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, overrides.get(name, default))


def task_option(task, name: str, default):
    """An option of the task's config (``task`` may be None, or a task without it)."""
    return getattr(getattr(task, "cfg", None), name, default)
