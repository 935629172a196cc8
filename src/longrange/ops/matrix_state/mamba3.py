"""Mamba-3's single-input single-output (SISO) recurrence as pure tensor ops.

A. Lahoti, K. Y. Li, B. Chen, C. Wang, A. Bick, J. Z. Kolter, T. Dao, A. Gu, "Mamba-3: Improved
Sequence Modeling using State Space Principles", arXiv:2603.15569, 2026. The op is defined at the
level of the authors' kernel ``mamba3_siso_combined`` (mamba-ssm,
``mamba_ssm/ops/triton/mamba3/mamba3_siso_combined.py``; inputs Q = C, K = B, V = x, ADT = A dt,
DT = dt, Trap, Q_bias, K_bias, Angles, D), without its ``Z`` gate, which the layer applies with
its output norm. The recurrence is that of the authors' PyTorch references
``mamba3_siso_step_ref`` and ``mamba3_siso_fwd_ref`` in ``tests/ops/triton/test_mamba3_siso.py``.

The recurrence
--------------
Per head ``i`` and position ``t``, with ``x_t`` (1 x p), ``dt_t > 0`` (after softplus and bias),
a data-dependent ``A_t < 0`` (the layer's ``-heavy_tail(dd_A)`` clamped to <= -A_floor), the B/C
vectors ``B_t``, ``C_t`` (1 x n) of the head's group ``i // (h // g)``, per-head biases ``b_B``,
``b_C`` (1 x n), a trapezoid gate logit ``trap_t``, raw angle inputs ``angles_t`` (1 x m, m <= n/2)
and an optional skip ``D``::

    theta_t = (theta_{t-1} + pi tanh(angles_t) dt_t) mod 2 pi           cumulative rotation angles
    k_t     = R(theta_t) (B_t + b_B),    q_t = R(theta_t) (C_t + b_C)    data-dependent rotary
    lam_t   = sigmoid(trap_t),   alpha_t = exp(dt_t A_t)
    S_t     = alpha_t S_{t-1} + alpha_t dt_t (1 - lam_t) k_{t-1}^T x_{t-1} + dt_t lam_t k_t^T x_t
    y_t     = q_t S_t + D x_t

``R(theta)`` rotates the pairs of adjacent entries ``(2j, 2j + 1)``, ``j < m``, of a row vector by
``theta_j`` (``(u, w) -> (u cos - w sin, u sin + w cos)``); entries ``2m`` onwards are not rotated.
The two write terms are the trapezoidal rule for the input integral (``lam = 1``: Mamba-2's
exponential-Euler write ``dt B^T x``; ``lam = 1/2``: the trapezoid between the previous and the
current input). The recurrent state is four tensors (:class:`Mamba3State`): ``S`` (b, h, n, p), the
angles ``theta`` (b, h, m), and the previous position's rotated key ``k`` (b, h, n) and input
``x`` (b, h, p); all four start at zero unless given.

Layouts: ours (batch, length, heads, ...). The authors' kernel takes ADT, DT, Trap as (batch, heads,
length), keeps its SSM state transposed, (batch, heads, p, n) (``S_ours = S_theirs.transpose(-1,
-2)``), returns the states in the order (angle, ssm, k, v), and its layer keeps the k state as
(batch, 1, heads, n). Here ``A`` is taken instead of ADT (``ADT = dt A``), of shape (heads,) or
(batch, length, heads); ``angles`` is (batch, length, heads, m) (the layer shares one set of
angles across heads: expand it).

At a padded position (``mask`` False) all four states are carried unchanged (no decay, no write, no
rotation, the previous key and input kept) and the output is zero; the next real position then
pairs its input with that of the last real one.

Implementations
---------------
:func:`mamba3_naive`: a Python loop over time in float64 (the ground truth). :func:`mamba3_step`:
one position. :func:`mamba3_chunk`: reduced to the scalar-decay core (:mod:`.scalar_decay`). The
rotation is position-wise (``q_t``, ``k_t`` above; ``theta`` by a cumulative sum in float64, then
mod 2 pi). The two-term write folds into one write per position by crediting the ``x_t`` part of
the next position's write in advance, as the authors' kernel does (``mamba3_siso_fwd``: the keys
scaled by ``dt_t lam_t + dt_{t+1} (1 - lam_{t+1})``, the diagonal corrected by the ``q_t . k_t``
term). With ``c_t = dt_{t'} (1 - lam_{t'})`` for ``t'`` the next real position after ``t`` (0 if
there is none) and ``c_start`` the same for the first real position::

    S'_t = S_t + c_t k_t^T x_t   satisfies   S'_t = alpha_t S'_{t-1} + (dt_t lam_t + c_t) k_t^T x_t
    S'_start = S_start + c_start k_prev^T x_prev                (the initial state's k and x)
    y_t = q_t S'_t - c_t (q_t . k_t) x_t + D x_t

so the core runs on ``q``, ``k``, values ``(dt lam + c) x``, log decay ``dt A``; after the last
position ``c = 0`` and ``S' = S``, the final state.

Dtypes: computation in float64 if a floating input is float64, else float32; outputs in ``x``'s
dtype, states in the compute dtype. Device: the inputs'.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from longrange.ops.matrix_state.common import (
    check_chunk_size,
    check_mask,
    check_shape,
    compute_dtype,
    keep,
    shape_of,
)
from longrange.ops.matrix_state.scalar_decay import (
    DEFAULT_CHUNK_SIZE,
    check_grouped,
    check_step_grouped,
    expand_groups,
    scalar_decay_chunked_core,
)
from longrange.ops.matrix_state.ssd import check_skip, skip

__all__ = ["Mamba3State", "mamba3_naive", "mamba3_chunk", "mamba3_step", "rotate_pairs"]

TWO_PI = 2 * math.pi


class Mamba3State(NamedTuple):
    """The recurrent state of Mamba-3, all in the compute dtype; with MIMO (:mod:`.mamba3_mimo`) ``k``
    and ``v`` hold the previous position's ``rank`` keys and inputs, (batch, heads, rank, ...)."""

    ssm: Tensor  #: (batch, heads, n, p), read by ``y = q S``
    angle: Tensor  #: (batch, heads, m), cumulative rotation angles in [0, 2 pi)
    k: Tensor  #: (batch, heads, n), the previous position's rotated, biased key ``R(theta)(B + b_B)``
    v: Tensor  #: (batch, heads, p), the previous position's input ``x``


def rotate_pairs(t: Tensor, theta: Tensor) -> Tensor:
    """``t`` (..., n) with its pairs of entries ``(2j, 2j + 1)``, ``j < m``, rotated by ``theta``
    (..., m); entries ``2m`` onwards unchanged."""
    m = theta.shape[-1]
    if m == 0:
        return t
    pairs = t[..., : 2 * m].unflatten(-1, (m, 2))
    u, w = pairs[..., 0], pairs[..., 1]
    cos, sin = theta.cos(), theta.sin()
    rotated = torch.stack((u * cos - w * sin, u * sin + w * cos), dim=-1).flatten(-2)
    return torch.cat((rotated, t[..., 2 * m :]), dim=-1) if 2 * m < t.shape[-1] else rotated


# ----------------------------------------------------------------------------------------------
# checks


def _check_common(
    op: str,
    h: int,
    n: int,
    p: int,
    m: int,
    B_bias: Tensor | None,
    C_bias: Tensor | None,
    D: Tensor | None,
    rank: int | None = None,
) -> None:
    """The angles' width and the parameters; ``rank``: MIMO's, whose biases are (heads, rank, n)."""
    if 2 * m > n:
        raise ValueError(
            f"{op}: angles must have at most n / 2 = {n // 2} entries per head (pairs of B and C "
            f"entries to rotate), got {m}"
        )
    shape, what = ((h, n), "(heads, n)") if rank is None else ((h, rank, n), "(heads, rank, n)")
    check_shape(op, "B_bias", B_bias, shape, what)
    check_shape(op, "C_bias", C_bias, shape, what)
    check_skip(op, D, h, p)


def _check_state(
    op: str, name: str, state: object, b: int, h: int, n: int, p: int, m: int, rank: int | None = None
) -> Mamba3State | None:
    """``state`` as a :class:`Mamba3State` with its parts' shapes checked (MIMO's ``rank``: k and v
    of (b, h, rank, ...)), or None."""
    if state is None:
        return None
    if not isinstance(state, tuple) or len(state) != 4:
        raise ValueError(f"{op}: {name} must be a Mamba3State (ssm, angle, k, v) or None, got {type(state).__name__}")
    state = Mamba3State(*state)
    ranks, ranks_text = ((), "") if rank is None else ((rank,), "rank, ")
    for part, shape, what in (
        ("ssm", (b, h, n, p), "(batch, heads, n, p)"),
        ("angle", (b, h, m), "(batch, heads, m)"),
        ("k", (b, h, *ranks, n), f"(batch, heads, {ranks_text}n)"),
        ("v", (b, h, *ranks, p), f"(batch, heads, {ranks_text}p)"),
    ):
        t = getattr(state, part)
        if not isinstance(t, Tensor):
            raise ValueError(f"{op}: {name}.{part} must have shape {what}={shape}, got {shape_of(t)}")
        check_shape(op, f"{name}.{part}", t, shape, what)
    return state


def _check_per_head(
    op: str,
    lead: tuple[int, ...],
    names: str,
    dt: Tensor,
    A: Tensor,
    trap: Tensor,
    angles: Tensor,
    h: int,
    n: int,
    p: int,
    B_bias: Tensor | None,
    C_bias: Tensor | None,
    D: Tensor | None,
    rank: int | None = None,
) -> int:
    """The inputs per head, ``dt``, ``trap``, ``A`` and ``angles``, at the leading dims ``lead``
    ((b, l) of a sequence or (b,) of a step, named ``names``), and the parameters; returns m."""
    shape = (*lead, h)
    for name, t in (("dt", dt), ("trap", trap)):
        if not isinstance(t, Tensor) or tuple(t.shape) != shape:
            raise ValueError(f"{op}: {name} must have shape ({names}, heads)={shape}, got {shape_of(t)}")
    if not isinstance(A, Tensor) or tuple(A.shape) not in ((h,), shape):
        raise ValueError(f"{op}: A must have shape (heads,)=({h},) or ({names}, heads)={shape}, got {shape_of(A)}")
    if not isinstance(angles, Tensor) or angles.dim() != len(shape) + 1 or tuple(angles.shape[:-1]) != shape:
        want = ", ".join(map(str, shape))
        raise ValueError(f"{op}: angles must have shape ({names}, heads, m)=({want}, m), got {shape_of(angles)}")
    m = angles.shape[-1]
    _check_common(op, h, n, p, m, B_bias, C_bias, D, rank)
    return m


def _check(
    op: str,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    trap: Tensor,
    angles: Tensor,
    B_bias: Tensor | None,
    C_bias: Tensor | None,
    D: Tensor | None,
    initial_state: object,
    mask: Tensor | None,
) -> tuple[int, int, int, int, int, int, Mamba3State | None, Tensor | None]:
    b, l, h, g, n, p = check_grouped(op, C, B, x, qk=("C", "B"), vname="x")
    m = _check_per_head(op, (b, l), "batch, length", dt, A, trap, angles, h, n, p, B_bias, C_bias, D)
    state = _check_state(op, "initial_state", initial_state, b, h, n, p, m)
    return b, l, h, n, p, m, state, check_mask(op, mask, b, l)


def _dtype(*tensors: Tensor | None, state: Mamba3State | None = None) -> torch.dtype:
    return compute_dtype(*tensors, *(state if state is not None else ()))


def _zero_state(b: int, h: int, n: int, p: int, m: int, dtype: torch.dtype, device: torch.device) -> Mamba3State:
    z = lambda *s: torch.zeros(*s, dtype=dtype, device=device)  # noqa: E731
    return Mamba3State(z(b, h, n, p), z(b, h, m), z(b, h, n), z(b, h, p))


def _state_in(
    state: Mamba3State | None, b: int, h: int, n: int, p: int, m: int, dtype: torch.dtype, device: torch.device
) -> Mamba3State:
    if state is None:
        return _zero_state(b, h, n, p, m, dtype, device)
    return Mamba3State(*(t.to(dtype) for t in state))


def _biased(t: Tensor, bias: Tensor | None, h: int, dim: int) -> Tensor:
    """B or C (groups along ``dim``, features last) with its groups repeated over the heads, plus the
    per-head bias (h, n), in one pass."""
    if bias is None:
        return expand_groups(t, h, dim=dim)
    g, n = t.shape[dim], t.shape[-1]
    out = t.unsqueeze(dim + 1) + bias.to(t.dtype).view(g, h // g, n)
    return out.flatten(dim, dim + 1)


def _rotate_by(t: Tensor, turn: Tensor) -> Tensor:
    """:func:`rotate_pairs` by the complex numbers ``turn = exp(i theta)`` (..., m): the pairs as
    complex numbers times ``turn`` (one multiplication); ``t`` (..., n), ``n`` even."""
    m = turn.shape[-1]
    z = torch.view_as_complex(t[..., : 2 * m].unflatten(-1, (m, 2)))
    rotated = torch.view_as_real(z * turn).flatten(-2)
    return torch.cat((rotated, t[..., 2 * m :]), dim=-1) if 2 * m < t.shape[-1] else rotated


# ----------------------------------------------------------------------------------------------
# naive and step


def mamba3_naive(
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
    """Mamba-3 SISO by a Python loop over time, in float64 (the ground truth; see the module
    docstring for the recurrence and its source).

    Args:
        x: (batch, length, heads, p), the kernel's V.
        dt: (batch, length, heads), positive (after softplus and bias), the kernel's DT.
        A: (heads,) or (batch, length, heads), negative; ``dt A`` is the kernel's ADT.
        B, C: (batch, length, groups, n), ``groups`` dividing ``heads`` (the kernel's K and Q).
        trap: (batch, length, heads), the trapezoid gate's logit (``lam = sigmoid(trap)``).
        angles: (batch, length, heads, m), ``m <= n / 2``, raw angle inputs (rate ``pi tanh(angles)``).
        B_bias, C_bias: (heads, n) or None (the kernel's K_bias, Q_bias).
        D: (heads,) or (heads, p), or None.
        initial_state: a :class:`Mamba3State` or None (zeros).
        output_final_state: also return the state after the last position.
        mask: (batch, length) bool, True at real positions, or None.

    Returns:
        ``y`` (batch, length, heads, p) in ``x``'s dtype, or ``(y, final_state)`` with a
        :class:`Mamba3State` in the compute dtype.
    """
    op = "mamba3_naive"
    b, l, h, n, p, m, state, mask = _check(op, x, dt, A, B, C, trap, angles, B_bias, C_bias, D, initial_state, mask)
    dtype = _dtype(x, dt, A, B, C, trap, angles, B_bias, C_bias, D, state=state)
    f64 = torch.float64
    S, theta, k_prev, v_prev = _state_in(state, b, h, n, p, m, f64, x.device)
    xs, dts, lam = x.to(f64), dt.to(f64), torch.sigmoid(trap.to(f64))
    As = A.to(f64).expand(b, l, h)
    rate = math.pi * torch.tanh(angles.to(f64))
    Bs, Cs = _biased(B.to(f64), B_bias, h, 2), _biased(C.to(f64), C_bias, h, 2)
    Ds = None if D is None else D.to(f64)
    ys = []
    for t in range(l):
        d = dts[:, t]
        th = torch.remainder(theta + rate[:, t] * d[..., None], TWO_PI)
        k, q = rotate_pairs(Bs[:, t], th), rotate_pairs(Cs[:, t], th)
        alpha = (d * As[:, t]).exp()
        prev_w = (alpha * d * (1 - lam[:, t]))[..., None, None]
        cur_w = (d * lam[:, t])[..., None, None]
        new = (
            alpha[..., None, None] * S
            + prev_w * k_prev[..., :, None] * v_prev[..., None, :]
            + cur_w * k[..., :, None] * xs[:, t, :, None, :]
        )
        y = torch.einsum("bhn,bhnp->bhp", q, new)
        if Ds is not None:
            y = y + skip(Ds, xs[:, t])
        v = xs[:, t]
        if mask is not None:
            mt = mask[:, t, None, None]
            new = torch.where(mt[..., None], new, S)
            th, k, v = torch.where(mt, th, theta), torch.where(mt, k, k_prev), torch.where(mt, v, v_prev)
            y = y * mt
        S, theta, k_prev, v_prev = new, th, k, v
        ys.append(y)
    y = (torch.stack(ys, dim=1) if ys else xs.new_zeros(b, 0, h, p)).to(x.dtype)
    if not output_final_state:
        return y
    return y, Mamba3State(S.to(dtype), theta.to(dtype), k_prev.to(dtype), v_prev.to(dtype))


def mamba3_step(
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
    """One position of Mamba-3 SISO, for decoding (the recurrence of the module docstring).

    ``x`` (batch, heads, p), ``dt`` and ``trap`` (batch, heads), ``A`` (heads,) or (batch, heads),
    ``B``, ``C`` (batch, groups, n), ``angles`` (batch, heads, m), ``state`` a :class:`Mamba3State`
    or None (zeros), ``B_bias``, ``C_bias`` (heads, n), ``D`` (heads,) or (heads, p). Returns
    ``(y (batch, heads, p) in x's dtype, the new Mamba3State in the compute dtype)``.
    """
    op = "mamba3_step"
    b, h, g, n, p = check_step_grouped(op, C, B, x, qk=("C", "B"), vname="x")
    m = _check_per_head(op, (b,), "batch", dt, A, trap, angles, h, n, p, B_bias, C_bias, D)
    state = _check_state(op, "state", state, b, h, n, p, m)
    dtype = _dtype(x, dt, A, B, C, trap, angles, B_bias, C_bias, D, state=state)
    S, theta, k_prev, v_prev = _state_in(state, b, h, n, p, m, dtype, x.device)
    xs, d, lam = x.to(dtype), dt.to(dtype), torch.sigmoid(trap.to(dtype))
    theta = torch.remainder(theta + math.pi * torch.tanh(angles.to(dtype)) * d[..., None], TWO_PI)
    k = rotate_pairs(_biased(B.to(dtype), B_bias, h, 1), theta)
    q = rotate_pairs(_biased(C.to(dtype), C_bias, h, 1), theta)
    alpha = (d * A.to(dtype)).exp()
    previous = (d * (1 - lam))[..., None, None] * k_prev[..., :, None] * v_prev[..., None, :]
    new = alpha[..., None, None] * (S + previous) + (d * lam)[..., None, None] * k[..., :, None] * xs[..., None, :]
    y = (q.unsqueeze(-2) @ new).squeeze(-2)
    if D is not None:
        y = y + skip(D, xs)
    return y.to(x.dtype), Mamba3State(new, theta, k, xs)


# ----------------------------------------------------------------------------------------------
# chunked


def _next_real(w: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """For ``w`` (b, l, h): at every real position ``t`` the value of ``w`` at the next real position
    after ``t`` (0 if none; 0 at padded positions), and the value at the first real position (b, h)."""
    b, l, h = w.shape
    if mask is None:
        return F.pad(w[:, 1:], (0, 0, 0, 1)), w[:, 0]
    pos = torch.arange(l, device=w.device).expand(b, l)
    first_from = torch.where(mask, pos, l).flip(1).cummin(1).values.flip(1)  # first real position >= t, l if none
    after = F.pad(first_from[:, 1:], (0, 1), value=l)
    wp = F.pad(w, (0, 0, 0, 1))  # index l: 0
    nxt = wp.gather(1, after.unsqueeze(-1).expand(b, l, h)) * mask.unsqueeze(-1).to(w.dtype)
    first = wp.gather(1, first_from[:, :1, None].expand(b, 1, h)).squeeze(1)
    return nxt, first


def _last_real(t: Tensor, mask: Tensor | None, before: Tensor) -> Tensor:
    """``t`` (b, l, h, d) at the last real position, ``before`` (b, h, d) where there is none."""
    if mask is None:
        return t[:, -1]
    b, l = mask.shape
    pos = torch.where(mask, torch.arange(l, device=mask.device).expand(b, l), -1).max(1).values
    sel = t.gather(1, pos.clamp(min=0).view(b, 1, 1, 1).expand(b, 1, *t.shape[2:])).squeeze(1)
    return torch.where((pos >= 0).view(b, 1, 1), sel, before)


def mamba3_chunk(
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
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor | tuple[Tensor, Mamba3State]:
    """Mamba-3 SISO, chunkwise parallel: the scalar-decay core on the rotated keys and queries with
    the trapezoidal write folded into one write per position (see the module docstring).

    Same arguments and results as :func:`mamba3_naive`, plus ``chunk_size`` (a positive integer; it
    changes the speed, not the result). Computes in the compute dtype; the cumulative sum of the
    angles in float64 (then taken mod 2 pi), so that long sequences keep them exact.
    """
    op = "mamba3_chunk"
    chunk_size = check_chunk_size(op, chunk_size)

    def core(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, S0: Tensor | None, write: Tensor):
        return scalar_decay_chunked_core(q, k, v, log_decay, S0, chunk_size, v_scale=write)

    args = (x, dt, A, B, C, trap, angles, B_bias, C_bias, D, initial_state, output_final_state, mask)
    return siso_by_core(op, core, *args)


#: A scalar-decay core: ``(q, k, v, log_decay, S0, write) -> (y, S)`` for q, k (b, l, h, n), v (b, l,
#: h, p), log_decay and write (b, l, h), S0 (b, h, n, p) or None: ``S_t = exp(log_decay_t) S_{t-1} +
#: write_t k_t^T v_t``, ``y_t = q_t S_t``, and the final state.
Core = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor], tuple[Tensor, Tensor]]


def siso_by_core(
    op: str,
    core: Core,
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
    """Mamba-3 SISO with its recurrence run by ``core`` (:data:`Core`: the chunked algorithm here,
    or the numba kernels of :mod:`.numba`): the rotation, the trapezoidal write folded into one
    write per position, the diagonal correction and the skip around it (the module docstring)."""
    b, l, h, n, p, m, state, mask = _check(op, x, dt, A, B, C, trap, angles, B_bias, C_bias, D, initial_state, mask)
    dtype = _dtype(x, dt, A, B, C, trap, angles, B_bias, C_bias, D, state=state)
    S0, theta0, k0, v0 = _state_in(state, b, h, n, p, m, dtype, x.device)
    if l == 0:
        y = x.new_zeros(b, 0, h, p)
        return (y, Mamba3State(S0, theta0, k0, v0)) if output_final_state else y
    xs = x.to(dtype)
    dts = keep(mask, dt.to(dtype))
    lam = torch.sigmoid(trap.to(dtype))
    f64 = torch.float64
    steps = (math.pi * torch.tanh(angles.to(dtype)) * dts.unsqueeze(-1)).to(f64)  # summed in float64
    theta = torch.remainder(theta0.to(f64).unsqueeze(1) + steps.cumsum(1), TWO_PI).to(dtype)  # (b, l, h, m)
    Bs, Cs = _biased(B.to(dtype), B_bias, h, 2), _biased(C.to(dtype), C_bias, h, 2)
    if m == 0:
        k, q = Bs, Cs
    elif n % 2 == 0 and not torch.compiler.is_compiling():
        # By complex factors (one product), except under torch.compile: Inductor's code for it gave
        # dt and the angles wrong gradients (PyTorch 2.13, CPU; test_compiled_mamba3_gradients_equal_eager).
        turn = torch.polar(torch.ones_like(theta), theta)
        k, q = _rotate_by(Bs, turn), _rotate_by(Cs, turn)
    else:
        k, q = rotate_pairs(Bs, theta), rotate_pairs(Cs, theta)

    ahead, first = _next_real(dts * (1 - lam), mask)  # c_t, and c before the first position
    write = dts * lam + ahead
    S_start = None if state is None else S0 + first[..., None, None] * k0.unsqueeze(-1) * v0.unsqueeze(-2)
    y, S = core(q, k, xs, dts * A.to(dtype), S_start, write)
    # - c_t (q_t . k_t) x_t + D x_t in one pass; q_t . k_t = (C_t + b_C) . (B_t + b_B)
    coef = -ahead * torch.linalg.vecdot(Bs, Cs)
    if D is not None and D.dim() == 1:
        coef = coef + D.to(dtype)
    y = torch.addcmul(y, coef.unsqueeze(-1), xs)
    if D is not None and D.dim() == 2:
        y = y + skip(D, xs)
    y = keep(mask, y).to(x.dtype)
    if not output_final_state:
        return y
    return y, Mamba3State(S, theta[:, -1], _last_real(k, mask, k0), _last_real(xs, mask, v0))
