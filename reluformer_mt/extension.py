"""Compiling the package's C++ CPU kernels (``attention/csrc``, ``knn/csrc``, ``memory/csrc``) on first use.

``torch.utils.cpp_extension.load`` needs a C++ compiler and ninja; each extension is built into
``$TORCH_EXTENSIONS_DIR/reluformer_mt`` or ``~/.cache/reluformer_mt/torch_extensions``, per torch
and Python version and per content of the kernel sources, and reused afterwards. Callers catch the failure and fall back to PyTorch
code (``RELUFORMER_NO_FUSED=1`` makes every caller skip its kernel). A module of the package's top
level, importing nothing of it: the retrieval (``memory/sparse_scores.py``) loads its kernel without
the attention package (fairseq, ~200 MB).
"""
import os
import sys
import warnings
from pathlib import Path

import torch

CFLAGS = ["-O3", "-fno-trapping-math", "-fno-math-errno", "-fopenmp"]
# a build takes well under a minute; torch's build lock older than this was left by a killed build
# (torch waits for it forever, which hung a test suite here)
STALE_LOCK_SECONDS = 600


def build_directory() -> Path:
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    base = Path(root) / "reluformer_mt" if root else Path.home() / ".cache" / "reluformer_mt" / "torch_extensions"
    tag = "torch%s_py%d%d" % (torch.__version__.replace("+", "_"), *sys.version_info[:2])
    # and per kernel source: two checkouts with different kernels (worktrees, branches) no longer
    # rebuild over each other's build and wait on each other's lock; equal sources share one build
    return base / f"{tag}_{sources_digest()}"


def sources_digest() -> str:
    import hashlib

    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent
    for source in sorted(package.glob("*/csrc/*")):
        if source.is_file():
            digest.update(str(source.relative_to(package)).encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:10]


def disabled() -> bool:
    return os.environ.get("RELUFORMER_NO_FUSED") == "1"


def clear_stale_lock(directory: Path, max_age: float = STALE_LOCK_SECONDS, poll: float = 0.5) -> bool:
    """Wait while another process holds torch's build lock in ``directory`` (a build beside this
    one); remove it once it is older than ``max_age`` seconds (left by a build that was killed).
    torch waits for the lock itself, but forever, also for a lock that only turns stale while it
    waits (a worker killed mid-build hung the next test run here). True when a lock was removed."""
    import time

    lock = directory / "lock"
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return False
        if age > max_age:
            lock.unlink(missing_ok=True)
            warnings.warn(f"reluformer_mt: removed a stale build lock {lock} (left by a build that was killed)")
            return True
        time.sleep(poll)


def compile_cpp(name: str, source: Path, verbose: bool = False):
    """The module built from one C++ source (raises whatever the build raises). A build of these
    very sources (the directory is per sources' digest) is imported as it is: torch's loader runs
    ninja to check it, and its peak added ~170 MB to a process that only retrieves from a memory."""
    directory = build_directory()
    built = directory / f"{name}.so"
    if built.is_file() and not (directory / "lock").exists():  # no build under way beside this one
        try:
            return import_built(name, built)
        except ImportError:  # a damaged file (a build killed while linking): built again below
            pass
    from torch.utils import cpp_extension

    directory.mkdir(parents=True, exist_ok=True)
    clear_stale_lock(directory)
    return cpp_extension.load(name=name, sources=[str(source)], build_directory=str(directory),
                              extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"], verbose=verbose)


def import_built(name: str, path: Path):
    """The extension module ``name`` from its built shared library (torch is imported: the library
    links against it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not an extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LazyExtension:
    """One C++ source, compiled on the first :meth:`load`; None after one warning if that fails
    (no compiler, no ninja, a compile error) or when ``RELUFORMER_NO_FUSED=1``."""

    def __init__(self, name: str, source: Path, what: str, fallback: str):
        self.name, self.source, self.what, self.fallback = name, source, what, fallback
        self.module, self.tried = None, False

    def load(self, verbose: bool = False):
        if self.tried:
            return self.module
        self.tried = True
        if disabled():
            return None
        try:
            self.module = compile_cpp(self.name, self.source, verbose)
        except Exception as error:  # fall back, never crash
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            warnings.warn(f"reluformer_mt: {self.what} unavailable ({first_line[:200]}); using {self.fallback}")
            self.module = None
        return self.module
