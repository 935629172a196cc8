"""Convolution kernels of linear time-invariant SSMs, each with an explicit-recurrence reference.

An SSM x' = A x + B u, y = C x discretised with step ``dt`` has the kernel K[l] = C Ā^l B̄, so
that y = K * u (causal convolution). Two structures of A are covered:

* diagonal (S4D): :func:`diag_ssm_kernel`, by a Vandermonde product;
* diagonal plus low rank (S4): :func:`dplr_generating_kernel` and :func:`dplr_ssm_kernel`, by
  evaluating the generating function at the roots of unity with Cauchy kernels and the Woodbury
  identity, then an inverse FFT.

Discretisations (per channel, elementwise for a diagonal A):

* ``zoh``:      Ā = exp(dt A),                       B̄ = (Ā - I) A^{-1} B
* ``bilinear``: Ā = (I - dt/2 A)^{-1} (I + dt/2 A),  B̄ = dt (I - dt/2 A)^{-1} B

The same discretisation helpers are used by the layers' recurrent (step) modes, so the
convolutional and recurrent modes agree by construction.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from longrange.ops.chunking import TEMPORARY_BYTES, group_size

from longrange import _optional
from longrange.ops import used

DISCRETIZATIONS = ("zoh", "bilinear")


# --------------------------------------------------------------------------------------------
# Diagonal state matrices (S4D)
# --------------------------------------------------------------------------------------------


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


def diag_ssm_kernel(dt: Tensor, A: Tensor, B: Tensor, C: Tensor, L: int, method: str = "zoh") -> Tensor:
    """Kernel of a diagonal SSM stored as conjugate pairs (the S4D convention).

    Args:
        dt: (H,) positive step sizes.
        A: (H, M) complex, one eigenvalue per conjugate pair (the state size is 2M).
        B: (H, M) or (1, M) complex.
        C: (H, M) or (channels, H, M) complex.
        L: kernel length.
        method: ``"zoh"`` or ``"bilinear"``.

    Returns:
        Real kernel of shape C.shape[:-1] + (L,):
        ``K[..., h, l] = 2 Re sum_m C[..., h, m] B̄[h, m] Ā[h, m]^l``.
    """
    _check_diag_args(dt, A, B, C, L, method)
    _, dB = discretize_diag(dt, A, B, method)
    return vandermonde_kernel(_log_dA(dt, A, method), 2 * C * dB, L)


def vandermonde_kernel(log_dA: Tensor, W: Tensor, L: int, *, chunk_bytes: int = TEMPORARY_BYTES) -> Tensor:
    """``K[..., h, l] = Re sum_m W[..., h, m] exp(l · log_dA[h, m])`` for l < L.

    ``log_dA`` (H, M) or (1, M) (modes shared by all channels), ``W`` (..., H, M) complex; returns
    (..., H, L) real. Powers come from one exponential per entry, never repeated multiplication.
    Per-channel modes are expanded in groups of channels whose (M, L) powers stay under
    ``chunk_bytes`` (see :mod:`longrange.ops.chunking`).
    """
    if log_dA.dim() != 2 or W.dim() < 2 or log_dA.shape[-1] != W.shape[-1] or log_dA.shape[0] not in (1, W.shape[-2]):
        raise ValueError(
            f"vandermonde_kernel: log_dA {tuple(log_dA.shape)} must be (H, M) or (1, M) for W of shape (..., H, M), "
            f"got W {tuple(W.shape)}"
        )
    pos = torch.arange(L, device=log_dA.device, dtype=log_dA.real.dtype)
    H, M = W.shape[-2], W.shape[-1]
    group = H if log_dA.shape[0] == 1 else group_size(M * L * log_dA.element_size(), chunk_bytes)
    parts = []
    for c in range(0, H, group):
        modes = log_dA if log_dA.shape[0] == 1 else log_dA[c : c + group]
        vandermonde = torch.exp(modes.unsqueeze(-1) * pos)  # (group, M, L) or (1, M, L)
        w = W[..., c : c + group, :]
        parts.append(torch.einsum("...hm,hml->...hl", w, vandermonde.expand(w.shape[-2], -1, -1)).real)
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)


def vandermonde_kernel_ref(log_dA: Tensor, W: Tensor, L: int) -> Tensor:
    """Reference for :func:`vandermonde_kernel` by the recurrence x <- Ā x from x = 1."""
    dA = torch.exp(log_dA)
    x = torch.ones_like(W)
    out = []
    for _ in range(L):
        out.append((W * x).sum(-1).real)
        x = dA * x
    return torch.stack(out, dim=-1)


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


# --------------------------------------------------------------------------------------------
# Cauchy kernel
# --------------------------------------------------------------------------------------------


#: Upper bound on the number of (z, w) pairs materialised at once by :func:`cauchy`.
CAUCHY_CHUNK_ELEMENTS = 1 << 22


def cauchy_ref(v: Tensor, z: Tensor, w: Tensor) -> Tensor:
    """Reference Cauchy kernel: materialises the whole (..., K, N) matrix of 1/(z - w)."""
    return (v.unsqueeze(-2) / (z.unsqueeze(-1) - w.unsqueeze(-2))).sum(-1)


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


def cauchy_impl(device: torch.device | str, deterministic: bool | None = None) -> str:
    """How :func:`cauchy` evaluates on ``device``: ``"pykeops"`` on CUDA when pykeops and its
    CUDA toolchain are found (see :mod:`longrange._optional`), else ``"chunked"`` (PyTorch).
    ``deterministic`` (None: ``torch.are_deterministic_algorithms_enabled()``): ``"chunked"``, whose
    backward is PyTorch's (the bits of KeOps' reductions are not established here)."""
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    usable = _optional.pykeops is not None and torch.device(device).type == "cuda"
    return "pykeops" if usable and not deterministic else "chunked"


def cauchy(v: Tensor, z: Tensor, w: Tensor, chunk_elements: int | None = None) -> Tensor:
    """Cauchy kernel ``out[..., k] = sum_n v[..., n] / (z[..., k] - w[..., n])``.

    ``v`` (..., N), ``z`` (..., K) and ``w`` (..., N) complex, broadcasting over their leading
    dimensions. On CUDA tensors with pykeops installed the sum is evaluated lazily by pykeops;
    otherwise plain PyTorch evaluates it over chunks of z holding at most ``chunk_elements``
    (default :data:`CAUCHY_CHUNK_ELEMENTS`) entries of the (..., K, N) matrix, in forward and in
    backward. :func:`cauchy_ref` is the fully materialised reference.
    """
    if v.shape[-1] != w.shape[-1]:
        raise ValueError(f"cauchy: v {tuple(v.shape)} and w {tuple(w.shape)} differ in their last dimension")
    impl = cauchy_impl(v.device)
    used.note("cauchy", impl)
    if impl == "pykeops":  # pragma: no cover - needs CUDA and pykeops
        return _cauchy_keops(v, z, w)
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


def _cauchy_keops(v: Tensor, z: Tensor, w: Tensor) -> Tensor:  # pragma: no cover - needs CUDA
    """pykeops evaluation of :func:`cauchy` in real arithmetic (real and imaginary parts)."""
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


def _cauchy_pairs(v: Tensor, z: Tensor, w: Tensor, conj_pairs: bool) -> Tensor:
    """:func:`cauchy`, summing also over the conjugate partners (v̄, w̄) when ``conj_pairs``."""
    out = cauchy(v, z, w)
    if conj_pairs:
        out = out + cauchy(v.conj(), z, w.conj())
    return out


# --------------------------------------------------------------------------------------------
# Diagonal plus low-rank state matrices (S4)
# --------------------------------------------------------------------------------------------


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
    k00 = _cauchy_pairs(C_tilde * B, g, Lambda, conj_pairs)  # (..., H, K)
    k01 = _cauchy_pairs(C_tilde.unsqueeze(-3) * P, g, Lambda, conj_pairs)  # (..., r, H, K)
    k10 = _cauchy_pairs(Qc * B, g, Lambda, conj_pairs)  # (r, H, K)
    k11 = _cauchy_pairs(Qc.unsqueeze(1) * P.unsqueeze(0), g, Lambda, conj_pairs)  # (r, r, H, K)

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
    return dplr_generating_kernel(dt, Lambda, P, Q, B, C_tilde, L, conj_pairs=conj_pairs)


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
