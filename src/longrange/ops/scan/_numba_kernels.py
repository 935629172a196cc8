"""The numba kernels of :mod:`longrange.ops.scan.numba` (imported on first use: importing numba
costs about half a second, compiling the kernels a few seconds once, after which they are loaded
from numba's on-disk cache).

Array layouts (all C-contiguous, one floating dtype, the compute dtype)::

    u, dt, z, out, gout, gu, gdt, gz  (b, d, l)     dt: delta after bias and softplus
    A                                 (d, n)
    B, C                              (bM, G, LM, n) bM in {1, b}, LM in {1, l}; channel c reads
                                                     group c // (d // G), position t * (LM > 1)
    D                                 (d,)
    h0, last, glast, gh0              (b, d, n)

A time-invariant (d, n) matrix is passed as (1, d, 1, n), a shared (b, n, l) one as (b, 1, l, n)
and a grouped (b, g, n, l) one as (b, g, l, n): the state index is innermost everywhere, so the
loop over it is contiguous and vectorised.

The exponential is computed inline (:func:`fast_exp`: range reduction by powers of two and a
polynomial, exact to about one unit in the last place) because a call to the C library's ``exp``
would stop the compiler from vectorising the loop over the state.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from longrange.ops._numba_common import ERROR_MODEL, FASTMATH, like, set_threads  # noqa: F401  (set_threads: this module's interface)

# --------------------------------------------------------------------------------------------
# Helpers generic over float32 / float64
# --------------------------------------------------------------------------------------------


@intrinsic
def _pow2(typingctx, k):
    """2**k for a float k holding an integer in the normal exponent range, from its bits."""
    if k == types.float32:
        width, shift, bias = 32, 23, 127
    elif k == types.float64:
        width, shift, bias = 64, 52, 1023
    else:
        return None

    def codegen(context, builder, signature, args):
        int_type = ir.IntType(width)
        exponent = builder.add(builder.fptosi(args[0], int_type), ir.Constant(int_type, bias))
        bits = builder.shl(exponent, ir.Constant(int_type, shift))
        return builder.bitcast(bits, context.get_value_type(signature.return_type))

    return k(k), codegen


def fast_exp(x):  # pragma: no cover - replaced by the overload below inside compiled code
    """exp(x), vectorisable; see the module docstring."""
    raise NotImplementedError


def _exp_impl(dtype, lo, hi, ln2_hi, ln2_lo, poly):
    """exp for one dtype: x = k ln2 + f with |f| <= ln2 / 2, exp(x) = 2**k * (1 + f + f^2 P(f)).

    ``lo``/``hi``: below ``lo`` the result is 0 (exp(lo) is about the smallest normal number),
    above ``hi`` infinity (``hi`` keeps 2**k finite); NaN gives NaN. ``ln2_hi + ln2_lo`` = ln 2
    with ``ln2_hi`` exact in few bits, so ``k * ln2_hi`` is exact (Cody and Waite's reduction).
    """
    lo, hi, ln2_hi, ln2_lo = dtype(lo), dtype(hi), dtype(ln2_hi), dtype(ln2_lo)
    log2e, half, one, zero, inf = dtype(1.4426950408889634), dtype(0.5), dtype(1.0), dtype(0.0), dtype(np.inf)

    def impl(x):
        xc = min(max(x, lo), hi)
        k = np.floor(xc * log2e + half)
        f = (xc - k * ln2_hi) - k * ln2_lo
        r = (poly(f) * (f * f) + f + one) * _pow2(k)
        return x if x != x else (zero if x < lo else (inf if x > hi else r))

    return impl


_F32, _F64 = np.float32, np.float64


@njit(inline="always")
def _poly32(f):  # pragma: no cover - compiled
    """Cephes' expf minimax polynomial (relative error ~1e-7 on |f| <= ln2/2)."""
    return (
        (((_F32(1.9875691500e-4) * f + _F32(1.3981999507e-3)) * f + _F32(8.3334519073e-3)) * f + _F32(4.1665795894e-2))
        * f
        + _F32(1.6666665459e-1)
    ) * f + _F32(5.0000001201e-1)


@njit(inline="always")
def _poly64(f):  # pragma: no cover - compiled
    """(exp(f) - 1 - f) / f^2 by its Taylor series: exp to degree 12 in f, error below 2e-16 on |f| <= ln2/2."""
    p = _F64(1.0 / 479001600.0)  # 1/12!
    p = p * f + _F64(1.0 / 39916800.0)
    p = p * f + _F64(1.0 / 3628800.0)
    p = p * f + _F64(1.0 / 362880.0)
    p = p * f + _F64(1.0 / 40320.0)
    p = p * f + _F64(1.0 / 5040.0)
    p = p * f + _F64(1.0 / 720.0)
    p = p * f + _F64(1.0 / 120.0)
    p = p * f + _F64(1.0 / 24.0)
    p = p * f + _F64(1.0 / 6.0)
    return p * f + _F64(0.5)


_EXP32 = _exp_impl(_F32, -87.33, 88.37, 0.693359375, -2.12194440e-4, _poly32)
_EXP64 = _exp_impl(_F64, -708.0, 709.0, 6.93145751953125e-1, 1.42860682030941723212e-6, _poly64)


@overload(fast_exp)
def _fast_exp(x):
    if x == types.float32:
        return _EXP32
    if x == types.float64:
        return _EXP64
    return None


def fast_softplus(x):  # pragma: no cover - replaced by the overload below inside compiled code
    """(softplus(x), sigmoid(x)), vectorisable; see :func:`_softplus_impl`."""
    raise NotImplementedError


def _softplus_impl(dtype, series):
    """softplus(x) = max(x, 0) + log1p(e) with e = exp(-|x|) in (0, 1], and log1p(e) = 2 atanh(s)
    with s = e / (2 + e) in (0, 1/3]: ``series(s^2)`` sums the odd series of atanh(s) / s, exact
    for small e as its first term is 1; no logarithm is called, so the loop it sits in vectorises.
    The sigmoid comes from the same e: 1 / (1 + e) for x >= 0, e / (1 + e) below. Above 20, as in
    F.softplus (and mamba-ssm's kernels), the value is x and the slope 1. softplus(inf) = inf,
    softplus(-inf) = 0, NaN gives NaN."""
    one, two, zero, threshold = dtype(1.0), dtype(2.0), dtype(0.0), dtype(20.0)

    def impl(x):
        e = fast_exp(-abs(x))
        s = e / (two + e)
        r = one / (one + e)
        value = max(x, zero) + two * s * series(s * s)
        slope = r if x >= zero else e * r
        return (x if x > threshold else value), (one if x > threshold else slope)  # selects, not branches

    return impl


@njit(inline="always")
def _atanh32(s2):  # pragma: no cover - compiled
    """atanh(s) / s = sum of s2^k / (2k + 1), 8 terms: the remainder is below (1/9)^8 / 17, 1.4e-9
    relative, for s2 <= 1/9."""
    p = _F32(1.0 / 15.0) * s2 + _F32(1.0 / 13.0)
    p = p * s2 + _F32(1.0 / 11.0)
    p = p * s2 + _F32(1.0 / 9.0)
    p = p * s2 + _F32(1.0 / 7.0)
    p = p * s2 + _F32(1.0 / 5.0)
    p = p * s2 + _F32(1.0 / 3.0)
    return p * s2 + _F32(1.0)


@njit(inline="always")
def _atanh64(s2):  # pragma: no cover - compiled
    """atanh(s) / s as :func:`_atanh32`, 17 terms: the remainder is below (1/9)^17 / 35, 2e-18
    relative."""
    p = _F64(1.0 / 33.0) * s2 + _F64(1.0 / 31.0)
    p = p * s2 + _F64(1.0 / 29.0)
    p = p * s2 + _F64(1.0 / 27.0)
    p = p * s2 + _F64(1.0 / 25.0)
    p = p * s2 + _F64(1.0 / 23.0)
    p = p * s2 + _F64(1.0 / 21.0)
    p = p * s2 + _F64(1.0 / 19.0)
    p = p * s2 + _F64(1.0 / 17.0)
    p = p * s2 + _F64(1.0 / 15.0)
    p = p * s2 + _F64(1.0 / 13.0)
    p = p * s2 + _F64(1.0 / 11.0)
    p = p * s2 + _F64(1.0 / 9.0)
    p = p * s2 + _F64(1.0 / 7.0)
    p = p * s2 + _F64(1.0 / 5.0)
    p = p * s2 + _F64(1.0 / 3.0)
    return p * s2 + _F64(1.0)


_SOFTPLUS32 = _softplus_impl(_F32, _atanh32)
_SOFTPLUS64 = _softplus_impl(_F64, _atanh64)


@overload(fast_softplus, inline="always")
def _fast_softplus(x):
    if x == types.float32:
        return _SOFTPLUS32
    if x == types.float64:
        return _SOFTPLUS64
    return None


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def scan_forward(u, dt, A, B, C, D, z, h0, has_z, out, last):  # pragma: no cover - compiled
    """``out`` (b, d, l) = the scan's output (with D and the z gate); ``last`` (b, d, n)."""
    b, d, l = u.shape
    n = A.shape[1]
    one = like(1.0, u)
    zero = like(0.0, u)
    for task in prange(b * d):
        bi = task // d
        c = task % d
        gB = c // (d // B.shape[1])
        gC = c // (d // C.shape[1])
        bB = bi if B.shape[0] > 1 else 0
        bC = bi if C.shape[0] > 1 else 0
        tB = 1 if B.shape[2] > 1 else 0
        tC = 1 if C.shape[2] > 1 else 0
        Dc = D[c]
        h = np.empty(n, dtype=u.dtype)
        for i in range(n):
            h[i] = h0[bi, c, i]
        for t in range(l):
            step = dt[bi, c, t]
            x = step * u[bi, c, t]
            acc = zero
            for i in range(n):
                hi = fast_exp(step * A[c, i]) * h[i] + x * B[bB, gB, t * tB, i]
                h[i] = hi
                acc += C[bC, gC, t * tC, i] * hi
            out[bi, c, t] = acc + Dc * u[bi, c, t]
        if has_z:
            for t in range(l):  # the gate, vectorised over the positions
                zt = z[bi, c, t]
                out[bi, c, t] = out[bi, c, t] * zt / (one + fast_exp(-zt))
        for i in range(n):
            last[bi, c, i] = h[i]


# --------------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------------


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def scan_backward(
    u,
    dt,
    A,
    B,
    C,
    D,
    z,
    h0,
    has_z,
    gout,
    glast,
    channels_per_task,
    gu,
    gdt,
    gA,
    gB,
    gC,
    gD,
    gz,
    gh0,
):  # pragma: no cover - compiled
    """Gradients of the scan, one task per (batch element, run of ``channels_per_task`` channels).

    Per channel: one forward pass recomputes the states into a scratch buffer of (l + 1, n)
    (row 0: the initial state), then one reverse pass runs the adjoint recurrence
    ``g_{t-1} = exp(dt_t A) * g_t`` (``g_{l-1}`` starts from ``glast``), accumulating every
    gradient. Outputs: ``gu``, ``gdt``, ``gz`` (b, d, l) and ``gh0`` (b, d, n) written; ``gA``
    (b, d, n) and ``gD`` (b, d) per batch element (the caller sums over it); ``gB`` and ``gC``
    zero-initialised partial sums of shape (b, S, LM, n), indexed by channel (S = d) for a
    time-invariant matrix and by task (S = d / channels_per_task) for a time-varying one, so no
    two tasks write the same element; the caller sums them over the channels of each group.
    """
    b, d, l = u.shape
    n = A.shape[1]
    one = like(1.0, u)
    zero = like(0.0, u)
    per_batch = d // channels_per_task
    for task in prange(b * per_batch):
        bi = task // per_batch
        k = task % per_batch
        bB = bi if B.shape[0] > 1 else 0
        bC = bi if C.shape[0] > 1 else 0
        tB = 1 if B.shape[2] > 1 else 0
        tC = 1 if C.shape[2] > 1 else 0
        hs = np.empty((l + 1, n), dtype=u.dtype)
        gh = np.empty(n, dtype=u.dtype)
        gAc = np.empty(n, dtype=u.dtype)
        ypre = np.empty(l if has_z else 0, dtype=u.dtype)
        for c in range(k * channels_per_task, (k + 1) * channels_per_task):
            gBi = c // (d // B.shape[1])
            gCi = c // (d // C.shape[1])
            sB = k if tB else c
            sC = k if tC else c
            Dc = D[c]
            # forward: the states h_0 .. h_{l-1} into hs[1:], the pre-gate output if gated
            for i in range(n):
                hs[0, i] = h0[bi, c, i]
            for t in range(l):
                step = dt[bi, c, t]
                x = step * u[bi, c, t]
                for i in range(n):
                    hs[t + 1, i] = fast_exp(step * A[c, i]) * hs[t, i] + x * B[bB, gBi, t * tB, i]
            if has_z:
                for t in range(l):
                    acc = zero
                    for i in range(n):
                        acc += C[bC, gCi, t * tC, i] * hs[t + 1, i]
                    ypre[t] = acc + Dc * u[bi, c, t]
            # gradient w.r.t. y_t before the gate (into gz's row, overwritten below)
            if has_z:
                for t in range(l):
                    zt = z[bi, c, t]
                    s = one / (one + fast_exp(-zt))
                    g = gout[bi, c, t]
                    gz[bi, c, t] = g * ypre[t] * s * (one + zt * (one - s))
                    gdt[bi, c, t] = g * zt * s  # parked here until the reverse pass reads it
            # reverse: adjoint of the state
            for i in range(n):
                gh[i] = glast[bi, c, i]
                gAc[i] = zero
            gDc = zero
            for t in range(l - 1, -1, -1):
                gy = gdt[bi, c, t] if has_z else gout[bi, c, t]
                step = dt[bi, c, t]
                ut = u[bi, c, t]
                x = step * ut
                gx = zero
                gstep = zero
                for i in range(n):
                    a = A[c, i]
                    decay = fast_exp(step * a)
                    Bv = B[bB, gBi, t * tB, i]
                    Cv = C[bC, gCi, t * tC, i]
                    h_now = hs[t + 1, i]
                    g = gh[i] + gy * Cv  # total gradient w.r.t. h_t
                    gC[bi, sC, t * tC, i] += gy * h_now
                    gB[bi, sB, t * tB, i] += g * x
                    gx += g * Bv
                    e = g * hs[t, i] * decay  # w.r.t. step * a
                    gstep += e * a
                    gAc[i] += e * step
                    gh[i] = g * decay
                gDc += gy * ut
                gu[bi, c, t] = gx * step + gy * Dc
                gdt[bi, c, t] = gx * ut + gstep
            for i in range(n):
                gA[bi, c, i] = gAc[i]
                gh0[bi, c, i] = gh[i]
            gD[bi, c] = gDc


# --------------------------------------------------------------------------------------------
# Channels-last kernels: time-varying B and C, vectorised over channels (see numba.py)
# --------------------------------------------------------------------------------------------
#
# Layouts: u, raw, z, out, gout, gu, gdt, gz (b, l, d), raw the step before its bias and softplus
# (applied here, row by row: gdt is the gradient w.r.t. raw); At (n, d) (A transposed); B, C
# (bM, G, l, n); D, bias (d,); h0, last, glast, gh0 (b, d, n); ck (b, chunks, n, d), the state at the
# start of every chunk of T positions (ck[:, 0] = h0). One task is a block of W channels of one
# batch element, inside one group of B and of C, so B[t, i] and C[t, i] are one number for the
# whole block: every inner loop runs over the W channels, contiguous in memory, and vectorises
# whatever the state size. The inner loops are small functions over one row of W values each,
# inlined into the parallel loop's body, which numba compiles knowing that the arrays passed in
# do not overlap (the same loops in a separate function ran about half as fast).


@njit(inline="always", fastmath=FASTMATH)
def _row_copy(dst, src, W):  # pragma: no cover - compiled
    for w in range(W):
        dst[w] = src[w]


@njit(inline="always", fastmath=FASTMATH)
def _row_delta(dt, raw, bias, softplus, W):  # pragma: no cover - compiled
    """dt = softplus(raw + bias) (or raw + bias): the step of one position."""
    if softplus:
        for w in range(W):
            dt[w] = fast_softplus(raw[w] + bias[w])[0]
    else:
        for w in range(W):
            dt[w] = raw[w] + bias[w]


@njit(inline="always", fastmath=FASTMATH)
def _row_delta_slope(dt, slope, raw, bias, softplus, W):  # pragma: no cover - compiled
    """As :func:`_row_delta`, with ``slope`` = d dt / d raw (the sigmoid, or 1)."""
    one = like(1.0, dt)
    if softplus:
        for w in range(W):
            value, sig = fast_softplus(raw[w] + bias[w])
            dt[w] = value
            slope[w] = sig
    else:
        for w in range(W):
            dt[w] = raw[w] + bias[w]
            slope[w] = one


@njit(inline="always", fastmath=FASTMATH)
def _row_start(x, acc, dt, u, D, W):  # pragma: no cover - compiled
    """x = dt u (the input of the step), acc = D u (the skip term of the output)."""
    for w in range(W):
        x[w] = dt[w] * u[w]
        acc[w] = D[w] * u[w]


@njit(inline="always", fastmath=FASTMATH)
def _row_advance(h, dt, a, x, bv, cv, acc, W):  # pragma: no cover - compiled
    """One state index of one step, in place: h = exp(dt a) h + x B; acc += C h."""
    for w in range(W):
        hw = fast_exp(dt[w] * a[w]) * h[w] + x[w] * bv
        h[w] = hw
        acc[w] += cv * hw


@njit(inline="always", fastmath=FASTMATH)
def _row_recompute(dec, hn, hp, dt, a, x, bv, cv, acc, W):  # pragma: no cover - compiled
    """As :func:`_row_advance` from the previous state ``hp`` into ``hn``, keeping the decays."""
    for w in range(W):
        dv = fast_exp(dt[w] * a[w])
        dec[w] = dv
        hw = dv * hp[w] + x[w] * bv
        hn[w] = hw
        acc[w] += cv * hw


@njit(inline="always", fastmath=FASTMATH)
def _row_gate(out, y, z, W):  # pragma: no cover - compiled
    """out = y silu(z)."""
    one = like(1.0, y)
    for w in range(W):
        zw = z[w]
        out[w] = y[w] * zw / (one + fast_exp(-zw))


@njit(inline="always", fastmath=FASTMATH)
def _row_gate_backward(gz, gy, g, y, z, W):  # pragma: no cover - compiled
    """From the gradient ``g`` of out = y silu(z): ``gz`` and ``gy``, the gradient w.r.t. y."""
    one = like(1.0, y)
    for w in range(W):
        zw = z[w]
        s = one / (one + fast_exp(-zw))
        gz[w] = g[w] * y[w] * s * (one + zw * (one - s))
        gy[w] = g[w] * zw * s


@njit(inline="always", fastmath=FASTMATH)
def _row_adjoint(gh, hn, hp, dec, gy, x, a, dt, bv, cv, gx, gstep, gA, W):  # pragma: no cover - compiled
    """One state index of one step of the adjoint recurrence, in place on ``gh``; accumulates the
    gradients w.r.t. x (``gx``), dt a (``gstep``, times a) and a (``gA``); returns the sums over
    the block of the gradients w.r.t. this step's C and B."""
    sc = like(0.0, gh)
    sb = like(0.0, gh)
    for w in range(W):
        decay = dec[w]
        g = gh[w] + gy[w] * cv  # total gradient w.r.t. h_t
        sc += gy[w] * hn[w]
        sb += g * x[w]
        gx[w] += g * bv
        e = g * hp[w] * decay  # w.r.t. dt a
        gstep[w] += e * a[w]
        gA[w] += e * dt[w]
        gh[w] = g * decay
    return sc, sb


@njit(inline="always", fastmath=FASTMATH)
def _row_inputs_backward(gu, gdt, gD, gbias, gx, gstep, gy, dt, slope, u, D, W):  # pragma: no cover - compiled
    """The gradients w.r.t. u, the raw step (through ``slope``, d dt / d raw), D and the bias."""
    for w in range(W):
        gu[w] = gx[w] * dt[w] + gy[w] * D[w]
        graw = (gx[w] * u[w] + gstep[w]) * slope[w]
        gdt[w] = graw
        gbias[w] += graw
        gD[w] += gy[w] * u[w]


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def scan_forward_cl(
    u, raw, bias, softplus, At, B, C, D, z, h0, has_z, W, T, out, last, ck
):  # pragma: no cover - compiled
    """``out`` (b, l, d), ``last`` (b, d, n) and the chunk-start states ``ck``; see above. The
    step is ``softplus(raw + bias)`` (``raw + bias`` without ``softplus``), computed here row by
    row. (The task's body is written out in the parallel loop, not called: numba compiles that
    body knowing that the arrays passed in do not overlap, which lets the inner loops vectorise.)"""
    b, l, d = u.shape
    n = At.shape[0]
    per_batch = d // W
    for task in prange(b * per_batch):
        bi = task // per_batch
        c0 = (task % per_batch) * W
        gB, gC = c0 // (d // B.shape[1]), c0 // (d // C.shape[1])
        bB = bi if B.shape[0] > 1 else 0
        bC = bi if C.shape[0] > 1 else 0
        h = np.empty((n, W), dtype=u.dtype)
        a = np.empty((n, W), dtype=u.dtype)
        x = np.empty(W, dtype=u.dtype)
        acc = np.empty(W, dtype=u.dtype)
        dtr = np.empty(W, dtype=u.dtype)
        for i in range(n):
            for w in range(W):
                h[i, w] = h0[bi, c0 + w, i]
                a[i, w] = At[i, c0 + w]
        Dr = D[c0 : c0 + W]
        biasr = bias[c0 : c0 + W]
        for t in range(l):
            if t % T == 0:
                for i in range(n):
                    _row_copy(ck[bi, t // T, i, c0 : c0 + W], h[i], W)
            _row_delta(dtr, raw[bi, t, c0 : c0 + W], biasr, softplus, W)
            ur = u[bi, t, c0 : c0 + W]
            _row_start(x, acc, dtr, ur, Dr, W)
            for i in range(n):
                _row_advance(h[i], dtr, a[i], x, B[bB, gB, t, i], C[bC, gC, t, i], acc, W)
            if has_z:
                _row_gate(out[bi, t, c0 : c0 + W], acc, z[bi, t, c0 : c0 + W], W)
            else:
                _row_copy(out[bi, t, c0 : c0 + W], acc, W)
        for i in range(n):
            for w in range(W):
                last[bi, c0 + w, i] = h[i, w]


@njit(parallel=True, fastmath=FASTMATH, error_model=ERROR_MODEL, cache=True)
def scan_backward_cl(
    u,
    raw,
    bias,
    softplus,
    At,
    B,
    C,
    D,
    z,
    ck,
    has_z,
    gout,
    glast,
    W,
    T,
    gu,
    gdt,
    gA,
    gB,
    gC,
    gD,
    gbias,
    gz,
    gh0,
):  # pragma: no cover - compiled
    """Gradients of :func:`scan_forward_cl` from its chunk-start states ``ck``. Per task, chunk by
    chunk from the last: the chunk's states are recomputed into a scratch buffer of (T + 1) n W
    values (with their decays, the steps, their slopes, the steps' inputs and the gradients w.r.t.
    the pre-gate outputs), then the adjoint recurrence runs back over them. Outputs as
    :func:`scan_backward`'s, in the channels-last layouts, ``gdt`` w.r.t. ``raw`` and ``gbias``
    (b, d) per batch element (the caller sums over it), with gB and gC (b, d / W, l, n)
    zero-initialised partial sums, one slice per task (the caller sums them over the tasks of each
    group)."""
    b, l, d = u.shape
    n = At.shape[0]
    zero = like(0.0, u)
    per_batch = d // W
    chunks = (l + T - 1) // T
    for task in prange(b * per_batch):
        bi = task // per_batch
        k = task % per_batch
        c0 = k * W
        gBi, gCi = c0 // (d // B.shape[1]), c0 // (d // C.shape[1])
        bB = bi if B.shape[0] > 1 else 0
        bC = bi if C.shape[0] > 1 else 0
        a = np.empty((n, W), dtype=u.dtype)
        gh = np.empty((n, W), dtype=u.dtype)
        gAc = np.zeros((n, W), dtype=u.dtype)
        gDc = np.zeros(W, dtype=u.dtype)
        gbiasc = np.zeros(W, dtype=u.dtype)
        dts = np.empty((T, W), dtype=u.dtype)
        slopes = np.empty((T, W), dtype=u.dtype)
        hs = np.empty(((T + 1) * n, W), dtype=u.dtype)  # row j n + i: state i before step j of the chunk
        dec = np.empty((T * n, W), dtype=u.dtype)
        xs = np.empty((T, W), dtype=u.dtype)
        gys = np.empty((T, W), dtype=u.dtype)
        y = np.empty(W, dtype=u.dtype)
        gx = np.empty(W, dtype=u.dtype)
        gstep = np.empty(W, dtype=u.dtype)
        for i in range(n):
            for w in range(W):
                a[i, w] = At[i, c0 + w]
                gh[i, w] = glast[bi, c0 + w, i]
        Dr = D[c0 : c0 + W]
        biasr = bias[c0 : c0 + W]
        for ch in range(chunks - 1, -1, -1):
            t0 = ch * T
            t1 = min(l, t0 + T)
            for i in range(n):
                _row_copy(hs[i], ck[bi, ch, i, c0 : c0 + W], W)
            for t in range(t0, t1):  # recompute
                j = t - t0
                dtr = dts[j]
                _row_delta_slope(dtr, slopes[j], raw[bi, t, c0 : c0 + W], biasr, softplus, W)
                _row_start(xs[j], y, dtr, u[bi, t, c0 : c0 + W], Dr, W)
                for i in range(n):
                    _row_recompute(
                        dec[j * n + i],
                        hs[(j + 1) * n + i],
                        hs[j * n + i],
                        dtr,
                        a[i],
                        xs[j],
                        B[bB, gBi, t, i],
                        C[bC, gCi, t, i],
                        y,
                        W,
                    )
                if has_z:
                    _row_gate_backward(
                        gz[bi, t, c0 : c0 + W], gys[j], gout[bi, t, c0 : c0 + W], y, z[bi, t, c0 : c0 + W], W
                    )
                else:
                    _row_copy(gys[j], gout[bi, t, c0 : c0 + W], W)
            for t in range(t1 - 1, t0 - 1, -1):  # the adjoint recurrence
                j = t - t0
                dtr = dts[j]
                for w in range(W):
                    gx[w] = zero
                    gstep[w] = zero
                for i in range(n):
                    sc, sb = _row_adjoint(
                        gh[i],
                        hs[(j + 1) * n + i],
                        hs[j * n + i],
                        dec[j * n + i],
                        gys[j],
                        xs[j],
                        a[i],
                        dtr,
                        B[bB, gBi, t, i],
                        C[bC, gCi, t, i],
                        gx,
                        gstep,
                        gAc[i],
                        W,
                    )
                    gC[bi, k, t, i] += sc
                    gB[bi, k, t, i] += sb
                _row_inputs_backward(
                    gu[bi, t, c0 : c0 + W],
                    gdt[bi, t, c0 : c0 + W],
                    gDc,
                    gbiasc,
                    gx,
                    gstep,
                    gys[j],
                    dtr,
                    slopes[j],
                    u[bi, t, c0 : c0 + W],
                    Dr,
                    W,
                )
        for i in range(n):
            for w in range(W):
                gA[bi, c0 + w, i] = gAc[i, w]
                gh0[bi, c0 + w, i] = gh[i, w]
        for w in range(W):
            gD[bi, c0 + w] = gDc[w]
            gbias[bi, c0 + w] = gbiasc[w]
