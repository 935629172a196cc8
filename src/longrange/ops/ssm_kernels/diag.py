"""Kernels of diagonal SSMs (S4D): discretisation and the Vandermonde product.

A diagonal SSM stored as conjugate pairs (one eigenvalue per pair, M = N/2 of them) has the real
kernel ``K[..., h, l] = 2 Re sum_m C[..., h, m] B̄[h, m] Ā[h, m]^l``, one Vandermonde product
(:func:`longrange.ops.ssm_kernels.vandermonde_kernel`) of the modes log Ā and the weights 2 C B̄.

Discretisations (per channel, elementwise):

* ``zoh``:      Ā = exp(dt A),                       B̄ = (Ā - I) A^{-1} B
* ``bilinear``: Ā = (I - dt/2 A)^{-1} (I + dt/2 A),  B̄ = dt (I - dt/2 A)^{-1} B

The same discretisation helpers are used by the layers' recurrent (step) modes, so the
convolutional and recurrent modes agree by construction.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops.ssm_kernels.dispatch import vandermonde_kernel

DISCRETIZATIONS = ("zoh", "bilinear")


def _check_diag_args(dt: Tensor, A: Tensor, B: Tensor, C: Tensor, L: int, method: str) -> None:
    if method not in DISCRETIZATIONS:
        raise ValueError(f"unknown discretization {method!r}; expected one of {DISCRETIZATIONS}")
    if not isinstance(L, int) or L < 1:
        raise ValueError(f"kernel length L must be a positive int, got {L!r}")
    if A.dim() != 2:
        raise ValueError(f"A must have shape (H, M), got {tuple(A.shape)}")
    H, M = A.shape
    if dt.shape != (H,):
        raise ValueError(f"dt must have shape ({H},) to match A {tuple(A.shape)}, got {tuple(dt.shape)}")
    if B.dim() != 2 or B.shape[-1] != M or B.shape[0] not in (1, H):
        raise ValueError(f"B must have shape ({H}, {M}) or (1, {M}), got {tuple(B.shape)}")
    if C.dim() not in (2, 3) or C.shape[-2:] != (H, M):
        raise ValueError(f"C must have shape ({H}, {M}) or (channels, {H}, {M}), got {tuple(C.shape)}")


def discretize_diag(dt: Tensor, A: Tensor, B: Tensor, method: str = "zoh") -> tuple[Tensor, Tensor]:
    """Discretise a diagonal SSM: dt (H,), A (H, M) complex, B (H, M) or (1, M) -> (Ā, B̄), (H, M)."""
    if method not in DISCRETIZATIONS:
        raise ValueError(f"unknown discretization {method!r}; expected one of {DISCRETIZATIONS}")
    dtA = dt.unsqueeze(-1) * A
    if method == "zoh":
        dA = torch.exp(dtA)
        dB = (dA - 1) / A * B
    else:
        denom = 1 - dtA / 2
        dA = (1 + dtA / 2) / denom
        dB = dt.unsqueeze(-1) / denom * B
    return dA, dB


def _log_dA(dt: Tensor, A: Tensor, method: str) -> Tensor:
    """log Ā, so that Ā^l = exp(l log Ā) without repeated multiplication."""
    dtA = dt.unsqueeze(-1) * A
    if method == "zoh":
        return dtA
    return torch.log1p(dtA / 2) - torch.log1p(-dtA / 2)


def diag_ssm_kernel(
    dt: Tensor, A: Tensor, B: Tensor, C: Tensor, L: int, method: str = "zoh", *, impl: str | None = None
) -> Tensor:
    """Kernel of a diagonal SSM stored as conjugate pairs (the S4D convention).

    Args:
        dt: (H,) positive step sizes.
        A: (H, M) complex, one eigenvalue per conjugate pair (the state size is 2M).
        B: (H, M) or (1, M) complex.
        C: (H, M) or (channels, H, M) complex.
        L: kernel length.
        method: ``"zoh"`` or ``"bilinear"``.
        impl: implementation of the Vandermonde product (see
            :mod:`longrange.ops.ssm_kernels.dispatch`; None: the default).

    Returns:
        Real kernel of shape C.shape[:-1] + (L,):
        ``K[..., h, l] = 2 Re sum_m C[..., h, m] B̄[h, m] Ā[h, m]^l``.
    """
    _check_diag_args(dt, A, B, C, L, method)
    _, dB = discretize_diag(dt, A, B, method)
    return vandermonde_kernel(_log_dA(dt, A, method), 2 * C * dB, L, impl=impl)


def diag_ssm_kernel_ref(dt: Tensor, A: Tensor, B: Tensor, C: Tensor, L: int, method: str = "zoh") -> Tensor:
    """Reference for :func:`diag_ssm_kernel` by running the recurrence on an impulse."""
    _check_diag_args(dt, A, B, C, L, method)
    dA, dB = discretize_diag(dt, A, B, method)
    x = dB.expand(A.shape)
    out = []
    for _ in range(L):
        out.append(2 * (C * x).sum(-1).real)
        x = dA * x
    return torch.stack(out, dim=-1)
