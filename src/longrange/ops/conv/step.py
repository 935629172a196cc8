"""Generation steps of the causal convolution: :func:`causal_conv1d_update` (see the package docstring)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from longrange.ops.conv.common import activate, check_activation, check_weight_bias


def causal_conv1d_update(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
) -> tuple[Tensor, Tensor]:
    """One generation step (or a few): returns ``(y, new_conv_state)``; does not modify its inputs.

    ``x``: (b, d) for one step or (b, d, k) for k steps; ``conv_state``: (b, d, s) with
    ``s >= width - 1``, the last ``s`` inputs (oldest first). ``y`` has the shape of ``x``;
    ``new_conv_state`` has the shape of ``conv_state`` and ends with the newest input.
    """
    single = x.dim() == 2
    xs = x[..., None] if single else x
    if xs.dim() != 3:
        raise ValueError(
            f"causal_conv1d_update: x must have shape (batch, d) or (batch, d, steps), got {tuple(x.shape)}"
        )
    b, d, _ = xs.shape
    check_weight_bias(weight, bias, d)
    check_activation(activation)
    w = weight.shape[1]
    if conv_state.dim() != 3 or conv_state.shape[:2] != (b, d) or conv_state.shape[2] < w - 1:
        raise ValueError(
            f"causal_conv1d_update: conv_state must have shape (batch, d, s)=({b}, {d}, s) with s >= width - 1 = {w - 1}, "
            f"got {tuple(conv_state.shape)}"
        )
    s = conv_state.shape[2]
    window = torch.cat([conv_state.to(xs.dtype), xs], dim=-1)  # (b, d, s + k)
    y = F.conv1d(window[..., s - (w - 1) :], weight[:, None, :].to(xs.dtype), bias, groups=d)
    y = activate(y, activation)
    new_state = window[..., window.shape[-1] - s :]
    return (y[..., 0] if single else y), new_state
