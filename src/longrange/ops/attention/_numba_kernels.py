"""The numba kernels of softmax attention without a mask on CPUs (:mod:`longrange.ops.attention.numba`,
``impl="numba"``), imported on first use.

Layouts (all C-contiguous, one floating dtype)::

    q, k, v, out, gq, gk, gv, gout   (N, L, D)   N = batch x heads, L positions, D = head width
    lse                              (N, L)      each query's log of its softmax's denominator

Scores are ``scale q_i . k_j``; a causal query ``i`` attends to keys ``j <= i``. One task per
(batch, head) pair, processed query by query: the pair's keys and values are copied once into
(D, Lp) tables, zero-padded to ``Lp``, a multiple of :data:`LANES`, so that every loop over keys
runs over whole vectors (the keys a causal query may not see, in its last block, are masked). The
forward keeps each query's log-sum-exp; the backward recomputes the probabilities from it (as
flash attention does: no (L, L) matrix is stored) and sums the keys' and values' gradients in the
pair's own tables, so it is deterministic.

Why: at the head widths of MAD's multi-head attention (4 and 8) PyTorch's fused CPU kernel spends
most of its time around products whose inner dimension is the head width; loops over keys with the
head width outermost run forward and backward 1.5-2.0x as fast at heads of 4 and 1.1-1.5x at heads
of 8, up to 256 positions (docs/small-models.md, "Fourteenth round").
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from longrange.ops._numba_common import ERROR_MODEL, FASTMATH, like, set_threads  # noqa: F401  (set_threads: this module's interface)
from longrange.ops.scan._numba_kernels import fast_exp

#: Keys per vector block: the tables' rows are padded to a multiple of it.
LANES = 16


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def attention_forward(q, k, v, scale, causal, out, lse):  # pragma: no cover - compiled
    N, L, D = q.shape
    Lp = (L + LANES - 1) // LANES * LANES
    neg = like(-np.inf, q)
    zero = like(0.0, q)
    sc = like(scale, q)
    for b in prange(N):
        kt = np.zeros((D, Lp), dtype=q.dtype)  # the keys, scaled, and the values: one row per feature
        vt = np.zeros((D, Lp), dtype=q.dtype)
        for j in range(L):
            for c in range(D):
                kt[c, j] = k[b, j, c] * sc
                vt[c, j] = v[b, j, c]
        s = np.empty(Lp, dtype=q.dtype)  # the query's scores, then its probabilities
        mv = np.empty(LANES, dtype=q.dtype)  # the scores' maxima, lane by lane
        for i in range(L):
            n = i + 1 if causal else L  # the keys the query sees
            npad = (n + LANES - 1) // LANES * LANES
            first, k0 = q[b, i, 0], kt[0]
            for j in range(npad):
                s[j] = first * k0[j]
            for c in range(1, D):
                qc, kc = q[b, i, c], kt[c]
                for j in range(npad):
                    s[j] += qc * kc[j]
            # The maximum, lane by lane (an elementwise maximum vectorises where a running one
            # does not); the keys past n, in the last block only, masked on the way.
            for lane in range(LANES):
                mv[lane] = neg
            last = npad - LANES
            for j0 in range(0, last, LANES):
                for lane in range(LANES):
                    x = s[j0 + lane]
                    mv[lane] = x if x > mv[lane] else mv[lane]
            for lane in range(LANES):
                x = s[last + lane] if last + lane < n else neg
                s[last + lane] = x
                mv[lane] = x if x > mv[lane] else mv[lane]
            m = mv[0]
            for lane in range(1, LANES):
                m = mv[lane] if mv[lane] > m else m
            total = zero
            for j in range(npad):
                p = fast_exp(s[j] - m)
                s[j] = p
                total += p
            inv = like(1.0, q) / total
            for c in range(D):
                vc = vt[c]
                acc = zero
                for j in range(npad):
                    acc += s[j] * vc[j]
                out[b, i, c] = acc * inv
            lse[b, i] = m + np.log(total)


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def attention_backward(q, k, v, out, lse, gout, scale, causal, gq, gk, gv):  # pragma: no cover - compiled
    N, L, D = q.shape
    Lp = (L + LANES - 1) // LANES * LANES
    zero = like(0.0, q)
    sc = like(scale, q)
    for b in prange(N):
        kt = np.zeros((D, Lp), dtype=q.dtype)
        vt = np.zeros((D, Lp), dtype=q.dtype)
        gkt = np.zeros((D, Lp), dtype=q.dtype)  # the keys' and values' gradients, summed over queries
        gvt = np.zeros((D, Lp), dtype=q.dtype)
        for j in range(L):
            for c in range(D):
                kt[c, j] = k[b, j, c] * sc
                vt[c, j] = v[b, j, c]
        p = np.empty(Lp, dtype=q.dtype)  # the query's probabilities
        ds = np.empty(Lp, dtype=q.dtype)  # the gradient of its scores
        for i in range(L):
            n = i + 1 if causal else L
            npad = (n + LANES - 1) // LANES * LANES
            delta = zero  # sum_j p_j dp_j = gout_i . out_i
            for c in range(D):
                delta += gout[b, i, c] * out[b, i, c]
            q0, g0, k0, v0 = q[b, i, 0], gout[b, i, 0], kt[0], vt[0]
            for j in range(npad):
                p[j] = q0 * k0[j]
                ds[j] = g0 * v0[j]
            for c in range(1, D):
                qc, g, kc, vc = q[b, i, c], gout[b, i, c], kt[c], vt[c]
                for j in range(npad):
                    p[j] += qc * kc[j]
                    ds[j] += g * vc[j]
            li = lse[b, i]
            for j in range(npad):
                pj = fast_exp(p[j] - li)
                p[j] = pj
                ds[j] = pj * (ds[j] - delta)
            for j in range(n, npad):  # keys the query does not see, in its last block
                p[j] = zero
                ds[j] = zero
            for c in range(D):
                g, qc = gout[b, i, c], q[b, i, c] * sc
                kc, gvc, gkc = kt[c], gvt[c], gkt[c]
                acc = zero
                for j in range(npad):
                    gvc[j] += p[j] * g
                    gkc[j] += ds[j] * qc
                    acc += ds[j] * kc[j]
                gq[b, i, c] = acc
        for j in range(L):
            for c in range(D):
                gk[b, j, c] = gkt[c, j]
                gv[b, j, c] = gvt[c, j]
