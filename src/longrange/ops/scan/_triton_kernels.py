"""Triton kernels of the selective scan (imported by :mod:`longrange.ops.scan.triton` only when triton is).

One program handles one batch element and a block of ``BLOCK_D`` channels, with the state
(``BLOCK_D`` x ``BLOCK_N``) in registers, and walks along the length in chunks of ``CHUNK``
positions. Inside a chunk, the states of all its positions are computed in registers by an
associative scan of the pairs (decay, input) along the chunk, seeded with the state carried over
from the previous chunk; nothing per position is written to memory but the output.

The forward stores the state at every chunk start (``STORE_STATES``) for the backward, which walks
the chunks in reverse: it recomputes the chunk's states from the stored one, runs the adjoint
recurrence ``g_t = C_t dy_t + exp(dt_{t+1} A) g_{t+1}`` as a reverse associative scan seeded with
the gradient carried from the next chunk (at the end: the gradient of the last state), and forms
every gradient from (h_t, g_t) in registers. Reductions over batch (dA, dD, d delta_bias and a
time-invariant dB/dC) go to per-batch partial sums; time-varying dB/dC are summed over the
program's channels and added atomically across channel blocks.

The reverse scan relies on ``tl.associative_scan(..., reverse=True)`` meaning flip, scan, flip
(the combine function's first operand holds the later positions), as the interpreter and current
Triton implement it; Triton releases have had bugs there for non-commutative combine functions
such as this one, which the tests on CUDA tensors would show.

The kernels are plain functions here; :func:`kernels` wraps them for compilation (``JITFunction``)
or for Triton's CPU interpreter (``InterpretedFunction``) on request, so that the choice does not
depend on the environment at import time.
"""

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction


def _combine_fn(a1, x1, a2, x2):
    # (a1, x1) then (a2, x2): h -> a2 * (a1 * h + x1) + x2
    return a1 * a2, a2 * x1 + x2


_combine = JITFunction(_combine_fn)


def _add_fn(a, b):
    return a + b


# The kernels use Triton's builtins only, no function of its jitted library (tl.sum, tl.zeros,
# tl.sigmoid, ...): those are fixed to compiled or interpreted when Triton is imported (by
# TRITON_INTERPRET), builtins follow the mode of the kernel. Sums are ``tl.reduce(x, axis, _SUM)``
# with Triton's own combine function when it is compiled (the interpreter recognises it and sums
# with numpy), else an equivalent one (correct in both modes, slower in the interpreter).
_SUM = getattr(tl.standard, "_sum_combine", None)
if not isinstance(_SUM, JITFunction):
    _SUM = JITFunction(_add_fn)


def _fwd(
    u_ptr,
    delta_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    D_ptr,
    z_ptr,
    bias_ptr,
    h0_ptr,
    out_ptr,
    last_ptr,
    states_ptr,
    d,
    L,
    n,
    n_chunks,
    sBb,
    sBg,
    sBn,
    sBl,
    B_GROUP,
    sCb,
    sCg,
    sCn,
    sCl,
    C_GROUP,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CHUNK: tl.constexpr,
    B_VARIES: tl.constexpr,
    C_VARIES: tl.constexpr,
    B_ONE_GROUP: tl.constexpr,
    C_ONE_GROUP: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_H0: tl.constexpr,
    SOFTPLUS: tl.constexpr,
    STORE_STATES: tl.constexpr,
    ACC: tl.constexpr,
):
    pid_b = tl.program_id(0).to(tl.int64)
    ch0 = tl.program_id(1) * BLOCK_D
    ch = ch0 + tl.arange(0, BLOCK_D)
    ch_ok = ch < d
    ns = tl.arange(0, BLOCK_N)
    n_ok = ns < n
    ts = tl.arange(0, CHUNK)
    m_dn = ch_ok[:, None] & n_ok[None, :]
    off_dn = (pid_b * d + ch[:, None]) * n + ns[None, :]  # into (b, d, n)

    A = tl.load(A_ptr + ch[:, None] * n + ns[None, :], mask=m_dn, other=0.0).to(ACC)
    # B, C per channel (BLOCK_D, BLOCK_N, .), or once for the block when it lies in one group
    B_rows = B_ptr + pid_b * sBb + (ch // B_GROUP)[:, None, None] * sBg + ns[None, :, None] * sBn
    C_rows = C_ptr + pid_b * sCb + (ch // C_GROUP)[:, None, None] * sCg + ns[None, :, None] * sCn
    B_block_rows = B_ptr + pid_b * sBb + (ch0 // B_GROUP) * sBg + ns[:, None] * sBn
    C_block_rows = C_ptr + pid_b * sCb + (ch0 // C_GROUP) * sCg + ns[:, None] * sCn
    if not B_VARIES:
        Bv = tl.load(B_rows, mask=m_dn[:, :, None], other=0.0).to(ACC)
    if not C_VARIES:
        Cv = tl.load(C_rows, mask=m_dn[:, :, None], other=0.0).to(ACC)
    if HAS_D:
        Dv = tl.load(D_ptr + ch, mask=ch_ok, other=0.0).to(ACC)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + ch, mask=ch_ok, other=0.0).to(ACC)
    if HAS_H0:
        h = tl.load(h0_ptr + off_dn, mask=m_dn, other=0.0).to(ACC)
    else:
        h = tl.full((BLOCK_D, BLOCK_N), 0.0, ACC)
    rows = (pid_b * d + ch) * L  # into (b, d, l)

    for c in range(n_chunks):
        t = c * CHUNK + ts
        m_dt = ch_ok[:, None] & (t < L)[None, :]
        m_nt = n_ok[:, None] & (t < L)[None, :]
        m3 = m_dt[:, None, :] & n_ok[None, :, None]
        off = rows[:, None] + t[None, :]
        if STORE_STATES:
            tl.store(states_ptr + ((pid_b * d + ch[:, None]) * n_chunks + c) * n + ns[None, :], h, mask=m_dn)
        u = tl.load(u_ptr + off, mask=m_dt, other=0.0).to(ACC)
        x = tl.load(delta_ptr + off, mask=m_dt, other=0.0).to(ACC)
        if HAS_BIAS:
            x = x + bias[:, None]
        if SOFTPLUS:
            e = tl.exp(-tl.abs(x))
            one_e = 1.0 + e
            log1p_e = tl.where(one_e == 1.0, e, tl.log(one_e) * e / tl.where(one_e == 1.0, 1.0, one_e - 1.0))
            x = tl.where(x > 20.0, x, tl.maximum(x, 0.0) + log1p_e)
        dt = tl.where(m_dt, x, 0.0)  # zero beyond the end: decay 1, input 0
        if B_VARIES:
            if B_ONE_GROUP:
                Bt = tl.load(B_block_rows + t[None, :] * sBl, mask=m_nt, other=0.0).to(ACC)[None, :, :]
            else:
                Bt = tl.load(B_rows + t[None, None, :] * sBl, mask=m3, other=0.0).to(ACC)
        else:
            Bt = Bv
        if C_VARIES:
            if C_ONE_GROUP:
                Ct = tl.load(C_block_rows + t[None, :] * sCl, mask=m_nt, other=0.0).to(ACC)[None, :, :]
            else:
                Ct = tl.load(C_rows + t[None, None, :] * sCl, mask=m3, other=0.0).to(ACC)
        else:
            Ct = Cv
        a = tl.exp(dt[:, None, :] * A[:, :, None])
        inp = (dt * u)[:, None, :] * Bt
        pa, hx = tl.associative_scan((a, inp), 2, _combine)
        hs = hx + pa * h[:, :, None]
        y = tl.reduce(hs * Ct, 1, _SUM)
        if HAS_D:
            y = y + Dv[:, None] * u
        if HAS_Z:
            zz = tl.load(z_ptr + off, mask=m_dt, other=0.0).to(ACC)
            y = y * zz / (1.0 + tl.exp(-zz))
        tl.store(out_ptr + off, y.to(out_ptr.dtype.element_ty), mask=m_dt)
        h = tl.reduce(tl.where((ts == CHUNK - 1)[None, None, :], hs, 0.0), 2, _SUM)
    tl.store(last_ptr + off_dn, h, mask=m_dn)


def _bwd(
    u_ptr,
    delta_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    D_ptr,
    z_ptr,
    bias_ptr,
    states_ptr,
    dout_ptr,
    dlast_ptr,
    du_ptr,
    ddelta_ptr,
    dz_ptr,
    dA_ptr,
    dB_ptr,
    dC_ptr,
    dD_ptr,
    dbias_ptr,
    dh0_ptr,
    d,
    L,
    n,
    n_chunks,
    sBb,
    sBg,
    sBn,
    sBl,
    B_GROUP,
    B_NG,
    sCb,
    sCg,
    sCn,
    sCl,
    C_GROUP,
    C_NG,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CHUNK: tl.constexpr,
    B_VARIES: tl.constexpr,
    C_VARIES: tl.constexpr,
    B_ONE_GROUP: tl.constexpr,
    C_ONE_GROUP: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SOFTPLUS: tl.constexpr,
    ACC: tl.constexpr,
):
    pid_b = tl.program_id(0).to(tl.int64)
    ch0 = tl.program_id(1) * BLOCK_D
    ch = ch0 + tl.arange(0, BLOCK_D)
    ch_ok = ch < d
    ns = tl.arange(0, BLOCK_N)
    n_ok = ns < n
    ts = tl.arange(0, CHUNK)
    m_dn = ch_ok[:, None] & n_ok[None, :]
    off_dn = (pid_b * d + ch[:, None]) * n + ns[None, :]

    A = tl.load(A_ptr + ch[:, None] * n + ns[None, :], mask=m_dn, other=0.0).to(ACC)
    # B, C per channel (BLOCK_D, BLOCK_N, .), or once for the block when it lies in one group
    B_rows = B_ptr + pid_b * sBb + (ch // B_GROUP)[:, None, None] * sBg + ns[None, :, None] * sBn
    C_rows = C_ptr + pid_b * sCb + (ch // C_GROUP)[:, None, None] * sCg + ns[None, :, None] * sCn
    B_block_rows = B_ptr + pid_b * sBb + (ch0 // B_GROUP) * sBg + ns[:, None] * sBn
    C_block_rows = C_ptr + pid_b * sCb + (ch0 // C_GROUP) * sCg + ns[:, None] * sCn
    # dB, dC of time-varying B, C: contiguous (b, groups, n, l) buffers
    dB_rows = dB_ptr + ((pid_b * B_NG + ch // B_GROUP) * n)[:, None, None] * L + ns[None, :, None] * L
    dC_rows = dC_ptr + ((pid_b * C_NG + ch // C_GROUP) * n)[:, None, None] * L + ns[None, :, None] * L
    dB_block = dB_ptr + (pid_b * B_NG + ch0 // B_GROUP) * n * L + ns[:, None] * L
    dC_block = dC_ptr + (pid_b * C_NG + ch0 // C_GROUP) * n * L + ns[:, None] * L
    if not B_VARIES:
        Bv = tl.load(B_rows, mask=m_dn[:, :, None], other=0.0).to(ACC)
        dB_acc = tl.full((BLOCK_D, BLOCK_N), 0.0, ACC)
    if not C_VARIES:
        Cv = tl.load(C_rows, mask=m_dn[:, :, None], other=0.0).to(ACC)
        dC_acc = tl.full((BLOCK_D, BLOCK_N), 0.0, ACC)
    if HAS_D:
        Dv = tl.load(D_ptr + ch, mask=ch_ok, other=0.0).to(ACC)
        dD_acc = tl.full((BLOCK_D,), 0.0, ACC)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + ch, mask=ch_ok, other=0.0).to(ACC)
        dbias_acc = tl.full((BLOCK_D,), 0.0, ACC)
    dA_acc = tl.full((BLOCK_D, BLOCK_N), 0.0, ACC)
    # gradient w.r.t. the state after the chunk's last position (at the end: the last state)
    g_next = tl.load(dlast_ptr + off_dn, mask=m_dn, other=0.0).to(ACC)
    dh = g_next  # gradient w.r.t. the state before position 0 (length 0: the last state's)
    rows = (pid_b * d + ch) * L

    for i in range(n_chunks):
        c = n_chunks - 1 - i
        t = c * CHUNK + ts
        m_dt = ch_ok[:, None] & (t < L)[None, :]
        m_next = ch_ok[:, None] & (t + 1 < L)[None, :]
        m_nt = n_ok[:, None] & (t < L)[None, :]
        m3 = m_dt[:, None, :] & n_ok[None, :, None]
        off = rows[:, None] + t[None, :]
        u = tl.load(u_ptr + off, mask=m_dt, other=0.0).to(ACC)
        x = tl.load(delta_ptr + off, mask=m_dt, other=0.0).to(ACC)
        x_next = tl.load(delta_ptr + off + 1, mask=m_next, other=0.0).to(ACC)
        if HAS_BIAS:
            x = x + bias[:, None]
            x_next = x_next + bias[:, None]
        if SOFTPLUS:
            e = tl.exp(-tl.abs(x))
            one_e = 1.0 + e
            log1p_e = tl.where(one_e == 1.0, e, tl.log(one_e) * e / tl.where(one_e == 1.0, 1.0, one_e - 1.0))
            dt = tl.where(x > 20.0, x, tl.maximum(x, 0.0) + log1p_e)
            e = tl.exp(-tl.abs(x_next))
            one_e = 1.0 + e
            log1p_e = tl.where(one_e == 1.0, e, tl.log(one_e) * e / tl.where(one_e == 1.0, 1.0, one_e - 1.0))
            dt_next = tl.where(x_next > 20.0, x_next, tl.maximum(x_next, 0.0) + log1p_e)
        else:
            dt = x
            dt_next = x_next
        dt = tl.where(m_dt, dt, 0.0)
        dt_next = tl.where(m_next, dt_next, 0.0)  # decay 1 after the end
        if B_VARIES:
            if B_ONE_GROUP:
                Bt = tl.load(B_block_rows + t[None, :] * sBl, mask=m_nt, other=0.0).to(ACC)[None, :, :]
            else:
                Bt = tl.load(B_rows + t[None, None, :] * sBl, mask=m3, other=0.0).to(ACC)
        else:
            Bt = Bv
        if C_VARIES:
            if C_ONE_GROUP:
                Ct = tl.load(C_block_rows + t[None, :] * sCl, mask=m_nt, other=0.0).to(ACC)[None, :, :]
            else:
                Ct = tl.load(C_rows + t[None, None, :] * sCl, mask=m3, other=0.0).to(ACC)
        else:
            Ct = Cv

        # the chunk's states, from the state stored at its start
        h_start = tl.load(
            states_ptr + ((pid_b * d + ch[:, None]) * n_chunks + c) * n + ns[None, :], mask=m_dn, other=0.0
        )
        a = tl.exp(dt[:, None, :] * A[:, :, None])
        inp = (dt * u)[:, None, :] * Bt
        pa, hx = tl.associative_scan((a, inp), 2, _combine)
        hs = hx + pa * h_start.to(ACC)[:, :, None]

        dy = tl.load(dout_ptr + off, mask=m_dt, other=0.0).to(ACC)
        if HAS_Z:
            y = tl.reduce(hs * Ct, 1, _SUM)
            if HAS_D:
                y = y + Dv[:, None] * u
            zz = tl.load(z_ptr + off, mask=m_dt, other=0.0).to(ACC)
            sig = 1.0 / (1.0 + tl.exp(-zz))
            tl.store(dz_ptr + off, (dy * y * sig * (1.0 + zz * (1.0 - sig))).to(dz_ptr.dtype.element_ty), mask=m_dt)
            dy = dy * zz * sig
        if HAS_D:
            dD_acc += tl.reduce(dy * u, 1, _SUM)
            du = dy * Dv[:, None]
        else:
            du = tl.full((BLOCK_D, CHUNK), 0.0, ACC)

        # adjoint: g_t = C_t dy_t + exp(dt_{t+1} A) g_{t+1}, in reverse, seeded with g_next
        a_next = tl.exp(dt_next[:, None, :] * A[:, :, None])
        pg, gx = tl.associative_scan((a_next, Ct * dy[:, None, :]), 2, _combine, reverse=True)
        g = gx + pg * g_next[:, :, None]

        decayed = hs - inp  # exp(dt_t A) h_{t-1}
        gB = tl.reduce(g * Bt, 1, _SUM)
        du += gB * dt
        ddt = gB * u + tl.reduce(g * decayed * A[:, :, None], 1, _SUM)
        dA_acc += tl.reduce(g * decayed * dt[:, None, :], 2, _SUM)
        if SOFTPLUS:
            ddt = tl.where(x > 20.0, ddt, ddt / (1.0 + tl.exp(-x)))
        ddt = tl.where(m_dt, ddt, 0.0)
        if HAS_BIAS:
            dbias_acc += tl.reduce(ddt, 1, _SUM)
        tl.store(du_ptr + off, du.to(du_ptr.dtype.element_ty), mask=m_dt)
        tl.store(ddelta_ptr + off, ddt.to(ddelta_ptr.dtype.element_ty), mask=m_dt)

        gBx = g * (dt * u)[:, None, :]
        if B_VARIES:
            if B_ONE_GROUP:
                tl.atomic_add(dB_block + t[None, :], tl.reduce(gBx, 0, _SUM), mask=m_nt)
            else:
                tl.atomic_add(dB_rows + t[None, None, :], gBx, mask=m3)
        else:
            dB_acc += tl.reduce(gBx, 2, _SUM)
        hdy = hs * dy[:, None, :]
        if C_VARIES:
            if C_ONE_GROUP:
                tl.atomic_add(dC_block + t[None, :], tl.reduce(hdy, 0, _SUM), mask=m_nt)
            else:
                tl.atomic_add(dC_rows + t[None, None, :], hdy, mask=m3)
        else:
            dC_acc += tl.reduce(hdy, 2, _SUM)

        first = (ts == 0)[None, None, :]
        g_next = tl.reduce(tl.where(first, g, 0.0), 2, _SUM)
        dh = tl.reduce(tl.where(first, a * g, 0.0), 2, _SUM)

    tl.store(dA_ptr + off_dn, dA_acc, mask=m_dn)
    tl.store(dh0_ptr + off_dn, dh, mask=m_dn)
    if not B_VARIES:
        tl.store(dB_ptr + off_dn, dB_acc, mask=m_dn)
    if not C_VARIES:
        tl.store(dC_ptr + off_dn, dC_acc, mask=m_dn)
    if HAS_D:
        tl.store(dD_ptr + pid_b * d + ch, dD_acc, mask=ch_ok)
    if HAS_BIAS:
        tl.store(dbias_ptr + pid_b * d + ch, dbias_acc, mask=ch_ok)


_KERNELS: dict = {}


def kernels(interpret: bool):
    """(forward, backward) kernels, compiled for the GPU or run by Triton's interpreter."""
    if interpret not in _KERNELS:
        wrap = InterpretedFunction if interpret else JITFunction
        _KERNELS[interpret] = (wrap(_fwd), wrap(_bwd))
    return _KERNELS[interpret]


__all__ = ["kernels", "triton"]
