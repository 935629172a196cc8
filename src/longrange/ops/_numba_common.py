"""What the numba kernel modules share (imported only by them, so only where numba imports)."""

from __future__ import annotations

import numba
from numba import types
from numba.extending import overload

#: Floating-point licences: contraction into fused multiply-adds and reassociation (to vectorise
#: sums). No assumptions about NaN or infinity, which propagate as usual.
FASTMATH = {"contract", "reassoc", "nsz", "arcp"}

#: NumPy's error model in the kernels: a division by zero gives inf or NaN instead of raising
#: Python's ZeroDivisionError, whose check in every division stops the compiler from vectorising
#: a loop that divides (the kernels divide by nothing that can be zero).
ERROR_MODEL = "numpy"


def like(x, ref):  # pragma: no cover - replaced by the overload below inside compiled code
    """``x`` converted to the dtype of the array (or scalar type) ``ref``: kernels generic over
    float32 / float64 keep float32 arithmetic in float32."""
    raise NotImplementedError


@overload(like, inline="always")
def _like(x, ref):
    target = ref.dtype if isinstance(ref, types.Array) else ref

    def impl(x, ref):
        return target(x)

    return impl


def set_threads(count: int) -> int:
    """Use ``count`` threads (capped at numba's maximum); returns the number used."""
    count = max(1, min(int(count), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(count)
    return count
