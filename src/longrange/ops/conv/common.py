"""What the implementations of the causal convolution share: the activations and the arguments' checks."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

ACTIVATIONS = (None, "silu", "swish")


def check_activation(activation: str | None) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"causal_conv1d: activation must be one of {ACTIVATIONS}, got {activation!r}")


def check_weight_bias(weight: Tensor, bias: Tensor | None, d: int) -> None:
    if weight.dim() != 2 or weight.shape[0] != d or weight.shape[1] < 1:
        raise ValueError(f"causal_conv1d: weight must have shape (d, width) with d={d}, got {tuple(weight.shape)}")
    if bias is not None and bias.shape != (d,):
        raise ValueError(f"causal_conv1d: bias must have shape (d,)=({d},), got {tuple(bias.shape)}")


def check_conv_inputs(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None) -> None:
    if x.dim() != 3:
        raise ValueError(f"causal_conv1d: x must have shape (batch, d, length), got {tuple(x.shape)}")
    check_weight_bias(weight, bias, x.shape[1])
    check_activation(activation)


def activate(y: Tensor, activation: str | None) -> Tensor:
    return F.silu(y) if activation in ("silu", "swish") else y
