"""The numba kernels of the (gated) delta rule and of gated linear attention on CPUs
(:mod:`longrange.ops.matrix_state.numba`, ``impl="numba"``; SSD runs GLA's), imported on first use.
The delta rule's are described here; GLA's (the same layouts, ``g`` of shape (B, L, H, dk), or
(B, L, H, 1) for one decay per head) beside them below.

Layouts (all C-contiguous, one floating dtype; row vectors as in :mod:`.delta_rule`)::

    q, k, dq, dk     (B, L, H, dk)
    v, o, dv, do     (B, L, H, dv)
    beta, g, ...     (B, L, H)          g: log-decays, read only when ``gated``
    normalize        q and k are L2-normalised per row first (x / max(||x||, EPS), as
                     :func:`~longrange.ops.matrix_state.common.normalize_qk`), and their gradients
                     pass back through it
    S0, S, dS        (B, H, dk, dv)     states: o_t = scale q_t S_t
    ckpt             (B, H, NC, dk, dv) the state entering each span of ``span`` positions

One task per (sequence, head) runs the recurrence of :mod:`.delta_rule` position by position, its
(dk, dv) state in a local array (a few hundred bytes to a few kilobytes at the small models' widths:
in the first-level cache), the inner loops over the dv features, contiguous in memory::

    a = exp(g_t)  (1 ungated),   r = v_t - a k_t S,   u = beta_t r,
    S <- a S + k_t^T u,          o_t = scale q_t S

The forward keeps the state entering every span of ``span`` positions; the backward walks the spans
from the last, recomputes the states of one span from its checkpoint into a local buffer (with its
``r`` and ``u``), then goes back through its positions with the state's gradient ``dS``::

    dq  = scale do S_t^T,  dS += scale q^T do
    du  = k dS,  dk = dS u^T,  dbeta = du . r,  dv = beta du,  dks = -beta du
    dk += a dks S_{t-1}^T,  dS' = dS + k^T dks,  dg = a <dS', S_{t-1}>,  dS <- a dS'

so the backward stores nothing per position and its memory is the checkpoints and one span's
states.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from longrange.ops._numba_common import ERROR_MODEL, FASTMATH, like, set_threads  # noqa: F401  (set_threads: this module's interface)
from longrange.ops.matrix_state.common import QK_NORM_EPS as EPS


@njit(inline="always")
def _load(x, b, t, h, normalize, eps, out):  # pragma: no cover - compiled
    """Row ``x[b, t, h]`` into ``out``, divided by max(its norm, eps) when ``normalize``; returns the
    norm (the divisor's argument), or 1 when not normalising."""
    n = x.shape[3]
    total = like(0.0, x)
    for i in range(n):
        xi = x[b, t, h, i]
        out[i] = xi
        total += xi * xi
    if not normalize:
        return like(1.0, x)
    norm = like(math.sqrt(total), x)
    inv = like(1.0, x) / max(norm, eps)
    for i in range(n):
        out[i] *= inv
    return norm


@njit(inline="always")
def _store_grad(dx, b, t, h, normalize, eps, norm, y, gy):  # pragma: no cover - compiled
    """``dx[b, t, h]`` from the gradient ``gy`` of ``y = x / max(norm, eps)`` (``gy`` itself when not
    normalising): ``(gy - y (y . gy)) / norm`` above ``eps``, ``gy / eps`` at or below it."""
    n = dx.shape[3]
    if not normalize:
        for i in range(n):
            dx[b, t, h, i] = gy[i]
        return
    if norm <= eps:
        for i in range(n):
            dx[b, t, h, i] = gy[i] / eps
        return
    dot = like(0.0, y)
    for i in range(n):
        dot += y[i] * gy[i]
    inv = like(1.0, y) / norm
    for i in range(n):
        dx[b, t, h, i] = (gy[i] - y[i] * dot) * inv


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def delta_forward(q, k, v, beta, g, gated, normalize, scale, S0, span, o, S_out, ckpt):  # pragma: no cover - compiled
    B, L, H, dk = q.shape
    dv = v.shape[3]
    zero, one = like(0.0, q), like(1.0, q)
    scale = like(scale, q)  # a Python float arrives as float64: keep float32 arithmetic in float32
    eps = like(EPS, q)
    for task in prange(B * H):
        b, h = task // H, task % H
        S = S0[b, h].copy()
        u = np.empty(dv, dtype=q.dtype)
        qt = np.empty(dk, dtype=q.dtype)
        kt = np.empty(dk, dtype=q.dtype)
        for t in range(L):
            if t % span == 0:
                ckpt[b, h, t // span] = S
            _load(q, b, t, h, normalize, eps, qt)
            _load(k, b, t, h, normalize, eps, kt)
            vt, ot = v[b, t, h], o[b, t, h]
            bt = beta[b, t, h]
            a = like(math.exp(g[b, t, h]), q) if gated else one
            for j in range(dv):
                u[j] = zero
            for i in range(dk):
                ki = kt[i]
                for j in range(dv):
                    u[j] += ki * S[i, j]
            for j in range(dv):
                u[j] = bt * (vt[j] - a * u[j])
                ot[j] = zero
            for i in range(dk):
                ki, qi = kt[i], scale * qt[i]
                for j in range(dv):
                    s = a * S[i, j] + ki * u[j]
                    S[i, j] = s
                    ot[j] += qi * s
        S_out[b, h] = S


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def delta_backward(
    q, k, v, beta, g, gated, normalize, scale, ckpt, span, do, dS_out, dq, dk_, dv_, dbeta, dg, dS0
):  # pragma: no cover - compiled
    B, L, H, dk = q.shape
    dv = v.shape[3]
    spans = ckpt.shape[2]
    zero, one = like(0.0, q), like(1.0, q)
    scale = like(scale, q)
    eps = like(EPS, q)
    for task in prange(B * H):
        b, h = task // H, task % H
        dS = dS_out[b, h].copy()
        states = np.empty((span + 1, dk, dv), dtype=q.dtype)  # states[n]: the state before position t0 + n
        R = np.empty((span, dv), dtype=q.dtype)  # r = v - a k S_{t-1}
        U = np.empty((span, dv), dtype=q.dtype)  # u = beta r
        du = np.empty(dv, dtype=q.dtype)
        dks = np.empty(dv, dtype=q.dtype)
        qt = np.empty(dk, dtype=q.dtype)
        kt = np.empty(dk, dtype=q.dtype)
        gq = np.empty(dk, dtype=q.dtype)
        gk = np.empty(dk, dtype=q.dtype)
        for c in range(spans - 1, -1, -1):
            t0 = c * span
            t1 = min(L, t0 + span)
            states[0] = ckpt[b, h, c]
            for t in range(t0, t1):  # the span's states again
                n = t - t0
                _load(k, b, t, h, normalize, eps, kt)
                vt, S, Snext = v[b, t, h], states[n], states[n + 1]
                bt = beta[b, t, h]
                a = like(math.exp(g[b, t, h]), q) if gated else one
                r, u = R[n], U[n]
                for j in range(dv):
                    r[j] = zero
                for i in range(dk):
                    ki = kt[i]
                    for j in range(dv):
                        r[j] += ki * S[i, j]
                for j in range(dv):
                    r[j] = vt[j] - a * r[j]
                    u[j] = bt * r[j]
                for i in range(dk):
                    ki = kt[i]
                    for j in range(dv):
                        Snext[i, j] = a * S[i, j] + ki * u[j]
            for t in range(t1 - 1, t0 - 1, -1):
                n = t - t0
                qnorm = _load(q, b, t, h, normalize, eps, qt)
                knorm = _load(k, b, t, h, normalize, eps, kt)
                dot = do[b, t, h]
                Sprev, St, r, u = states[n], states[n + 1], R[n], U[n]
                bt = beta[b, t, h]
                a = like(math.exp(g[b, t, h]), q) if gated else one
                for j in range(dv):
                    du[j] = zero
                for i in range(dk):
                    sq, ki = scale * qt[i], kt[i]
                    acc_q, acc_k = zero, zero
                    for j in range(dv):
                        acc_q += dot[j] * St[i, j]
                        d = dS[i, j] + sq * dot[j]
                        dS[i, j] = d
                        du[j] += ki * d
                        acc_k += d * u[j]
                    gq[i] = scale * acc_q
                    gk[i] = acc_k
                db = zero
                dvt = dv_[b, t, h]
                for j in range(dv):
                    db += du[j] * r[j]
                    dvt[j] = bt * du[j]
                    dks[j] = -bt * du[j]
                dbeta[b, t, h] = db
                da = zero
                for i in range(dk):
                    ki = kt[i]
                    acc = zero
                    for j in range(dv):
                        sp = Sprev[i, j]
                        acc += dks[j] * sp
                        d = dS[i, j] + ki * dks[j]
                        da += d * sp
                        dS[i, j] = a * d
                    gk[i] += a * acc
                if gated:
                    dg[b, t, h] = a * da
                _store_grad(dq, b, t, h, normalize, eps, qnorm, qt, gq)
                _store_grad(dk_, b, t, h, normalize, eps, knorm, kt, gk)
        dS0[b, h] = dS


# ----------------------------------------------------------------------------------------------
# Gated linear attention: S <- diag(exp(g_t)) S + k_t^T v_t,  o_t = scale q_t S
#
# g (B, L, H, dk) as q and k, or (B, L, H, 1): one decay for every row (SSD's scalar decay, whose dg
# is then the sum over the rows). Backward per position, from the last, with dS the gradient of S_t:
#     dS += scale q^T do,  dq = scale do S_t^T,  dk = dS v^T,  dv = k dS,
#     dg_i = a_i <dS_i, S_{t-1, i}>,  dS_i <- a_i dS_i   (row i of the state, a_i = exp(g_t, i))


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def gla_forward(q, k, v, g, scale, S0, span, o, S_out, ckpt):  # pragma: no cover - compiled
    B, L, H, dk = q.shape
    dv = v.shape[3]
    zero = like(0.0, q)
    scale = like(scale, q)
    per_row = g.shape[3] > 1
    for task in prange(B * H):
        b, h = task // H, task % H
        S = S0[b, h].copy()
        for t in range(L):
            if t % span == 0:
                ckpt[b, h, t // span] = S
            vt, ot = v[b, t, h], o[b, t, h]
            for j in range(dv):
                ot[j] = zero
            a = like(math.exp(g[b, t, h, 0]), q)
            for i in range(dk):
                if per_row:
                    a = like(math.exp(g[b, t, h, i]), q)
                ki, qi = k[b, t, h, i], scale * q[b, t, h, i]
                for j in range(dv):
                    s = a * S[i, j] + ki * vt[j]
                    S[i, j] = s
                    ot[j] += qi * s
        S_out[b, h] = S


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def gla_backward(q, k, v, g, scale, ckpt, span, do, dS_out, dq, dk_, dv_, dg, dS0):  # pragma: no cover - compiled
    B, L, H, dk = q.shape
    dv = v.shape[3]
    spans = ckpt.shape[2]
    zero = like(0.0, q)
    scale = like(scale, q)
    per_row = g.shape[3] > 1
    for task in prange(B * H):
        b, h = task // H, task % H
        dS = dS_out[b, h].copy()
        states = np.empty((span + 1, dk, dv), dtype=q.dtype)  # states[n]: the state before position t0 + n
        for c in range(spans - 1, -1, -1):
            t0 = c * span
            t1 = min(L, t0 + span)
            states[0] = ckpt[b, h, c]
            for t in range(t0, t1):
                n = t - t0
                vt, S, Snext = v[b, t, h], states[n], states[n + 1]
                a = like(math.exp(g[b, t, h, 0]), q)
                for i in range(dk):
                    if per_row:
                        a = like(math.exp(g[b, t, h, i]), q)
                    ki = k[b, t, h, i]
                    for j in range(dv):
                        Snext[i, j] = a * S[i, j] + ki * vt[j]
            for t in range(t1 - 1, t0 - 1, -1):
                n = t - t0
                vt, dot, dvt = v[b, t, h], do[b, t, h], dv_[b, t, h]
                Sprev, St = states[n], states[n + 1]
                for j in range(dv):
                    dvt[j] = zero
                a = like(math.exp(g[b, t, h, 0]), q)
                dg_all = zero
                for i in range(dk):
                    if per_row:
                        a = like(math.exp(g[b, t, h, i]), q)
                    ki, sq = k[b, t, h, i], scale * q[b, t, h, i]
                    acc_q, acc_k, acc_g = zero, zero, zero
                    for j in range(dv):
                        acc_q += dot[j] * St[i, j]
                        d = dS[i, j] + sq * dot[j]
                        acc_k += d * vt[j]
                        dvt[j] += ki * d
                        acc_g += d * Sprev[i, j]
                        dS[i, j] = a * d
                    dq[b, t, h, i] = scale * acc_q
                    dk_[b, t, h, i] = acc_k
                    if per_row:
                        dg[b, t, h, i] = a * acc_g
                    else:
                        dg_all += acc_g
                if not per_row:
                    dg[b, t, h, 0] = a * dg_all
        dS0[b, h] = dS
