"""The numba kernels of RWKV-4's WKV on CPUs (:mod:`longrange.ops.wkv.numba`, ``impl="numba"``),
imported on first use.

Layouts (C-contiguous, one floating dtype; ``mask`` uint8)::

    w, u                  (D,)       decay rates (> 0) and bonuses
    k, v, y, gy, gk, gv   (B, L, D)
    mask                  (B, L)     1 at real positions
    gw_rows, gu_rows      (B, D)     each sequence's share of w's and u's gradients (summed by the caller)

Each task is one sequence; the inner loops run over its D channels, contiguous in memory. With
N_t, D_t the sums of :mod:`longrange.ops.wkv` after position t (N_t = exp(-w) N_{t-1} + m_t e^{k_t}
v_t), ``Z_t = D_{t-1} + e^{u + k_t}`` and ``g_t`` the output's gradient:

* forward: the v4 recurrence, the sums kept as ``exp(o) (P, Q)`` with o their running maximum;
* backward, a forward sweep: recomputes y_t and 1/Z_t (as ``iden_t exp(-top_t)``), adds the direct
  gradients ``g_t e^{u+k_t} (v_t - y_t) / Z_t`` (to k_t and u) and ``g_t e^{u+k_t} / Z_t`` (to v_t),
  and w's ``g_t (dN_{t-1}/dw - y_t dD_{t-1}/dw) / Z_t`` by carrying the sums' derivatives in w
  (``dN_t/dw = exp(-w) (dN_{t-1}/dw - N_{t-1})``) at the sums' scale;
* backward, a reverse sweep: the sums' adjoints ``GN_t = Σ_{s>t} exp(-(s-1-t) w) g_s / Z_s`` and
  ``GD_t`` (the same with ``-g_s y_s``), kept at their own running maximum r, give k_t's and v_t's
  gradients through the sums, ``m_t e^{k_t} (v_t GN_t + GD_t)`` and ``m_t e^{k_t} GN_t``
  (``k_t + r_t <= 0``: no overflow).

An empty sum has the scale :data:`EMPTY` (-1e38, finite: every exponential of it is 0).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from longrange.ops._numba_common import ERROR_MODEL, FASTMATH, like, set_threads  # noqa: F401  (set_threads: this module's interface)
from longrange.ops.scan._numba_kernels import fast_exp

#: The scale of an empty sum.
EMPTY = -1e38


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def wkv_forward(w, u, k, v, mask, y, num, den, scale):  # pragma: no cover - compiled
    B, L, D = k.shape
    empty = like(EMPTY, k)
    for b in prange(B):
        P = np.zeros(D, k.dtype)
        Q = np.zeros(D, k.dtype)
        o = np.full(D, empty, k.dtype)
        for t in range(L):
            kt, vt, yt = k[b, t], v[b, t], y[b, t]
            for d in range(D):
                bonus = u[d] + kt[d]
                top = max(o[d], bonus)
                a = fast_exp(o[d] - top)
                e = fast_exp(bonus - top)
                yt[d] = (a * P[d] + e * vt[d]) / (a * Q[d] + e)
            if mask[b, t]:
                for d in range(D):
                    new = max(o[d] - w[d], kt[d])
                    a = fast_exp(o[d] - w[d] - new)
                    e = fast_exp(kt[d] - new)
                    P[d] = a * P[d] + e * vt[d]
                    Q[d] = a * Q[d] + e
                    o[d] = new
            else:
                for d in range(D):
                    o[d] = max(o[d] - w[d], empty)
        num[b] = P
        den[b] = Q
        scale[b] = o


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def wkv_backward(w, u, k, v, mask, gy, gk, gv, gw_rows, gu_rows):  # pragma: no cover - compiled
    B, L, D = k.shape
    empty = like(EMPTY, k)
    for b in prange(B):
        ys = np.empty((L, D), k.dtype)
        idens = np.empty((L, D), k.dtype)
        tops = np.empty((L, D), k.dtype)
        P = np.zeros(D, k.dtype)
        Q = np.zeros(D, k.dtype)
        dP = np.zeros(D, k.dtype)
        dQ = np.zeros(D, k.dtype)
        o = np.full(D, empty, k.dtype)
        gw = np.zeros(D, k.dtype)
        gu = np.zeros(D, k.dtype)
        for t in range(L):
            kt, vt, gt, gkt, gvt = k[b, t], v[b, t], gy[b, t], gk[b, t], gv[b, t]
            for d in range(D):
                bonus = u[d] + kt[d]
                top = max(o[d], bonus)
                a = fast_exp(o[d] - top)
                e = fast_exp(bonus - top)
                iden = 1 / (a * Q[d] + e)
                yd = (a * P[d] + e * vt[d]) * iden
                ys[t, d], idens[t, d], tops[t, d] = yd, iden, top
                g = gt[d] * iden
                direct = g * e * (vt[d] - yd)
                gkt[d] = direct
                gvt[d] = g * e
                gu[d] += direct
                gw[d] += g * a * (dP[d] - yd * dQ[d])
            if mask[b, t]:
                for d in range(D):
                    new = max(o[d] - w[d], kt[d])
                    a = fast_exp(o[d] - w[d] - new)
                    e = fast_exp(kt[d] - new)
                    dP[d] = a * (dP[d] - P[d])
                    dQ[d] = a * (dQ[d] - Q[d])
                    P[d] = a * P[d] + e * vt[d]
                    Q[d] = a * Q[d] + e
                    o[d] = new
            else:
                for d in range(D):
                    dP[d] -= P[d]
                    dQ[d] -= Q[d]
                    o[d] = max(o[d] - w[d], empty)
        gw_rows[b] = gw
        gu_rows[b] = gu
        GN = np.zeros(D, k.dtype)
        GD = np.zeros(D, k.dtype)
        r = np.full(D, empty, k.dtype)
        for t in range(L - 1, -1, -1):
            kt, vt, gt, gkt, gvt = k[b, t], v[b, t], gy[b, t], gk[b, t], gv[b, t]
            if mask[b, t]:
                for d in range(D):
                    f = fast_exp(kt[d] + r[d])
                    gkt[d] += f * (vt[d] * GN[d] + GD[d])
                    gvt[d] += f * GN[d]
            for d in range(D):
                c = gt[d] * idens[t, d]
                new = max(r[d] - w[d], -tops[t, d])
                a = fast_exp(r[d] - w[d] - new)
                e = fast_exp(-tops[t, d] - new) * c
                GN[d] = a * GN[d] + e
                GD[d] = a * GD[d] - e * ys[t, d]
                r[d] = new
