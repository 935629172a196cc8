"""Swapping a tensor's last two dimensions with both the result and its gradient laid out as shaped.

``x.transpose(1, 2)`` is a view: the ops after it then read one operand transposed and another
contiguous, and PyTorch's pointwise operations run several times slower on such mixed layouts than
on one (on a CPU, GELU's backward on (64, 256, 64) tensors took 13.5 ms mixed against 2.5 ms in one
layout: docs/small-models.md, "Second round"). Its gradient is a transposed view as well, so the
backward's products meet the same mixed layouts one layer earlier. :func:`transposed` copies once
forward and once backward instead. (The convolutional layers call the FFT convolution channels
last, which folds the transposes into its padding; its other implementations transpose with this.)
"""

from __future__ import annotations

import torch
from torch import Tensor


class _Transposed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.transpose(-1, -2).contiguous()

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.transpose(-1, -2).contiguous()


def transposed(x: Tensor) -> Tensor:
    """``x`` with its last two dimensions swapped, contiguous; its gradient contiguous too (a copy
    each way, none where the swap already is contiguous)."""
    if x.dim() < 2:
        raise ValueError(f"transposed: needs at least two dimensions, got a tensor of shape {tuple(x.shape)}")
    if not x.requires_grad:
        return x.transpose(-1, -2).contiguous()
    return _Transposed.apply(x)
