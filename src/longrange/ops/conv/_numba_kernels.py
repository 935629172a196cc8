"""The numba kernels of the causal depthwise convolution on CPUs (:mod:`longrange.ops.conv.numba`,
``impl="numba"``), imported on first use.

Layouts, channels last (all C-contiguous, one floating dtype)::

    x, y, gy, gx   (b, l, d)
    weight         (w, d)      tap k multiplies the input w - 1 - k steps back
    bias           (d,)
    gweight        (b, w, d)   per batch element (the caller sums over it)
    gbias          (b, d)

One task is a block of ``W`` channels of one batch element; every inner loop runs over the block's
channels, contiguous in memory. The backward recomputes the pre-activation output instead of
storing it, and walks back from the last position keeping the last ``w`` gradients w.r.t. the
pre-activation output in a ring of ``w`` rows.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from longrange.ops._numba_common import ERROR_MODEL, FASTMATH, like, set_threads  # noqa: F401  (set_threads: this module's interface)
from longrange.ops.scan._numba_kernels import fast_exp


@njit(inline="always", fastmath=FASTMATH)
def _row_fill(dst, src, W):  # pragma: no cover - compiled
    for j in range(W):
        dst[j] = src[j]


@njit(inline="always", fastmath=FASTMATH)
def _row_tap(acc, wk, x, W):  # pragma: no cover - compiled
    for j in range(W):
        acc[j] += wk[j] * x[j]


@njit(inline="always", fastmath=FASTMATH)
def _row_out(y, acc, silu, W):  # pragma: no cover - compiled
    one = like(1.0, acc)
    if silu:
        for j in range(W):
            a = acc[j]
            y[j] = a / (one + fast_exp(-a))
    else:
        for j in range(W):
            y[j] = acc[j]


@njit(inline="always", fastmath=FASTMATH)
def _row_pre_grad(g, acc, gy, silu, W):  # pragma: no cover - compiled
    """g = gy * d silu(acc) / d acc (or gy without the activation)."""
    one = like(1.0, acc)
    if silu:
        for j in range(W):
            s = one / (one + fast_exp(-acc[j]))
            g[j] = gy[j] * s * (one + acc[j] * (one - s))
    else:
        for j in range(W):
            g[j] = gy[j]


@njit(inline="always", fastmath=FASTMATH)
def _row_tap_backward(gx, gw, wk, g, x, W):  # pragma: no cover - compiled
    """gx += w_k g; gw_k += g x (x: the input the tap multiplied)."""
    for j in range(W):
        gx[j] += wk[j] * g[j]
        gw[j] += g[j] * x[j]


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def conv_forward(x, weight, bias, silu, W, y):  # pragma: no cover - compiled
    b, l, d = x.shape
    K = weight.shape[0]
    per_batch = d // W
    for task in prange(b * per_batch):
        bi = task // per_batch
        c0 = (task % per_batch) * W
        acc = np.empty(W, dtype=x.dtype)
        br = bias[c0 : c0 + W]
        for t in range(l):
            _row_fill(acc, br, W)
            for k in range(max(0, K - 1 - t), K):
                _row_tap(acc, weight[k, c0 : c0 + W], x[bi, t - (K - 1) + k, c0 : c0 + W], W)
            _row_out(y[bi, t, c0 : c0 + W], acc, silu, W)


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def conv_backward(x, weight, bias, silu, gy, W, gx, gweight, gbias):  # pragma: no cover - compiled
    """``gx`` (b, l, d) and the per-batch-element ``gweight`` (b, w, d), ``gbias`` (b, d).

    Per task, blocks of T positions from the last: first the gradients w.r.t. the block's
    pre-activation outputs (recomputed) into rows K-1 .. K-1+T-1 of a buffer whose rows above keep
    the K-1 rows of the block after it, then each input's gradient and the weights' from them."""
    b, l, d = x.shape
    K = weight.shape[0]
    T = 64
    per_batch = d // W
    zero = like(0.0, x)
    for task in prange(b * per_batch):
        bi = task // per_batch
        c0 = (task % per_batch) * W
        acc = np.empty(W, dtype=x.dtype)
        g = np.zeros((T + K - 1, W), dtype=x.dtype)  # row r: position t0 + r
        gw = np.zeros((K, W), dtype=x.dtype)
        gb = np.zeros(W, dtype=x.dtype)
        wb = np.empty((K, W), dtype=x.dtype)
        for k in range(K):
            for j in range(W):
                wb[k, j] = weight[k, c0 + j]
        br = bias[c0 : c0 + W]
        t1 = l
        while t1 > 0:
            t0 = max(0, t1 - T)
            # the gradients of positions t1 .. t1+K-2 (the first rows of the block after this one)
            # move to rows t1-t0 .., below this block's; last row first, as the two ranges can overlap
            for r in range(K - 2, -1, -1):
                _row_fill(g[t1 - t0 + r], g[r], W)
            for t in range(t0, t1):
                _row_fill(acc, br, W)
                for k in range(max(0, K - 1 - t), K):
                    _row_tap(acc, wb[k], x[bi, t - (K - 1) + k, c0 : c0 + W], W)
                _row_pre_grad(g[t - t0], acc, gy[bi, t, c0 : c0 + W], silu, W)
            for t in range(t0, t1):
                gr = g[t - t0]
                for j in range(W):
                    gb[j] += gr[j]
                gxr = gx[bi, t, c0 : c0 + W]
                for j in range(W):
                    gxr[j] = zero
                for s in range(min(K, l - t)):  # input t feeds the outputs t + s through tap K - 1 - s
                    _row_tap_backward(gxr, gw[K - 1 - s], wb[K - 1 - s], g[t - t0 + s], x[bi, t, c0 : c0 + W], W)
            t1 = t0
        for k in range(K):
            for j in range(W):
                gweight[bi, k, c0 + j] = gw[k, j]
        for j in range(W):
            gbias[bi, c0 + j] = gb[j]
