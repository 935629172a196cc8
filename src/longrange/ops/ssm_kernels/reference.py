"""The slow, obviously correct forms of the two products, which every other implementation is held to.

* :func:`vandermonde_kernel_ref`: the recurrence x <- exp(log_dA) x from x = 1, one position at a
  time;
* :func:`cauchy_ref`: the whole (..., K, N) matrix of 1 / (z - w), materialised and summed.

Both are plain PyTorch, differentiable by autograd, on any device and dtype; ``impl="ref"`` of
:func:`longrange.ops.ssm_kernels.vandermonde_kernel` and :func:`~longrange.ops.ssm_kernels.cauchy`
runs them.
"""

from __future__ import annotations

import torch
from torch import Tensor


def vandermonde_kernel_ref(log_dA: Tensor, W: Tensor, L: int) -> Tensor:
    """``K[..., h, l] = Re sum_m W[..., h, m] exp(l · log_dA[h, m])`` by the recurrence x <- Ā x from x = 1."""
    dA = torch.exp(log_dA)
    x = torch.ones_like(W)
    out = []
    for _ in range(L):
        out.append((W * x).sum(-1).real)
        x = dA * x
    return torch.stack(out, dim=-1)


def cauchy_ref(v: Tensor, z: Tensor, w: Tensor, conj_pairs: bool = False) -> Tensor:
    """Reference Cauchy kernel ``sum_n v[..., n] / (z[..., k] - w[..., n])``: materialises the whole
    (..., K, N) matrix of 1/(z - w); with ``conj_pairs`` adds the same sum over (conj(v), conj(w))."""
    out = (v.unsqueeze(-2) / (z.unsqueeze(-1) - w.unsqueeze(-2))).sum(-1)
    if conj_pairs:
        out = out + (v.conj().unsqueeze(-2) / (z.unsqueeze(-1) - w.conj().unsqueeze(-2))).sum(-1)
    return out
