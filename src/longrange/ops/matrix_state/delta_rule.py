"""The delta rule (DeltaNet) and the gated delta rule (Gated DeltaNet) as pure tensor ops.

Layout and conventions are those of the matrix-state family (:mod:`.common`): ``q``, ``k``
(batch, length, heads, dk), ``v`` (batch, length, heads, dv), per-position scalars ``beta`` and
``g`` (batch, length, heads), a per-head state ``S`` (dk, dv) read by ``o_t = q_t S_t``, states
(batch, heads, dk, dv), an optional boolean ``mask`` (batch, length) that is True at real
positions. Row vectors throughout: ``q_t``, ``k_t`` are 1 x dk, ``v_t`` is 1 x dv.

The recurrences
---------------
Gated delta rule (Gated DeltaNet; S. Yang, J. Kautz, A. Hatamizadeh, "Gated Delta Networks:
Improving Mamba2 with Delta Rule", arXiv:2412.06464, 2024)::

    S_t = exp(g_t) (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t
    o_t = scale * q_t S_t

with ``g_t`` the log of a scalar decay (``g_t <= 0``, finite). The delta rule (DeltaNet; S. Yang,
B. Wang, Y. Zhang, Y. Shen, Y. Kim, "Parallelizing Linear Transformers with the Delta Rule over
Sequence Length", NeurIPS 2024, arXiv:2406.06484) is the case ``g_t = 0``::

    S_t = (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t
    o_t = scale * q_t S_t

With column vectors instead this reads ``S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t
v_t^T``, ``o_t = scale * S_t^T q_t``. Written as an update, the step first decays, then replaces
the value the state holds for ``k_t`` by a ``beta_t``-blend of it and ``v_t`` (the delta rule of
Widrow & Hoff, used as a fast-weight update by Schlag, Irie & Schmidhuber, arXiv:2102.11174)::

    S'  = exp(g_t) S_{t-1}
    u_t = beta_t (v_t - k_t S')            (1 x dv)
    S_t = S' + k_t^T u_t

``scale`` defaults to dk^-1/2. At a padded position (``mask`` False) the state is carried
unchanged (``g = 0`` and ``beta = 0`` there) and the output is zero; ``q``, ``k``, ``v`` there
enter only multiplied by zero (they must be finite).

Stability. The transition ``I - beta k^T k`` is symmetric, with eigenvalue ``1 - beta ||k||^2``
along ``k`` and 1 on its orthogonal complement, so its spectral norm is at most 1 exactly when
``0 <= beta ||k||^2 <= 2``; then ``||S_t|| <= exp(g_t) ||S_{t-1}|| + |beta_t| ||k_t|| ||v_t||`` and
the state stays bounded. DeltaNet layers L2-normalise the keys (``||k|| = 1``) and take ``beta`` in
(0, 1) (a sigmoid: the transition erases a fraction ``beta`` of the old value, ``beta = 1``
overwrites it), or in (0, 2) to allow the negative eigenvalues of Grazzi et al., "Unlocking
State-Tracking in Linear RNNs Through Negative Eigenvalues", arXiv:2411.12537. These ops neither
normalise nor clip: ``||k|| <= 1`` and ``0 <= beta <= 2`` is sufficient for a non-expanding
transition; beyond it the state can grow geometrically along ``k``, and so can the entries of the
chunked form's triangular inverse.

Implementations
---------------
``*_naive``: a Python loop over time, one :func:`delta_rule_step`-style update per position, in
the compute dtype (float64 when an input is float64); the ground truth. Its autograd graph keeps
one (dk, dv) state per position and head. ``*_step``: one position, for decoding. ``*_chunk``:
the chunkwise-parallel form of Yang et al. 2024 (section 3), through the WY / UT representation
of a product of generalised Householder transitions. Within a chunk of C positions, with ``S_0``
the state entering it and, for the gated rule, ``gam_t = g_1 + ... + g_t`` the cumulative
log-decay from the chunk's start (``gam = 0`` for the ungated rule)::

    A    = strictly_lower( beta_t exp(gam_t - gam_s) k_t . k_s )           (C x C)
    T    = (I + A)^{-1} diag(beta)
    W    = T (exp(gam) * K),   U = T V                                     (C x dk, C x dv)
    u    = U - W S_0                                       (row t: the u_t of the update above)
    O    = scale ( (exp(gam) * Q) S_0 + P u ),   P = lower( exp(gam_t - gam_s) q_t . k_s )
    S_C  = exp(gam_C) S_0 + (exp(gam_C - gam) * K)^T u

``(I + A)^{-1}`` comes from a unit-lower-triangular solve against the identity
(``torch.linalg.solve_triangular``); every exponent is a difference ``gam_t - gam_s`` with
``t >= s`` (entries above the diagonal are set to -inf *before* ``exp``), ``gam_t`` or
``gam_C - gam_s``, so with ``g <= 0`` nothing positive is exponentiated and nothing overflows
however strong the decay. ``A``, ``P``, ``T``, ``W`` and ``U`` are computed for all chunks at once
(batched matmuls); the loop over chunks does only ``u = U - W S`` and the state update (two small
matmuls per chunk); the outputs are then one batched ``Q S + P u``. The ungated path skips every
decay term (about 10% of the time, measured). Forward and backward run through autograd, except
for the triangular inverse, whose backward is written out.

Cost: per position the chunked form does the three (dk x dv) products of the loop (``W S``,
``K^T u``, ``Q S``) plus O(C (dk + dv)) for the chunk's (C x C) products, so it does not do fewer
operations than the loop; it is faster because they are batched matrix products rather than
per-position small ones. Measured on this project's 2-core CPU, one thread, forward + backward,
float32, length 4096, dk = dv = 64: with batch 8 and 4 heads the chunked forms take 0.6 to 0.7 s
(chunks of 32, the CPU default at this width) or 0.7 to 0.9 s (chunks of 64; 128: 1.2 to 1.4 s)
against 3.1 to 3.8 s for the loop, about 4 to 5 times faster; with one sequence and one head, 0.02
to 0.03 s against 1.1 to 1.2 s, 40 to 60 times. Chunks of 32 were the fastest on this CPU for
dk = dv = 64, and chunks of 16 for the small models' key widths (8 to 32: at batch 32, length 128,
8 heads of 8, 41 ms with chunks of 16, 68 with 32 and 126 with 64), hence
:func:`default_chunk_size`.

On CPUs, fresh allocations above glibc's mmap threshold are zeroed page by page every time (see
:mod:`longrange.ops.chunking`): the chunked form therefore works through groups of batch elements
and heads (and, for a single very long head, segments of the length with the state carried across)
whose temporaries stay below ``chunking.TEMPORARY_BYTES``; at length 4096 (batch 8, 4 heads,
64 features) this cut the time of a forward and backward pass by about a third.

Dtypes: computation in float64 if any floating input is float64, else float32; outputs in ``v``'s
dtype, states in the compute dtype. Device: the inputs'.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from longrange.ops.chunking import group_size
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

__all__ = [
    "delta_rule_naive",
    "delta_rule_chunk",
    "delta_rule_step",
    "gated_delta_rule_naive",
    "gated_delta_rule_chunk",
    "gated_delta_rule_step",
]


# ----------------------------------------------------------------------------------------------
# argument checks and preparation


def _prepare(
    op: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None,
    gated: bool,
    scale: float | None,
    initial_state: Tensor | None,
    mask: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor, float, Tensor | None]:
    """Checked inputs in the compute dtype, ``beta`` and ``g`` zeroed at padded positions, the
    starting state and the scale."""
    b, l, h, dk, dv = check_qkv(op, q, k, v)
    require_shape(op, "beta", beta, (b, l, h), "(batch, length, heads)")
    if gated:
        require_shape(op, "g", g, (b, l, h), "(batch, length, heads)")
    mask = check_mask(op, mask, b, l)
    dtype = compute_dtype(q, k, v, beta, g, initial_state)
    state = initial(op, initial_state, b, h, dk, dv, dtype, k.device)
    beta = keep(mask, beta.to(dtype))
    if g is not None:
        g = keep(mask, g.to(dtype))
    return q.to(dtype), k.to(dtype), v.to(dtype), beta, g, state, default_scale(scale, dk), mask


def _prepare_step(
    op: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None,
    gated: bool,
    state: Tensor | None,
    scale: float | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor, float]:
    if not isinstance(k, Tensor) or k.dim() != 3:
        raise ValueError(f"{op}: k must have shape (batch, heads, dk), got {shape_of(k)}")
    b, h, dk = k.shape
    if not isinstance(q, Tensor) or q.shape != k.shape:
        raise ValueError(f"{op}: q must have the shape of k (batch, heads, dk)={tuple(k.shape)}, got {shape_of(q)}")
    if not isinstance(v, Tensor) or v.dim() != 3 or v.shape[:2] != (b, h):
        raise ValueError(f"{op}: v must have shape (batch, heads, dv)=({b}, {h}, dv), got {shape_of(v)}")
    dv = v.shape[2]
    require_shape(op, "beta", beta, (b, h), "(batch, heads)")
    if gated:
        require_shape(op, "g", g, (b, h), "(batch, heads)")
    dtype = compute_dtype(q, k, v, beta, g, state)
    if state is None:
        state = torch.zeros(b, h, dk, dv, dtype=dtype, device=k.device)
    else:
        check_shape(op, "state", state, (b, h, dk, dv), "(batch, heads, dk, dv)")
        state = state.to(dtype)
    return (
        q.to(dtype),
        k.to(dtype),
        v.to(dtype),
        beta.to(dtype),
        None if g is None else g.to(dtype),
        state,
        default_scale(scale, dk),
    )


# ----------------------------------------------------------------------------------------------
# one position


def _update(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, state: Tensor) -> tuple[Tensor, Tensor]:
    """One step of the (gated) delta rule, in the compute dtype, ``q`` already scaled: q, k (..., dk),
    v (..., dv), beta, g (...), state (..., dk, dv) -> (o (..., dv), new state). Computed as
    ``u = beta (v - exp(g) k S)``, ``S' = exp(g) S + k^T u``: one new state-sized tensor per step."""
    ks = (k.unsqueeze(-2) @ state).squeeze(-2)  # k S_{t-1}
    if g is None:
        u = beta[..., None] * (v - ks)
        state = torch.addcmul(state, k.unsqueeze(-1), u.unsqueeze(-2))
    else:
        a = g.exp()[..., None]
        u = beta[..., None] * (v - a * ks)
        state = torch.addcmul(k.unsqueeze(-1) * u.unsqueeze(-2), state, a[..., None])
    return (q.unsqueeze(-2) @ state).squeeze(-2), state


def _step(
    op: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None,
    gated: bool,
    state: Tensor | None,
    scale: float | None,
) -> tuple[Tensor, Tensor]:
    out_dtype = v.dtype
    q, k, v, beta, g, state, scale = _prepare_step(op, q, k, v, beta, g, gated, state, scale)
    o, state = _update(q * scale, k, v, beta, g, state)
    return o.to(out_dtype), state


def delta_rule_step(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, state: Tensor | None, scale: float | None = None
) -> tuple[Tensor, Tensor]:
    """One position of the delta rule: ``S = (I - beta k^T k) state + beta k^T v``, ``o = scale q S``.

    q, k (batch, heads, dk), v (batch, heads, dv), beta (batch, heads), state (batch, heads, dk, dv)
    or None for zeros; returns ``(o (batch, heads, dv) in v's dtype, S in the compute dtype)``.
    """
    return _step("delta_rule_step", q, k, v, beta, None, False, state, scale)


def gated_delta_rule_step(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor | None, scale: float | None = None
) -> tuple[Tensor, Tensor]:
    """One position of the gated delta rule:
    ``S = exp(g) (I - beta k^T k) state + beta k^T v``, ``o = scale q S``.

    q, k (batch, heads, dk), v (batch, heads, dv), g and beta (batch, heads), state
    (batch, heads, dk, dv) or None for zeros; returns ``(o (batch, heads, dv) in v's dtype, S in the
    compute dtype)``.
    """
    return _step("gated_delta_rule_step", q, k, v, beta, g, True, state, scale)


# ----------------------------------------------------------------------------------------------
# the loop over time (ground truth)


def _naive(
    op: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None,
    gated: bool,
    scale: float | None,
    initial_state: Tensor | None,
    output_final_state: bool,
    mask: Tensor | None,
) -> Tensor | tuple[Tensor, Tensor]:
    out_dtype = v.dtype
    q, k, v, beta, g, state, scale, mask = _prepare(op, q, k, v, beta, g, gated, scale, initial_state, mask)
    # unbind, not q[:, t]: the backward of L selects would fill L full-size zero tensors (quadratic).
    gs = [None] * q.shape[1] if g is None else g.unbind(1)
    outs = []
    for q_t, k_t, v_t, beta_t, g_t in zip((q * scale).unbind(1), k.unbind(1), v.unbind(1), beta.unbind(1), gs):
        o_t, state = _update(q_t, k_t, v_t, beta_t, g_t, state)
        outs.append(o_t)
    o = torch.stack(outs, dim=1) if outs else v.new_zeros(v.shape)
    o = keep(mask, o).to(out_dtype)
    return (o, state) if output_final_state else o


def delta_rule_naive(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """The delta rule (DeltaNet, Yang et al. 2024, arXiv:2406.06484) as a loop over time::

        S_t = (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t,    o_t = scale * q_t S_t

    q, k (batch, length, heads, dk), v (batch, length, heads, dv), beta (batch, length, heads),
    ``scale`` default dk^-1/2, ``initial_state`` (batch, heads, dk, dv) or zeros, ``mask``
    (batch, length) bool True at real positions. Keys are used as given (the layer normalises
    them; stable for ``||k|| <= 1``, ``0 <= beta <= 2``). Returns ``o`` (batch, length, heads, dv)
    in v's dtype, and the final state (compute dtype) too when ``output_final_state``.
    """
    return _naive("delta_rule_naive", q, k, v, beta, None, False, scale, initial_state, output_final_state, mask)


def gated_delta_rule_naive(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """The gated delta rule (Gated DeltaNet, Yang, Kautz & Hatamizadeh 2024, arXiv:2412.06464) as a
    loop over time::

        S_t = exp(g_t) (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t,    o_t = scale * q_t S_t

    ``g`` (batch, length, heads) is the log of the scalar decay (``<= 0``), given before ``beta`` as
    in FLA's ``chunk_gated_delta_rule(q, k, v, g, beta)`` (``g`` and ``beta`` have the same shape:
    pass them by keyword where in doubt); other arguments and the return value as in
    :func:`delta_rule_naive`.
    """
    return _naive("gated_delta_rule_naive", q, k, v, beta, g, True, scale, initial_state, output_final_state, mask)


# ----------------------------------------------------------------------------------------------
# chunkwise-parallel form


class _UnitLowerInverse(torch.autograd.Function):
    """``T = (I + strictly_lower(a))^{-1}`` for ``a`` (..., c, c), by a unit-lower-triangular solve
    against the identity. The diagonal and the upper triangle of ``a`` are not read and receive no
    gradient. Backward: ``dA = -strictly_lower(T^T dT T^T)``, two matmuls (autograd's backward of
    the solve takes a second triangular solve, slower on CPUs); written with differentiable ops on
    the saved output, so it can itself be differentiated."""

    @staticmethod
    def forward(ctx, a: Tensor) -> Tensor:  # type: ignore[override]
        eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        t = torch.linalg.solve_triangular(a, eye, upper=False, unitriangular=True)
        ctx.save_for_backward(t)
        return t

    @staticmethod
    def backward(ctx, dt: Tensor) -> Tensor:  # type: ignore[override]
        (t,) = ctx.saved_tensors
        tt = t.transpose(-1, -2)
        return -(tt @ dt @ tt).tril(-1)


def _blocks(x: Tensor, n: int, c: int) -> Tensor:
    """(b, l, h, ...) -> (n, b * h, c, ...): chunks first, zero-padded along the length to n * c.
    Chunk-major, so that the loop over chunks reads contiguous slices."""
    b, l, h = x.shape[:3]
    rest = x.shape[3:]
    if n * c != l:
        x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, n * c - l))
    x = x.reshape(b, n, c, h, *rest).movedim(1, 0).movedim(3, 2)  # (n, b, h, c, ...)
    return x.reshape(n, b * h, c, *rest)


def _chunk_core(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, state: Tensor, scale: float, c: int
) -> tuple[Tensor, Tensor]:
    """The chunked (gated) delta rule on prepared inputs, q, k (b, l, h, dk), v (b, l, h, dv),
    beta and g (b, l, h), state (b, h, dk, dv), all in the compute dtype, in chunks of ``c``
    positions; returns (o (b, l, h, dv) unmasked, final state). ``g`` None: the ungated rule, which
    skips every decay term."""
    b, l, h, dk = k.shape
    dv = v.shape[-1]
    c = min(c, l)
    n = -(-l // c)
    # Padding has beta = 0 and g = 0, so padded positions leave the state alone.
    q = _blocks(q, n, c)  # (n, bh, c, dk)
    k, v = _blocks(k, n, c), _blocks(v, n, c)  # (n, bh, c, dk), (n, bh, c, dv)
    beta = _blocks(beta, n, c).unsqueeze(-1)  # (n, bh, c, 1)
    kt = k.transpose(-1, -2)
    kk = k @ kt  # k_t . k_s
    qk = q @ kt  # q_t . k_s
    if g is None:
        a = beta * kk  # only its strictly lower part is read
        p = qk.tril()
        k_end = k
    else:
        gam = _blocks(g, n, c).cumsum(-1)  # (n, bh, c): log-decay from the chunk's start, <= 0
        # exp(gam_t - gam_s) for s <= t; above the diagonal the (positive) difference is masked to -inf
        # before exp, so it is exactly 0 and never overflows.
        upper = torch.ones(c, c, dtype=torch.bool, device=k.device).triu(1)
        decay = (gam.unsqueeze(-1) - gam.unsqueeze(-2)).masked_fill(upper, float("-inf")).exp()
        a = beta * kk * decay
        p = qk * decay
        last = gam[..., -1:]  # (n, bh, 1)
        k_end = k * (last - gam).exp().unsqueeze(-1)  # decayed to the chunk's end
        start = gam.exp()  # decay from the chunk's start
        q = q * start.unsqueeze(-1)
        decay_end = last.exp().unsqueeze(-1)  # (n, bh, 1, 1)
    # T = (I + A)^{-1} diag(beta) by a unit-lower-triangular solve; W = T (exp(gam) K), U = T V.
    # W is kept negated (the sign folded into the small (c, c) factor): no alpha = -1 in the loop,
    # whose backward would cost two extra multiplies per chunk.
    t = _UnitLowerInverse.apply(a) * beta.transpose(-1, -2)
    w_neg = (-t if g is None else t * (-start).unsqueeze(-2)) @ k
    u = t @ v
    # The loop over chunks: u_i = U_i - W_i S_i, S_{i+1} = exp(gam_C) S_i + K_end_i^T u_i.
    s = state.reshape(b * h, dk, dv)
    starts, news = [], []
    for i, (w_i, u_i, k_i) in enumerate(zip(w_neg.unbind(0), u.unbind(0), k_end.unbind(0))):
        starts.append(s)
        new = torch.baddbmm(u_i, w_i, s)
        news.append(new)
        if g is not None:
            s = s * decay_end[i]
        s = torch.baddbmm(s, k_i.transpose(-1, -2), new)
    # o = scale (q S_i + P u) for every chunk at once.
    o = (p @ torch.stack(news)).flatten(0, 1)
    o = torch.baddbmm(o, q.flatten(0, 1), torch.stack(starts).flatten(0, 1), beta=scale, alpha=scale)
    o = o.reshape(n, b, h, c, dv).permute(1, 0, 3, 2, 4).reshape(b, n * c, h, dv)
    return (o if n * c == l else o[:, :l]), s.reshape(b, h, dk, dv)


def _cut(
    x: Tensor, bg: int, hg: int, seg: int, head_dim: int | None, length_dim: int | None
) -> list[list[list[Tensor]]]:
    """``x`` cut into groups of ``bg`` batch elements, those into groups of ``hg`` heads along
    ``head_dim`` and those into segments of ``seg`` positions along ``length_dim`` (a None dim is
    not cut). ``split``, not slicing, so that the backward assembles each gradient in one ``cat``
    instead of filling a full-size zero tensor per piece."""
    return [
        [
            list(xh.split(seg, length_dim)) if length_dim is not None else [xh]
            for xh in (xb.split(hg, head_dim) if head_dim is not None else [xb])
        ]
        for xb in x.split(bg, 0)
    ]


def _join(pieces: list[list[Tensor]], head_dim: int) -> Tensor:
    """Groups of batch elements, each a list of groups of heads, put back together."""
    rows = [row[0] if len(row) == 1 else torch.cat(row, head_dim) for row in pieces]
    return rows[0] if len(rows) == 1 else torch.cat(rows, 0)


def _chunk(
    op: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None,
    gated: bool,
    scale: float | None,
    initial_state: Tensor | None,
    output_final_state: bool,
    mask: Tensor | None,
    chunk_size: int | None,
) -> Tensor | tuple[Tensor, Tensor]:
    if chunk_size is not None:
        check_chunk_size(op, chunk_size)
    out_dtype = v.dtype
    q, k, v, beta, g, state, scale, mask = _prepare(op, q, k, v, beta, g, gated, scale, initial_state, mask)
    c = default_chunk_size(k) if chunk_size is None else chunk_size
    b, l, h, dk = k.shape
    dv = v.shape[-1]
    if l == 0:
        o = v.new_zeros(v.shape).to(out_dtype)
        return (o, state) if output_final_state else o
    c = min(c, l)
    n = -(-l // c)
    # Pieces: groups of batch elements and heads, and, when one head is too long, segments of the
    # length (the state carried from one to the next), whose largest temporaries, (chunks, c, dk + dv),
    # (chunks, c, c) or (chunks, dk, dv) per head, stay below chunking.TEMPORARY_BYTES: on CPUs larger
    # ones come as fresh zeroed pages every time (a third of the time at length 4096). The meta
    # device allocates nothing: one piece.
    per_chunk = max(c * (dk + dv), c * c, dk * dv) * q.element_size()
    chunks = n if k.device.type == "meta" else min(n, group_size(per_chunk))
    heads = b * h if k.device.type == "meta" else (group_size(n * per_chunk) if chunks == n else 1)
    bg, hg = (max(1, heads // h), h) if heads >= h else (1, heads)
    seg = chunks * c
    qs, ks, vs, betas = (_cut(x, bg, hg, seg, 2, 1) for x in (q, k, v, beta))
    gs = None if g is None else _cut(g, bg, hg, seg, 2, 1)
    masks = None if mask is None else _cut(mask, bg, hg, seg, None, 1)
    states = _cut(state, bg, hg, seg, 1, None)
    outs: list[list[Tensor]] = []
    finals: list[list[Tensor]] = []
    for i, row in enumerate(qs):
        outs.append([])
        finals.append([])
        for j, segments in enumerate(row):
            s = states[i][j][0]
            parts = []
            for r in range(len(segments)):
                o, s = _chunk_core(
                    qs[i][j][r],
                    ks[i][j][r],
                    vs[i][j][r],
                    betas[i][j][r],
                    None if gs is None else gs[i][j][r],
                    s,
                    scale,
                    c,
                )
                parts.append(keep(None if masks is None else masks[i][0][r], o).to(out_dtype))
            outs[i].append(parts[0] if len(parts) == 1 else torch.cat(parts, 1))
            finals[i].append(s)
    o = _join(outs, 2)
    return (o, _join(finals, 1)) if output_final_state else o


def default_chunk_size(k: Tensor) -> int:
    """The chunk length the chunked forms use unless told: on a CPU 16 for key widths up to 32 and
    32 above (measured the fastest there, forward and backward: the triangular solve within a chunk
    costs C^3, and at the small models' widths chunks of 64 took 1.4-3x as long as chunks of 16;
    see the module docstring), elsewhere 64, the chunk of flash-linear-attention's kernels."""
    if k.device.type != "cpu":
        return 64
    return 16 if k.shape[-1] <= 32 else 32


def delta_rule_chunk(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """The delta rule of :func:`delta_rule_naive`, chunkwise-parallel: the WY/UT representation
    within chunks of ``chunk_size`` positions (a unit-lower-triangular solve and matmuls), a loop
    over chunks for the state (see the module docstring). Same arguments and results; the length
    need not be a multiple of ``chunk_size``, and any ``chunk_size >= 1`` gives the same result up
    to rounding (None: :func:`default_chunk_size`).
    """
    return _chunk(
        "delta_rule_chunk", q, k, v, beta, None, False, scale, initial_state, output_final_state, mask, chunk_size
    )


def gated_delta_rule_chunk(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """The gated delta rule of :func:`gated_delta_rule_naive`, chunkwise-parallel with decays
    relative to each chunk's start (no positive exponent is ever taken; see the module docstring).
    Same arguments and results; the length need not be a multiple of ``chunk_size`` (None:
    :func:`default_chunk_size`).
    """
    return _chunk(
        "gated_delta_rule_chunk", q, k, v, beta, g, True, scale, initial_state, output_final_state, mask, chunk_size
    )
