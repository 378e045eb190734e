"""The ``.npy`` arrays the project stores (datastore keys, values and pair hashes, memory
neighbours), read back checked: plain numbers of the expected dtype kind and number of
dimensions, never pickled objects, and one line naming the file otherwise."""
from pathlib import Path

import numpy as np

KIND_NAMES = {"f": "floats", "iu": "integers", "u": "unsigned integers", "i": "signed integers"}


def load_checked_array(path: Path, kinds: str, ndim: int, error: type, remedy: str, mmap: bool = False) -> np.ndarray:
    """``path`` as an array of ``ndim`` dimensions whose dtype kind is one of ``kinds`` (numpy's
    letters: "f" float, "i" signed, "u" unsigned); else ``error`` (an exception class) with one
    line naming the file, what was expected and ``remedy`` (truncated, pickled objects, another
    shape or dtype)."""
    try:
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileNotFoundError:
        raise error(f"{path}: missing; {remedy}") from None
    except (OSError, ValueError, EOFError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise error(f"{path}: not a readable array of plain numbers ({reason}); {remedy}") from None
    if not isinstance(array, np.ndarray) or array.dtype.kind not in kinds or array.ndim != ndim:
        raise error(f"{path}: expected a {ndim}-d array of {KIND_NAMES.get(kinds, kinds)}, got "
                    f"{getattr(array, 'dtype', type(array).__name__)} of shape {getattr(array, 'shape', '?')}; {remedy}")
    return array


__all__ = ["load_checked_array"]
