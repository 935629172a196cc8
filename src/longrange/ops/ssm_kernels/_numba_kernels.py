"""The numba kernels of :mod:`longrange.ops.ssm_kernels.numba` (imported on first use; compiled once per
dtype and cached on disk by numba).

Layouts (C-contiguous; complex numbers as separate real and imaginary arrays of one floating dtype,
the compute dtype, except where float64 is named)::

    Vandermonde    d_re, d_im     (R, M)     exp(log_dA): one step of the powers
                   D_re, D_im     (R, M)     exp(block · log_dA) in float64: one block of steps
                   w_re, w_im     (J, R, M)  weights; row r of the modes serves every j
                   out, g         (J, R, L)  K[j, r, l] = Re sum_m W[j, r, m] exp(l · log_dA[r, m])
    Cauchy         v_re, v_im     (J, R, N)
                   z_re, z_im     (R, K)
                   w_re, w_im     (R, N)
                   out, g         (J, R, K)  sum_n v[j, r, n] / (z[r, k] - w[r, n])
                                             (+ conj(v) / (z - conj(w)) with conj_pairs)

Powers of the Vandermonde kernel come from a recurrence in the compute dtype, restarted every
``block`` positions from a seed carried in float64 (``seed <- seed · exp(block · log_dA)``), so
that no complex exponential is evaluated per term and the rounding error of a power stays that of
``block`` multiplications. Loops over the state (Vandermonde) or over the evaluation points
(Cauchy) are innermost and vectorised.

Every output element is written by exactly one task, and every sum has a fixed order: partial
sums across tasks go to separate slots that the caller adds up, so results do not depend on the
number of threads or on their timing (the backward passes are deterministic).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from longrange.ops._numba_common import FASTMATH, like, set_threads  # noqa: F401  (set_threads: this module's interface)

# --------------------------------------------------------------------------------------------
# Vandermonde
# --------------------------------------------------------------------------------------------


@njit(inline="always", fastmath=FASTMATH)
def _power_table(d_re, d_im, r, nt, t_re, t_im):  # pragma: no cover - compiled
    """``t[s, m] = d[r, m]^s`` for s < nt, by a recurrence in float64 (vectorised over m), stored
    in the dtype of ``t``."""
    M = d_re.shape[1]
    p_re = np.ones(M, dtype=np.float64)
    p_im = np.zeros(M, dtype=np.float64)
    for s in range(nt):
        for m in range(M):
            t_re[s, m] = p_re[m]
            t_im[s, m] = p_im[m]
            re = p_re[m] * d_re[r, m] - p_im[m] * d_im[r, m]
            p_im[m] = p_re[m] * d_im[r, m] + p_im[m] * d_re[r, m]
            p_re[m] = re


@njit(parallel=True, fastmath=FASTMATH, cache=True)
def vandermonde_forward(d_re, d_im, D_re, D_im, w_re, w_im, block, j_group, out):  # pragma: no cover - compiled
    """``out[j, r, l] = Re sum_m W[j, r, m] d[r, m]^l``; one task per (r, group of ``j_group`` rows j).

    With l = l0 + s (l0 a multiple of ``block``): d^l = d^l0 · d^s, so per block
    ``out[j, r, l0 + s] = Re sum_m (W d^l0)[m] T[m, s]`` with the table T[m, s] = d^s (s < block)
    made once per task, and d^l0 carried from block to block in float64
    (``d^(l0 + block) = d^l0 · D``). The inner loop runs over s, contiguous and vectorised.
    """
    J, R, M = w_re.shape
    L = out.shape[2]
    nt = min(block, L)
    groups = (J + j_group - 1) // j_group
    for task in prange(R * groups):
        r = task // groups
        j0 = (task % groups) * j_group
        j1 = min(J, j0 + j_group)
        tt_re = np.empty((nt, M), dtype=out.dtype)
        tt_im = np.empty((nt, M), dtype=out.dtype)
        _power_table(d_re, d_im, r, nt, tt_re, tt_im)
        t_re = np.ascontiguousarray(tt_re.T)  # (M, nt)
        t_im = np.ascontiguousarray(tt_im.T)
        seed_re = np.ones(M, dtype=np.float64)
        seed_im = np.zeros(M, dtype=np.float64)
        ws_re = np.empty(M, dtype=out.dtype)
        ws_im = np.empty(M, dtype=out.dtype)
        acc = np.empty(nt, dtype=out.dtype)
        for l0 in range(0, L, nt):
            n_here = min(L, l0 + nt) - l0
            for j in range(j0, j1):
                for m in range(M):  # W d^l0
                    wr = np.float64(w_re[j, r, m])
                    wi = np.float64(w_im[j, r, m])
                    ws_re[m] = wr * seed_re[m] - wi * seed_im[m]
                    ws_im[m] = wr * seed_im[m] + wi * seed_re[m]
                for s in range(nt):
                    acc[s] = like(0.0, out)
                for m in range(M):
                    a = ws_re[m]
                    b = ws_im[m]
                    for s in range(nt):
                        acc[s] += a * t_re[m, s] - b * t_im[m, s]
                for s in range(n_here):
                    out[j, r, l0 + s] = acc[s]
            for m in range(M):
                re = seed_re[m] * D_re[r, m] - seed_im[m] * D_im[r, m]
                seed_im[m] = seed_re[m] * D_im[r, m] + seed_im[m] * D_re[r, m]
                seed_re[m] = re


@njit(parallel=True, fastmath=FASTMATH, cache=True)
def vandermonde_backward(
    d_re, d_im, D_re, D_im, w_re, w_im, g, block, j_group, gw_re, gw_im, ga_re, ga_im
):  # pragma: no cover - compiled
    """Gradients of :func:`vandermonde_forward` for the output gradient ``g`` (J, R, L).

    ``gw`` (J, R, M) = sum_l g[j, r, l] conj(d^l); ``ga`` (R, groups, M): per task, the sum over
    its rows j of conj(W) sum_l l g conj(d^l) (the caller sums over the groups). Per block,
    U = sum_s g T[s] and V = sum_s s g T[s] in the compute dtype, then (in float64)
    gw += conj(d^l0 U) and the l-weighted sum += conj(d^l0 (l0 U + V)).
    """
    J, R, M = w_re.shape
    L = g.shape[2]
    nt = min(block, L)
    groups = (J + j_group - 1) // j_group
    for task in prange(R * groups):
        r = task // groups
        grp = task % groups
        j0 = grp * j_group
        j1 = min(J, j0 + j_group)
        t_re = np.empty((nt, M), dtype=g.dtype)
        t_im = np.empty((nt, M), dtype=g.dtype)
        _power_table(d_re, d_im, r, nt, t_re, t_im)
        seed_re = np.ones(M, dtype=np.float64)
        seed_im = np.zeros(M, dtype=np.float64)
        u_re = np.empty(M, dtype=g.dtype)
        u_im = np.empty(M, dtype=g.dtype)
        v_re = np.empty(M, dtype=g.dtype)
        v_im = np.empty(M, dtype=g.dtype)
        s0_re = np.zeros((j1 - j0, M), dtype=np.float64)  # sum_l g conj(d^l)
        s0_im = np.zeros((j1 - j0, M), dtype=np.float64)
        s1_re = np.zeros((j1 - j0, M), dtype=np.float64)  # sum_l l g conj(d^l)
        s1_im = np.zeros((j1 - j0, M), dtype=np.float64)
        for l0 in range(0, L, nt):
            n_here = min(L, l0 + nt) - l0
            for j in range(j0, j1):
                for m in range(M):
                    u_re[m] = like(0.0, g)
                    u_im[m] = like(0.0, g)
                    v_re[m] = like(0.0, g)
                    v_im[m] = like(0.0, g)
                for s in range(n_here):
                    gs = g[j, r, l0 + s]
                    sg = gs * s
                    for m in range(M):
                        u_re[m] += gs * t_re[s, m]
                        u_im[m] += gs * t_im[s, m]
                        v_re[m] += sg * t_re[s, m]
                        v_im[m] += sg * t_im[s, m]
                for m in range(M):
                    ur = np.float64(u_re[m])
                    ui = np.float64(u_im[m])
                    xr = l0 * ur + np.float64(v_re[m])
                    xi = l0 * ui + np.float64(v_im[m])
                    sr = seed_re[m]
                    si = seed_im[m]
                    # conj(seed * u), conj(seed * x)
                    s0_re[j - j0, m] += sr * ur - si * ui
                    s0_im[j - j0, m] -= sr * ui + si * ur
                    s1_re[j - j0, m] += sr * xr - si * xi
                    s1_im[j - j0, m] -= sr * xi + si * xr
            for m in range(M):
                re = seed_re[m] * D_re[r, m] - seed_im[m] * D_im[r, m]
                seed_im[m] = seed_re[m] * D_im[r, m] + seed_im[m] * D_re[r, m]
                seed_re[m] = re
        for m in range(M):
            ga_r = 0.0
            ga_i = 0.0
            for j in range(j0, j1):
                gw_re[j, r, m] = s0_re[j - j0, m]
                gw_im[j, r, m] = s0_im[j - j0, m]
                wr = np.float64(w_re[j, r, m])
                wi = np.float64(w_im[j, r, m])
                ga_r += wr * s1_re[j - j0, m] + wi * s1_im[j - j0, m]  # conj(W) * S1
                ga_i += wr * s1_im[j - j0, m] - wi * s1_re[j - j0, m]
            ga_re[r, grp, m] = ga_r
            ga_im[r, grp, m] = ga_i


# --------------------------------------------------------------------------------------------
# Cauchy
# --------------------------------------------------------------------------------------------


@njit(inline="always", fastmath=FASTMATH)
def _pole(zr, zi, wr, wi, one):  # pragma: no cover - compiled
    """ρ = 1/(z - w) for one point z = zr + i zi and pole w = wr + i wi, as (Re ρ, Im ρ)."""
    dr = zr - wr
    di = zi - wi
    inv = one / (dr * dr + di * di)
    return dr * inv, -di * inv


@njit(inline="always", fastmath=FASTMATH)
def _pole_pair(zr, zi, wr, wi, one):  # pragma: no cover - compiled
    """ρ = 1/(z - w) and σ = 1/(z - conj(w)) as (Re ρ, Im ρ, Re σ, Im σ), one division for both:
    1/q = q2/(q q2) and 1/q2 = q/(q q2) with q = |z - w|², q2 = |z - conj(w)|²."""
    dr = zr - wr
    di = zi - wi
    ei = zi + wi
    dr2 = dr * dr
    q = dr2 + di * di
    q2 = dr2 + ei * ei
    inv12 = one / (q * q2)
    inv = q2 * inv12
    inv2 = q * inv12
    return dr * inv, -di * inv, dr * inv2, -ei * inv2


@njit(inline="always", fastmath=FASTMATH)
def _mix(rr, ri, sr, si):  # pragma: no cover - compiled
    """(a, b, c, e) = (Re ρ + Re σ, Im σ - Im ρ, Im ρ + Im σ, Re ρ - Re σ) (see :func:`_resolvents`)."""
    return rr + sr, si - ri, ri + si, rr - sr


@njit(inline="always", fastmath=FASTMATH)
def _resolvents(zr, zi, wr, wi, conj_pairs, a, b, c, e):  # pragma: no cover - compiled
    """For the task's points z = zr + i zi (contiguous) and the pole w = wr + i wi, with
    ρ = 1/(z - w) and σ = 1/(z - conj(w)) (σ = 0 without ``conj_pairs``), the combinations
    a = Re ρ + Re σ, b = Im σ - Im ρ, c = Im ρ + Im σ, e = Re ρ - Re σ, so that
    ``v ρ + conj(v) σ = (vr a + vi b) + i (vr c + vi e)`` and
    ``g conj(ρ) + conj(g) σ = (gr a + gi c) + i (gi e + gr b)``."""
    one = like(1.0, a)
    zero = like(0.0, a)
    if conj_pairs:
        for k in range(zr.shape[0]):
            rr, ri, sr, si = _pole_pair(zr[k], zi[k], wr, wi, one)
            a[k], b[k], c[k], e[k] = _mix(rr, ri, sr, si)
    else:
        for k in range(zr.shape[0]):
            rr, ri = _pole(zr[k], zi[k], wr, wi, one)
            a[k], b[k], c[k], e[k] = _mix(rr, ri, zero, zero)


@njit(inline="always", fastmath=FASTMATH)
def _squared_resolvents(zr, zi, wr, wi, conj_pairs, a, b, c, e, a2, b2, c2, e2):  # pragma: no cover - compiled
    """:func:`_resolvents` of ρ, σ into (a, b, c, e) and of ρ², σ² into (a2, b2, c2, e2)."""
    one = like(1.0, a)
    two = like(2.0, a)
    zero = like(0.0, a)
    for k in range(zr.shape[0]):
        if conj_pairs:
            rr, ri, sr, si = _pole_pair(zr[k], zi[k], wr, wi, one)
        else:
            rr, ri = _pole(zr[k], zi[k], wr, wi, one)
            sr, si = zero, zero
        a[k], b[k], c[k], e[k] = _mix(rr, ri, sr, si)
        a2[k], b2[k], c2[k], e2[k] = _mix(rr * rr - ri * ri, two * rr * ri, sr * sr - si * si, two * sr * si)


@njit(inline="always")
def _row(x, r, k0, nk, dtype):  # pragma: no cover - compiled
    """``x[r, k0:k0 + nk]`` as a contiguous copy in ``dtype``."""
    out = np.empty(nk, dtype=dtype)
    for k in range(nk):
        out[k] = x[r, k0 + k]
    return out


@njit(parallel=True, fastmath=FASTMATH, cache=True)
def cauchy_forward(
    v_re, v_im, z_re, z_im, w_re, w_im, conj_pairs, k_block, out_re, out_im
):  # pragma: no cover - compiled
    """``out[j, r, k]``; one task per (r, block of ``k_block`` points), vectorised over the points.

    Computed in float64 whatever the inputs' dtype, the output rounded once: the resolvents of
    each pole (:func:`_resolvents` on float64 points), each term ``v ρ + conj(v) σ`` and the sums
    over the poles. Two vectors v[j] share a pass over the points (fewer loads of the resolvents)."""
    J, R, N = v_re.shape
    K = z_re.shape[1]
    blocks = (K + k_block - 1) // k_block
    for task in prange(R * blocks):
        r = task // blocks
        k0 = (task % blocks) * k_block
        nk = min(K, k0 + k_block) - k0
        zr = _row(z_re, r, k0, nk, np.float64)
        zi = _row(z_im, r, k0, nk, np.float64)
        a = np.empty(nk, dtype=np.float64)
        b = np.empty(nk, dtype=np.float64)
        c = np.empty(nk, dtype=np.float64)
        e = np.empty(nk, dtype=np.float64)
        acc_re = np.zeros((J, nk), dtype=np.float64)
        acc_im = np.zeros((J, nk), dtype=np.float64)
        for n in range(N):
            _resolvents(zr, zi, np.float64(w_re[r, n]), np.float64(w_im[r, n]), conj_pairs, a, b, c, e)
            j = 0
            while j + 4 <= J:  # four vectors per pass over the points: fewer loads of the resolvents
                vr0 = np.float64(v_re[j, r, n])
                vi0 = np.float64(v_im[j, r, n])
                vr1 = np.float64(v_re[j + 1, r, n])
                vi1 = np.float64(v_im[j + 1, r, n])
                vr2 = np.float64(v_re[j + 2, r, n])
                vi2 = np.float64(v_im[j + 2, r, n])
                vr3 = np.float64(v_re[j + 3, r, n])
                vi3 = np.float64(v_im[j + 3, r, n])
                re0 = acc_re[j]
                im0 = acc_im[j]
                re1 = acc_re[j + 1]
                im1 = acc_im[j + 1]
                re2 = acc_re[j + 2]
                im2 = acc_im[j + 2]
                re3 = acc_re[j + 3]
                im3 = acc_im[j + 3]
                for k in range(nk):
                    ak = a[k]
                    bk = b[k]
                    ck = c[k]
                    ek = e[k]
                    re0[k] += vr0 * ak + vi0 * bk
                    im0[k] += vr0 * ck + vi0 * ek
                    re1[k] += vr1 * ak + vi1 * bk
                    im1[k] += vr1 * ck + vi1 * ek
                    re2[k] += vr2 * ak + vi2 * bk
                    im2[k] += vr2 * ck + vi2 * ek
                    re3[k] += vr3 * ak + vi3 * bk
                    im3[k] += vr3 * ck + vi3 * ek
                j += 4
            while j < J:
                vr = np.float64(v_re[j, r, n])
                vi = np.float64(v_im[j, r, n])
                re = acc_re[j]
                im = acc_im[j]
                for k in range(nk):
                    re[k] += vr * a[k] + vi * b[k]
                    im[k] += vr * c[k] + vi * e[k]
                j += 1
        for j in range(J):
            for k in range(nk):
                out_re[j, r, k0 + k] = acc_re[j, k]
                out_im[j, r, k0 + k] = acc_im[j, k]


#: The dtype of the partial sums :func:`cauchy_backward` writes (the caller adds them up).
PARTIAL_SUM_DTYPE = np.float64


@njit(parallel=True, fastmath=FASTMATH, cache=True)
def cauchy_backward(
    v_re,
    v_im,
    z_re,
    z_im,
    w_re,
    w_im,
    g_re,
    g_im,
    conj_pairs,
    k_block,
    gv_re,
    gv_im,
    gw_re,
    gw_im,
    gz_re,
    gz_im,
):  # pragma: no cover - compiled
    """Gradients of :func:`cauchy_forward` for the output gradient ``g`` (J, R, K), PyTorch's
    convention for complex inputs (the gradient of a real loss is dL/dRe + i dL/dIm).

    Per task (r, block of points): ``gz`` (R, K) of its points in full; partial sums over its
    points of ``gv`` (blocks, J, R, N) and ``gw`` (blocks, R, N), float64, which the caller adds
    up::

        gv[j, r, n] = sum_k g conj(ρ) + conj(g) σ
        gw[r, n]    = sum_j conj(v[j, r, n]) sum_k g conj(ρ²) + conj(g) σ²
        gz[r, k]    = -sum_j g[j, r, k] conj(sum_n v ρ² + conj(v) σ²)

    Computed in float64 as the forward pass is, each result rounded once.
    """
    J, R, N = v_re.shape
    K = z_re.shape[1]
    blocks = (K + k_block - 1) // k_block
    for task in prange(R * blocks):
        r = task // blocks
        blk = task % blocks
        k0 = blk * k_block
        nk = min(K, k0 + k_block) - k0
        zr = _row(z_re, r, k0, nk, np.float64)
        zi = _row(z_im, r, k0, nk, np.float64)
        gr = np.empty((J, nk), dtype=np.float64)
        gi = np.empty((J, nk), dtype=np.float64)
        for j in range(J):
            for k in range(nk):
                gr[j, k] = g_re[j, r, k0 + k]
                gi[j, k] = g_im[j, r, k0 + k]
        a = np.empty(nk, dtype=np.float64)
        b = np.empty(nk, dtype=np.float64)
        c = np.empty(nk, dtype=np.float64)
        e = np.empty(nk, dtype=np.float64)
        a2 = np.empty(nk, dtype=np.float64)
        b2 = np.empty(nk, dtype=np.float64)
        c2 = np.empty(nk, dtype=np.float64)
        e2 = np.empty(nk, dtype=np.float64)
        t_re = np.zeros((J, nk), dtype=np.float64)  # sum_n v ρ² + conj(v) σ²
        t_im = np.zeros((J, nk), dtype=np.float64)
        for n in range(N):
            _squared_resolvents(
                zr, zi, np.float64(w_re[r, n]), np.float64(w_im[r, n]), conj_pairs, a, b, c, e, a2, b2, c2, e2
            )
            sw_re = 0.0
            sw_im = 0.0
            for j in range(J):
                vr = np.float64(v_re[j, r, n])
                vi = np.float64(v_im[j, r, n])
                grj = gr[j]
                gij = gi[j]
                tr = t_re[j]
                ti = t_im[j]
                yv_re = 0.0
                yv_im = 0.0
                yw_re = 0.0
                yw_im = 0.0
                for k in range(nk):
                    yv_re += grj[k] * a[k] + gij[k] * c[k]
                    yv_im += gij[k] * e[k] + grj[k] * b[k]
                    yw_re += grj[k] * a2[k] + gij[k] * c2[k]
                    yw_im += gij[k] * e2[k] + grj[k] * b2[k]
                    tr[k] += vr * a2[k] + vi * b2[k]
                    ti[k] += vr * c2[k] + vi * e2[k]
                gv_re[blk, j, r, n] = yv_re
                gv_im[blk, j, r, n] = yv_im
                sw_re += vr * yw_re + vi * yw_im  # conj(v) * yw
                sw_im += vr * yw_im - vi * yw_re
            gw_re[blk, r, n] = sw_re
            gw_im[blk, r, n] = sw_im
        gzr = np.zeros(nk, dtype=np.float64)
        gzi = np.zeros(nk, dtype=np.float64)
        for j in range(J):
            grj = gr[j]
            gij = gi[j]
            tr = t_re[j]
            ti = t_im[j]
            for k in range(nk):  # -g conj(t)
                gzr[k] -= grj[k] * tr[k] + gij[k] * ti[k]
                gzi[k] -= gij[k] * tr[k] - grj[k] * ti[k]
        for k in range(nk):
            gz_re[r, k0 + k] = gzr[k]
            gz_im[r, k0 + k] = gzi[k]
