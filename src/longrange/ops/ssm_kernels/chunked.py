"""The two products in plain PyTorch over bounded pieces: any device, any dtype (``impl="chunked"``).

* :func:`vandermonde_chunked` materialises the powers exp(l · log_dA) for groups of channels whose
  (M, L) powers stay under ``chunk_bytes`` (see :mod:`longrange.ops.chunking`), and contracts them
  with the weights; autograd differentiates it (and stores the powers of each group).
* :func:`cauchy_chunked` sums over chunks of the evaluation points holding at most
  ``chunk_elements`` entries of the (..., K, N) matrix of 1/(z - w), in the forward pass and, by a
  hand-written backward that recomputes them (:class:`_ChunkedCauchy`), in the backward pass.

These were the only implementations before the fused CPU and GPU kernels; they remain the
fallback on every device and the baseline the benchmarks compare with.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from longrange.ops.chunking import TEMPORARY_BYTES, group_size
from longrange.ops.ssm_kernels.reference import cauchy_ref

#: Upper bound on the number of (z, w) pairs materialised at once by :func:`cauchy_chunked`.
CAUCHY_CHUNK_ELEMENTS = 1 << 22


def vandermonde_chunked(log_dA: Tensor, W: Tensor, L: int, chunk_bytes: int = TEMPORARY_BYTES) -> Tensor:
    """``K[..., h, l] = Re sum_m W[..., h, m] exp(l · log_dA[h, m])`` for l < L (arguments checked
    by the caller). Powers come from one exponential per entry, never repeated multiplication.
    Per-channel modes are expanded in groups of channels whose (M, L) powers stay under
    ``chunk_bytes``."""
    pos = torch.arange(L, device=log_dA.device, dtype=log_dA.real.dtype)
    H, M = W.shape[-2], W.shape[-1]
    group = (
        H if log_dA.shape[0] == 1 or W.device.type == "meta" else group_size(M * L * log_dA.element_size(), chunk_bytes)
    )
    parts = []
    for c in range(0, H, group):
        modes = log_dA if log_dA.shape[0] == 1 else log_dA[c : c + group]
        vandermonde = torch.exp(modes.unsqueeze(-1) * pos)  # (group, M, L) or (1, M, L)
        w = W[..., c : c + group, :]
        parts.append(torch.einsum("...hm,hml->...hl", w, vandermonde.expand(w.shape[-2], -1, -1)).real)
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)


class _ChunkedCauchy(torch.autograd.Function):
    """Cauchy kernel over chunks of z, recomputing 1/(z - w) in backward.

    Memory is bounded by ``CAUCHY_CHUNK_ELEMENTS`` instead of growing with K·N per call and per
    saved autograd buffer. Gradients follow PyTorch's convention for holomorphic functions
    (grad_input = grad_output · conj(derivative)); double backward is not supported.
    """

    @staticmethod
    def forward(ctx, v: Tensor, z: Tensor, w: Tensor, chunk: int) -> Tensor:
        ctx.save_for_backward(v, z, w)
        ctx.chunk = chunk
        out = [cauchy_ref(v, z[..., i : i + chunk], w) for i in range(0, z.shape[-1], chunk)]
        return torch.cat(out, dim=-1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        v, z, w = ctx.saved_tensors
        chunk = ctx.chunk
        grad_v = torch.zeros_like(v) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(w) if ctx.needs_input_grad[2] else None
        grad_z = [] if ctx.needs_input_grad[1] else None
        for i in range(0, z.shape[-1], chunk):
            r = 1 / (z[..., i : i + chunk].unsqueeze(-1) - w.unsqueeze(-2))  # (..., k, N)
            g = grad[..., i : i + chunk].unsqueeze(-1)  # (..., k, 1)
            r_conj = r.conj()
            if grad_v is not None:
                grad_v = grad_v + (g * r_conj).sum(-2)
            if grad_w is not None:
                grad_w = grad_w + (g * r_conj.square()).sum(-2)
            if grad_z is not None:
                grad_z.append(-(g.squeeze(-1)) * (v.unsqueeze(-2) * r.square()).sum(-1).conj())
        if grad_w is not None:
            grad_w = grad_w * v.conj()
        return grad_v, (torch.cat(grad_z, dim=-1) if grad_z is not None else None), grad_w, None


def _cauchy_chunked(v: Tensor, z: Tensor, w: Tensor, chunk_elements: int | None) -> Tensor:
    lead = torch.broadcast_shapes(v.shape[:-1], z.shape[:-1], w.shape[:-1])
    dtype = torch.promote_types(torch.promote_types(v.dtype, z.dtype), w.dtype)
    N, K = v.shape[-1], z.shape[-1]
    # expanding here lets autograd reduce the gradients of broadcast inputs outside the Function
    v, w = v.to(dtype).expand(*lead, N), w.to(dtype).expand(*lead, N)
    z = z.to(dtype).expand(*lead, K)
    budget = CAUCHY_CHUNK_ELEMENTS if chunk_elements is None else chunk_elements
    rows = max(1, math.prod(lead) * N)
    chunk = max(1, min(K, budget // rows))
    return _ChunkedCauchy.apply(v, z, w, chunk)


def cauchy_chunked(
    v: Tensor, z: Tensor, w: Tensor, conj_pairs: bool = False, chunk_elements: int | None = None
) -> Tensor:
    """``sum_n v[..., n] / (z[..., k] - w[..., n])`` over chunks of z holding at most
    ``chunk_elements`` (default :data:`CAUCHY_CHUNK_ELEMENTS`) entries of the (..., K, N) matrix,
    plus the sum over (conj(v), conj(w)) when ``conj_pairs`` (arguments checked by the caller)."""
    out = _cauchy_chunked(v, z, w, chunk_elements)
    if conj_pairs:
        out = out + _cauchy_chunked(v.conj(), z, w.conj(), chunk_elements)
    return out
