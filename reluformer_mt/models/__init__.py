"""Models and architectures registered with fairseq."""
from reluformer_mt.models import reluformer_transformer, architectures  # noqa: F401
from reluformer_mt.models.architectures import ARCHITECTURES, FAMILIES  # noqa: F401
