"""tasks: ``--task document_translation`` (segments of whole sentences with document metadata)."""
from . import document_translation  # noqa: F401  (registers the task)
