"""reluformer-mt: ReLU-attention Transformers for (document-level) machine translation.

Importing the package (or ``reluformer_mt.data``, ``.evaluation.aer``, ``.evaluation.bleu``)
loads neither torch nor fairseq. Registration with fairseq is explicit:
:func:`reluformer_mt.plugin.register` (also ``reluformer_mt.register``). The one implicit
caller is fairseq's ``--user-dir reluformer_mt``, which imports this package by its folder: then
the package registers itself here, as a fairseq plugin must.
"""
import os
import sys

from reluformer_mt.plugin import register  # noqa: F401  (light: imports fairseq only when called)

__version__ = "0.1.0"

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _imported_as_user_dir() -> bool:
    """Whether fairseq's ``import_user_module`` is importing us: it records the folder's absolute
    path in its ``memo`` just before the import (and never imports a folder twice)."""
    fairseq_utils = sys.modules.get("fairseq.utils")
    memo = getattr(getattr(fairseq_utils, "import_user_module", None), "memo", ())
    return PACKAGE_DIR in memo


if _imported_as_user_dir():
    register()
    from reluformer_mt.fairseq_compat import install_one_line_errors

    install_one_line_errors()  # fairseq's own command: the plugin's errors in one line
