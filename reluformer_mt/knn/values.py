"""kNN-MT's search values, declared once: the record ``reluformer-memory tune`` writes beside a
datastore (``tuned.full``) and the defaults where nothing is tuned. reluformer-translate's
``--knn-k`` etc., the translator's ``knn_k`` keywords and the fairseq task's ``--knn-k`` fields are
derived from these fields (:class:`reluformer_mt.guidance.knn_options.KnnMtOptions`).
Imports neither torch nor fairseq.
"""
import math
import numbers
from dataclasses import asdict, dataclass, field, fields
from typing import Callable

READOUTS = ("softmax", "relu", "sparsemax", "entmax15")
# the most neighbours a step may read (faiss's GPU search stops at 2048; a step's read-out and
# mixture grow with k): a larger --knn-k is refused before the datastore is opened
MAX_K = 2048
MIN_TEMPERATURE = 1.1754943508222875e-38  # float32's smallest normal number (numpy's finfo(float32).tiny)


class ReadoutError(ValueError):
    """A bad read-out option: one line naming it."""


def _value(default, flat: str, help: str, metavar=None, choices=None):
    """A search value: its default where none is tuned, its keyword and its help (the kNN-MT
    options' declarations read these metadata; this module sits below them)."""
    metadata = {"flat": flat, "help": help, "task": True, "metavar": metavar, "choices": choices}
    return field(default=default, metadata={k: v for k, v in metadata.items() if v is not None})


@dataclass
class KnnOptions:
    """Search values of kNN-MT; ``reluformer-memory tune`` chooses them on the validation split and
    stores them with the datastore."""
    k: int = _value(16, "knn_k", "neighbours per step", "K")
    # the largest share of the distribution the neighbours may take
    lam: float = _value(0.5, "knn_lambda", "largest share of the neighbours", "L")
    # softmax / sparsemax / entmax15: weights of -d / T
    temperature: float = _value(10.0, "knn_temperature", "T of softmax/sparsemax/entmax15", "T")
    radius: float = _value(10.0, "knn_radius", "radius of the relu read-out", "R")  # relu: a = ReLU(1 - d / radius)
    readout: str = _value("softmax", "knn_readout", "softmax(-d/T) (kNN-MT), relu: ReLU(1 - d/radius) with no mass "
                          "when every neighbour is beyond the radius, sparsemax/entmax15 over -d/T", choices=READOUTS)
    # a Meta-k network beside the datastore picks k per step (knn/adaptive.py)
    adaptive: bool = _value(False, "knn_adaptive", "adaptive kNN-MT (Zheng et al. 2021): the Meta-k network that "
                            "'reluformer-memory tune' trained beside the --knn datastore picks k and the neighbours' "
                            "share at every step (--knn-k/--knn-lambda then unused)")

    def check(self, name=None) -> "KnnOptions":
        """One line for a value out of range, naming it by ``name(field)`` (the --knn-* option by
        default): :func:`check_search_values`."""
        check_search_values(asdict(self), name or option_name)
        return self

    def as_dict(self) -> dict:
        return asdict(self)

    def translator_options(self) -> dict:
        """The same values as :class:`reluformer_mt.inference.DocumentTranslator` keywords (= the
        --knn-* options of reluformer-translate)."""
        return {f.metadata["flat"]: getattr(self, f.name) for f in fields(self)}


def option_name(name: str) -> str:
    """The command-line option of a search value: ``lam`` -> ``--knn-lambda``."""
    return "--" + next(f.metadata["flat"] for f in fields(KnnOptions) if f.name == name).replace("_", "-")


def _whole(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and not math.isnan(x)


def check_search_values(values: dict, name: Callable[[str], str] = option_name) -> None:
    """One line for a search value out of range (``values``: any of k, lam, temperature, radius,
    readout, adaptive), naming it by ``name(field)``: the --knn-* option by default, a file's field
    for tuned values (a bad value there is the file's, not an option the user never gave)."""
    if "k" in values and not (_whole(values["k"]) and 1 <= values["k"] <= MAX_K):
        raise ReadoutError(f"{name('k')}: expected 1 to {MAX_K} neighbours per step, got {values['k']!r}")
    if "lam" in values and not (_number(values["lam"]) and 0 <= values["lam"] <= 1):
        raise ReadoutError(f"{name('lam')}: expected a share between 0 and 1, got {values['lam']!r}")
    if "readout" in values and values["readout"] not in READOUTS:
        raise ReadoutError(f"{name('readout')}: got {values['readout']!r}, expected one of {', '.join(READOUTS)}")
    for field_name in ("temperature", "radius"):
        if field_name in values and not (_number(values[field_name]) and 0 < values[field_name] < math.inf):
            raise ReadoutError(f"{name(field_name)}: expected a positive number, got {values[field_name]!r}")
    # the read-outs divide float32 distances by T: below float32's smallest normal number 1 / T overflows
    if "temperature" in values and values["temperature"] < MIN_TEMPERATURE:
        raise ReadoutError(f"{name('temperature')}: expected a positive number of at least {MIN_TEMPERATURE:.4g} "
                           f"(float32's smallest normal number), got {values['temperature']!r}")
    if "adaptive" in values and not isinstance(values["adaptive"], bool):
        raise ReadoutError(f"{name('adaptive')}: expected true or false, got {values['adaptive']!r}")
