"""Compile every C++ kernel of the package now: ``make setup`` runs ``python -m
reluformer_mt.cli.build_kernels`` once, so that the first training run does not spend its
first two minutes or so compiling (docs/DESIGN.md, installation). A kernel that cannot be built is reported, never fatal: its callers fall
back to PyTorch code (:class:`reluformer_mt.extension.LazyExtension`).
"""
import sys
import time
import warnings

from reluformer_mt.attention import fused, sparse_maps
from reluformer_mt.knn import fused as knn_fused
from reluformer_mt.memory import fused as memory_fused


def build_all() -> int:
    """Build (or load) each kernel; prints one line per kernel. Returns 0 even when one cannot be built."""
    for kernel in (fused.KERNEL, sparse_maps.KERNEL, knn_fused.KERNEL, memory_fused.KERNEL):
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = kernel.load()
        took = time.perf_counter() - start
        if module is not None:
            print(f"reluformer_mt: {kernel.what} ready ({took:.0f} s)")
        else:
            reason = str(caught[-1].message) if caught else "RELUFORMER_NO_FUSED=1"
            print(f"reluformer_mt: {kernel.what} not built: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(build_all())
