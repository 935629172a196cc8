"""``"torch"``: the (gated) RMS norm as PyTorch's elementwise operations, the formula itself
(:func:`rms_norm_ref`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def rms_norm_ref(
    x: Tensor, weight: Tensor, gate: Tensor | None = None, gate_first: bool = False, eps: float = 1e-5
) -> Tensor:
    """``x r w`` with ``r = 1 / sqrt(mean(x²) + eps)`` over the last dimension; with a ``gate``,
    ``norm(x) silu(gate)`` (``gate_first=False``) or ``norm(x silu(gate))`` (``gate_first=True``).
    ``weight`` (D,) or (H, D) with H the second-last dimension of ``x`` (one scale per head)."""
    if gate is not None and gate_first:
        x = x * F.silu(gate)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
    if gate is not None and not gate_first:
        y = y * F.silu(gate)
    return y
