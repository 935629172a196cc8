"""Normalisation layers over the feature dimension of (batch, length, d) sequences."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.ops.norm import rms_norm

NORMS = ("layer", "batch", "rms", "none")


class RMSNorm(nn.Module):
    """x / rms(x) * weight, over the last dimension, by :func:`longrange.ops.norm.rms_norm` (one
    pass over each row forward and backward on a CPU, the formula elsewhere)."""

    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return rms_norm(x, self.weight, eps=self.eps)


class LayerNorm(nn.LayerNorm):
    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return super().forward(x)


class SequenceBatchNorm(nn.Module):
    """BatchNorm over the batch and length of (batch, length, d), ignoring padded positions.

    Statistics in training are taken over real positions only, so padding does not change them.
    """

    def __init__(self, d: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.bn = nn.BatchNorm1d(d, eps=eps, momentum=momentum)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if mask is None:
            return self.bn(x.reshape(-1, x.shape[-1])).reshape(x.shape)
        out = torch.zeros_like(x)
        out[mask] = self.bn(x[mask])
        return out


class Identity(nn.Module):
    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return x


def make_norm(kind: str, d: int) -> nn.Module:
    """A norm taking ``(x, mask=None)``: "layer", "batch", "rms" or "none"."""
    if kind == "layer":
        return LayerNorm(d)
    if kind == "batch":
        return SequenceBatchNorm(d)
    if kind == "rms":
        return RMSNorm(d)
    if kind == "none":
        return Identity()
    raise ConfigError(f"unknown norm {kind!r}; expected one of {', '.join(NORMS)}")
