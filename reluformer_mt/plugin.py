"""Registration with fairseq: the one place that loads torch and fairseq for the plugin.

``register()`` applies the fixes of :mod:`reluformer_mt.fairseq_compat` (checkpoint allowlist,
no lost last batch) and imports the modules whose fairseq decorators register the ``reluformer``
model and its architectures, the ``reluformer_cross_entropy`` criterion and the
``document_translation`` task. It runs once per process; later calls do nothing.

Who calls it:
- fairseq itself, through the package ``__init__``, when ``--user-dir reluformer_mt`` imports the
  package (``fairseq.utils.import_user_module``);
- every console script and library entry point that builds or loads a model in-process
  (``run_fairseq``, the checkpoint loaders, the CLIs, the tests' ``conftest.py``): fairseq skips
  a ``--user-dir`` whose package was already imported, e.g. for ``reluformer_mt.data``.
"""
import logging

# fairseq's speech task logs an install hint for tensorboardX when fairseq is first imported; it is
# noise for MT. Set here, on the package's import, because a Python user's first import of fairseq
# (e.g. through DocumentTranslator's module) comes before any register() call.
logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)

_registered = False


def register() -> None:
    """Apply the fairseq fixes and register every model, architecture, criterion and task."""
    global _registered
    if _registered:
        return
    from reluformer_mt import fairseq_compat

    fairseq_compat.apply()  # before any checkpoint is loaded or any batch is made
    from reluformer_mt import criteria, models, tasks  # noqa: F401  (their decorators register them)

    _registered = True


def is_registered() -> bool:
    return _registered
