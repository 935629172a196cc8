"""Pieces shared by the blocks."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class FeatureDropout(nn.Module):
    """Dropout of whole features: a dropped feature is zeroed at every position of a sequence.

    This is the 1-D feature-wise dropout the S4 and Mamba-on-LRA models use (thesis 12.1.3),
    for inputs of shape (batch, length, d).
    """

    def __init__(self, p: float = 0.0):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.empty(x.shape[0], *([1] * (x.dim() - 2)), x.shape[-1], device=x.device, dtype=x.dtype)
        keep.bernoulli_(1.0 - self.p)
        return x * keep / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def norm_step(norm: nn.Module, x: Tensor) -> Tensor:
    """Apply a sequence norm to one position x of shape (batch, d) (BatchNorm uses running statistics in eval mode)."""
    return norm(x.unsqueeze(1)).squeeze(1)
