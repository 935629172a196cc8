"""RWKV-4's WKV as a chunked scan in PyTorch (``impl="chunked"`` of :func:`longrange.ops.wkv.wkv`):
both sums are the diagonal linear recurrence ``h_t = exp(s_{t-1} - w - s_t) h_{t-1} + exp(k_t - s_t)
[v_t, 1]`` of :func:`~longrange.ops.scan.linear_scan`, where ``s_t`` is the running maximum
``max_{i<=t} (k_i - (t-i) w)`` computed in float64 from the detached inputs (the output does not
depend on ``s``: any choice gives the same sums, so it is a constant of the gradient); then the
bonus term as the v4 kernel adds it. Differentiable in every input, the initial state included;
runs on any device."""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops.scan.chunked import linear_scan
from longrange.ops.scan.common import compute_dtype
from longrange.ops.wkv.reference import STATE_KEYS


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


def wkv_chunked(
    w: Tensor,
    u: Tensor,
    k: Tensor,
    v: Tensor,
    state: dict[str, Tensor] | None = None,
    mask: Tensor | None = None,
    chunk_size: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The chunked form (module docstring; arguments checked by :func:`longrange.ops.wkv.wkv`):
    outputs (batch, length, channels) and the final state, differentiable in ``w``, ``u``, ``k``,
    ``v`` and the state. A position where ``mask`` (batch, length) is False adds nothing to the
    sums (a padded position, first in a reversed sequence). ``chunk_size``: that of
    :func:`~longrange.ops.scan.linear_scan` (None: its default)."""
    work = compute_dtype(w, u, k, v)
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
    # Time-major and contiguous: the scan steps along the first axis.
    log_decay, inputs = (t.transpose(0, 1).contiguous() for t in (log_decay, inputs))
    h = linear_scan(log_decay, inputs, h0, chunk_size=chunk_size).transpose(0, 1)
    first = h0 if h0 is not None else torch.zeros_like(h[:, 0])
    h_before = torch.cat([first[:, None], h[:, :-1]], dim=1)
    bonus = u + k
    top = torch.maximum(before, bonus).detach()
    a, b = torch.exp(before - top), torch.exp(bonus - top)
    y = (a * h_before[..., 0] + b * v) / (a * h_before[..., 1] + b)
    return y, {"num": h[:, -1, :, 0], "den": h[:, -1, :, 1], "scale": s[:, -1]}


__all__ = ["wkv_chunked"]
