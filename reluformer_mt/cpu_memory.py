"""Keep freed CPU memory in the process for the next step's tensors of the same size (glibc).

A training step allocates and frees the same tensors every step. glibc's malloc serves blocks
above its mmap threshold (128 KB, rising by itself to at most 32 MB) with fresh pages from the
kernel and trims the heap's free top back to it, so the next step pays a page fault per 4 KB to
get them zeroed again. ReLU attention allocates more such blocks than fairseq's fused softmax
(the logits, weights and their gradients of a short call: 8 MB per call at the demo's
128-token segments), so it paid more: a ReLUFormer attention call at that size took 20.6 ms of
CPU time by default and 13.3 ms with freed memory kept, SDPA 9.4 ms either way (issue 22,
docs/PERFORMANCE.md). ``keep_freed_memory`` raises both thresholds with ``mallopt``: blocks up to
32 MB come from the heap and freed ones stay there for reuse. Only where memory comes from
changes, not one computed bit; the price is that the process keeps its peak heap.

Called when a reluformer model is built on the CPU (``ReluformerModel.build_model``);
``RELUFORMER_KEEP_FREED_MEMORY=0`` leaves malloc's defaults. A no-op where the C library is not
glibc.
"""
import ctypes
import ctypes.util
import logging
import os

logger = logging.getLogger(__name__)

# mallopt parameters (glibc malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
# the largest mmap threshold glibc accepts on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 2 ** 31 - 1  # an int: never trim the heap's free top while training
ENV = "RELUFORMER_KEEP_FREED_MEMORY"

_applied = None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True where they are set."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get(ENV, "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl without mallopt): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not _applied:
        logger.info("mallopt refused the thresholds: malloc's defaults stay")
    return _applied


__all__ = ["ENV", "keep_freed_memory"]
