"""The numba kernels of SwiGLU on CPUs (:mod:`longrange.ops.glu.numba`, ``impl="numba"``),
imported on first use.

Layouts (all C-contiguous, one floating dtype)::

    h, gh     (R, 2H)   rows of the projection: the gate in columns 0..H-1, up in H..2H-1
    y, gy     (R, H)    ``y = silu(gate) * up``

Each task is a block of consecutive rows; the inner loops run over a row's H features, contiguous
in memory. The backward recomputes the gate's sigmoid and writes both halves of each row of
``gh``: the gradient reaches the projection without a concatenation.
"""

from __future__ import annotations

from numba import njit, prange

from longrange.ops._numba_common import ERROR_MODEL, FASTMATH, like, set_threads  # noqa: F401  (set_threads: this module's interface)
from longrange.ops.scan._numba_kernels import fast_exp


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def glu_forward(h, rows_per_task, y):  # pragma: no cover - compiled
    R, H = y.shape
    one = like(1.0, h)
    tasks = (R + rows_per_task - 1) // rows_per_task
    for task in prange(tasks):
        for r in range(task * rows_per_task, min(R, (task + 1) * rows_per_task)):
            hr, yr = h[r], y[r]
            for j in range(H):
                g = hr[j]
                yr[j] = g / (one + fast_exp(-g)) * hr[H + j]


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def glu_backward(h, gy, rows_per_task, gh):  # pragma: no cover - compiled
    R, H = gy.shape
    one = like(1.0, h)
    tasks = (R + rows_per_task - 1) // rows_per_task
    for task in prange(tasks):
        for r in range(task * rows_per_task, min(R, (task + 1) * rows_per_task)):
            hr, gyr, ghr = h[r], gy[r], gh[r]
            for j in range(H):
                g, d = hr[j], gyr[j]
                s = one / (one + fast_exp(-g))
                ghr[H + j] = d * g * s  # d y / d up = silu(g)
                ghr[j] = d * hr[H + j] * s * (one + g * (one - s))  # silu'(g) = s (1 + g (1 - s))
