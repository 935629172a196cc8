"""Argument checking and preparation shared by every implementation of the selective scan.

The implementations (:mod:`.reference`, :mod:`.chunked`, :mod:`.numba`, :mod:`.triton`) and the
dispatcher (:mod:`.dispatch`) import these helpers from here, never from each other; see the
package docstring for the shapes and the semantics they check.

- :func:`check_shapes`: every argument's shape against u's (ValueError naming the argument);
- :func:`compute_dtype`: float64 if any floating input is float64, else float32;
- :func:`prepare_delta`: delta plus its bias, through softplus, in the compute dtype;
- :func:`per_channel`: B or C broadcastable to (b, d, n, l);
- :func:`finish`: the skip term D, the SiLU gate z and the output dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def shape_of(t: Tensor) -> tuple[int, ...]:
    """The shape of ``t`` as a plain tuple (for error messages)."""
    return tuple(t.shape)


def check_shapes(u, delta, A, B, C, D, z, delta_bias, initial_state) -> None:
    """Raise a ValueError naming the first argument whose shape does not fit u's (batch, d, length)."""
    if not isinstance(u, Tensor) or u.dim() != 3:
        raise ValueError(
            f"selective_scan: u must have shape (batch, d, length), got {shape_of(u) if isinstance(u, Tensor) else type(u)}"
        )
    b, d, l = u.shape
    if delta.shape != u.shape:
        raise ValueError(
            f"selective_scan: delta must have the shape of u (batch, d, length)={shape_of(u)}, got {shape_of(delta)}"
        )
    if A.is_complex():
        raise ValueError("selective_scan: complex A is not supported; pass a real A of shape (d, n)")
    if A.dim() != 2 or A.shape[0] != d:
        raise ValueError(f"selective_scan: A must have shape (d, n) with d={d}, got {shape_of(A)}")
    n = A.shape[1]
    for name, M in (("B", B), ("C", C)):
        if M.is_complex():
            raise ValueError(f"selective_scan: complex {name} is not supported")
        ok = (
            (M.dim() == 2 and M.shape == (d, n))
            or (M.dim() == 3 and M.shape == (b, n, l))
            or (M.dim() == 4 and M.shape[0] == b and M.shape[2:] == (n, l) and M.shape[1] >= 1 and d % M.shape[1] == 0)
        )
        if not ok:
            raise ValueError(
                f"selective_scan: {name} must have shape (d, n)={(d, n)}, (batch, n, length)={(b, n, l)} or "
                f"(batch, groups, n, length)=({b}, g, {n}, {l}) with g dividing d={d}; got {shape_of(M)}"
            )
    for name, v in (("D", D), ("delta_bias", delta_bias)):
        if v is not None and v.shape != (d,):
            raise ValueError(f"selective_scan: {name} must have shape (d,)={(d,)}, got {shape_of(v)}")
    if z is not None and z.shape != u.shape:
        raise ValueError(
            f"selective_scan: z must have the shape of u (batch, d, length)={shape_of(u)}, got {shape_of(z)}"
        )
    if initial_state is not None and initial_state.shape != (b, d, n):
        raise ValueError(
            f"selective_scan: initial_state must have shape (batch, d, n)={(b, d, n)}, got {shape_of(initial_state)}"
        )


def compute_dtype(*tensors: Tensor | None) -> torch.dtype:
    """The dtype the scan computes in: float64 if any floating input is float64, else float32."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def prepare_delta(
    delta: Tensor, delta_bias: Tensor | None, delta_softplus: bool, dtype: torch.dtype, channel_dim: int = 1
) -> Tensor:
    """delta in ``dtype``, plus ``delta_bias`` (per channel: ``delta``'s dimension ``channel_dim``,
    1 for (b, d, l), -1 for (b, l, d)), through softplus if asked."""
    delta = delta.to(dtype)
    if delta_bias is not None:
        delta = delta + (delta_bias.to(dtype)[:, None] if channel_dim == 1 else delta_bias.to(dtype))
    if delta_softplus:
        delta = F.softplus(delta)
    return delta


def per_channel(M: Tensor, d: int) -> Tensor:
    """B or C as a tensor broadcastable to (b, d, n, l)."""
    if M.dim() == 2:  # (d, n)
        return M[None, :, :, None]
    if M.dim() == 3:  # (b, n, l)
        return M[:, None]
    b, g, n, l = M.shape  # grouped: expand groups to channels (channel c -> group c // (d // g))
    return M[:, :, None].expand(b, g, d // g, n, l).reshape(b, d, n, l)


def finish(y: Tensor, u: Tensor, D: Tensor | None, z: Tensor | None, out_dtype: torch.dtype) -> Tensor:
    """The output from the states' part ``y``: plus ``D * u``, times ``silu(z)``, in ``out_dtype``."""
    if D is not None:
        y = y + u * D.to(y.dtype)[:, None]
    if z is not None:
        y = y * F.silu(z.to(y.dtype))
    return y.to(out_dtype)


def scan_flops(
    b: int,
    d: int,
    l: int,
    n: int,
    has_D: bool,
    has_z: bool,
    *,
    backward: bool = False,
    has_bias: bool = False,
    softplus: bool = False,
) -> int:
    """Floating-point operations of the fused scan's forward (or, with ``backward``, its backward)
    pass, counted as :mod:`longrange.ops.custom_ops` says (one per add, multiply, divide or exp).

    Forward, per state element (b, d, l, n): exp(Δ A) 2, ā h + (Δ u) B 3, y += C h 2; per position
    (b, d, l): Δ u 1, with D ``+ D u`` 2, with z the gate ``y z σ(z)`` 5, and where the kernel
    applies them (``has_bias``, ``softplus``: Triton) Δ + bias 1, softplus 2. Backward, per state
    element: the states recomputed 5 (with z the output too, 2), the adjoint 15 (g = g_h + g_y C,
    g_C, g_B, g_x, e = g h ā, g_Δ, g_A: 2 each; g_h = g ā: 1); per position: 6 (Δ u, g_u, g_Δ),
    with D 2, with z 11 (σ(z), g_z, g_y), with the bias 1, with softplus 4 (σ(Δ) times g_Δ).
    """
    per_state = (22 if has_z else 20) if backward else 7
    if backward:
        per_position = 6 + 2 * has_D + 11 * has_z + has_bias + 4 * softplus
    else:
        per_position = 1 + 2 * has_D + 5 * has_z + has_bias + 2 * softplus
    return b * d * l * (n * per_state + per_position)


def loop_operands(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    delta_bias: Tensor | None,
    delta_softplus: bool,
    initial_state: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The arguments checked and in the compute dtype, as the loops over time read them: ``u``
    (b, d, l), ``delta`` (b, d, l) with its bias and softplus applied, ``A`` (d, n), ``B`` and ``C``
    per channel (b, d, n, l), and the initial state (b, d, n), zeros when None."""
    check_shapes(u, delta, A, B, C, D, z, delta_bias, initial_state)
    dtype = compute_dtype(u, delta, A, B, C, D, z, delta_bias, initial_state)
    b, d, l = u.shape
    n = A.shape[1]
    h = u.new_zeros(b, d, n, dtype=dtype) if initial_state is None else initial_state.to(dtype)
    return (
        u.to(dtype),
        prepare_delta(delta, delta_bias, delta_softplus, dtype),
        A.to(dtype),
        per_channel(B.to(dtype), d).expand(b, d, n, l),
        per_channel(C.to(dtype), d).expand(b, d, n, l),
        h,
    )
