"""``impl="ref"``: the causal convolution as an explicit sum over the kernel taps."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from longrange.ops.conv.common import activate, check_conv_inputs


def causal_conv1d_ref(x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str | None = None) -> Tensor:
    """Reference: an explicit sum over the kernel taps."""
    check_conv_inputs(x, weight, bias, activation)
    w = weight.shape[1]
    l = x.shape[-1]
    padded = F.pad(x, (w - 1, 0))
    y = torch.zeros_like(x) if bias is None else bias[:, None].to(x.dtype).expand_as(x).clone()
    for k in range(w):
        # tap k multiplies the input (w - 1 - k) steps back
        y = y + weight[:, k, None] * padded[..., k : k + l]
    return activate(y, activation)
