"""Mamba-2's state space duality (SSD) as pure tensor ops.

T. Dao, A. Gu, "Transformers are SSMs: Generalized Models and Efficient Algorithms Through
Structured State Space Duality", ICML 2024, arXiv:2405.21060.

The recurrence
--------------
Per head ``i`` with inputs ``x_t`` (1 x p), a step ``dt_t > 0`` (already through softplus and bias:
the layer does that), a per-head ``A < 0``, the B/C vectors ``B_t``, ``C_t`` (1 x n) of the head's
group ``i // (h // g)``, an optional skip ``D``, and a state ``S_t`` (n x p)::

    S_t = exp(dt_t A) S_{t-1} + dt_t B_t^T x_t
    y_t = C_t S_t + D x_t

This is the scalar-decay recurrence of :mod:`.scalar_decay` with ``q = C``, ``k = B``,
``v = dt x`` and the log decay ``dt A``; unrolled it is the paper's masked attention form
``y = (L o C B^T) (dt x) + D x`` with ``L[t, s] = exp(A (dt_{s+1} + ... + dt_t))`` for ``s <= t``.

State layout: (batch, heads, n, p), read by ``y_t = C_t S_t`` as in the rest of this family.
mamba-ssm stores the same state transposed, (batch, heads, p, n) (``ssd_minimal_discrete``,
``mamba_chunk_scan_combined``'s ``initial_states``/final states, ``Mamba2.step``'s ``ssm_state``):
``S_ours = S_mamba.transpose(-1, -2)``.

At a padded position (``mask`` False) the state is carried unchanged (``dt = 0`` there: no decay, no
write) and the output is zero (the ``D`` term included).

Implementations: :func:`ssd_naive` (a Python loop over time in float64, the ground truth),
:func:`ssd_chunk` (the chunked SSD algorithm of :func:`.scalar_decay.scalar_decay_chunk`: B and C
are used per group, never repeated over the heads) and :func:`ssd_step` (one position). Dtypes:
computation in float64 if a floating input is float64, else float32; outputs in ``x``'s dtype,
states in the compute dtype. Device: the inputs'.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops.matrix_state.common import (
    check_chunk_size,
    check_mask,
    check_shape,
    compute_dtype,
    initial,
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

__all__ = ["ssd_naive", "ssd_chunk", "ssd_step"]


def check_skip(op: str, D: Tensor | None, h: int, p: int) -> None:
    """A ValueError naming ``D`` unless it is None, (heads,) or (heads, p)."""
    if D is not None and (not isinstance(D, Tensor) or tuple(D.shape) not in ((h,), (h, p))):
        raise ValueError(f"{op}: D must have shape (heads,)=({h},) or (heads, p)=({h}, {p}), got {shape_of(D)}")


def skip(D: Tensor | None, x: Tensor) -> Tensor | None:
    """``D x`` for ``x`` (..., h, p) and ``D`` (h,) or (h, p); None without ``D``."""
    if D is None:
        return None
    return x * (D.to(x.dtype).unsqueeze(-1) if D.dim() == 1 else D.to(x.dtype))


def _check(
    op: str,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    initial_state: Tensor | None,
    mask: Tensor | None,
) -> tuple[int, int, int, int, int, int, Tensor | None]:
    b, l, h, g, n, p = check_grouped(op, C, B, x, qk=("C", "B"), vname="x")
    for name, t, shape, what in (("dt", dt, (b, l, h), "(batch, length, heads)"), ("A", A, (h,), "(heads,)")):
        if t is None:
            raise ValueError(f"{op}: {name} must have shape {what}={shape}, got None")
        check_shape(op, name, t, shape, what)
    check_skip(op, D, h, p)
    check_shape(op, "initial_state", initial_state, (b, h, n, p), "(batch, heads, n, p)")
    return b, l, h, g, n, p, check_mask(op, mask, b, l)


def ssd_naive(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """SSD by a Python loop over time, in float64 (the ground truth).

    ``S_t = exp(dt_t A) S_{t-1} + dt_t B_t^T x_t``, ``y_t = C_t S_t + D x_t`` (Dao & Gu 2024,
    arXiv:2405.21060; see the module docstring).

    Args:
        x: (batch, length, heads, p).
        dt: (batch, length, heads), positive (after softplus and bias).
        A: (heads,), negative.
        B, C: (batch, length, groups, n), ``groups`` dividing ``heads``; head ``i`` reads group
            ``i // (heads // groups)``.
        D: (heads,) or (heads, p), or None.
        initial_state: (batch, heads, n, p) or None (zeros); mamba-ssm's states are the transpose.
        output_final_state: also return the state after the last position.
        mask: (batch, length) bool, True at real positions, or None.

    Returns:
        ``y`` (batch, length, heads, p) in ``x``'s dtype, or ``(y, final_state)`` with the state
        (batch, heads, n, p) in the compute dtype.
    """
    op = "ssd_naive"
    b, l, h, g, n, p, mask = _check(op, x, dt, A, B, C, D, initial_state, mask)
    dtype = compute_dtype(x, dt, A, B, C, D, initial_state)
    f64 = torch.float64
    S = initial(op, initial_state, b, h, n, p, f64, x.device)
    xs, dts, As = x.to(f64), dt.to(f64), A.to(f64)
    Bs, Cs = expand_groups(B.to(f64), h), expand_groups(C.to(f64), h)
    Ds = None if D is None else D.to(f64)
    ys = []
    for t in range(l):
        d = dts[:, t, :, None, None]  # (b, h, 1, 1)
        new = (d * As[:, None, None]).exp() * S + d * Bs[:, t, :, :, None] * xs[:, t, :, None, :]
        y = torch.einsum("bhn,bhnp->bhp", Cs[:, t], new)
        if Ds is not None:
            y = y + skip(Ds, xs[:, t])
        if mask is not None:
            m = mask[:, t, None, None]
            new = torch.where(m[..., None], new, S)
            y = y * m
        S = new
        ys.append(y)
    y = (torch.stack(ys, dim=1) if ys else xs.new_zeros(b, 0, h, p)).to(x.dtype)
    return (y, S.to(dtype)) if output_final_state else y


def ssd_chunk(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor | tuple[Tensor, Tensor]:
    """SSD, chunkwise parallel: the scalar-decay core (:func:`.scalar_decay.scalar_decay_chunk`) on
    ``q = C``, ``k = B`` (per group), ``v = dt x``, log decay ``dt A``, plus ``D x``.

    Same arguments and results as :func:`ssd_naive`, plus ``chunk_size`` (a positive integer; it
    changes the speed, not the result). Computes in the compute dtype.
    """
    op = "ssd_chunk"
    b, l, h, g, n, p, mask = _check(op, x, dt, A, B, C, D, initial_state, mask)
    chunk_size = check_chunk_size(op, chunk_size)
    dtype = compute_dtype(x, dt, A, B, C, D, initial_state)
    state = None if initial_state is None else initial(op, initial_state, b, h, n, p, dtype, x.device)
    if l == 0:
        y = x.new_zeros(b, 0, h, p)
        S = state if state is not None else torch.zeros(b, h, n, p, dtype=dtype, device=x.device)
        return (y, S) if output_final_state else y
    xs = x.to(dtype)
    dts = keep(mask, dt.to(dtype))
    y, S = scalar_decay_chunked_core(C.to(dtype), B.to(dtype), xs, dts * A.to(dtype), state, chunk_size, v_scale=dts)
    if D is not None:
        y = torch.addcmul(y, D.to(dtype).unsqueeze(-1), xs) if D.dim() == 1 else y + skip(D, xs)
    y = keep(mask, y).to(x.dtype)
    return (y, S) if output_final_state else y


def ssd_step(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, state: Tensor | None, D: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """One position of SSD, for decoding.

    ``x`` (batch, heads, p), ``dt`` (batch, heads), ``A`` (heads,), ``B``, ``C`` (batch, groups, n),
    ``state`` (batch, heads, n, p) or None (zeros), ``D`` (heads,) or (heads, p) or None. Returns
    ``(y (batch, heads, p) in x's dtype, new_state in the compute dtype)`` with
    ``new_state = exp(dt A) state + dt B^T x`` and ``y = C new_state + D x``.
    """
    op = "ssd_step"
    b, h, g, n, p = check_step_grouped(op, C, B, x, qk=("C", "B"), vname="x")
    for name, t, shape, what in (("dt", dt, (b, h), "(batch, heads)"), ("A", A, (h,), "(heads,)")):
        if t is None:
            raise ValueError(f"{op}: {name} must have shape {what}={shape}, got None")
        check_shape(op, name, t, shape, what)
    check_skip(op, D, h, p)
    dtype = compute_dtype(x, dt, A, B, C, D, state)
    S = initial(op, state, b, h, n, p, dtype, x.device)
    xs, d = x.to(dtype), dt.to(dtype)[..., None, None]
    Bs, Cs = expand_groups(B.to(dtype), h, dim=1), expand_groups(C.to(dtype), h, dim=1)
    new = (d * A.to(dtype)[:, None, None]).exp() * S + d * Bs.unsqueeze(-1) * xs.unsqueeze(-2)
    y = (Cs.unsqueeze(-2) @ new).squeeze(-2)
    if D is not None:
        y = y + skip(D, xs)
    return y.to(x.dtype), new
