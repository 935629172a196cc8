"""HiPPO-LegS matrices, their normal-plus-low-rank (NPLR) form, and the diagonal S4D inits.

Conventions (those of the S4 papers and repository):

* LegS: ``A[n, k] = -sqrt(2n+1) sqrt(2k+1)`` for n > k, ``-(n+1)`` for n = k, 0 above the
  diagonal; ``B[n] = sqrt(2n+1)``.
* NPLR: with ``P[n] = sqrt(n + 1/2)``, ``S = A + P P^T`` is normal: ``-1/2 I`` plus a skew-symmetric
  matrix. Hence ``S = V diag(Λ) V^H`` with V unitary and every eigenvalue ``Λ = -1/2 + iω``, and
  ``V^H A V = diag(Λ) - (V^H P)(V^H P)^H``. The real matrix has its eigenvalues in conjugate pairs;
  :func:`legs_nplr` keeps the N/2 with positive imaginary part (and their eigenvectors), the other
  half being the complex conjugates.

All functions compute in float64 and return the dtype asked for (default float64 / complex128).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from longrange.layers.ssm import check_positive_int, check_state_size

S4D_INITS = ("legs", "lin", "inv", "real", "random")


def legs_matrices(N: int, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """Dense HiPPO-LegS (A, B): A (N, N), B (N,)."""
    check_positive_int("state size N", N)
    n = torch.arange(N, dtype=torch.float64)
    r = torch.sqrt(2 * n + 1)
    A = -torch.tril(r.unsqueeze(1) * r.unsqueeze(0), diagonal=-1) - torch.diag(n + 1)
    return A.to(dtype), r.clone().to(dtype)


def legs_rank_correction(N: int, rank: int = 1, dtype: torch.dtype = torch.float64) -> Tensor:
    """P (rank, N) with A + P^T P normal; LegS needs rank 1, extra rows are zero."""
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    P = torch.zeros(rank, N, dtype=torch.float64)
    P[0] = torch.sqrt(torch.arange(N, dtype=torch.float64) + 0.5)
    return P.to(dtype)


def legs_nplr(N: int, rank: int = 1, dtype: torch.dtype = torch.complex128) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """NPLR form of HiPPO-LegS, one member of each conjugate pair.

    Returns:
        Lambda (N/2,): eigenvalues of A + P P^T with positive imaginary part, real part -1/2,
            sorted by increasing imaginary part.
        P (rank, N/2): V^H P_legs (rows beyond the first are zero).
        B (N/2,): V^H B_legs.
        V (N, N/2): the matching orthonormal eigenvectors. With ``V_full = [V, conj(V)]``
            (unitary), ``A = V_full (diag(Λ_full) - P_full P_full^H) V_full^H``.
    """
    check_state_size(N, "N")
    A, B = legs_matrices(N)
    P = legs_rank_correction(N, rank)
    S = A + P.T @ P
    skew = (S - S.T) / 2
    # i·skew is Hermitian: eigh is stable and gives orthonormal eigenvectors, unlike a general eig.
    mu, V = torch.linalg.eigh(1j * skew.to(torch.complex128))
    # skew = V diag(-i mu) V^H, so S = V diag(-1/2 - i mu) V^H; positive imaginary part <=> mu < 0.
    keep = torch.argsort(-mu)[N // 2 :]  # the N/2 most negative mu
    keep = keep[torch.argsort(-mu[keep])]  # increasing imaginary part -mu
    Lambda = torch.complex(torch.full((N // 2,), -0.5, dtype=torch.float64), -mu[keep])
    V = V[:, keep]
    Vh = V.conj().T
    P_out = (Vh @ P.to(torch.complex128).T).T
    B_out = Vh @ B.to(torch.complex128)
    return Lambda.to(dtype), P_out.to(dtype), B_out.to(dtype), V.to(dtype)


def s4d_init(
    init: str, N: int, H: int = 1, dtype: torch.dtype = torch.complex128, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Diagonal inits of S4D: (A, B), each (H, N/2) complex, one member per conjugate pair.

    * ``legs``: A = Λ of the LegS NPLR form (real part -1/2), B = V^H B_legs.
    * ``lin``: A = -1/2 + iπn.
    * ``inv``: A = -1/2 + i (N/π)(N/(2n+1) - 1).
    * ``real``: A = -(n+1) (S4D-Real; imaginary part zero).
    * ``random``: A = -1/2 + i exp(ε), ε standard normal, independently per channel.

    n = 0..N/2-1 and N is the full state size. B is ones except for ``legs``.
    """
    check_state_size(N, "N")
    if init not in S4D_INITS:
        raise ValueError(f"unknown S4D init {init!r}; expected one of {S4D_INITS}")
    M = N // 2
    n = torch.arange(M, dtype=torch.float64)
    real = torch.full((H, M), -0.5, dtype=torch.float64)
    B = torch.ones(H, M, dtype=torch.complex128)
    if init == "legs":
        Lambda, _, B_legs, _ = legs_nplr(N)
        A = Lambda.expand(H, M)
        B = B_legs.expand(H, M)
    elif init == "lin":
        A = torch.complex(real, (math.pi * n).expand(H, M))
    elif init == "inv":
        A = torch.complex(real, ((N / math.pi) * (N / (2 * n + 1) - 1)).expand(H, M))
    elif init == "real":
        A = torch.complex(-(n + 1).expand(H, M), torch.zeros(H, M, dtype=torch.float64))
    else:
        imag = torch.exp(torch.randn(H, M, dtype=torch.float64, generator=generator))
        A = torch.complex(real, imag)
    return A.clone().to(dtype), B.clone().to(dtype)
