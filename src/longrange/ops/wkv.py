"""RWKV-4's WKV: a per-channel decaying weighted average of values, with a bonus for the current token.

Shapes: ``k``, ``v`` (batch, length, channels); ``w``, ``u`` (channels,). Per channel, with the
decay rate ``w > 0`` (the layer passes ``exp(time_decay)``) and the bonus ``u`` (``time_first``)::

    y_t = (Σ_{i<t} exp(k_i - (t-1-i) w) v_i + exp(u + k_t) v_t)
          / (Σ_{i<t} exp(k_i - (t-1-i) w)     + exp(u + k_t))

(Peng et al., "RWKV: Reinventing RNNs for the Transformer Era", arXiv 2305.13048, eq. 14; the
token at t-1 enters undecayed, as BlinkDL/RWKV-LM's v4 kernel and Zoology's copy of it compute.)

The state after position t is the numerator and denominator of the sums over i <= t, kept as
``{"num", "den", "scale"}`` (each (batch, channels)) with the sums equal to ``exp(scale) * num``
and ``exp(scale) * den``: the log-scale keeps every exponential at most 1 whatever the keys (the
v4 kernel's running maximum), so nothing overflows in float32. The empty state has scale -inf.

Three forms, each tested against the others:

* :func:`wkv_ref`: the sums as written, a loop over time accumulating them unscaled; in float64
  the ground truth (keys up to a few hundred);
* :func:`wkv`: the parallel form: both sums are the diagonal linear recurrence
  ``h_t = exp(s_{t-1} - w - s_t) h_{t-1} + exp(k_t - s_t) [v_t, 1]`` of
  :func:`~longrange.ops.scan.linear_scan` (chunked, differentiable), where ``s_t`` is the running
  maximum ``max_{i<=t} (k_i - (t-i) w)`` computed in float64 from the detached inputs (the output
  does not depend on ``s``: any choice gives the same sums, so it is a constant of the gradient),
  then the bonus term as the kernel adds it;
* :func:`wkv_step`: one position, the v4 kernel's recurrence, for generation.

Computation runs in the wider of the inputs' dtype and float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops.scan.chunked import linear_scan

#: The keys of a WKV state.
STATE_KEYS = ("num", "den", "scale")


def _check(
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


def _work(*tensors: Tensor) -> torch.dtype:
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


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
    _check(w, u, k, v, state, mask, "wkv_ref")
    work = _work(w, u, k, v)
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
    work = _work(w, u, k, v)
    w, u, k, v = (t.to(work) for t in (w, u, k, v))
    num, den, scale = (state[key].to(work) for key in STATE_KEYS)
    bonus = u + k
    top = torch.maximum(scale, bonus)
    a, b = torch.exp(scale - top), torch.exp(bonus - top)
    y = (a * num + b * v) / (a * den + b)
    new_scale = torch.maximum(scale - w, k)
    a, b = torch.exp(scale - w - new_scale), torch.exp(k - new_scale)
    return y, {"num": a * num + b * v, "den": a * den + b, "scale": new_scale}


def _running_scale(w: Tensor, k: Tensor, start: Tensor | None) -> Tensor:
    """s_t = max(start - (t+1) w, max_{i<=t} (k_i - (t-i) w)), in float64, detached: the
    log-scale of the sums after each position (``start``: the log of the initial state's
    denominator mass, -inf for none)."""
    with torch.no_grad():
        kd, wd = k.detach().double(), w.detach().double()
        t = torch.arange(k.shape[1], dtype=torch.float64, device=k.device)[:, None]
        s = torch.cummax(kd + t * wd, dim=1).values - t * wd
        if start is not None:
            s = torch.maximum(s, start.double()[:, None, :] - (t + 1) * wd)
    return s


def wkv(
    w: Tensor,
    u: Tensor,
    k: Tensor,
    v: Tensor,
    state: dict[str, Tensor] | None = None,
    mask: Tensor | None = None,
    chunk_size: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The parallel form (module docstring): outputs (batch, length, channels) and the final state;
    differentiable in ``w``, ``u``, ``k``, ``v`` and the state. A position where ``mask`` (batch,
    length) is False adds nothing to the sums (a padded position, first in a reversed sequence).
    ``chunk_size``: that of :func:`~longrange.ops.scan.linear_scan` (None: its default)."""
    _check(w, u, k, v, state, mask, "wkv")
    work = _work(w, u, k, v)
    w, u, k, v = (t.to(work) for t in (w, u, k, v))
    real = None if mask is None else mask[:, :, None]
    keys = k if real is None else k.detach().masked_fill(~real, -torch.inf)
    mass, h0 = None, None
    if state is not None:
        num0, den0, scale0 = (state[key].to(work) for key in STATE_KEYS)
        empty0 = ~torch.isfinite(scale0) | (den0 <= 0)
        with torch.no_grad():
            mass = torch.where(empty0, -torch.inf, scale0 + torch.log(den0.clamp_min(torch.finfo(work).tiny)))
        h0 = torch.stack([torch.where(empty0, 0.0, num0), torch.where(empty0, 0.0, den0)], dim=-1)
    s = _running_scale(w, keys, mass)  # -inf while the sums are empty
    empty = ~torch.isfinite(s)
    # While the sums are empty any finite scale is theirs: the key's (detached).
    s = torch.where(empty, k.detach().double(), s).to(work)
    if state is None:
        before, empty_before = (
            torch.cat([s[:, :1], s[:, :-1]], dim=1),
            torch.cat([torch.ones_like(empty[:, :1]), empty[:, :-1]], dim=1),
        )
    else:
        scale0 = torch.where(empty0, s[:, 0], scale0)
        before = torch.cat([scale0[:, None], s[:, :-1]], dim=1)
        empty_before = torch.cat([empty0[:, None], empty[:, :-1]], dim=1)
    weight = torch.exp(k - s)
    if real is not None:
        weight = weight * real.to(work)
    inputs = torch.stack([weight * v, weight], dim=-1)  # (batch, length, channels, 2)
    # The decay of empty sums is any: 0 keeps its exponential finite whatever the scales.
    log_decay = torch.where(empty_before, 0.0, before - w - s).unsqueeze(-1).expand_as(inputs)
    h = linear_scan(log_decay.transpose(0, 1), inputs.transpose(0, 1), h0, chunk_size=chunk_size).transpose(0, 1)
    first = h0 if h0 is not None else torch.zeros_like(h[:, 0])
    h_before = torch.cat([first[:, None], h[:, :-1]], dim=1)
    bonus = u + k
    top = torch.maximum(before, bonus).detach()
    a, b = torch.exp(before - top), torch.exp(bonus - top)
    y = (a * h_before[..., 0] + b * v) / (a * h_before[..., 1] + b)
    return y, {"num": h[:, -1, :, 0], "den": h[:, -1, :, 1], "scale": s[:, -1]}


__all__ = ["STATE_KEYS", "check_state", "empty_state", "wkv", "wkv_ref", "wkv_step"]
