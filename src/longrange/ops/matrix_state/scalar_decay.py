"""The matrix-state recurrence with one scalar decay per head and position, the core shared by SSD
(Mamba-2, :mod:`.ssd`) and Mamba-3 (:mod:`.mamba3`).

The recurrence
--------------
Per head, with row vectors ``q_t``, ``k_t`` (1 x dk), ``v_t`` (1 x dv) and a state ``S_t`` (dk x dv)::

    S_t = exp(a_t) S_{t-1} + k_t^T v_t
    o_t = scale * q_t S_t

``a_t`` (``log_decay``) is the log of the decay, ``a_t <= 0`` (finite); ``scale`` defaults to 1 here
(SSD and Mamba-3 have none). This is the scalar-decay ("SSD") case of the structured masked
attention of Dao & Gu, "Transformers are SSMs: Generalized Models and Efficient Algorithms Through
Structured State Space Duality", ICML 2024, arXiv:2405.21060: unrolled,
``o_t = scale * sum_{s<=t} exp(a_{s+1} + ... + a_t) (q_t . k_s) v_s``.

Grouped keys: ``q`` and ``k`` may have fewer heads than ``v`` (``hk`` dividing ``h``); head ``i``
reads ``q``/``k`` head ``i // (h // hk)`` (Mamba-2's B/C groups, grouped-query attention). The
(chunk x chunk) products ``q k^T`` are then computed once per group, not once per head.

Implementations
---------------
:func:`scalar_decay_naive`: a Python loop over time in float64, the ground truth.
:func:`scalar_decay_step`: one position, for decoding.
:func:`scalar_decay_chunk`: chunkwise parallel (the SSD algorithm, Dao & Gu 2024, section 6). The
length is cut into chunks of ``C`` positions; with ``c_t = a_1 + ... + a_t`` the cumulative log
decay from the chunk start (inclusive) and ``S_0`` the state entering the chunk::

    O     = scale * ( (exp(c_t - c_s) masked to s <= t) o (Q K^T) V  +  exp(c) o (Q S_0) )
    S_C   = exp(c_C) S_0 + K^T (exp(c_C - c) o V)

Every exponent is a difference ``c_t - c_s`` with ``t >= s`` (the entries above the diagonal are
set to -inf *before* the exponential), ``c_t`` or ``c_C - c_s``: with ``a <= 0`` nothing positive is
exponentiated, so nothing overflows however strong the decay. All of this is batched over chunks
(matmuls only); the only sequential part is the carry ``S_{i+1} = exp(c_C) S_i + W_i`` from chunk to
chunk, a loop of one in-place multiply-add per chunk (linear in the number of chunks: no (chunks x
chunks) decay matrix is built). The backward is written by hand (:class:`_Chunked`): the same
structure run backwards, the carry in reverse, the (C x C) matrices recomputed rather than stored,
and the chunks worked through in pieces of bounded size, so that the temporaries stay in cache
(:data:`PIECE_BYTES`).

Masks: at a padded position (``mask`` False) the decay is 1 and nothing is written (``a`` and ``k``
are zeroed there), and the output is zero.

Dtypes: computation in float64 if a floating input is float64, else float32 (the naive loop always
in float64); outputs in ``v``'s dtype, states in the compute dtype. Device: the inputs'.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from longrange.ops.chunking import TEMPORARY_BYTES, group_size
from longrange.ops.matrix_state.common import (
    check_chunk_size,
    check_mask,
    compute_dtype,
    initial,
    keep,
    require_shape,
    shape_of,
)

__all__ = ["scalar_decay_naive", "scalar_decay_chunk", "scalar_decay_step", "DEFAULT_CHUNK_SIZE"]

#: Default chunk length of :func:`scalar_decay_chunk` (and of SSD and Mamba-3). Timed on this
#: project's 2-core CPU (SSD forward + backward, float32, batch 8, 8 heads, n = p = 64, length 4096):
#: chunks of 32, 64 and 128 took 0.67, 0.59 and 0.63 s with one group of B/C, 0.75 s each with one
#: group per head; 64 is also the usual choice on GPUs (Mamba-2, Mamba-3). Any value >= 1 gives the
#: same result.
DEFAULT_CHUNK_SIZE = 64


# ----------------------------------------------------------------------------------------------
# checks


def check_grouped(
    op: str, q: Tensor, k: Tensor, v: Tensor, qk: tuple[str, str] = ("q", "k"), vname: str = "v"
) -> tuple[int, int, int, int, int, int]:
    """(b, l, h, hk, dk, dv) of ``q``, ``k`` (b, l, hk, dk) and ``v`` (b, l, h, dv) with ``hk``
    dividing ``h``; a ValueError naming the argument that does not fit (``qk`` and ``vname`` are the
    names the caller knows them by)."""
    qn, kn = qk
    if not isinstance(k, Tensor) or k.dim() != 4:
        raise ValueError(f"{op}: {kn} must have shape (batch, length, groups, dk), got {shape_of(k)}")
    b, l, hk, dk = k.shape
    if not isinstance(q, Tensor) or q.shape != k.shape:
        raise ValueError(
            f"{op}: {qn} must have the shape of {kn} (batch, length, groups, dk)={tuple(k.shape)}, got {shape_of(q)}"
        )
    if not isinstance(v, Tensor) or v.dim() != 4 or v.shape[:2] != (b, l):
        raise ValueError(
            f"{op}: {vname} must have shape (batch, length, heads, dv)=({b}, {l}, heads, dv), got {shape_of(v)}"
        )
    h = v.shape[2]
    if hk < 1 or h % hk != 0:
        raise ValueError(f"{op}: the groups of {kn} and {qn} ({hk}) must divide the heads of {vname} ({h})")
    return b, l, h, hk, dk, v.shape[3]


def check_step_grouped(
    op: str, q: Tensor, k: Tensor, v: Tensor, qk: tuple[str, str] = ("q", "k"), vname: str = "v"
) -> tuple[int, int, int, int, int]:
    """(b, h, hk, dk, dv) of one position: ``q``, ``k`` (b, hk, dk), ``v`` (b, h, dv)."""
    qn, kn = qk
    if not isinstance(k, Tensor) or k.dim() != 3:
        raise ValueError(f"{op}: {kn} must have shape (batch, groups, dk), got {shape_of(k)}")
    b, hk, dk = k.shape
    if not isinstance(q, Tensor) or q.shape != k.shape:
        raise ValueError(
            f"{op}: {qn} must have the shape of {kn} (batch, groups, dk)={tuple(k.shape)}, got {shape_of(q)}"
        )
    if not isinstance(v, Tensor) or v.dim() != 3 or v.shape[0] != b:
        raise ValueError(f"{op}: {vname} must have shape (batch, heads, dv)=({b}, heads, dv), got {shape_of(v)}")
    h = v.shape[1]
    if hk < 1 or h % hk != 0:
        raise ValueError(f"{op}: the groups of {kn} and {qn} ({hk}) must divide the heads of {vname} ({h})")
    return b, h, hk, dk, v.shape[2]


def expand_groups(t: Tensor, h: int, dim: int = 2) -> Tensor:
    """``t`` with ``hk`` heads along ``dim`` repeated to ``h`` heads (head ``i`` reads ``i // (h // hk)``)."""
    hk = t.shape[dim]
    return t if hk == h else t.repeat_interleave(h // hk, dim=dim)


# ----------------------------------------------------------------------------------------------
# naive and step


def scalar_decay_naive(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_decay: Tensor,
    scale: float = 1.0,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """The scalar-decay recurrence by a Python loop over time, in float64 (the ground truth).

    ``S_t = exp(a_t) S_{t-1} + k_t^T v_t``, ``o_t = scale * q_t S_t`` (see the module docstring).

    Args:
        q, k: (batch, length, hk, dk), ``hk`` dividing ``heads``.
        v: (batch, length, heads, dv).
        log_decay: ``a`` (batch, length, heads), <= 0.
        scale: factor of the output (1 by default).
        initial_state: (batch, heads, dk, dv) or None (zeros).
        output_final_state: also return the state after the last position.
        mask: (batch, length) bool, True at real positions, or None.

    Returns:
        ``o`` (batch, length, heads, dv) in ``v``'s dtype, or ``(o, final_state)`` with the state in
        the compute dtype.
    """
    op = "scalar_decay_naive"
    b, l, h, hk, dk, dv = check_grouped(op, q, k, v)
    require_shape(op, "log_decay", log_decay, (b, l, h), "(batch, length, heads)")
    mask = check_mask(op, mask, b, l)
    dtype = compute_dtype(q, k, v, log_decay, initial_state)
    f64 = torch.float64
    S = initial(op, initial_state, b, h, dk, dv, f64, k.device)
    qe, ke = expand_groups(q.to(f64), h), expand_groups(k.to(f64), h)
    ve, a = v.to(f64), log_decay.to(f64)
    outs = []
    for t in range(l):
        new = a[:, t, :, None, None].exp() * S + ke[:, t, :, :, None] * ve[:, t, :, None, :]
        o = scale * torch.einsum("bhk,bhkv->bhv", qe[:, t], new)
        if mask is not None:
            m = mask[:, t, None, None]
            new = torch.where(m[..., None], new, S)
            o = o * m
        S = new
        outs.append(o)
    o = (torch.stack(outs, dim=1) if outs else ve.new_zeros(b, 0, h, dv)).to(v.dtype)
    return (o, S.to(dtype)) if output_final_state else o


def scalar_decay_step(
    q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, state: Tensor | None, scale: float = 1.0
) -> tuple[Tensor, Tensor]:
    """One position of the scalar-decay recurrence: ``q``, ``k`` (batch, hk, dk), ``v`` (batch, heads,
    dv), ``log_decay`` (batch, heads), ``state`` (batch, heads, dk, dv) or None (zeros). Returns
    ``(o (batch, heads, dv) in v's dtype, new_state in the compute dtype)``."""
    op = "scalar_decay_step"
    b, h, hk, dk, dv = check_step_grouped(op, q, k, v)
    require_shape(op, "log_decay", log_decay, (b, h), "(batch, heads)")
    dtype = compute_dtype(q, k, v, log_decay, state)
    S = initial(op, state, b, h, dk, dv, dtype, k.device)
    qe, ke = expand_groups(q.to(dtype), h, dim=1), expand_groups(k.to(dtype), h, dim=1)
    new = log_decay.to(dtype)[..., None, None].exp() * S + ke[..., :, None] * v.to(dtype)[..., None, :]
    o = scale * (qe[..., None, :] @ new).squeeze(-2)
    return o.to(v.dtype), new


# ----------------------------------------------------------------------------------------------
# chunked


def _decay_matrix(cs: Tensor) -> Tensor:
    """``L[..., t, s] = exp(cs_t - cs_s)`` for ``s <= t``, 0 above the diagonal, from cumulative log
    decays ``cs`` (..., T). The differences above the diagonal are set to -inf before ``exp``."""
    T = cs.shape[-1]
    upper = torch.ones(T, T, dtype=torch.bool, device=cs.device).triu_(1)
    return (cs[..., :, None] - cs[..., None, :]).masked_fill_(upper, -math.inf).exp_()


#: Bound on the largest temporary of one piece of chunks of :func:`scalar_decay_chunk` on CPUs
#: (bytes): a piece's few temporaries then stay within a shared L3 cache. Timed on this project's
#: 2-core CPU (32 MiB L3; SSD forward + backward, float32, batch 8, 8 heads, n = p = 64, length 4096,
#: one thread): 1.2 s with pieces of 4 MiB, 1.6 s with 16 MiB (longrange's
#: :data:`~longrange.ops.chunking.TEMPORARY_BYTES`), 2.6 s with 64 MiB.
PIECE_BYTES = TEMPORARY_BYTES // 4

#: The same bound on other devices (GPUs): as large as memory allows, for large kernels.
DEVICE_PIECE_BYTES = 1 << 28


def _pieces(nc: int, per_chunk_bytes: int, device: torch.device) -> list[tuple[int, int]]:
    """Ranges of chunks worked through together, their temporaries within :data:`PIECE_BYTES` on CPUs,
    :data:`DEVICE_PIECE_BYTES` elsewhere (one piece on the ``meta`` device)."""
    if device.type == "meta":
        return [(0, nc)]
    step = group_size(per_chunk_bytes, PIECE_BYTES if device.type == "cpu" else DEVICE_PIECE_BYTES)
    return [(c0, min(nc, c0 + step)) for c0 in range(0, nc, step)]


def _piece(t: Tensor, c0: int, c1: int, T: int, shape: tuple[int, ...], order: tuple[int, ...]) -> Tensor:
    """Chunks ``c0:c1`` of ``t`` (b, l, ...) as a contiguous tensor in a chunk-major layout: ``t``'s
    positions viewed as (b, c1 - c0, T, *shape), then permuted by ``order`` (a view of ``t`` where
    that is already contiguous: not to be modified in place)."""
    return t[:, c0 * T : c1 * T].reshape(t.shape[0], c1 - c0, T, *shape).permute(order).contiguous()


def _values(v: Tensor, w: Tensor | None, c0: int, c1: int, T: int, hk: int, r: int) -> Tensor:
    """Chunks ``c0:c1`` of ``w o v`` (``v`` (b, l, h, dv), ``w`` (b, l, h) or None) as (n, b, hk, r,
    T, dv)."""
    vp = _piece(v, c0, c1, T, (hk, r, v.shape[-1]), (1, 0, 3, 4, 2, 5))  # may be a view of v: not in place
    return vp if w is None else vp * _piece(w, c0, c1, T, (hk, r), (1, 0, 3, 4, 2)).unsqueeze(-1)


def linear_scan_(x: Tensor, d: Tensor, reverse: bool = False) -> Tensor:
    """The linear recurrence ``x[c + 1] += d[c] x[c]`` for ``c = 0 .. N - 1`` in place (``reverse``:
    ``x[c] += d[c] x[c + 1]`` for ``c = N - 1 .. 0``), ``x`` (N + 1, ...), ``d`` (N, ...) broadcasting
    against ``x[0]``, the ``d`` in [0, 1]. Returns ``x``.

    Blocked in two levels so that it takes about ``3 sqrt(N)`` operations instead of ``N`` (each
    operation on a parallel CPU is a synchronisation of its threads): with blocks of ``B ~ sqrt(N)``
    steps, the scans within all blocks from zero, side by side (``B - 1`` operations); the carry from
    block to block through the blocks' products of ``d`` (``N / B`` operations); then each block's
    entering value times the running products of ``d`` added to the whole block (one operation).
    Only products of the ``d`` (cumulative products, in [0, 1]) are formed: nothing can overflow.
    """
    N = d.shape[0]
    B = max(1, math.isqrt(N))
    nb = N // B
    if nb < 2 or B < 2:
        steps = range(N - 1, -1, -1) if reverse else range(N)
        for c in steps:
            if reverse:
                x[c].addcmul_(d[c], x[c + 1])
            else:
                x[c + 1].addcmul_(d[c], x[c])
        return x
    rem = N - nb * B
    if not reverse:
        xb, db = x[1 : nb * B + 1].unflatten(0, (nb, B)), d[: nb * B].unflatten(0, (nb, B))
        for i in range(1, B):  # within blocks, from zero
            xb[:, i].addcmul_(db[:, i], xb[:, i - 1])
        run = db.cumprod(1)  # d products from the block's start
        enter = torch.empty_like(x[:nb])  # x before each block
        enter[0] = x[0]
        for j in range(nb - 1):
            torch.addcmul(xb[j, B - 1], run[j, B - 1], enter[j], out=enter[j + 1])
        xb.addcmul_(run, enter.unsqueeze(1))
        for c in range(nb * B, N):
            x[c + 1].addcmul_(d[c], x[c])
    else:
        xb, db = x[rem:N].unflatten(0, (nb, B)), d[rem:N].unflatten(0, (nb, B))
        for i in range(B - 2, -1, -1):
            xb[:, i].addcmul_(db[:, i], xb[:, i + 1])
        run = db.flip(1).cumprod(1).flip(1)  # d products to the block's end
        after = torch.empty_like(x[:nb])  # x after each block
        after[nb - 1] = x[N]
        for j in range(nb - 1, 0, -1):
            torch.addcmul(xb[j, 0], run[j, 0], after[j], out=after[j - 1])
        xb.addcmul_(run, after.unsqueeze(1))
        for c in range(rem - 1, -1, -1):
            x[c].addcmul_(d[c], x[c + 1])
    return x


class _Chunked(torch.autograd.Function):
    """The chunked algorithm with a hand-written backward.

    Inputs: ``q``, ``k`` (b, l, hk, dk), ``v`` (b, l, h, dv), ``w`` (b, l, h) or None (a factor of
    every ``v_t``: the values are ``w_t v_t``), ``a`` (b, l, h), contiguous, in one dtype, ``l`` a
    multiple of ``T``, padded positions already neutral; ``state`` (b, h, dk, dv) or None. Outputs:
    ``o`` (b, l, h, dv) and the final state (b, h, dk, dv).

    Internal layouts are chunk-major, (nc, b, hk, ...): queries and keys of a piece (n, b, hk, T,
    dk); values (n, b, hk, r, T, dv) with ``r = h // hk`` heads per group; cumulative log decays
    ``cs`` (nc, b, hk, r, T); states of a group (b, hk, dk, r, dv), its ``r`` heads side by side, so
    that ``K^T V`` and ``Q S`` are one matmul per group and chunk. The work runs over pieces of
    chunks whose temporaries stay within :data:`PIECE_BYTES` (on CPUs, larger ones fall out of the
    cache, and beyond :data:`~longrange.ops.chunking.TEMPORARY_BYTES` come as fresh pages from the
    kernel every time); the backward recomputes the (T x T) matrices instead of storing them.
    Stored for the backward: the inputs, ``cs`` and the states entering every chunk.
    """

    @staticmethod
    def forward(
        ctx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        w: Tensor | None,
        a: Tensor,  # type: ignore[override]
        state: Tensor | None,
        T: int,
    ) -> tuple[Tensor, Tensor]:
        b, l, hk, dk = k.shape
        h, dv = v.shape[2], v.shape[3]
        r, nc = h // hk, l // T
        qo = (1, 0, 3, 2, 4)  # chunk-major order of (b, n, T, hk, dk)
        cs = a.reshape(b, nc, T, hk, r).permute(1, 0, 3, 4, 2).contiguous().cumsum(-1)  # (nc, b, hk, r, T)
        decay = cs[..., -1].exp()  # (nc, b, hk, r)
        S_all = torch.empty(nc + 1, b, hk, dk, r, dv, dtype=v.dtype, device=v.device)  # entering chunk c; final
        if state is None:
            S_all[0].zero_()
        else:
            S_all[0].copy_(state.reshape(b, hk, r, dk, dv).transpose(2, 3))
        out = torch.empty(b, l, h, dv, dtype=v.dtype, device=v.device)
        out6 = out.view(b, nc, T, hk, r, dv)
        pieces = _pieces(nc, b * h * T * max(T, dk, dv) * v.element_size(), v.device)

        # within chunks, (L o Q K^T) V into the output; each chunk's write K^T (exp(c_T - c) o V)
        for c0, c1 in pieces:
            n = c1 - c0
            qp, kp = _piece(q, c0, c1, T, (hk, dk), qo), _piece(k, c0, c1, T, (hk, dk), qo)
            vp = _values(v, w, c0, c1, T, hk, r)
            csp = cs[c0:c1]
            M = (
                (qp @ kp.transpose(-1, -2)).unsqueeze(3).mul_(_decay_matrix(csp))
                if r == 1
                else (qp @ kp.transpose(-1, -2)).unsqueeze(3) * _decay_matrix(csp)
            )
            out6[:, c0:c1].copy_((M @ vp).permute(1, 0, 4, 2, 3, 5))
            del M
            vdec = (vp * (csp[..., -1:] - csp).exp_().unsqueeze(-1)).transpose(3, 4)
            torch.bmm(
                kp.reshape(n * b * hk, T, dk).transpose(1, 2),
                vdec.reshape(n * b * hk, T, r * dv),
                out=S_all[c0 + 1 : c1 + 1].view(n * b * hk, dk, r * dv),
            )

        # the carry S_{i+1} = exp(c_T) S_i + W_i, in place over the writes
        decay6 = decay.view(nc, b, hk, 1, r, 1)
        linear_scan_(S_all, decay6)

        # from the entering states: exp(c_t) (q_t S_0)
        for c0, c1 in pieces:
            n = c1 - c0
            qp = _piece(q, c0, c1, T, (hk, dk), qo)
            y_off = (qp @ S_all[c0:c1].view(n, b, hk, dk, r * dv)).view(n, b, hk, T, r, dv)
            y_off.mul_(cs[c0:c1].exp().transpose(3, 4).unsqueeze(-1))
            out6[:, c0:c1] += y_off.permute(1, 0, 3, 2, 4, 5)

        ctx.save_for_backward(q, k, v, w, cs, S_all, decay)
        ctx.T, ctx.has_state, ctx.pieces = T, state is not None, pieces
        final = S_all[nc].transpose(2, 3).reshape(b, h, dk, dv)
        return out, final

    @staticmethod
    @once_differentiable
    def backward(
        ctx,
        dout: Tensor | None,
        dfinal: Tensor | None,  # type: ignore[override]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor, Tensor | None, None]:
        q, k, v, w, cs, S_all, decay = ctx.saved_tensors
        T, pieces = ctx.T, ctx.pieces
        b, l, hk, dk = k.shape
        h, dv = v.shape[2], v.shape[3]
        r, nc = h // hk, l // T
        qo, V = (1, 0, 3, 2, 4), (1, 0, 3, 4, 2, 5)  # chunk-major orders of (b, n, T, hk[, r], d)
        kw = dict(dtype=v.dtype, device=v.device)
        if dout is None:
            dout = torch.zeros(b, l, h, dv, **kw)
        dout6 = dout.reshape(b, nc, T, hk, r, dv)
        dq, dk_, dv_ = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dw = None if w is None else torch.empty_like(w)
        dq5, dk5 = dq.view(b, nc, T, hk, dk), dk_.view(b, nc, T, hk, dk)
        dv6 = dv_.view(b, nc, T, hk, r, dv)
        dcs = torch.empty_like(cs)
        dS = torch.empty(nc + 1, b, hk, dk, r, dv, **kw)  # d/d(state entering chunk c); see the carry

        # within chunks and from the entering states
        for c0, c1 in pieces:
            n = c1 - c0
            qp, kp = _piece(q, c0, c1, T, (hk, dk), qo), _piece(k, c0, c1, T, (hk, dk), qo)
            vp = _values(v, w, c0, c1, T, hk, r)
            csp = cs[c0:c1]
            dyp = dout6[:, c0:c1].permute(V).contiguous()  # (n, b, hk, r, T, dv)
            L = _decay_matrix(csp)
            M = (qp @ kp.transpose(-1, -2)).unsqueeze(3) * L
            dM = dyp @ vp.transpose(-1, -2)
            dv6[:, c0:c1].copy_((M.transpose(-1, -2) @ dyp).permute(1, 0, 4, 2, 3, 5))
            M.mul_(dM)  # d/d(c_t - c_s) of the (t, s) entries
            dcsp = M.sum(-1) - M.sum(-2)
            del M
            dG = dM.mul_(L).sum(3) if r > 1 else dM.mul_(L).squeeze(3)  # (n, b, hk, T, T)
            del L
            dqp = dG @ kp
            dk5[:, c0:c1].copy_((dG.transpose(-1, -2) @ qp).permute(1, 0, 3, 2, 4))
            del dG, dM
            dyE = torch.empty(n, b, hk, T, r, dv, **kw)  # dy o exp(c_t)
            torch.mul(dout6[:, c0:c1].permute(1, 0, 3, 2, 4, 5), cs[c0:c1].exp().transpose(3, 4).unsqueeze(-1), out=dyE)
            dyE = dyE.view(n, b, hk, T, r * dv)
            Sp = S_all[c0:c1].view(n, b, hk, dk, r * dv)
            dqp.add_(dyE @ Sp.transpose(-1, -2))
            dq5[:, c0:c1].copy_(dqp.permute(1, 0, 3, 2, 4))
            torch.bmm(
                qp.reshape(n * b * hk, T, dk).transpose(1, 2),
                dyE.reshape(n * b * hk, T, r * dv),
                out=dS[c0:c1].view(n * b * hk, dk, r * dv),
            )
            qS = (qp @ Sp).view(n, b, hk, T, r, dv).mul_(dyE.view(n, b, hk, T, r, dv))
            dcs[c0:c1] = dcsp.add_(qS.sum(-1).transpose(3, 4))

        # the carry, backwards, in place: dS[c] = dS_in[c] + exp(c_T of chunk c) dS[c + 1] becomes the
        # gradient w.r.t. the state entering chunk c, so dS[c + 1] is that w.r.t. the write of chunk c
        if dfinal is None:
            dS[nc].zero_()
        else:
            dS[nc].copy_(dfinal.reshape(b, hk, r, dk, dv).transpose(2, 3))
        decay6 = decay.view(nc, b, hk, 1, r, 1)
        linear_scan_(dS, decay6, reverse=True)
        dstate = dS[0].transpose(2, 3).reshape(b, h, dk, dv) if ctx.has_state else None

        # the writes W = K^T (u o V), u = exp(c_T - c)
        for c0, c1 in pieces:
            n = c1 - c0
            kp = _piece(k, c0, c1, T, (hk, dk), qo)
            vp = _values(v, w, c0, c1, T, hk, r)
            csp = cs[c0:c1]
            u = (csp[..., -1:] - csp).exp_()
            vdec = (vp * u.unsqueeze(-1)).transpose(3, 4).reshape(n, b, hk, T, r * dv)
            dW = dS[c0 + 1 : c1 + 1].view(n, b, hk, dk, r * dv)
            dlast = (dS[c0 + 1 : c1 + 1] * S_all[c0:c1]).sum((3, 5)).mul_(decay[c0:c1])
            dk5[:, c0:c1] += (vdec @ dW.transpose(-1, -2)).permute(1, 0, 3, 2, 4)
            dvdec = (kp @ dW).view(n, b, hk, T, r, dv).transpose(3, 4)  # (n, b, hk, r, T, dv)
            du = (vp * dvdec).sum(-1).mul_(u)
            dv6[:, c0:c1] += (dvdec * u.unsqueeze(-1)).permute(1, 0, 4, 2, 3, 5)
            dcsp = dcs[c0:c1]
            dcsp.sub_(du)
            dcsp[..., -1] += du.sum(-1) + dlast
            if w is not None:  # d/dv so far is d/d(w v): split it
                dvw = dv6[:, c0:c1]
                dw.view(b, nc, T, hk, r)[:, c0:c1] = (dvw * v.view(b, nc, T, hk, r, dv)[:, c0:c1]).sum(-1)
                dvw.mul_(w.view(b, nc, T, hk, r, 1)[:, c0:c1])

        # cumulative sums back to log decays, in the caller's layout
        da = dcs.flip(-1).cumsum(-1).flip(-1).permute(1, 0, 4, 2, 3).reshape(b, l, h)
        return dq, dk_, dv_, dw, da, dstate, None


def scalar_decay_chunked_core(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    state: Tensor | None,
    chunk_size: int,
    scale: float = 1.0,
    v_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The chunked algorithm on checked inputs, without checks or mask handling (for SSD and Mamba-3).

    ``q``, ``k`` (b, l, hk, dk), ``v`` (b, l, h, dv), ``a`` (b, l, h), ``v_scale`` (b, l, h) or None
    (the values are then ``v_scale_t v_t``, formed chunk by chunk: SSD's ``dt x``), all in one dtype,
    padded positions already neutral (``a = 0`` and ``k = 0`` or ``v_scale = 0``); ``state`` (b, h,
    dk, dv) or None; ``l >= 1``. Returns the outputs (b, l, h, dv) in the compute dtype and the
    final state (b, h, dk, dv).
    """
    l = k.shape[1]
    T = min(chunk_size, l)
    pad = -l % T
    if pad:
        q, k, v, a = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (q, k, v, a))
        v_scale = None if v_scale is None else F.pad(v_scale, (0, 0, 0, pad))
    v_scale = None if v_scale is None else v_scale.contiguous()
    out, final = _Chunked.apply(q.contiguous(), k.contiguous(), v.contiguous(), v_scale, a.contiguous(), state, T)
    if pad:
        out = out[:, :l]
    if scale != 1.0:
        out = out * scale
    return out, final


def scalar_decay_chunk(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_decay: Tensor,
    scale: float = 1.0,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor | tuple[Tensor, Tensor]:
    """The scalar-decay recurrence, chunkwise parallel (see the module docstring for the algorithm).

    Same arguments and results as :func:`scalar_decay_naive`, plus ``chunk_size`` (a positive
    integer; it changes the speed, not the result). Computes in the compute dtype.
    """
    op = "scalar_decay_chunk"
    b, l, h, hk, dk, dv = check_grouped(op, q, k, v)
    require_shape(op, "log_decay", log_decay, (b, l, h), "(batch, length, heads)")
    mask = check_mask(op, mask, b, l)
    chunk_size = check_chunk_size(op, chunk_size)
    dtype = compute_dtype(q, k, v, log_decay, initial_state)
    state = None if initial_state is None else initial(op, initial_state, b, h, dk, dv, dtype, k.device)
    if l == 0:
        o = v.new_zeros(b, 0, h, dv)
        S = state if state is not None else torch.zeros(b, h, dk, dv, dtype=dtype, device=v.device)
        return (o, S) if output_final_state else o
    a = keep(mask, log_decay.to(dtype))
    k_ = keep(mask, k.to(dtype))
    o, S = scalar_decay_chunked_core(q.to(dtype), k_, v.to(dtype), a, state, chunk_size, scale)
    o = keep(mask, o).to(v.dtype)
    return (o, S) if output_final_state else o
