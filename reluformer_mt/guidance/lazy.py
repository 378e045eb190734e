"""A package's names loaded when first used (PEP 562), so that importing the package -- or a light
module inside it -- loads none of the heavy modules (torch, fairseq) its other names live in."""
import importlib
from typing import Callable, Dict


def lazy_attributes(package: str, homes: Dict[str, str]) -> Callable[[str], object]:
    """The package's ``__getattr__``: ``homes`` maps each name to its module, relative to ``package``."""

    def __getattr__(name):
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{homes[name]}"), name)
    return __getattr__
