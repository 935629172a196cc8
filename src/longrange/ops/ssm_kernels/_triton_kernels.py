"""Triton kernels of :mod:`longrange.ops.ssm_kernels.triton` (imported only when triton is).

Layouts are those of :mod:`longrange.ops.ssm_kernels._numba_kernels` (contiguous; complex numbers as
separate real and imaginary arrays), with the modes of the Vandermonde kernel in float64::

    Vandermonde    a_re, a_im (R, M) float64; w_re, w_im (J, R, M); out, g (J, R, L)
    Cauchy         v (J, R, N); z (R, K); w (R, N); out, g (J, R, K)

Vandermonde: a program computes a tile of BLOCK_L positions from l0 for a block of weight rows;
the powers are exp(l0 · a) (in float64: the phase l0 · Im a is large) times exp(s · a) for
s < BLOCK_L (in the compute dtype), so their accuracy does not degrade with the length. The
backward program owns a block of rows and modes and walks along the length, recomputing the
powers tile by tile.

Cauchy: a program owns a row r, a block of evaluation points and a block of vectors v[j] (forward,
gradient of z) and loops over the poles one at a time, or a block of poles and every vector
(gradients of v and w) and loops over the points in tiles, recomputing the resolvents 1/(z - w)
(and 1/(z - conj(w))). Their arithmetic is compensated (see the Cauchy section).

No atomics: every output element is written by one program; the gradient of the Vandermonde
modes is summed over row blocks by the caller. The backward passes are therefore deterministic.

As for the selective scan's Triton kernels, the kernels are plain functions that use Triton's
builtins and the device functions of this module only; :func:`kernels` wraps them, device
functions included, for compilation (``JITFunction``) or for Triton's CPU interpreter
(``InterpretedFunction``), and plain sums are ``tl.reduce(x, axis, _SUM)``.
"""

import types

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction


def _add_fn(a, b):
    return a + b


_SUM = getattr(tl.standard, "_sum_combine", None)
if not isinstance(_SUM, JITFunction):
    _SUM = JITFunction(_add_fn)


# --------------------------------------------------------------------------------------------
# Device functions shared by the kernels (bound to each kernel's mode by :func:`kernels`)
# --------------------------------------------------------------------------------------------


def _seed(l0, ar, ai, ACC: tl.constexpr):
    """exp(l0 · a) for the modes a = ar + i ai (float64), computed in float64 (the phase l0 · ai
    is large), returned in the compute dtype."""
    start = tl.full(ar.shape, 0.0, tl.float64) + l0
    mag = tl.exp(start * ar)
    return (mag * tl.cos(start * ai)).to(ACC), (mag * tl.sin(start * ai)).to(ACC)


def _powers_at(sf, ar, ai, ACC: tl.constexpr):
    """exp(s · a) for the positions ``sf`` (a float64 column) and the modes a = ar + i ai (float64):
    the phase s · ai reduced modulo 2π in float64 (where it is exact), then the exponential, cosine
    and sine in the compute dtype."""
    two_pi = tl.full((1, 1), 6.283185307179586, tl.float64)
    phase = sf * ai[None, :]
    phase = phase - two_pi * tl.floor(phase / two_pi + 0.5)
    mag = tl.exp((sf * ar[None, :]).to(ACC))
    angle = phase.to(ACC)
    return mag * tl.cos(angle), mag * tl.sin(angle)


def _local_powers(ar, ai, BLOCK_L: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, ACC: tl.constexpr):
    """exp(s · a) for s < BLOCK_L, tiles (BLOCK_L, BLOCK_M) in the compute dtype, as the products
    exp(BLOCK_S · q · a) exp(t · a) (s = BLOCK_S q + t, t < BLOCK_S) of two small tables of
    :func:`_powers_at` (a few ulp whatever the phase; three elementary functions per table entry,
    not per power)."""
    t = tl.arange(0, BLOCK_S).to(tl.float64)[:, None]
    q = (tl.arange(0, BLOCK_L // BLOCK_S) * BLOCK_S).to(tl.float64)[:, None]
    t_re, t_im = _powers_at(t, ar, ai, ACC)  # (BLOCK_S, BLOCK_M)
    q_re, q_im = _powers_at(q, ar, ai, ACC)  # (BLOCK_L / BLOCK_S, BLOCK_M)
    p_re = q_re[:, None, :] * t_re[None, :, :] - q_im[:, None, :] * t_im[None, :, :]
    p_im = q_re[:, None, :] * t_im[None, :, :] + q_im[:, None, :] * t_re[None, :, :]
    return tl.reshape(p_re, (BLOCK_L, BLOCK_M)), tl.reshape(p_im, (BLOCK_L, BLOCK_M))


def _add(total, lost, x):
    """Compensated (Kahan) summation: ``x`` added to ``total``, whose rounding errors so far are
    ``-lost``; returns the new (total, lost). The sum is ``total - lost``. Used to add up the
    sums of successive tiles, so that a long loop over tiles adds no error growing with its length."""
    y = x - lost
    t = total + y
    return t, (t - total) - y


def _two_sum(a, b):
    """(s, e) with s = a + b rounded and s + e = a + b exactly, whatever the magnitudes (Knuth's
    TwoSum; the kernels that use it run without contraction into multiply-adds, see
    :mod:`longrange.ops.ssm_kernels.triton`)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _add2(hi, lo, x):
    """``x`` added to the pair (hi, lo) whose sum hi + lo is a running sum: hi takes the rounded
    sum, lo collects every rounding error (Neumaier's compensated summation)."""
    s, e = _two_sum(hi, x)
    return s, lo + e


def _reciprocal(xr, xr_lo, xi, xi_lo, ok):
    """1/x for x = (xr + xr_lo) + i (xi + xi_lo), as (re, re_lo, im, im_lo) with re + re_lo and
    im + im_lo the parts of 1/x to about twice the compute dtype's precision; 0 where ``ok`` is
    false. |x|² is summed with the exact errors of its products (fma) and of its sum (the larger
    square first), and the reciprocal 1/|x|² is corrected by one Newton step from its exact
    residual 1 - |x|² (1/|x|²) (one fma), so that the result does not depend on the division's
    accuracy (an approximate division on GPUs); the products conj(x)/|x|² keep their errors too."""
    s1 = xr * xr
    s2 = xi * xi
    big = tl.maximum(s1, s2)
    small = tl.minimum(s1, s2)
    q = big + small
    q_lo = (small - (q - big)) + (tl.fma(xr, xr, -s1) + tl.fma(xi, xi, -s2)) + 2.0 * (xr * xr_lo + xi * xi_lo)
    q = tl.where(ok, q, 1.0)
    inv = 1.0 / q
    inv_lo = tl.where(ok, inv * (tl.fma(-q, inv, 1.0) - q_lo * inv), 0.0)
    inv = tl.where(ok, inv, 0.0)
    re = xr * inv
    re_lo = tl.fma(xr, inv, -re) + (xr * inv_lo + xr_lo * inv)
    im = xi * inv
    im_lo = tl.fma(xi, inv, -im) + (xi * inv_lo + xi_lo * inv)
    return re, re_lo, -im, -im_lo


def _resolvents(zr, zi, wr, wi, ok, CONJ: tl.constexpr):
    """ρ = 1/(z - w) and σ = 1/(z - conj(w)) (σ = 0 without conjugate pairs) on broadcast
    points and poles, each part as a pair (hi, lo) (see :func:`_reciprocal`; the differences
    z - w are exact pairs too): (ρr, ρr_lo, ρi, ρi_lo, σr, σr_lo, σi, σi_lo); 0 where ``ok`` is
    false."""
    dr, dr_lo = _two_sum(zr, -wr)
    di, di_lo = _two_sum(zi, -wi)
    rr, rr_lo, ri, ri_lo = _reciprocal(dr, dr_lo, di, di_lo, ok)
    if CONJ:
        ei, ei_lo = _two_sum(zi, wi)
        sr, sr_lo, si, si_lo = _reciprocal(dr, dr_lo, ei, ei_lo, ok)
    else:
        sr = rr * 0.0
        sr_lo, si, si_lo = sr, sr, sr
    return rr, rr_lo, ri, ri_lo, sr, sr_lo, si, si_lo


def _square2(re, re_lo, im, im_lo):
    """The square of (re + re_lo) + i (im + im_lo) as pairs (re, re_lo, im, im_lo) (products and
    difference with their exact errors)."""
    p = re * re
    m = im * im
    s, e = _two_sum(p, -m)
    s_lo = e + ((tl.fma(re, re, -p) - tl.fma(im, im, -m)) + 2.0 * (re * re_lo - im * im_lo))
    t = re * im
    t_lo = tl.fma(re, im, -t) + (re * im_lo + im * re_lo)
    return s, s_lo, 2.0 * t, 2.0 * t_lo


def _round_sum(x, x_lo, y, y_lo):
    """(x + x_lo) + (y + y_lo) rounded once to the compute dtype (within its rounding)."""
    s, e = _two_sum(x, y)
    return s + (e + (x_lo + y_lo))


def _mix(rr, rr_lo, ri, ri_lo, sr, sr_lo, si, si_lo):
    """(a, b, c, e) = (Re ρ + Re σ, Im σ - Im ρ, Im ρ + Im σ, Re ρ - Re σ) (see the Cauchy
    section), each rounded once from the pairs of ρ and σ."""
    a = _round_sum(rr, rr_lo, sr, sr_lo)
    b = _round_sum(si, si_lo, -ri, -ri_lo)
    c = _round_sum(ri, ri_lo, si, si_lo)
    e = _round_sum(rr, rr_lo, -sr, -sr_lo)
    return a, b, c, e


def _mix_squares(rr, rr_lo, ri, ri_lo, sr, sr_lo, si, si_lo):
    """(a2, b2, c2, e2): :func:`_mix` of ρ² and σ²."""
    p = _square2(rr, rr_lo, ri, ri_lo)
    q = _square2(sr, sr_lo, si, si_lo)
    return _mix(p[0], p[1], p[2], p[3], q[0], q[1], q[2], q[3])


def _pole_sums(
    v_re_ptr,
    v_im_ptr,
    w_re_ptr,
    w_im_ptr,
    zr,
    zi,
    k_ok,
    js,
    j_ok,
    r,
    R,
    N,
    SQUARED: tl.constexpr,
    CONJ: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ACC: tl.constexpr,
):
    """sum_n v ρ + conj(v) σ (with ``SQUARED``: v ρ² + conj(v) σ²) over the poles of row r, one
    pole at a time, for the vectors ``js`` at the points zr + i zi (a (BLOCK_J, BLOCK_K) tile):
    the real and imaginary parts as compensated pairs (re, re_lo, im, im_lo)."""
    zero = tl.full((BLOCK_J, BLOCK_K), 0.0, ACC)
    re, re_lo, im, im_lo = zero, zero, zero, zero
    for n in range(0, N):
        wr = tl.load(w_re_ptr + r * N + n).to(ACC)
        wi = tl.load(w_im_ptr + r * N + n).to(ACC)
        pair = _resolvents(zr, zi, wr, wi, k_ok, CONJ)
        if SQUARED:
            a, b, c, e = _mix_squares(*pair)
        else:
            a, b, c, e = _mix(*pair)
        v_off = (js * R + r) * N + n
        vr = tl.load(v_re_ptr + v_off, mask=j_ok, other=0.0).to(ACC)[:, None]
        vi = tl.load(v_im_ptr + v_off, mask=j_ok, other=0.0).to(ACC)[:, None]
        re, re_lo = _add2(re, re_lo, tl.fma(vr, a[None, :], vi * b[None, :]))
        im, im_lo = _add2(im, im_lo, tl.fma(vr, c[None, :], vi * e[None, :]))
    return re, re_lo, im, im_lo


def _sum_last(hi, lo, A: tl.constexpr, B: tl.constexpr, LEVELS: tl.constexpr):
    """The sum over the last axis of a tile (A, B, 2**LEVELS) of pairs hi + lo, by a pairwise tree
    of compensated additions, rounded once: a tile (A, B)."""
    for i in tl.static_range(LEVELS):
        a, b = tl.split(tl.reshape(hi, (A, B, 1 << (LEVELS - 1 - i), 2)))
        a_lo, b_lo = tl.split(tl.reshape(lo, (A, B, 1 << (LEVELS - 1 - i), 2)))
        hi, e = _two_sum(a, b)
        lo = (a_lo + b_lo) + e
    return tl.reshape(hi + lo, (A, B))


_HELPERS = {
    f.__name__: f
    for f in (
        _seed,
        _powers_at,
        _local_powers,
        _add,
        _two_sum,
        _add2,
        _reciprocal,
        _resolvents,
        _square2,
        _round_sum,
        _mix,
        _mix_squares,
        _pole_sums,
        _sum_last,
    )
}


# --------------------------------------------------------------------------------------------
# Vandermonde
# --------------------------------------------------------------------------------------------


def _vandermonde_fwd(
    a_re_ptr,
    a_im_ptr,
    w_re_ptr,
    w_im_ptr,
    out_ptr,
    J,
    R,
    M,
    L,
    BLOCK_J: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr,
    ACC: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    js = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    l0 = tl.program_id(2) * BLOCK_L
    s = tl.arange(0, BLOCK_L)
    j_ok = js < J
    l_ok = (l0 + s) < L
    acc = tl.full((BLOCK_J, BLOCK_L), 0.0, ACC)
    lost = tl.full((BLOCK_J, BLOCK_L), 0.0, ACC)
    for m0 in range(0, M, BLOCK_M):
        ms = m0 + tl.arange(0, BLOCK_M)
        m_ok = ms < M
        ar = tl.load(a_re_ptr + r * M + ms, mask=m_ok, other=0.0)
        ai = tl.load(a_im_ptr + r * M + ms, mask=m_ok, other=0.0)
        seed_re, seed_im = _seed(l0, ar, ai, ACC)  # exp(l0 a)
        loc_re, loc_im = _local_powers(ar, ai, BLOCK_L, BLOCK_M, BLOCK_S, ACC)  # exp(s a), s < BLOCK_L
        p_re = seed_re[None, :] * loc_re - seed_im[None, :] * loc_im  # (BLOCK_L, BLOCK_M)
        p_im = seed_re[None, :] * loc_im + seed_im[None, :] * loc_re
        m2 = j_ok[:, None] & m_ok[None, :]
        w_off = (js[:, None] * R + r) * M + ms[None, :]
        wr = tl.load(w_re_ptr + w_off, mask=m2, other=0.0).to(ACC)
        wi = tl.load(w_im_ptr + w_off, mask=m2, other=0.0).to(ACC)
        term = wr[:, None, :] * p_re[None, :, :] - wi[:, None, :] * p_im[None, :, :]
        acc, lost = _add(acc, lost, tl.reduce(tl.where(m_ok[None, None, :], term, 0.0), 2, _SUM))
    out_off = (js[:, None] * R + r) * L + l0 + s[None, :]
    tl.store(out_ptr + out_off, (acc - lost).to(out_ptr.dtype.element_ty), mask=j_ok[:, None] & l_ok[None, :])


def _vandermonde_bwd(
    a_re_ptr,
    a_im_ptr,
    w_re_ptr,
    w_im_ptr,
    g_ptr,
    gw_re_ptr,
    gw_im_ptr,
    ga_re_ptr,
    ga_im_ptr,
    J,
    R,
    M,
    L,
    J_BLOCKS,
    BLOCK_J: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr,
    ACC: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    jb = tl.program_id(1)
    js = jb * BLOCK_J + tl.arange(0, BLOCK_J)
    ms = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    j_ok = js < J
    m_ok = ms < M
    s = tl.arange(0, BLOCK_L)
    ar = tl.load(a_re_ptr + r * M + ms, mask=m_ok, other=0.0)
    ai = tl.load(a_im_ptr + r * M + ms, mask=m_ok, other=0.0)
    loc_re, loc_im = _local_powers(ar, ai, BLOCK_L, BLOCK_M, BLOCK_S, ACC)  # exp(s a), the same for every tile
    zero = tl.full((BLOCK_J, BLOCK_M), 0.0, ACC)
    s0_re, s0_im, s1_re, s1_im = zero, zero, zero, zero  # sum_l g conj(p), sum_l l g conj(p)
    c0_re, c0_im, c1_re, c1_im = zero, zero, zero, zero  # their compensations (see _add)
    for l0 in range(0, L, BLOCK_L):
        seed_re, seed_im = _seed(l0, ar, ai, ACC)
        p_re = seed_re[None, :] * loc_re - seed_im[None, :] * loc_im  # (BLOCK_L, BLOCK_M)
        p_im = seed_re[None, :] * loc_im + seed_im[None, :] * loc_re
        l_ok = (l0 + s) < L
        g = tl.load(
            g_ptr + (js[:, None] * R + r) * L + l0 + s[None, :], mask=j_ok[:, None] & l_ok[None, :], other=0.0
        ).to(ACC)
        lg = g * (l0 + s).to(ACC)[None, :]
        s0_re, c0_re = _add(s0_re, c0_re, tl.reduce(g[:, :, None] * p_re[None, :, :], 1, _SUM))
        s0_im, c0_im = _add(s0_im, c0_im, -tl.reduce(g[:, :, None] * p_im[None, :, :], 1, _SUM))
        s1_re, c1_re = _add(s1_re, c1_re, tl.reduce(lg[:, :, None] * p_re[None, :, :], 1, _SUM))
        s1_im, c1_im = _add(s1_im, c1_im, -tl.reduce(lg[:, :, None] * p_im[None, :, :], 1, _SUM))
    s0_re, s0_im, s1_re, s1_im = s0_re - c0_re, s0_im - c0_im, s1_re - c1_re, s1_im - c1_im
    m2 = j_ok[:, None] & m_ok[None, :]
    w_off = (js[:, None] * R + r) * M + ms[None, :]
    tl.store(gw_re_ptr + w_off, s0_re.to(gw_re_ptr.dtype.element_ty), mask=m2)
    tl.store(gw_im_ptr + w_off, s0_im.to(gw_im_ptr.dtype.element_ty), mask=m2)
    wr = tl.load(w_re_ptr + w_off, mask=m2, other=0.0).to(ACC)
    wi = tl.load(w_im_ptr + w_off, mask=m2, other=0.0).to(ACC)
    ga_re = tl.reduce(wr * s1_re + wi * s1_im, 0, _SUM)  # conj(W) S1, summed over the block's rows
    ga_im = tl.reduce(wr * s1_im - wi * s1_re, 0, _SUM)
    ga_off = (r * J_BLOCKS + jb) * M + ms
    tl.store(ga_re_ptr + ga_off, ga_re.to(ga_re_ptr.dtype.element_ty), mask=m_ok)
    tl.store(ga_im_ptr + ga_off, ga_im.to(ga_im_ptr.dtype.element_ty), mask=m_ok)


# --------------------------------------------------------------------------------------------
# Cauchy
# --------------------------------------------------------------------------------------------
#
# With ρ = 1/(z - w), σ = 1/(z - conj(w)) (σ = 0 without conjugate pairs) and
# a = Re ρ + Re σ, b = Im σ - Im ρ, c = Im ρ + Im σ, e = Re ρ - Re σ (:func:`_resolvents`, :func:`_mix`):
#     v ρ + conj(v) σ          = (vr a + vi b) + i (vr c + vi e)
#     g conj(ρ) + conj(g) σ    = (gr a + gi c) + i (gi e + gr b)
# and the same with (a2, b2, c2, e2) from ρ², σ² (:func:`_mix_squares`). Entries outside the tiles
# are zeroed (their resolvents would divide by zero).
#
# Accuracy in float32: at a point where the sum over the poles cancels (a result far smaller than
# its terms), every rounding of a term or of a partial sum counts against the small result. So
# ρ and σ (and their squares) are carried as pairs hi + lo to about twice float32's precision
# (error-free transformations: TwoSum, products' errors by fma, a Newton-corrected reciprocal),
# a, b, c, e are rounded once from them, and every sum is compensated: the sums over the poles one
# pole at a time (:func:`_pole_sums`), those over the points elementwise across tiles and then by
# a compensated tree (:func:`_sum_last`). No float64 arithmetic; the kernels run without
# contraction into multiply-adds (``enable_fp_fusion=False``), which the transformations need.


def _cauchy_fwd(
    v_re_ptr,
    v_im_ptr,
    z_re_ptr,
    z_im_ptr,
    w_re_ptr,
    w_im_ptr,
    out_re_ptr,
    out_im_ptr,
    J,
    R,
    N,
    K,
    CONJ: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ACC: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    js = tl.program_id(2) * BLOCK_J + tl.arange(0, BLOCK_J)
    k_ok = ks < K
    j_ok = js < J
    zr = tl.load(z_re_ptr + r * K + ks, mask=k_ok, other=0.0).to(ACC)
    zi = tl.load(z_im_ptr + r * K + ks, mask=k_ok, other=0.0).to(ACC)
    re, re_lo, im, im_lo = _pole_sums(
        v_re_ptr, v_im_ptr, w_re_ptr, w_im_ptr, zr, zi, k_ok, js, j_ok, r, R, N, False, CONJ, BLOCK_J, BLOCK_K, ACC
    )
    out_off = (js[:, None] * R + r) * K + ks[None, :]
    om = j_ok[:, None] & k_ok[None, :]
    tl.store(out_re_ptr + out_off, (re + re_lo).to(out_re_ptr.dtype.element_ty), mask=om)
    tl.store(out_im_ptr + out_off, (im + im_lo).to(out_im_ptr.dtype.element_ty), mask=om)


def _cauchy_bwd_z(
    v_re_ptr,
    v_im_ptr,
    z_re_ptr,
    z_im_ptr,
    w_re_ptr,
    w_im_ptr,
    g_re_ptr,
    g_im_ptr,
    gz_re_ptr,
    gz_im_ptr,
    J,
    R,
    N,
    K,
    CONJ: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ACC: tl.constexpr,
):
    """gz[r, k] = -sum_j g[j, r, k] conj(sum_n v ρ² + conj(v) σ²)."""
    r = tl.program_id(0).to(tl.int64)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    k_ok = ks < K
    zr = tl.load(z_re_ptr + r * K + ks, mask=k_ok, other=0.0).to(ACC)
    zi = tl.load(z_im_ptr + r * K + ks, mask=k_ok, other=0.0).to(ACC)
    gz_re = tl.full((BLOCK_K,), 0.0, ACC)
    gz_im = tl.full((BLOCK_K,), 0.0, ACC)
    for j0 in range(0, J, BLOCK_J):
        js = j0 + tl.arange(0, BLOCK_J)
        j_ok = js < J
        t_re, t_re_lo, t_im, t_im_lo = _pole_sums(
            v_re_ptr, v_im_ptr, w_re_ptr, w_im_ptr, zr, zi, k_ok, js, j_ok, r, R, N, True, CONJ, BLOCK_J, BLOCK_K, ACC
        )
        t_re, t_im = t_re + t_re_lo, t_im + t_im_lo
        g_off = (js[:, None] * R + r) * K + ks[None, :]
        gm = j_ok[:, None] & k_ok[None, :]
        gr = tl.load(g_re_ptr + g_off, mask=gm, other=0.0).to(ACC)
        gi = tl.load(g_im_ptr + g_off, mask=gm, other=0.0).to(ACC)
        gz_re -= tl.reduce(gr * t_re + gi * t_im, 0, _SUM)
        gz_im -= tl.reduce(gi * t_re - gr * t_im, 0, _SUM)
    tl.store(gz_re_ptr + r * K + ks, gz_re.to(gz_re_ptr.dtype.element_ty), mask=k_ok)
    tl.store(gz_im_ptr + r * K + ks, gz_im.to(gz_im_ptr.dtype.element_ty), mask=k_ok)


def _cauchy_bwd_vw(
    v_re_ptr,
    v_im_ptr,
    z_re_ptr,
    z_im_ptr,
    w_re_ptr,
    w_im_ptr,
    g_re_ptr,
    g_im_ptr,
    gv_re_ptr,
    gv_im_ptr,
    gw_re_ptr,
    gw_im_ptr,
    J,
    R,
    N,
    K,
    CONJ: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    LOG2_BLOCK_K: tl.constexpr,
    ACC: tl.constexpr,
):
    """gv[j, r, n] = sum_k g conj(ρ) + conj(g) σ; gw[r, n] = sum_j conj(v) sum_k g conj(ρ²) + conj(g) σ².
    Tiles (vectors, poles, points); the terms are summed elementwise across the tiles of points
    (compensated), then over the tile's points (:func:`_sum_last`)."""
    r = tl.program_id(0).to(tl.int64)
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = ns < N
    wr = tl.load(w_re_ptr + r * N + ns, mask=n_ok, other=0.0).to(ACC)[:, None]
    wi = tl.load(w_im_ptr + r * N + ns, mask=n_ok, other=0.0).to(ACC)[:, None]
    gw_re = tl.full((BLOCK_N,), 0.0, ACC)
    gw_im = tl.full((BLOCK_N,), 0.0, ACC)
    for j0 in range(0, J, BLOCK_J):
        js = j0 + tl.arange(0, BLOCK_J)
        j_ok = js < J
        zero = tl.full((BLOCK_J, BLOCK_N, BLOCK_K), 0.0, ACC)
        yv_re, yv_im, yw_re, yw_im = zero, zero, zero, zero
        cv_re, cv_im, cw_re, cw_im = zero, zero, zero, zero  # their rounding errors (see _add2)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            zr = tl.load(z_re_ptr + r * K + ks, mask=k_ok, other=0.0).to(ACC)[None, :]
            zi = tl.load(z_im_ptr + r * K + ks, mask=k_ok, other=0.0).to(ACC)[None, :]
            pair = _resolvents(zr, zi, wr, wi, n_ok[:, None] & k_ok[None, :], CONJ)  # (BLOCK_N, BLOCK_K)
            a, b, c, e = _mix(*pair)
            a2, b2, c2, e2 = _mix_squares(*pair)
            g_off = (js[:, None] * R + r) * K + ks[None, :]
            gm = j_ok[:, None] & k_ok[None, :]
            gr = tl.load(g_re_ptr + g_off, mask=gm, other=0.0).to(ACC)[:, None, :]
            gi = tl.load(g_im_ptr + g_off, mask=gm, other=0.0).to(ACC)[:, None, :]
            yv_re, cv_re = _add2(yv_re, cv_re, tl.fma(gr, a[None, :, :], gi * c[None, :, :]))
            yv_im, cv_im = _add2(yv_im, cv_im, tl.fma(gi, e[None, :, :], gr * b[None, :, :]))
            yw_re, cw_re = _add2(yw_re, cw_re, tl.fma(gr, a2[None, :, :], gi * c2[None, :, :]))
            yw_im, cw_im = _add2(yw_im, cw_im, tl.fma(gi, e2[None, :, :], gr * b2[None, :, :]))
        yv_re = _sum_last(yv_re, cv_re, BLOCK_J, BLOCK_N, LOG2_BLOCK_K)  # (BLOCK_J, BLOCK_N)
        yv_im = _sum_last(yv_im, cv_im, BLOCK_J, BLOCK_N, LOG2_BLOCK_K)
        yw_re = _sum_last(yw_re, cw_re, BLOCK_J, BLOCK_N, LOG2_BLOCK_K)
        yw_im = _sum_last(yw_im, cw_im, BLOCK_J, BLOCK_N, LOG2_BLOCK_K)
        v_off = (js[:, None] * R + r) * N + ns[None, :]
        vm = j_ok[:, None] & n_ok[None, :]
        tl.store(gv_re_ptr + v_off, yv_re.to(gv_re_ptr.dtype.element_ty), mask=vm)
        tl.store(gv_im_ptr + v_off, yv_im.to(gv_im_ptr.dtype.element_ty), mask=vm)
        vr = tl.load(v_re_ptr + v_off, mask=vm, other=0.0).to(ACC)
        vi = tl.load(v_im_ptr + v_off, mask=vm, other=0.0).to(ACC)
        gw_re += tl.reduce(vr * yw_re + vi * yw_im, 0, _SUM)  # conj(v) yw
        gw_im += tl.reduce(vr * yw_im - vi * yw_re, 0, _SUM)
    tl.store(gw_re_ptr + r * N + ns, gw_re.to(gw_re_ptr.dtype.element_ty), mask=n_ok)
    tl.store(gw_im_ptr + r * N + ns, gw_im.to(gw_im_ptr.dtype.element_ty), mask=n_ok)


_FUNCTIONS = {
    "vandermonde_fwd": _vandermonde_fwd,
    "vandermonde_bwd": _vandermonde_bwd,
    "cauchy_fwd": _cauchy_fwd,
    "cauchy_bwd_z": _cauchy_bwd_z,
    "cauchy_bwd_vw": _cauchy_bwd_vw,
}
_KERNELS: dict = {}


def _rebind(fn, scope: dict):
    """``fn`` with the globals ``scope``: the same code, defaults and annotations. The annotations
    matter: Triton's compiler reads ``tl.constexpr`` from them (without them every block size and
    the compute dtype would be run-time arguments, which the compiler refuses for a dtype and
    which the interpreter, not checking, accepts)."""
    out = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__annotations__ = dict(fn.__annotations__)
    out.__kwdefaults__, out.__qualname__, out.__module__, out.__doc__ = (
        fn.__kwdefaults__,
        fn.__qualname__,
        fn.__module__,
        fn.__doc__,
    )
    return out


def _bind(fn, wrap):
    """``fn`` with the device functions of :data:`_HELPERS` wrapped by ``wrap`` in its globals (and
    in theirs, so that they call each other in the same mode): a compiled kernel calls compiled
    (``JITFunction``) ones, an interpreted kernel interpreted ones."""
    scope = dict(fn.__globals__)
    scope.update({name: wrap(_rebind(helper, scope)) for name, helper in _HELPERS.items()})
    return _rebind(fn, scope)


def kernels(interpret: bool) -> dict:
    """The kernels by name, compiled for the GPU or run by Triton's interpreter."""
    if interpret not in _KERNELS:
        wrap = InterpretedFunction if interpret else JITFunction
        _KERNELS[interpret] = {name: wrap(_bind(fn, wrap)) for name, fn in _FUNCTIONS.items()}
    return _KERNELS[interpret]


__all__ = ["kernels", "triton"]
