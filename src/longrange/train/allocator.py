"""The C allocator's settings for training on a CPU: memory freed in one step kept for the next.

A training step allocates and frees the same tensors every step. glibc's ``malloc`` gives blocks
above its mmap threshold (128 KiB, raised as large blocks are freed) their own mapping, unmapped
when freed, and returns the top of its heap to the operating system beyond its trim threshold; so
each step touches fresh pages and pays a page fault for every 4 KiB of its temporaries. Small
models spend a large share of their step so: the recall study's S4D model (2 layers, width 64,
batch 64 x 256) took 146 ms a step, and 93 ms with the thresholds raised (docs/small-models.md,
"Fifth round: the C allocator").

:func:`keep_freed_memory` raises both thresholds once per process (``mallopt``): blocks up to
:data:`MMAP_THRESHOLD` come from the heap and freed memory stays with the process, up to
:data:`TRIM_THRESHOLD` of it at the heap's top, for the next step to reuse. The process keeps its
peak memory rather than returning it between steps; its peak is what a step needs anyway. The
trainer calls it when it trains on a CPU, and so does a dry-run step (``experiment/dryrun.py``), so
that benchmarks time what training runs. Only glibc has these settings: elsewhere (macOS, musl)
nothing changes. ``LONGRANGE_MALLOC=system`` leaves the allocator as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

from longrange.typed import env_choice

__all__ = ["ENV", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory", "setting"]

#: glibc's ``mallopt`` parameters (``malloc.h``).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: Blocks up to this size come from the heap (larger ones are still mapped on their own).
MMAP_THRESHOLD = 1 << 30
#: Free memory at the heap's top kept rather than returned to the system (``mallopt`` takes an int).
TRIM_THRESHOLD = 2**31 - 1
#: The environment variable that turns the setting off (``system``) or on (``keep``, the default).
ENV = "LONGRANGE_MALLOC"

_applied: str | None = None


def setting() -> str:
    """``"keep"`` (the default) or ``"system"``, from :data:`ENV`; anything else is an error."""
    return env_choice(ENV, ("keep", "system"))


def keep_freed_memory() -> str:
    """Raise glibc's mmap and trim thresholds (see the module docstring), once per process.

    Returns what holds now: ``"kept"`` (set, now or earlier), ``"system"`` (``LONGRANGE_MALLOC=system``),
    or ``"not glibc"`` (nothing to set)."""
    global _applied
    if _applied is not None:
        return _applied
    if setting() == "system":
        _applied = "system"
        return _applied
    mallopt = _mallopt()
    if mallopt is None:
        _applied = "not glibc"
        return _applied
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        raise RuntimeError(
            f"glibc's mallopt refused the thresholds (mmap {MMAP_THRESHOLD}, trim {TRIM_THRESHOLD}); "
            f"set {ENV}=system to train with the allocator's defaults"
        )
    _applied = "kept"
    return _applied


def _mallopt():
    """glibc's ``mallopt(int, int) -> int``, or None where the C library is not glibc."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn
