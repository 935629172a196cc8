"""A primitive of one's own, registered as ``longconv``: a long convolution whose kernel is learned
tap by tap, with a learned exponential decay per channel (in the spirit of explicit long-convolution
models). Both directions when ``bidirectional``; it has a ``kernel(L)``, so ``longrange report
--kernels`` analyses it like S4D's.

    K[c, h, l] = w[c, h, l] * exp(-softplus(a[c, h]) * l),   l = 0 .. length - 1
    y = K * x (by FFT; c = 0 forward, c = 1 backward) + D * x

Loaded with ``LONGRANGE_PLUGINS=longconv`` and this directory on ``PYTHONPATH``.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from longrange.errors import ConfigError
from longrange.layers import SequencePrimitive, apply_mask, register_primitive
from longrange.ops import fft_conv


@register_primitive("longconv")
class LongConv(SequencePrimitive):
    """An explicit long convolution over (batch, length, d_model), ``length`` taps per direction."""

    def __init__(self, d_model: int, bidirectional: bool = False, length: int = 128):
        super().__init__()
        if not isinstance(length, int) or length < 1:
            raise ConfigError(f"longconv: length must be a positive integer, got {length!r}")
        self.d_model, self.bidirectional, self.length = d_model, bidirectional, length
        channels = 2 if bidirectional else 1
        self.taps = nn.Parameter(torch.randn(channels, d_model, length) / math.sqrt(length))
        # decay rates spread from slow to fast over the channels, as S4D's timescales are
        rates = torch.logspace(-3, 0, d_model).expand(channels, d_model)
        self.raw_rate = nn.Parameter(torch.log(torch.expm1(rates)).clone())
        self.D = nn.Parameter(torch.ones(d_model))

    def kernel(self, L: int) -> Tensor:
        """(channels, d_model, L): channel 1 (if bidirectional) is the backward kernel; taps beyond
        ``length`` are zero."""
        n = min(L, self.length)
        lags = torch.arange(n, device=self.taps.device, dtype=self.taps.dtype)
        k = self.taps[..., :n] * torch.exp(-F.softplus(self.raw_rate).unsqueeze(-1) * lags)
        return F.pad(k, (0, L - n))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        self._check_input(x)
        u = apply_mask(x, mask).transpose(1, 2)  # (batch, d_model, length)
        k = self.kernel(u.shape[-1])
        return fft_conv(u, k if self.bidirectional else k[0], self.D).transpose(1, 2)
