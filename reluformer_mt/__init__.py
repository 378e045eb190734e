"""reluformer-mt: ReLU-attention Transformers for (document-level) machine translation.

``fairseq-train --user-dir reluformer_mt`` imports this package, which registers the models,
architectures, criteria and tasks, and first neutralises two traps of the Python-3.11 fairseq
builds (see :mod:`reluformer_mt.fairseq_compat`).
"""
import logging

__version__ = "0.1.0"

# fairseq's speech task logs an install hint for tensorboardX at import; it is noise for MT
logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)

from reluformer_mt import fairseq_compat as _fairseq_compat

_fairseq_compat.apply()

from reluformer_mt import models, criteria, tasks  # noqa: E402,F401  (registration side effects)
