"""The numba kernels of the (gated) RMS norm on CPUs (:mod:`longrange.ops.norm.numba`,
``impl="numba"``), imported on first use.

Layouts (all C-contiguous, one floating dtype)::

    x, gate, y, gy, gx, ggate   (R, D)    rows of D features (the caller flattens (..., heads, D))
    weight                      (H, D)    row r is scaled by weight[r % H] (H = 1: one shared scale)
    rstd                        (R,)      1 / sqrt(mean(u²) + eps) of each row's normalised input u
    gweight                     (T, H, D) per task (the caller sums over the tasks, in order)

``mode`` 0: no gate, ``y = x r w``; 1: the gate after the norm, ``y = x r w silu(g)``; 2: the gate
first, ``u = x silu(g)``, ``y = u r w``; ``r`` is ``rstd`` of ``x`` (modes 0, 1) or ``u`` (mode 2).
Each task is a block of consecutive rows; every inner loop runs over a row's D features,
contiguous in memory. The backward recomputes silu and the normalised row from x, the gate and
the stored ``rstd``, so the forward stores one number per row.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from longrange.ops._numba_common import ERROR_MODEL, FASTMATH, like, set_threads  # noqa: F401  (set_threads: this module's interface)
from longrange.ops.scan._numba_kernels import fast_exp


@njit(inline="always", fastmath=FASTMATH)
def _forward_rows(x, gate, weight, eps, mode, r0, r1, y, rstd):  # pragma: no cover - compiled
    """Rows ``r0`` to ``r1`` of the forward; inlined with ``mode`` a constant, so that each mode's
    loops are compiled without the others' branches (which, per row, made rows of 16 features
    twice as slow)."""
    D = x.shape[1]
    H = weight.shape[0]
    one = like(1.0, x)
    u = np.empty(D, dtype=x.dtype)
    for r in range(r0, r1):
        xr, w = x[r], weight[r % H]
        if mode == 2:
            gr = gate[r]
            for j in range(D):
                g = gr[j]
                u[j] = xr[j] * g / (one + fast_exp(-g))
        else:
            for j in range(D):
                u[j] = xr[j]
        ss = like(0.0, x)
        for j in range(D):
            ss += u[j] * u[j]
        rs = one / np.sqrt(ss / D + eps)
        rstd[r] = rs
        yr = y[r]
        if mode == 1:
            gr = gate[r]
            for j in range(D):
                g = gr[j]
                yr[j] = u[j] * rs * w[j] * g / (one + fast_exp(-g))
        else:
            for j in range(D):
                yr[j] = u[j] * rs * w[j]


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def norm_forward(x, gate, weight, eps, mode, rows_per_task, y, rstd):  # pragma: no cover - compiled
    R = x.shape[0]
    eps = like(eps, x)
    tasks = (R + rows_per_task - 1) // rows_per_task
    if mode == 0:
        for task in prange(tasks):
            _forward_rows(x, gate, weight, eps, 0, task * rows_per_task, min(R, (task + 1) * rows_per_task), y, rstd)
    elif mode == 1:
        for task in prange(tasks):
            _forward_rows(x, gate, weight, eps, 1, task * rows_per_task, min(R, (task + 1) * rows_per_task), y, rstd)
    else:
        for task in prange(tasks):
            _forward_rows(x, gate, weight, eps, 2, task * rows_per_task, min(R, (task + 1) * rows_per_task), y, rstd)


@njit(inline="always", fastmath=FASTMATH)
def _backward_rows(x, gate, weight, rstd, gy, mode, r0, r1, gx, ggate, gw):  # pragma: no cover - compiled
    """Rows ``r0`` to ``r1`` of the backward, the weight's gradient summed into ``gw`` (H, D);
    inlined with ``mode`` a constant, as :func:`_forward_rows`."""
    D = x.shape[1]
    H = weight.shape[0]
    one = like(1.0, x)
    zero = like(0.0, x)
    n = np.empty(D, dtype=x.dtype)  # the normalised row
    dn = np.empty(D, dtype=x.dtype)  # the gradient w.r.t. it
    sig = np.empty(D, dtype=x.dtype)  # the gate's SiLU (mode 1) or sigmoid (mode 2), once per row
    for h in range(H):
        for j in range(D):
            gw[h, j] = zero
    for r in range(r0, r1):
        xr, gyr, w, gwr = x[r], gy[r], weight[r % H], gw[r % H]
        rs = rstd[r]
        dot = zero
        if mode == 0:
            for j in range(D):
                nj = xr[j] * rs
                n[j] = nj
                d = gyr[j] * w[j]
                gwr[j] += gyr[j] * nj
                dn[j] = d
                dot += d * nj
        elif mode == 1:  # two loops, each writing few arrays (one loop writing four did not vectorise)
            gr, ggr = gate[r], ggate[r]
            for j in range(D):
                g = gr[j]
                s = one / (one + fast_exp(-g))
                t = gyr[j] * xr[j] * rs * w[j]  # gradient w.r.t. silu(g)
                ggr[j] = t * s * (one + g * (one - s))
                sig[j] = g * s  # silu(g)
            for j in range(D):
                nj = xr[j] * rs
                n[j] = nj
                t = gyr[j] * sig[j]  # gradient w.r.t. the norm's output
                gwr[j] += t * nj
                d = t * w[j]
                dn[j] = d
                dot += d * nj
        else:
            for j in range(D):
                g = gate[r, j]
                s = one / (one + fast_exp(-g))
                sig[j] = s
                nj = xr[j] * g * s * rs
                n[j] = nj
                d = gyr[j] * w[j]
                gwr[j] += gyr[j] * nj
                dn[j] = d
                dot += d * nj
        dot = dot / D
        gxr = gx[r]
        if mode == 2:  # through u = x silu(g): du = r (dn - n mean(dn n))
            gr, ggr = gate[r], ggate[r]
            for j in range(D):
                g, s = gr[j], sig[j]
                du = rs * (dn[j] - n[j] * dot)
                gxr[j] = du * g * s
                ggr[j] = du * xr[j] * s * (one + g * (one - s))
        else:
            for j in range(D):
                gxr[j] = rs * (dn[j] - n[j] * dot)


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def norm_backward(x, gate, weight, rstd, gy, mode, rows_per_task, gx, ggate, gweight):  # pragma: no cover - compiled
    R = x.shape[0]
    tasks = (R + rows_per_task - 1) // rows_per_task
    if mode == 0:
        for task in prange(tasks):
            r0, r1 = task * rows_per_task, min(R, (task + 1) * rows_per_task)
            _backward_rows(x, gate, weight, rstd, gy, 0, r0, r1, gx, ggate, gweight[task])
    elif mode == 1:
        for task in prange(tasks):
            r0, r1 = task * rows_per_task, min(R, (task + 1) * rows_per_task)
            _backward_rows(x, gate, weight, rstd, gy, 1, r0, r1, gx, ggate, gweight[task])
    else:
        for task in prange(tasks):
            r0, r1 = task * rows_per_task, min(R, (task + 1) * rows_per_task)
            _backward_rows(x, gate, weight, rstd, gy, 2, r0, r1, gx, ggate, gweight[task])
