"""Mamba-3's multi-input multi-output (MIMO) recurrence as pure tensor ops.

Lahoti et al., "Mamba-3: Improved Sequence Modeling using State Space Principles", arXiv:2603.15569,
2026. MIMO raises the rank of each position's write and read from 1 to ``r`` at the same state
size: the recurrence of the authors' PyTorch reference ``mamba3_MIMO_step_ref``
(``tests/ops/tilelang/test_mamba3_mimo.py`` of mamba-ssm), whose kernel is ``mamba3_mimo``
(TileLang). The op starts after the layer's up-projection of the input to ``r`` ranks (their
``einsum("bthd,hrd->btrhd", V, MIMO_V)``) and stops before its per-rank gate and down-projection
(``MIMO_Z``, ``MIMO_O``), which the layer applies (:mod:`longrange.layers.mamba3`), as the SISO op
(:mod:`.mamba3`) leaves its gate to the layer.

The recurrence
--------------
Per head ``i`` and position ``t``, with the inputs of rank ``j < r``: ``x_{t,j}`` (1 x p), the B/C
vectors ``B_{t,j}``, ``C_{t,j}`` (1 x n) of the head's group, per-head and per-rank biases
``b_B[i, j]``, ``b_C[i, j]``, and per head and position (shared by the ranks) ``dt_t``, ``A_t``,
``trap_t`` and the angles::

    theta_t  = theta_{t-1} + pi tanh(angles_t) dt_t                    (mod 2 pi)
    k_{t,j}  = R(theta_t) (B_{t,j} + b_B[j]),   q_{t,j} = R(theta_t) (C_{t,j} + b_C[j])
    W_t      = sum_j k_{t,j}^T x_{t,j}                                  a rank-r write (n x p)
    S_t      = alpha_t S_{t-1} + alpha_t dt_t (1 - lam_t) W_{t-1} + dt_t lam_t W_t
    y_{t,j}  = q_{t,j} S_t + D x_{t,j}

with ``alpha_t = exp(dt_t A_t)``, ``lam_t = sigmoid(trap_t)`` and ``R`` the rotation of adjacent pairs
``(2j, 2j + 1)`` of :func:`~longrange.ops.matrix_state.mamba3.rotate_pairs`, as the step reference
rotates them. (The authors' MIMO kernel pairs entries half or a quarter of the state apart instead:
a fixed permutation of the state's entries, so the same family of layers and the same initialisation;
weights taken from a layer of their kernel would need the entries of B, C and their biases and norms
permuted.) With ``r = 1`` this is Mamba-3 SISO
(:mod:`.mamba3`). The state per sequence is the same ``S`` (heads, n, p) as SISO's, plus the angles
and the previous position's ``r`` keys and inputs: a :class:`~.mamba3.Mamba3State` whose ``k`` is
(b, h, r, n) and ``v`` (b, h, r, p) (mamba-ssm's K_State and V_State layouts).

Layouts: ``x`` (batch, length, rank, heads, p) and ``B``, ``C`` (batch, length, rank, groups, n)
(mamba-ssm's ``btrhd`` and ``b l r g n``), biases (heads, rank, n); ``dt``, ``A``, ``trap``,
``angles`` and ``D`` as in SISO. The output ``y`` is (batch, length, rank, heads, p).

Masks as in SISO: at a padded position the four parts of the state are carried unchanged and the
output is zero.

Implementations
---------------
:func:`mamba3_mimo_naive`: a Python loop over time in float64 (the ground truth).
:func:`mamba3_mimo_step`: one position. :func:`mamba3_mimo_chunk`: the scalar-decay core
(:mod:`.scalar_decay`) on the sequence of ``length x r`` sub-positions ``(t, 0), ..., (t, r - 1)``,
as the authors' kernel, whose chunks are ``chunk / r`` positions of ``r`` ranks each. The decay of
position ``t`` is applied at its first sub-position, each sub-position writes ``k_{t,j}^T x_{t,j}``
and reads with ``q_{t,j}``, so the core's output at ``(t, j)`` has seen the writes of ranks ``<= j``
of position ``t``; the writes of ranks ``> j`` are added afterwards, within the position, an (r x r)
correction. The trapezoid folds into one write per position as in SISO (the ``x_t`` part of the next
position's write credited in advance, ``c_t``)::

    y_{t,j} = core_{t,j} + sum_{j' > j} w_t (q_{t,j} . k_{t,j'}) x_{t,j'}
              - c_t sum_{j'} (q_{t,j} . k_{t,j'}) x_{t,j'} + D x_{t,j}

with ``w_t = dt_t lam_t + c_t`` the core's write strength; ``q . k`` at one position does not depend
on the rotation (both are turned by the same angles). Here ``chunk_size`` counts positions (of ``r``
ranks each), so the core's chunks are ``chunk_size x r`` sub-positions long.

Dtypes and devices as in SISO: float64 if a floating input is float64, else float32; outputs in
``x``'s dtype, states in the compute dtype.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from longrange.ops.matrix_state.common import check_chunk_size, check_mask, compute_dtype, keep, shape_of
from longrange.ops.matrix_state.mamba3 import (
    TWO_PI,
    Mamba3State,
    _check_per_head,
    _check_state,
    _last_real,
    _next_real,
    _rotate_by,
    rotate_pairs,
)
from longrange.ops.matrix_state.scalar_decay import DEFAULT_CHUNK_SIZE, scalar_decay_chunked_core
from longrange.ops.matrix_state.ssd import skip

__all__ = ["mamba3_mimo_naive", "mamba3_mimo_chunk", "mamba3_mimo_step", "default_chunk_size"]


def default_chunk_size(rank: int) -> int:
    """The default chunk of Mamba-3 of ``rank`` (1: SISO), in positions: ``64 // rank``, chunks of
    64 rank-positions, as mamba-ssm recommends (64 for SISO, 64 / r for MIMO)."""
    return max(1, DEFAULT_CHUNK_SIZE // rank)


# ----------------------------------------------------------------------------------------------
# checks


def _check_ranked(op: str, x: Tensor, B: Tensor, C: Tensor, seq: bool) -> tuple[int, ...]:
    """(b, [l,] r, h, g, n, p) of ``x`` (b, [l,] r, h, p) and ``B``, ``C`` (b, [l,] r, g, n)."""
    lead = "batch, length, " if seq else "batch, "
    dims = 5 if seq else 4
    if not isinstance(x, Tensor) or x.dim() != dims:
        raise ValueError(f"{op}: x must have shape ({lead}rank, heads, p), got {shape_of(x)}")
    *outer, h, p = x.shape
    if not isinstance(B, Tensor) or B.dim() != dims or tuple(B.shape[: dims - 2]) != tuple(outer):
        want = ", ".join(str(s) for s in outer)
        raise ValueError(f"{op}: B must have shape ({lead}rank, groups, n)=({want}, groups, n), got {shape_of(B)}")
    g, n = B.shape[-2:]
    if h % g:
        raise ValueError(f"{op}: B's groups ({g}) must divide x's heads ({h}), got B {shape_of(B)}")
    if not isinstance(C, Tensor) or C.shape != B.shape:
        raise ValueError(f"{op}: C must have the shape of B {tuple(B.shape)}, got {shape_of(C)}")
    return (*outer, h, g, n, p)


def _check(op, x, dt, A, B, C, trap, angles, B_bias, C_bias, D, initial_state, mask):
    b, l, r, h, g, n, p = _check_ranked(op, x, B, C, seq=True)
    m = _check_per_head(op, (b, l), "batch, length", dt, A, trap, angles, h, n, p, B_bias, C_bias, D, rank=r)
    state = _check_state(op, "initial_state", initial_state, b, h, n, p, m, rank=r)
    return b, l, r, h, n, p, m, state, check_mask(op, mask, b, l)


# ----------------------------------------------------------------------------------------------
# shared pieces


def _state_in(state: Mamba3State | None, b, r, h, n, p, m, dtype, device) -> Mamba3State:
    """The state in ``dtype``, its k and v laid out (b, r, h, ...) as the sequences are."""
    if state is None:
        z = lambda *s: torch.zeros(*s, dtype=dtype, device=device)  # noqa: E731
        return Mamba3State(z(b, h, n, p), z(b, h, m), z(b, r, h, n), z(b, r, h, p))
    S, theta, k, v = (t.to(dtype) for t in state)
    return Mamba3State(S, theta, k.transpose(1, 2), v.transpose(1, 2))


def _state_out(S: Tensor, theta: Tensor, k: Tensor, v: Tensor) -> Mamba3State:
    """The state with k and v (b, r, h, ...) laid out (b, h, r, ...) as mamba-ssm keeps them."""
    return Mamba3State(S, theta, k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())


def _biased(t: Tensor, bias: Tensor | None, h: int) -> Tensor:
    """B or C (..., r, g, n) with its groups repeated over the heads, plus the bias (h, r, n):
    (..., r, h, n)."""
    *outer, r, g, n = t.shape
    if bias is None:
        return t.unsqueeze(-2).expand(*outer, r, g, h // g, n).flatten(-3, -2)
    out = t.unsqueeze(-2) + bias.to(t.dtype).transpose(0, 1).reshape(r, g, h // g, n)
    return out.flatten(-3, -2)


def _write(k: Tensor, v: Tensor) -> Tensor:
    """``sum_j k_j^T v_j``: (b, h, n, p) from k (b, r, h, n) and v (b, r, h, p)."""
    return torch.einsum("brhn,brhp->bhnp", k, v)


# ----------------------------------------------------------------------------------------------
# naive and step


def mamba3_mimo_naive(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    trap: Tensor,
    angles: Tensor,
    B_bias: Tensor | None = None,
    C_bias: Tensor | None = None,
    D: Tensor | None = None,
    initial_state: Mamba3State | None = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
) -> Tensor | tuple[Tensor, Mamba3State]:
    """Mamba-3 MIMO by a Python loop over time, in float64 (the ground truth; see the module
    docstring for the recurrence and its source).

    Args:
        x: (batch, length, rank, heads, p), the input after the layer's up-projection to ``rank``.
        dt, trap: (batch, length, heads); A: (heads,) or (batch, length, heads), negative.
        B, C: (batch, length, rank, groups, n), ``groups`` dividing ``heads``.
        angles: (batch, length, heads, m), ``m <= n / 2``.
        B_bias, C_bias: (heads, rank, n) or None. D: (heads,) or (heads, p), or None.
        initial_state: a :class:`~.mamba3.Mamba3State` (k (b, h, rank, n), v (b, h, rank, p)) or None.
        output_final_state: also return the state after the last position.
        mask: (batch, length) bool, True at real positions, or None.

    Returns:
        ``y`` (batch, length, rank, heads, p) in ``x``'s dtype, or ``(y, final_state)``.
    """
    op = "mamba3_mimo_naive"
    b, l, r, h, n, p, m, state, mask = _check(op, x, dt, A, B, C, trap, angles, B_bias, C_bias, D, initial_state, mask)
    dtype = compute_dtype(x, dt, A, B, C, trap, angles, B_bias, C_bias, D, *(state or ()))
    f64 = torch.float64
    S, theta, k_prev, v_prev = _state_in(state, b, r, h, n, p, m, f64, x.device)
    xs, dts, lam = x.to(f64), dt.to(f64), torch.sigmoid(trap.to(f64))
    As = A.to(f64).expand(b, l, h)
    rate = math.pi * torch.tanh(angles.to(f64))
    Bs, Cs = _biased(B.to(f64), B_bias, h), _biased(C.to(f64), C_bias, h)
    ys = []
    for t in range(l):
        d = dts[:, t]
        th = torch.remainder(theta + rate[:, t] * d[..., None], TWO_PI)
        k, q = rotate_pairs(Bs[:, t], th.unsqueeze(1)), rotate_pairs(Cs[:, t], th.unsqueeze(1))
        v = xs[:, t]
        alpha = (d * As[:, t]).exp()
        prev_w = (alpha * d * (1 - lam[:, t]))[..., None, None]
        cur_w = (d * lam[:, t])[..., None, None]
        new = alpha[..., None, None] * S + prev_w * _write(k_prev, v_prev) + cur_w * _write(k, v)
        y = torch.einsum("brhn,bhnp->brhp", q, new)
        if D is not None:
            y = y + skip(D.to(f64), v)
        if mask is not None:
            mt = mask[:, t]
            new = torch.where(mt[:, None, None, None], new, S)
            th = torch.where(mt[:, None, None], th, theta)
            k = torch.where(mt[:, None, None, None], k, k_prev)
            v = torch.where(mt[:, None, None, None], v, v_prev)
            y = y * mt[:, None, None, None]
        S, theta, k_prev, v_prev = new, th, k, v
        ys.append(y)
    y = (torch.stack(ys, dim=1) if ys else xs.new_zeros(b, 0, r, h, p)).to(x.dtype)
    if not output_final_state:
        return y
    return y, _state_out(S.to(dtype), theta.to(dtype), k_prev.to(dtype), v_prev.to(dtype))


def mamba3_mimo_step(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    trap: Tensor,
    angles: Tensor,
    state: Mamba3State | None,
    B_bias: Tensor | None = None,
    C_bias: Tensor | None = None,
    D: Tensor | None = None,
) -> tuple[Tensor, Mamba3State]:
    """One position of Mamba-3 MIMO, for decoding: ``x`` (batch, rank, heads, p), ``dt`` and ``trap``
    (batch, heads), ``A`` (heads,) or (batch, heads), ``B``, ``C`` (batch, rank, groups, n),
    ``angles`` (batch, heads, m), ``state`` a :class:`~.mamba3.Mamba3State` or None (zeros), biases
    (heads, rank, n), ``D`` (heads,) or (heads, p). Returns ``(y (batch, rank, heads, p) in x's
    dtype, the new state in the compute dtype)``."""
    op = "mamba3_mimo_step"
    b, r, h, g, n, p = _check_ranked(op, x, B, C, seq=False)
    m = _check_per_head(op, (b,), "batch", dt, A, trap, angles, h, n, p, B_bias, C_bias, D, rank=r)
    state = _check_state(op, "state", state, b, h, n, p, m, rank=r)
    dtype = compute_dtype(x, dt, A, B, C, trap, angles, B_bias, C_bias, D, *(state or ()))
    S, theta, k_prev, v_prev = _state_in(state, b, r, h, n, p, m, dtype, x.device)
    v, d, lam = x.to(dtype), dt.to(dtype), torch.sigmoid(trap.to(dtype))
    theta = torch.remainder(theta + math.pi * torch.tanh(angles.to(dtype)) * d[..., None], TWO_PI)
    k = rotate_pairs(_biased(B.to(dtype), B_bias, h), theta.unsqueeze(1))
    q = rotate_pairs(_biased(C.to(dtype), C_bias, h), theta.unsqueeze(1))
    alpha = (d * A.to(dtype)).exp()[..., None, None]
    new = alpha * (S + (d * (1 - lam))[..., None, None] * _write(k_prev, v_prev)) + (d * lam)[..., None, None] * _write(
        k, v
    )
    y = torch.einsum("brhn,bhnp->brhp", q, new)
    if D is not None:
        y = y + skip(D, v)
    return y.to(x.dtype), _state_out(new, theta, k, v)


# ----------------------------------------------------------------------------------------------
# chunked


def mamba3_mimo_chunk(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    trap: Tensor,
    angles: Tensor,
    B_bias: Tensor | None = None,
    C_bias: Tensor | None = None,
    D: Tensor | None = None,
    initial_state: Mamba3State | None = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor | tuple[Tensor, Mamba3State]:
    """Mamba-3 MIMO, chunkwise parallel: the scalar-decay core on the ``length x rank`` sub-positions
    and the (rank x rank) correction within each position (see the module docstring).

    Same arguments and results as :func:`mamba3_mimo_naive`, plus ``chunk_size`` in positions (a
    positive integer; it changes the speed, not the result; None: :func:`default_chunk_size`)."""
    op = "mamba3_mimo_chunk"
    b, l, r, h, n, p, m, state, mask = _check(op, x, dt, A, B, C, trap, angles, B_bias, C_bias, D, initial_state, mask)
    chunk_size = check_chunk_size(op, default_chunk_size(r) if chunk_size is None else chunk_size)
    dtype = compute_dtype(x, dt, A, B, C, trap, angles, B_bias, C_bias, D, *(state or ()))
    S0, theta0, k0, v0 = _state_in(state, b, r, h, n, p, m, dtype, x.device)
    if l == 0:
        y = x.new_zeros(b, 0, r, h, p)
        return (y, _state_out(S0, theta0, k0, v0)) if output_final_state else y
    xs = x.to(dtype)
    dts = keep(mask, dt.to(dtype))
    lam = torch.sigmoid(trap.to(dtype))
    steps = (math.pi * torch.tanh(angles.to(dtype)) * dts.unsqueeze(-1)).to(torch.float64)
    theta = torch.remainder(theta0.to(torch.float64).unsqueeze(1) + steps.cumsum(1), TWO_PI).to(dtype)
    Bs, Cs = _biased(B.to(dtype), B_bias, h), _biased(C.to(dtype), C_bias, h)  # (b, l, r, h, n)
    th = theta.unsqueeze(2)  # the ranks of a position turn alike
    if m == 0:
        k, q = Bs, Cs
    elif n % 2 == 0 and not torch.compiler.is_compiling():  # Inductor: see mamba3.mamba3_chunk
        turn = torch.polar(torch.ones_like(th), th)
        k, q = _rotate_by(Bs, turn), _rotate_by(Cs, turn)
    else:
        k, q = rotate_pairs(Bs, th), rotate_pairs(Cs, th)

    ahead, first = _next_real(dts * (1 - lam), mask)  # c_t, and c before the first position
    write = dts * lam + ahead  # (b, l, h)
    S_start = None if state is None else S0 + first[..., None, None] * _write(k0, v0)
    log_decay = torch.zeros(b, l, r, h, dtype=dtype, device=x.device)
    log_decay[:, :, 0] = dts * A.to(dtype)  # the position's decay, before its first rank writes
    sub = lambda t: t.flatten(1, 2)  # noqa: E731  (b, l, r, ...) -> (b, l * r, ...)
    v_scale = write.unsqueeze(2).expand(b, l, r, h)
    y, S = scalar_decay_chunked_core(
        sub(q), sub(k), sub(xs), sub(log_decay), S_start, chunk_size * r, v_scale=sub(v_scale)
    )
    y = y.unflatten(1, (l, r))
    # within each position: + w_t (q_j . k_j') x_j' for j' > j, - c_t (q_j . k_j') x_j' for all j'
    dots = torch.einsum("blihn,bljhn->blhij", Cs, Bs)  # q . k is the same unrotated
    later = torch.ones(r, r, dtype=torch.bool, device=x.device).triu(1).to(dtype)
    weight = write[..., None, None] * later - ahead[..., None, None]
    y = y + torch.einsum("blhij,bljhp->blihp", dots * weight, xs)
    if D is not None:
        y = y + skip(D.to(dtype), xs)
    y = keep(mask, y).to(x.dtype)
    if not output_final_state:
        return y
    last_k = _last_real(k.flatten(2, 3), mask, k0.flatten(1, 2)).unflatten(1, (r, h))
    last_v = _last_real(xs.flatten(2, 3), mask, v0.flatten(1, 2)).unflatten(1, (r, h))
    return y, _state_out(S, theta[:, -1], last_k, last_v)
