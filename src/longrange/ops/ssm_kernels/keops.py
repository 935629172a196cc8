"""The Cauchy product by pykeops on CUDA tensors (``impl="pykeops"``): a lazy reduction compiled by
KeOps at run time, in real arithmetic (real and imaginary parts), differentiated by KeOps.

Usable when :mod:`longrange._optional` found ``pykeops.torch`` and KeOps found its CUDA toolchain
(:func:`keops_available`). KeOps reduces each output in a fixed order (its one-dimensional
map-reduce accumulates every output row in one thread, without atomics), for the values and for
the gradients, which KeOps computes as further reductions of the same kind.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange import _optional


def keops_available(device: torch.device | str) -> bool:
    """Whether :func:`cauchy_keops` can run on ``device``: a CUDA device and a usable pykeops."""
    return _optional.pykeops is not None and torch.device(device).type == "cuda"


def unavailable_reason() -> str:
    return _optional.status()["pykeops"].get("reason", "pykeops is not usable here")


def _cauchy_keops(v: Tensor, z: Tensor, w: Tensor) -> Tensor:  # pragma: no cover - needs CUDA
    LazyTensor = _optional.pykeops.LazyTensor
    lead = torch.broadcast_shapes(v.shape[:-1], z.shape[:-1], w.shape[:-1])
    N, K = v.shape[-1], z.shape[-1]
    v = v.expand(*lead, N).reshape(-1, 1, N, 1)
    w = w.expand(*lead, N).reshape(-1, 1, N, 1)
    z = z.expand(*lead, K).reshape(-1, K, 1, 1)

    def lazy(t: Tensor) -> LazyTensor:
        return LazyTensor(t.contiguous())

    vr, vi, wr, wi = lazy(v.real), lazy(v.imag), lazy(w.real), lazy(w.imag)
    zr, zi = lazy(z.real), lazy(z.imag)
    dr, di = zr - wr, zi - wi
    den = dr * dr + di * di
    re = ((vr * dr + vi * di) / den).sum(dim=2)
    im = ((vi * dr - vr * di) / den).sum(dim=2)
    return torch.complex(re.squeeze(-1), im.squeeze(-1)).reshape(*lead, K)


def cauchy_keops(v: Tensor, z: Tensor, w: Tensor, conj_pairs: bool = False) -> Tensor:  # pragma: no cover - needs CUDA
    """The Cauchy sum of :func:`longrange.ops.ssm_kernels.cauchy` by pykeops (arguments checked by
    the caller)."""
    if not keops_available(v.device):
        raise RuntimeError(f"cauchy: impl='pykeops' needs CUDA tensors and a usable pykeops ({unavailable_reason()})")
    out = _cauchy_keops(v, z, w)
    if conj_pairs:
        out = out + _cauchy_keops(v.conj(), z, w.conj())
    return out
