"""Gated Linear Attention (GLA) as pure tensor ops.

S. Yang, B. Wang, Y. Shen, R. Panda, Y. Kim, "Gated Linear Attention Transformers with
Hardware-Efficient Training", ICML 2024, arXiv:2312.06635.

The recurrence
--------------
Per head, with row vectors ``q_t``, ``k_t`` (1 x dk), ``v_t`` (1 x dv), a data-dependent decay of
every key dimension ``alpha_t = exp(g_t)`` (1 x dk, ``g_t <= 0`` its log, finite) and a state
``S_t`` (dk x dv)::

    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t
    o_t = scale * q_t S_t

``scale`` defaults to dk^-1/2. Unrolled, with ``G_t = g_1 + ... + g_t``::

    o_t = scale * sum_{s<=t} (q_t o exp(G_t - G_s)) . k_s  v_s  +  scale * (q_t o exp(G_t)) S_0

At a padded position (``mask`` False) the state is carried unchanged (``g = 0``, ``k = 0`` there) and
the output is zero.

Implementations
---------------
:func:`gla_naive`: a Python loop over time in float64, the ground truth. :func:`gla_step`: one
position, for decoding. :func:`gla_chunk`: chunkwise parallel (the paper's chunkwise form). Within a
chunk of ``C`` positions, ``G`` is the cumulative log decay from the chunk start and ``S_0`` the
entering state::

    O   = scale * (A V + (Q o exp(G)) S_0),   A[t, s] = sum_d q_td k_sd exp(G_td - G_sd)  (s <= t)
    S_C = diag(exp(G_C)) S_0 + (K o exp(G_C - G))^T V

and the chunk-to-chunk carry ``S_{i+1} = diag(exp(G_C)) S_i + W_i`` is a short loop over chunks.
For ``A`` there are two ways, chosen chunk by chunk:

* relative to the chunk start, ``A = lower((Q o exp(G)) (K o exp(-G))^T)``, one matmul: the
  exponents ``-G`` are positive, so this is taken only where the chunk's total decay ``-G_C`` is
  at most half the log of the dtype's largest number (44 in float32, 354 in float64) in every key
  dimension, which bounds every factor and product: nothing can overflow (the usual case: GLA's
  gates ``logsigmoid(.) / 16`` decay by far less);
* for chunks with a stronger decay, the secondary chunking of the paper, in which nothing positive
  is exponentiated. ``A`` is built from sub-chunks of ``c = gcd(C, 16)`` positions; a block of
  sub-chunk ``I`` (rows) and an earlier sub-chunk ``J`` (columns) factors through the cumulative
  decays at the sub-chunk boundaries: with ``E_J`` the value of ``G`` at the end of ``J`` and
  ``R_I = E_{I-1}`` its value just before ``I``::

      A_IJ = (Q_I o exp(G_I - R_I)) diag(exp(R_I - E_J)) (K_J o exp(E_J - G_J))^T

  a matmul per block with every exponent <= 0; the diagonal blocks (``I = J``) are computed exactly,
  column by column, ``A[t, s] = (q_t o k_s o exp(G_t - G_s)).sum()`` for ``t >= s`` (a hand-written
  autograd function that recomputes instead of storing the (c x c x dk) terms).

Either way no overflow or cancellation, however strong the decay. Which chunks take the second way
is read on the host (one device synchronisation per call on a GPU, and the slower path only where
needed); dry runs without data (meta or fake tensors) take the first way everywhere.

Dtypes: computation in float64 if a floating input is float64, else float32 (the naive loop always
in float64); outputs in ``v``'s dtype, states in the compute dtype. Device: the inputs'.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from longrange.ops.dataless import holds_data
from longrange.ops.matrix_state.common import (
    check_chunk_size,
    check_mask,
    check_qkv,
    check_shape,
    compute_dtype,
    default_scale,
    initial,
    keep,
    require_shape,
    shape_of,
)

__all__ = ["gla_naive", "gla_chunk", "gla_step"]

#: Largest sub-chunk of :func:`gla_chunk` (the sub-chunk is ``gcd(chunk_size, SUB_CHUNK)``).
SUB_CHUNK = 16


def _prepare(
    op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, initial_state: Tensor | None, mask: Tensor | None
) -> tuple[int, int, int, int, int, torch.dtype, Tensor | None]:
    b, l, h, dk, dv = check_qkv(op, q, k, v)
    require_shape(op, "g", g, (b, l, h, dk), "(batch, length, heads, dk)")
    mask = check_mask(op, mask, b, l)
    check_shape(op, "initial_state", initial_state, (b, h, dk, dv), "(batch, heads, dk, dv)")
    return b, l, h, dk, dv, compute_dtype(q, k, v, g, initial_state), mask


def gla_naive(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Gated linear attention by a Python loop over time, in float64 (the ground truth).

    ``S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t``, ``o_t = scale * q_t S_t`` (Yang et al. 2023,
    arXiv:2312.06635; see the module docstring).

    Args:
        q, k: (batch, length, heads, dk).
        v: (batch, length, heads, dv).
        g: (batch, length, heads, dk), the log of the decay, <= 0.
        scale: factor of the output, dk^-1/2 by default.
        initial_state: (batch, heads, dk, dv) or None (zeros).
        output_final_state: also return the state after the last position.
        mask: (batch, length) bool, True at real positions, or None.

    Returns:
        ``o`` (batch, length, heads, dv) in ``v``'s dtype, or ``(o, final_state)`` with the state
        (batch, heads, dk, dv) in the compute dtype.
    """
    op = "gla_naive"
    b, l, h, dk, dv, dtype, mask = _prepare(op, q, k, v, g, initial_state, mask)
    scale = default_scale(scale, dk)
    f64 = torch.float64
    S = initial(op, initial_state, b, h, dk, dv, f64, k.device)
    out_dtype = v.dtype
    q, k, v, g = q.to(f64), k.to(f64), v.to(f64), g.to(f64)
    outs = []
    for t in range(l):
        new = g[:, t, :, :, None].exp() * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        o = scale * torch.einsum("bhk,bhkv->bhv", q[:, t], new)
        if mask is not None:
            m = mask[:, t, None, None]
            new = torch.where(m[..., None], new, S)
            o = o * m
        S = new
        outs.append(o)
    o = (torch.stack(outs, dim=1) if outs else v.new_zeros(b, 0, h, dv)).to(out_dtype)
    return (o, S.to(dtype)) if output_final_state else o


def gla_step(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, state: Tensor | None, scale: float | None = None
) -> tuple[Tensor, Tensor]:
    """One position of gated linear attention, for decoding.

    ``q``, ``k``, ``g`` (batch, heads, dk), ``v`` (batch, heads, dv), ``state`` (batch, heads, dk, dv)
    or None (zeros). Returns ``(o (batch, heads, dv) in v's dtype, new_state in the compute dtype)``
    with ``new_state = diag(exp(g)) state + k^T v`` and ``o = scale * q new_state``.
    """
    op = "gla_step"
    if not isinstance(k, Tensor) or k.dim() != 3:
        raise ValueError(f"{op}: k must have shape (batch, heads, dk), got {shape_of(k)}")
    b, h, dk = k.shape
    if not isinstance(q, Tensor) or q.shape != k.shape:
        raise ValueError(f"{op}: q must have the shape of k (batch, heads, dk)={tuple(k.shape)}, got {shape_of(q)}")
    if not isinstance(v, Tensor) or v.dim() != 3 or v.shape[:2] != (b, h):
        raise ValueError(f"{op}: v must have shape (batch, heads, dv)=({b}, {h}, dv), got {shape_of(v)}")
    dv = v.shape[2]
    require_shape(op, "g", g, (b, h, dk), "(batch, heads, dk)")
    dtype = compute_dtype(q, k, v, g, state)
    S = initial(op, state, b, h, dk, dv, dtype, k.device)
    new = g.to(dtype).exp().unsqueeze(-1) * S + k.to(dtype).unsqueeze(-1) * v.to(dtype).unsqueeze(-2)
    o = default_scale(scale, dk) * (q.to(dtype).unsqueeze(-2) @ new).squeeze(-2)
    return o.to(v.dtype), new


class _DiagonalBlocks(torch.autograd.Function):
    """``A[n, t, s] = sum_d q[n, t, d] k[n, s, d] exp(G[n, t, d] - G[n, s, d])`` for ``s <= t``, 0
    above the diagonal, for ``q``, ``k``, ``G`` (N, c, dk): one column ``s`` at a time, so that every
    exponent is a difference ``G_t - G_s`` with ``t >= s`` and no (N, c, c, dk) tensor is stored."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, G: Tensor) -> Tensor:  # type: ignore[override]
        N, c, _ = q.shape
        A = q.new_zeros(N, c, c)
        for s in range(c):
            E = (G[:, s:] - G[:, s : s + 1]).exp_()
            A[:, s:, s] = (E.mul_(q[:, s:]).mul_(k[:, s : s + 1])).sum(-1)
        ctx.save_for_backward(q, k, G)
        return A

    @staticmethod
    @once_differentiable
    def backward(ctx, dA: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        q, k, G = ctx.saved_tensors
        c = q.shape[1]
        dq, dk, dG = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(G)
        for s in range(c):
            E = (G[:, s:] - G[:, s : s + 1]).exp_()
            w = dA[:, s:, s, None]  # (N, c - s, 1)
            wE = E.mul_(w)
            dq[:, s:].addcmul_(wE, k[:, s : s + 1])
            P = wE.mul_(q[:, s:])  # dA_ts q_t exp(G_t - G_s), then times k_s
            dk[:, s] += P.sum(1)
            P.mul_(k[:, s : s + 1])
            dG[:, s:] += P
            dG[:, s] -= P.sum(1)
        return dq, dk, dG


def _exp_limit(dtype: torch.dtype) -> float:
    """Largest exponent :func:`_within_chunks` lets ``exp`` see: half the log of the dtype's largest
    number (44 in float32, 354 in float64), so that neither factor nor their products overflow."""
    return 0.5 * math.log(torch.finfo(dtype).max)


def _within_chunks_exact(q: Tensor, k: Tensor, v: Tensor, G: Tensor) -> Tensor:
    """``A V`` for chunks of any decay: sub-chunk blocks below the diagonal through the boundary
    decays, diagonal blocks column by column (see the module docstring). (N, T, d) in and out."""
    N, T, dk = q.shape
    c = math.gcd(T, SUB_CHUNK)
    ns = T // c
    Gs, qs, ks, vs = (t.reshape(N, ns, c, t.shape[-1]) for t in (G, q, k, v))
    A = _DiagonalBlocks.apply(qs.reshape(-1, c, dk), ks.reshape(-1, c, dk), Gs.reshape(-1, c, dk))
    o = A.view(N, ns, c, c) @ vs
    if ns > 1:
        end = Gs[..., -1, :]  # E_J (N, ns, dk)
        before = F.pad(end[..., :-1, :], (0, 0, 1, 0))  # R_I = E_{I-1}, 0 before the first
        qh = qs * (Gs - before.unsqueeze(-2)).exp()
        kh = ks * (end.unsqueeze(-2) - Gs).exp()
        for d in range(1, ns):  # the blocks (I, I - d)
            mid = (before[..., d:, :] - end[..., : ns - d, :]).exp().unsqueeze(-2)
            blocks = (qh[..., d:, :, :] * mid) @ kh[..., : ns - d, :, :].transpose(-1, -2)
            o = o + F.pad(blocks @ vs[..., : ns - d, :, :], (0, 0, 0, 0, d, 0))
    return o.reshape(N, T, -1)


def _within_chunks(qe: Tensor, q: Tensor, k: Tensor, v: Tensor, G: Tensor) -> Tensor:
    """``A V`` within each chunk, ``A[t, s] = sum_d q_td k_sd exp(G_td - G_sd)`` for ``s <= t``;
    ``q``, ``k``, ``G`` (N, T, dk), ``v`` (N, T, dv), ``qe = q o exp(G)``.

    A chunk whose total decay ``-G_T`` stays within :func:`_exp_limit` in every key dimension takes
    the factorisation relative to the chunk start, ``A = lower((Q o exp(G)) (K o exp(-G))^T)``: one
    matmul, with positive exponents that are bounded and cannot overflow. The other chunks (strong
    decays) take :func:`_within_chunks_exact`, which exponentiates nothing positive. Compiled
    (``train.compile``), where the selection of those chunks would break the graph, the exact path is
    computed for every chunk and kept where needed.
    """
    T = q.shape[1]
    upper = torch.ones(T, T, dtype=torch.bool, device=q.device).triu_(1)
    if not holds_data(G):  # dry runs (meta or fake tensors): the usual case, every chunk within the limit
        return (qe @ (k * (-G).exp()).transpose(-1, -2)).masked_fill_(upper, 0.0) @ v
    strong = (-G[:, -1]).amax(-1) > _exp_limit(G.dtype)
    compiling = torch.compiler.is_compiling()
    Gf = G  # the log decays the factorisation runs on
    if compiling or bool(strong.any()):
        # The factorisation runs on G = 0 in the strong chunks, whose results the exact path replaces:
        # their values and gradients are then finite and discarded. (Clamping exp(-G) instead kept the
        # forward finite, but its gradient overflowed and reached the log decays as 0 x inf = NaN.)
        Gf = torch.where(strong[:, None, None], torch.zeros_like(G), G)
        qe = q * Gf.exp()
    # exp(-G) <= exp(limit) where used. It is exponentiated, not 1 / exp(G): the gradient of a quotient
    # squares the divisor, exp(2 limit), which overflowed float32 (inf into the log decays, NaN in the
    # gate's projection: GLA diverged where a gate saturated).
    o = (qe @ (k * (-Gf).exp()).transpose(-1, -2)).masked_fill_(upper, 0.0) @ v
    if compiling:  # no data-dependent branch in a graph: the exact path where needed
        return torch.where(strong[:, None, None], _within_chunks_exact(q, k, v, G), o)
    if bool(strong.any()):
        idx = strong.nonzero().squeeze(1)
        o = o.index_put((idx,), _within_chunks_exact(q[idx], k[idx], v[idx], G[idx]))
    return o


def default_chunk_size(k: Tensor) -> int:
    """The chunk length :func:`gla_chunk` uses unless told: on a CPU 16 (one sub-chunk) for key
    widths up to 32, where chunks of 64 took 1.2-1.8x as long forward and backward (batch 32,
    length 128, 8 heads of 8: 15 ms with chunks of 16, 27 with 64), else 64, the chunk of
    flash-linear-attention's kernels (and the fastest here at 64-wide heads and length 4096)."""
    return 16 if k.device.type == "cpu" and k.shape[-1] <= 32 else 64


def gla_chunk(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Gated linear attention, chunkwise parallel (see the module docstring for the algorithm).

    Same arguments and results as :func:`gla_naive`, plus ``chunk_size`` (a positive integer; it
    changes the speed, not the result; multiples of 16 use sub-chunks of 16; None:
    :func:`default_chunk_size`). Computes in the compute dtype; forward and backward through autograd.
    """
    op = "gla_chunk"
    b, l, h, dk, dv, dtype, mask = _prepare(op, q, k, v, g, initial_state, mask)
    chunk_size = check_chunk_size(op, default_chunk_size(k) if chunk_size is None else chunk_size)
    scale = default_scale(scale, dk)
    S = initial(op, initial_state, b, h, dk, dv, dtype, k.device)
    if l == 0:
        o = v.new_zeros(b, 0, h, dv)
        return (o, S) if output_final_state else o
    out_dtype = v.dtype
    q, v = q.to(dtype), v.to(dtype)
    k, g = keep(mask, k.to(dtype)), keep(mask, g.to(dtype))

    T = min(chunk_size, l)
    nc = -(-l // T)
    pad = nc * T - l
    if pad:
        q, k, v, g = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v, g))
    # (b h nc, T, d): chunks (batch, head, chunk) and the positions in a chunk
    N = b * h * nc
    qc, kc, vc, gc = (
        t.reshape(b, nc, T, h, t.shape[-1]).permute(0, 3, 1, 2, 4).reshape(N, T, t.shape[-1]) for t in (q, k, v, g)
    )
    G = gc.cumsum(1)  # log decay from the chunk start
    eG = G.exp()
    qe = qc * eG
    o = _within_chunks(qe, qc, kc, vc, G)

    # between chunks: the carry of the states
    last = G[:, -1]  # (N, dk)
    writes = ((kc * (last.unsqueeze(1) - G).exp()).transpose(1, 2) @ vc).view(b, h, nc, dk, dv)
    entering = []
    for w, d in zip(writes.unbind(2), last.exp().view(b, h, nc, dk, 1).unbind(2)):
        entering.append(S)
        S = torch.addcmul(w, d, S)
    o = torch.baddbmm(o, qe, torch.stack(entering, dim=2).view(N, dk, dv))

    o = (scale * o).view(b, h, nc, T, dv).permute(0, 2, 3, 1, 4).reshape(b, nc * T, h, dv)[:, :l]
    o = keep(mask, o).to(out_dtype)
    return (o, S) if output_final_state else o
