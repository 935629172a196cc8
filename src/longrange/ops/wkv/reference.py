"""RWKV-4's WKV as written (see :mod:`longrange.ops.wkv`): the loop over time (the ground truth in
float64), the step of generation, the state's checks and the inputs' checks every implementation
shares."""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops.scan.common import compute_dtype

#: The keys of a WKV state.
STATE_KEYS = ("num", "den", "scale")


def check_inputs(
    w: Tensor, u: Tensor, k: Tensor, v: Tensor, state: dict[str, Tensor] | None, mask: Tensor | None, where: str
) -> None:
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(
            f"{where}: k and v must be (batch, length, channels) of one shape, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if k.shape[1] < 1:
        raise ValueError(f"{where}: the length must be at least 1, got k of shape {tuple(k.shape)}")
    channels = k.shape[-1]
    for name, p in (("w", w), ("u", u)):
        if p.shape != (channels,):
            raise ValueError(
                f"{where}: {name} must have shape ({channels},) for k of shape {tuple(k.shape)}, got {tuple(p.shape)}"
            )
    if state is not None:
        check_state(state, (k.shape[0], channels), where)
    if mask is not None and (mask.dtype != torch.bool or tuple(mask.shape) != tuple(k.shape[:2])):
        raise ValueError(
            f"{where}: mask must be boolean of shape {tuple(k.shape[:2])} (batch, length), "
            f"got {mask.dtype} of shape {tuple(mask.shape)}"
        )


def check_state(state: dict[str, Tensor], shape: tuple[int, int], where: str) -> None:
    """A ValueError naming what is wrong unless ``state`` has the keys :data:`STATE_KEYS`, each of ``shape``."""
    if not isinstance(state, dict) or set(state) != set(STATE_KEYS):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{where}: a WKV state is a dict of {', '.join(STATE_KEYS)}, got {got}")
    for key in STATE_KEYS:
        if tuple(state[key].shape) != shape:
            raise ValueError(
                f"{where}: state[{key!r}] must have shape {shape} (batch, channels), got {tuple(state[key].shape)}"
            )


def empty_state(batch: int, channels: int, device=None, dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """The state before the first position: no mass (num = den = 0, scale -inf)."""
    zeros = torch.zeros(batch, channels, device=device, dtype=dtype)
    return {"num": zeros, "den": zeros.clone(), "scale": torch.full_like(zeros, -torch.inf)}


def wkv_ref(
    w: Tensor,
    u: Tensor,
    k: Tensor,
    v: Tensor,
    state: dict[str, Tensor] | None = None,
    mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The sums of the module docstring as a loop over time, unscaled (the ground truth in float64).
    Returns the outputs (batch, length, channels) and the final state. A position where ``mask``
    (batch, length) is False adds nothing to the sums (they decay over it)."""
    check_inputs(w, u, k, v, state, mask, "wkv_ref")
    work = compute_dtype(w, u, k, v)
    w, u, k, v = (t.to(work) for t in (w, u, k, v))
    B, L, D = k.shape
    if state is None:
        num = den = k.new_zeros(B, D)
    else:
        scale = torch.exp(state["scale"].to(work))
        num, den = scale * state["num"].to(work), scale * state["den"].to(work)
    decay = torch.exp(-w)
    ys = []
    for t in range(L):
        bonus = torch.exp(u + k[:, t])
        ys.append((num + bonus * v[:, t]) / (den + bonus))
        weight = torch.exp(k[:, t])
        if mask is not None:
            weight = weight * mask[:, t, None].to(work)
        num = decay * num + weight * v[:, t]
        den = decay * den + weight
    return torch.stack(ys, dim=1), {"num": num, "den": den, "scale": torch.zeros_like(num)}


def wkv_step(w: Tensor, u: Tensor, k: Tensor, v: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """One position: ``k``, ``v`` (batch, channels) -> (output (batch, channels), the new state),
    by the v4 kernel's scaled recurrence."""
    if k.dim() != 2 or k.shape != v.shape:
        raise ValueError(
            f"wkv_step: k and v must be (batch, channels) of one shape, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    check_state(state, tuple(k.shape), "wkv_step")
    work = compute_dtype(w, u, k, v)
    w, u, k, v = (t.to(work) for t in (w, u, k, v))
    num, den, scale = (state[key].to(work) for key in STATE_KEYS)
    bonus = u + k
    top = torch.maximum(scale, bonus)
    a, b = torch.exp(scale - top), torch.exp(bonus - top)
    y = (a * num + b * v) / (a * den + b)
    new_scale = torch.maximum(scale - w, k)
    a, b = torch.exp(scale - w - new_scale), torch.exp(k - new_scale)
    return y, {"num": a * num + b * v, "den": a * den + b, "scale": new_scale}


__all__ = ["STATE_KEYS", "check_inputs", "check_state", "empty_state", "wkv_ref", "wkv_step"]
