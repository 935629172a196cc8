"""HiPPO-LegS matrices, the NPLR decomposition and the S4D inits."""

import math

import pytest
import torch

from longrange.layers.hippo import S4D_INITS, legs_matrices, legs_nplr, legs_rank_correction, s4d_init

C128 = torch.complex128


def test_legs_matrices_entries():
    A, B = legs_matrices(4)
    assert A.shape == (4, 4) and B.shape == (4,)
    assert A[2, 0] == pytest.approx(-math.sqrt(5) * math.sqrt(1))
    assert A[3, 1] == pytest.approx(-math.sqrt(7) * math.sqrt(3))
    torch.testing.assert_close(torch.diagonal(A), -torch.arange(1.0, 5.0, dtype=torch.float64))
    assert (torch.triu(A, diagonal=1) == 0).all()
    torch.testing.assert_close(B, torch.sqrt(2 * torch.arange(4.0, dtype=torch.float64) + 1))


def test_rank_correction_makes_legs_normal():
    A, _ = legs_matrices(6)
    P = legs_rank_correction(6)
    S = A + P.T @ P
    torch.testing.assert_close(S @ S.T, S.T @ S)
    torch.testing.assert_close(torch.diagonal(S), torch.full((6,), -0.5, dtype=torch.float64))
    assert (legs_rank_correction(6, rank=2)[1] == 0).all()


@pytest.mark.parametrize("N", [2, 8, 16])
def test_nplr_reconstructs_dense_legs(N):
    A, B = legs_matrices(N)
    Lam, P, B_eig, V = legs_nplr(N)
    assert Lam.shape == (N // 2,) and P.shape == (1, N // 2) and B_eig.shape == (N // 2,) and V.shape == (N, N // 2)
    torch.testing.assert_close(Lam.real, torch.full((N // 2,), -0.5, dtype=torch.float64))
    assert (Lam.imag > 0).all() and (Lam.imag.diff() > 0).all()
    V_full = torch.cat([V, V.conj()], dim=-1)
    torch.testing.assert_close(V_full.conj().T @ V_full, torch.eye(N, dtype=C128))
    Lam_full = torch.cat([Lam, Lam.conj()])
    P_full = torch.cat([P, P.conj()], dim=-1)
    # in the eigenbasis A is Λ - P P^H, up to the conjugate-pair completion
    inner = torch.diag(Lam_full) - P_full.T @ P_full.conj()
    torch.testing.assert_close(V_full @ inner @ V_full.conj().T, A.to(C128))
    torch.testing.assert_close(V_full @ torch.cat([B_eig, B_eig.conj()]), B.to(C128))


def test_nplr_odd_state_size_raises():
    with pytest.raises(ValueError, match="even"):
        legs_nplr(5)


@pytest.mark.parametrize("init", S4D_INITS)
def test_s4d_inits_shapes_and_stability(init):
    A, B = s4d_init(init, 8, H=3)
    assert A.shape == (3, 4) and B.shape == (3, 4)
    assert A.dtype == C128 and B.dtype == C128
    assert (A.real < 0).all()
    assert (A.imag >= 0).all()


def test_s4d_init_formulas():
    N = 8
    n = torch.arange(4, dtype=torch.float64)
    A, B = s4d_init("lin", N)
    torch.testing.assert_close(A[0], torch.complex(torch.full((4,), -0.5, dtype=torch.float64), math.pi * n))
    torch.testing.assert_close(B, torch.ones(1, 4, dtype=C128))
    A, _ = s4d_init("inv", N)
    torch.testing.assert_close(A[0].imag, (N / math.pi) * (N / (2 * n + 1) - 1))
    A, _ = s4d_init("real", N)
    torch.testing.assert_close(A[0], torch.complex(-(n + 1), torch.zeros(4, dtype=torch.float64)))
    A, B = s4d_init("legs", N)
    Lam, _, B_eig, _ = legs_nplr(N)
    torch.testing.assert_close(A[0], Lam)
    torch.testing.assert_close(B[0], B_eig)


def test_s4d_init_unknown_raises():
    with pytest.raises(ValueError, match="unknown S4D init"):
        s4d_init("fourier", 8)
