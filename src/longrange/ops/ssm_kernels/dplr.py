"""Kernels of SSMs with a diagonal-plus-low-rank state matrix (S4), by Cauchy products.

For A = diag(Λ) - P Q^H discretised by the bilinear transform, the length-L kernel
``K[l] = Re(C Ā^l B̄)`` comes from evaluating its generating function at the L-th roots of unity:
the resolvent of the DPLR matrix follows from the Woodbury identity and Cauchy sums
(:func:`longrange.ops.ssm_kernels.cauchy`, all of them in one call), and an inverse FFT returns
the kernel (:func:`dplr_generating_kernel`). :func:`dplr_ssm_kernel` does the same from the true
output vector C; the ``*_ref`` functions run the dense recurrence.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from longrange.ops.ssm_kernels.dispatch import cauchy


def _as_rank_r(X: Tensor, name: str, H: int, N: int) -> Tensor:
    if X.dim() == 2:
        X = X.unsqueeze(0)
    if X.dim() != 3 or X.shape[-2:] != (H, N):
        raise ValueError(f"{name} must have shape (rank, {H}, {N}) or ({H}, {N}), got {tuple(X.shape)}")
    return X


def _check_dplr_args(
    dt: Tensor, Lambda: Tensor, P: Tensor, Q: Tensor, B: Tensor, C: Tensor, L: int
) -> tuple[Tensor, Tensor]:
    if not isinstance(L, int) or L < 1:
        raise ValueError(f"kernel length L must be a positive int, got {L!r}")
    if Lambda.dim() != 2 or not Lambda.is_complex():
        raise ValueError(f"Lambda must be a complex tensor of shape (H, N), got {tuple(Lambda.shape)}")
    H, N = Lambda.shape
    if dt.shape != (H,):
        raise ValueError(f"dt must have shape ({H},) to match Lambda {tuple(Lambda.shape)}, got {tuple(dt.shape)}")
    P = _as_rank_r(P, "P", H, N)
    Q = _as_rank_r(Q, "Q", H, N)
    if P.shape != Q.shape:
        raise ValueError(f"P {tuple(P.shape)} and Q {tuple(Q.shape)} must have the same rank")
    if B.shape != (H, N):
        raise ValueError(f"B must have shape ({H}, {N}), got {tuple(B.shape)}")
    if C.dim() < 2 or C.shape[-2:] != (H, N):
        raise ValueError(f"C must have shape (..., {H}, {N}), got {tuple(C.shape)}")
    return P, Q


def complete_conj(x: Tensor) -> Tensor:
    """Append the conjugate partners along the last dimension: (..., M) -> (..., 2M)."""
    return torch.cat([x, x.conj()], dim=-1)


def dplr_dense(Lambda: Tensor, P: Tensor, Q: Tensor) -> Tensor:
    """Dense A = diag(Lambda) - sum_r P_r Q_r^H: Lambda (H, N), P, Q (r, H, N) -> (H, N, N)."""
    if P.dim() == 2:
        P, Q = P.unsqueeze(0), Q.unsqueeze(0)
    low_rank = torch.einsum("rhn,rhm->hnm", P, Q.conj())
    return torch.diag_embed(Lambda) - low_rank


def bilinear_dense(dt: Tensor, A: Tensor, B: Tensor) -> tuple[Tensor, Tensor]:
    """Bilinear discretisation of dense A (H, N, N), B (H, N) with dt (H,) -> Ā (H, N, N), B̄ (H, N)."""
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    half = (dt / 2).to(A.dtype).reshape(-1, 1, 1)
    back = eye - half * A
    dA = torch.linalg.solve(back, eye + half * A)
    dB = torch.linalg.solve(back, dt.to(A.dtype).unsqueeze(-1) * B)
    return dA, dB


def _left_matmul(C: Tensor, M: Tensor) -> Tensor:
    """Row vectors times matrices: C (..., H, N), M (H, N, N) -> (..., H, N) = C M."""
    return torch.einsum("...hn,hnm->...hm", C, M)


def c_to_c_tilde(C: Tensor, dA: Tensor, L: int) -> Tensor:
    """C̃ = C (I - Ā^L), the output vector whose truncated generating function has no z^L term.

    Ā^L is formed by repeated squaring (``torch.linalg.matrix_power``): O(N^3 log L) per channel.
    """
    return C - _left_matmul(C, torch.linalg.matrix_power(dA, L))


def c_tilde_to_c(C_tilde: Tensor, dA: Tensor, L: int) -> Tensor:
    """Inverse of :func:`c_to_c_tilde`: C = C̃ (I - Ā^L)^{-1}."""
    eye = torch.eye(dA.shape[-1], dtype=dA.dtype, device=dA.device)
    M = eye - torch.linalg.matrix_power(dA, L)  # (H, N, N)
    # C M = C̃  <=>  M^T C^T = C̃^T
    rhs = C_tilde.unsqueeze(-1)  # (..., H, N, 1)
    Mt = M.transpose(-1, -2).expand(*C_tilde.shape[:-2], *M.shape)
    return torch.linalg.solve(Mt, rhs).squeeze(-1)


def dplr_generating_kernel(
    dt: Tensor,
    Lambda: Tensor,
    P: Tensor,
    Q: Tensor,
    B: Tensor,
    C_tilde: Tensor,
    L: int,
    conj_pairs: bool = False,
    *,
    impl: str | None = None,
) -> Tensor:
    """Length-L kernel of the bilinear-discretised SSM with A = diag(Lambda) - P Q^H, from C̃.

    For C̃ = C (I - Ā^L) this is exactly ``K[l] = Re(C Ā^l B̄)``, l < L (see
    :func:`dplr_ssm_kernel`); the S4 layer learns C̃ directly.

    Method: at the L-th roots of unity z (z^L = 1),
    ``sum_{l<L} K_l z^l = C̃ (I - Ā z)^{-1} B̄ = 2/(1+z) · C̃ (g(z) - A)^{-1} B`` with
    ``g(z) = 2/dt · (1-z)/(1+z)``; the resolvent of the DPLR matrix follows from the Woodbury
    identity and four Cauchy sums, and an inverse FFT returns the kernel. At z = -1 (even L) the
    limit is ``dt/2 · C̃ B``, used exactly instead of evaluating the singular form.

    Args:
        dt: (H,) positive steps.
        Lambda: (H, N) complex diagonal.
        P, Q: (r, H, N) or (H, N) (rank 1) complex low-rank factors.
        B: (H, N) complex.
        C_tilde: (..., H, N) complex; leading dimensions are kept (e.g. two output channels).
        L: kernel length.
        conj_pairs: if True, the arguments hold one member of each conjugate pair of a system of
            size 2N whose other members are the complex conjugates; the result is the (real)
            kernel of that full system. If False, the arguments are the full set and the real part
            of the complex kernel is returned.
        impl: implementation of the Cauchy sums (see :mod:`longrange.ops.ssm_kernels.dispatch`;
            None: the default).

    Returns:
        (..., H, L) real kernel.
    """
    P, Q = _check_dplr_args(dt, Lambda, P, Q, B, C_tilde, L)
    rank = P.shape[0]
    cdtype = Lambda.dtype
    n_freq = L // 2 + 1 if conj_pairs else L
    k = torch.arange(n_freq, device=Lambda.device, dtype=Lambda.real.dtype)
    z = torch.polar(torch.ones_like(k), -2 * math.pi * k / L)  # z_k = exp(-2πik/L): DFT convention
    at_minus_one = 2 * torch.arange(n_freq, device=Lambda.device) == L
    z = torch.where(at_minus_one, torch.zeros((), dtype=cdtype, device=z.device), z.to(cdtype))
    g = (2 / dt).to(cdtype).unsqueeze(-1) * ((1 - z) / (1 + z))  # (H, K)

    Qc = Q.conj()
    # the four Cauchy sums of the Woodbury identity share z = g and the poles Λ: one call
    H, N = Lambda.shape
    lead = C_tilde.shape[:-2]
    vectors = [
        C_tilde * B,  # (..., H, N)
        C_tilde.unsqueeze(-3) * P,  # (..., r, H, N)
        Qc * B,  # (r, H, N)
        Qc.unsqueeze(1) * P.unsqueeze(0),  # (r, r, H, N)
    ]
    sizes = [math.prod(x.shape[:-2]) for x in vectors]
    vdtype = torch.promote_types(torch.promote_types(C_tilde.dtype, B.dtype), torch.promote_types(P.dtype, Q.dtype))
    stacked = torch.cat([x.to(vdtype).reshape(-1, H, N) for x in vectors])
    sums = cauchy(stacked, g, Lambda, conj_pairs=conj_pairs, impl=impl).split(sizes)  # (J, H, K) pieces
    k00 = sums[0].reshape(*lead, H, n_freq)
    k01 = sums[1].reshape(*lead, rank, H, n_freq)
    k10 = sums[2].reshape(rank, H, n_freq)
    k11 = sums[3].reshape(rank, rank, H, n_freq)

    # Woodbury: C̃ (g - Λ + P Q^H)^{-1} B = k00 - k01 (I + k11)^{-1} k10
    if rank == 1:
        correction = k01[..., 0, :, :] * k10[0] / (1 + k11[0, 0])
    else:
        eye = torch.eye(rank, dtype=cdtype, device=Lambda.device)
        system = eye + k11.permute(2, 3, 0, 1)  # (H, K, r, r)
        solved = torch.linalg.solve(system, k10.permute(1, 2, 0).unsqueeze(-1)).squeeze(-1)  # (H, K, r)
        correction = torch.einsum("...rhk,hkr->...hk", k01, solved)
    resolvent = k00 - correction
    spectrum = 2 / (1 + z) * resolvent

    CB = (C_tilde * B).sum(-1)
    if conj_pairs:
        CB = 2 * CB.real.to(cdtype)
    limit = (dt / 2).to(cdtype) * CB  # value at z = -1
    spectrum = torch.where(at_minus_one, limit.unsqueeze(-1), spectrum)

    if conj_pairs:
        return torch.fft.irfft(spectrum, n=L)
    return torch.fft.ifft(spectrum, n=L).real


def dplr_ssm_kernel(
    dt: Tensor,
    Lambda: Tensor,
    P: Tensor,
    Q: Tensor,
    B: Tensor,
    C: Tensor,
    L: int,
    conj_pairs: bool = False,
    *,
    impl: str | None = None,
) -> Tensor:
    """Exact kernel ``K[l] = Re(C Ā^l B̄)``, l < L, of the bilinear-discretised DPLR SSM.

    Same arguments as :func:`dplr_generating_kernel` but with the true output vector C. C̃ = C (I -
    Ā^L) is formed internally with a dense Ā (O(N^3 log L) per channel, once per call); the kernel
    itself comes from the generating function, not from matrix powers.
    """
    P, Q = _check_dplr_args(dt, Lambda, P, Q, B, C, L)
    N = Lambda.shape[-1]
    if conj_pairs:
        A = dplr_dense(complete_conj(Lambda), complete_conj(P), complete_conj(Q))
        dA, _ = bilinear_dense(dt, A, complete_conj(B))
        C_tilde = c_to_c_tilde(complete_conj(C), dA, L)[..., :N]
    else:
        A = dplr_dense(Lambda, P, Q)
        dA, _ = bilinear_dense(dt, A, B)
        C_tilde = c_to_c_tilde(C, dA, L)
    return dplr_generating_kernel(dt, Lambda, P, Q, B, C_tilde, L, conj_pairs=conj_pairs, impl=impl)


def dense_ssm_kernel_ref(dA: Tensor, dB: Tensor, C: Tensor, L: int) -> Tensor:
    """Complex kernel ``C Ā^l B̄`` by the explicit recurrence: dA (H, N, N), dB (H, N), C (..., H, N)."""
    x = dB
    out = []
    for _ in range(L):
        out.append((C * x).sum(-1))
        x = torch.einsum("hnm,hm->hn", dA, x)
    return torch.stack(out, dim=-1)


def dplr_ssm_kernel_ref(
    dt: Tensor,
    Lambda: Tensor,
    P: Tensor,
    Q: Tensor,
    B: Tensor,
    C: Tensor,
    L: int,
    conj_pairs: bool = False,
) -> Tensor:
    """Reference for :func:`dplr_ssm_kernel`: dense Ā, B̄ and the explicit recurrence."""
    P, Q = _check_dplr_args(dt, Lambda, P, Q, B, C, L)
    if conj_pairs:
        Lambda, P, Q, B, C = (complete_conj(t) for t in (Lambda, P, Q, B, C))
    dA, dB = bilinear_dense(dt, dplr_dense(Lambda, P, Q), B)
    return dense_ssm_kernel_ref(dA, dB, C, L).real
