"""Argument checks and preparation shared by every matrix-state recurrence and implementation.

Conventions of the family (see the package docstring):

* sequences are (batch, length, heads, features): ``q``, ``k`` (b, l, h, dk), ``v`` (b, l, h, dv);
* the state of a head is a (dk, dv) matrix, ``S`` of shape (b, h, dk, dv), read by ``o_t = q_t S_t``;
* per-position scalars (a decay's log, the delta rule's ``beta``) are (b, l, h);
* ``mask`` (b, l), True at real positions: at a padded position the state is carried unchanged
  (no decay, no write, no erase) and the output is zero, so the final state is the state after the
  last real position and outputs at real positions do not depend on the padding that follows;
* computation runs in float64 if a floating input is float64, else float32; outputs come back in
  ``v``'s dtype, states in the compute dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from longrange.ops.scan.common import compute_dtype  # noqa: F401  (the ops' compute dtype, shared with the scans)

#: The floor of the norm by which the delta rules' ``normalize_qk`` divides q and k (the ``eps`` of
#: ``torch.nn.functional.normalize`` as the DeltaNet layers call it).
QK_NORM_EPS = 1e-6


def normalize_qk(x: Tensor) -> Tensor:
    """``x / max(||x||, QK_NORM_EPS)`` over the last dimension: the delta rules' ``normalize_qk``."""
    return F.normalize(x, dim=-1, eps=QK_NORM_EPS)


def shape_of(t: object) -> object:
    """The shape of ``t`` as a plain tuple when it is a tensor, else its type (for messages)."""
    return tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__


def check_qkv(op: str, q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int, int, int, int]:
    """(b, l, h, dk, dv) of ``q``, ``k`` (b, l, h, dk) and ``v`` (b, l, h, dv); a ValueError naming
    the argument that does not fit."""
    if not isinstance(k, Tensor) or k.dim() != 4:
        raise ValueError(f"{op}: k must have shape (batch, length, heads, dk), got {shape_of(k)}")
    b, l, h, dk = k.shape
    if not isinstance(q, Tensor) or q.shape != k.shape:
        raise ValueError(
            f"{op}: q must have the shape of k (batch, length, heads, dk)={tuple(k.shape)}, got {shape_of(q)}"
        )
    if not isinstance(v, Tensor) or v.dim() != 4 or v.shape[:3] != (b, l, h):
        raise ValueError(f"{op}: v must have shape (batch, length, heads, dv)=({b}, {l}, {h}, dv), got {shape_of(v)}")
    return b, l, h, dk, v.shape[3]


def check_shape(op: str, name: str, t: Tensor | None, shape: tuple[int, ...], what: str) -> None:
    """A ValueError naming ``name`` unless ``t`` is None or has ``shape`` (described as ``what``)."""
    if t is not None and (not isinstance(t, Tensor) or tuple(t.shape) != tuple(shape)):
        raise ValueError(f"{op}: {name} must have shape {what}={tuple(shape)}, got {shape_of(t)}")


def require_shape(op: str, name: str, t: Tensor | None, shape: tuple[int, ...], what: str) -> None:
    """:func:`check_shape` for an argument that must be given (None is refused too)."""
    if t is None:
        raise ValueError(f"{op}: {name} must have shape {what}={tuple(shape)}, got None")
    check_shape(op, name, t, shape, what)


def check_mask(op: str, mask: Tensor | None, b: int, l: int) -> Tensor | None:
    """``mask`` as a (b, l) boolean tensor, or None; a ValueError for another shape or dtype."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or tuple(mask.shape) != (b, l):
        raise ValueError(f"{op}: mask must have shape (batch, length)=({b}, {l}), got {shape_of(mask)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"{op}: mask must be a boolean tensor (True at real positions), got {mask.dtype}")
    return mask


def keep(mask: Tensor | None, t: Tensor) -> Tensor:
    """``t`` (b, l, ...) zeroed at the padded positions of ``mask`` (b, l); ``t`` itself without a mask.
    Zeroing a log-decay means no decay there; zeroing a write strength (``k``, ``beta``, ``dt``)
    means no write."""
    if mask is None:
        return t
    return t * mask.reshape(*mask.shape, *([1] * (t.dim() - 2))).to(t.dtype)


def initial(
    op: str, initial_state: Tensor | None, b: int, h: int, dk: int, dv: int, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """The starting state (b, h, dk, dv) in ``dtype``: ``initial_state`` checked, or zeros."""
    if initial_state is None:
        return torch.zeros(b, h, dk, dv, dtype=dtype, device=device)
    check_shape(op, "initial_state", initial_state, (b, h, dk, dv), "(batch, heads, dk, dv)")
    return initial_state.to(dtype)


def check_chunk_size(op: str, chunk_size: int) -> int:
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"{op}: chunk_size must be a positive integer, got {chunk_size!r}")
    return chunk_size


def default_scale(scale: float | None, dk: int) -> float:
    """``scale`` or dk^-1/2 (the attention-like default of GLA and the delta rule)."""
    return dk**-0.5 if scale is None else float(scale)
