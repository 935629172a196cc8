"""The fused CPU (numba) Vandermonde and Cauchy kernels against the float64 references: values and
every gradient, float64 and float32, odd lengths, state sizes that are not a multiple of the
vector width, shared and per-channel modes, conjugate pairs, broadcasting; the S4D and S4 kernels
built on them (both discretisations, both directions); determinism across thread counts."""

from __future__ import annotations

import pytest
import ssm_kernel_cases as cases  # noqa: E402 - a helper module next to this file
import torch

from longrange.ops.ssm_kernels import diag_ssm_kernel, diag_ssm_kernel_ref, dplr_ssm_kernel, dplr_ssm_kernel_ref
from longrange.ops.ssm_kernels import numba as ssm_numba
from longrange.ops.ssm_kernels.dispatch import cauchy, vandermonde_kernel

pytestmark = pytest.mark.skipif(
    not ssm_numba.numba_available(), reason=f"numba does not import: {ssm_numba.unavailable_reason()}"
)
F64, F32 = torch.float64, torch.float32


@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize(
    "H, M, lead, shared, L",
    [
        (3, 5, (), False, 13),  # M not a multiple of the vector width, odd length
        (2, 9, (2,), False, 67),  # two output channels (bidirectional), length crossing a block of 64
        (4, 3, (2, 3), False, 130),  # extra leading dimensions, several blocks and a ragged last one
        (5, 4, (2,), True, 70),  # modes shared by the channels: 10 weight rows in two groups of 8
        (1, 1, (), False, 1),
        (3, 32, (), False, 64),  # exactly one block
    ],
)
def test_vandermonde_matches_reference(H, M, lead, shared, L, dtype):
    inputs = cases.vandermonde_inputs(H, M, lead, shared, seed=H * M + L)
    cases.assert_matches_reference(
        cases.vandermonde("numba", L), cases.vandermonde_ref(L), inputs, dtype, what="vandermonde numba"
    )


def test_vandermonde_long_kernel_float32_is_accurate():
    """Powers restart from float64 seeds every 64 positions: float32 stays accurate at length 5000
    (the recurrence reference in float64 is the truth)."""
    log_dA, W = cases.vandermonde_inputs(2, 6, seed=3)
    log_dA = log_dA * 0.02  # slow decay: the powers stay large over the whole length
    cases.assert_matches_reference(
        cases.vandermonde("numba", 5000), cases.vandermonde_ref(5000), (log_dA, W), F32, tol=1e-5
    )


def test_vandermonde_result_does_not_depend_on_the_threads():
    log_dA, W = cases.vandermonde_inputs(16, 8, (2,), seed=4)
    results = []
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            a, w = log_dA.clone().requires_grad_(), W.clone().requires_grad_()
            out = vandermonde_kernel(a, w, 300, impl="numba")
            out.square().sum().backward()
            results.append((out.detach(), a.grad, w.grad))
    finally:
        torch.set_num_threads(previous)
    for x, y in zip(*results):
        assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize("conj_pairs", [False, True])
@pytest.mark.parametrize(
    "v_shape, z_shape, w_shape",
    [
        ((3, 5), (3, 7), (3, 5)),  # one vector per row, odd N and K
        ((4, 6, 9), (6, 13), (6, 9)),  # four vectors sharing each row's points and poles (S4's case)
        ((3, 1, 5), (1, 7), (2, 5)),  # broadcasting in every argument
        ((2, 3), (600,), (3,)),  # one row, many points: split into blocks of points
        ((2, 4, 3), (4, 300), (1, 3)),  # blocks of points with a ragged last one
        ((5,), (4, 7), (5,)),  # z alone varies over the rows
    ],
)
def test_cauchy_matches_reference(v_shape, z_shape, w_shape, conj_pairs, dtype):
    inputs = cases.cauchy_inputs(v_shape, z_shape, w_shape, seed=len(v_shape) + z_shape[-1])
    cases.assert_matches_reference(
        cases.cauchy_with("numba", conj_pairs),
        cases.cauchy_reference(conj_pairs),
        inputs,
        dtype,
        tol=1e-10 if dtype == F64 else 1e-4,
        what="cauchy numba",
    )


def test_cauchy_of_real_inputs_is_real():
    v, z, w = torch.randn(2, 4, dtype=F64), torch.randn(2, 3, dtype=F64) + 10, torch.randn(2, 4, dtype=F64)
    out = cauchy(v, z, w, impl="numba")
    assert not out.is_complex()
    torch.testing.assert_close(out, cauchy(v, z, w, impl="ref"))


def test_cauchy_result_does_not_depend_on_the_threads():
    v, z, w = cases.cauchy_inputs((4, 3, 8), (3, 200), (3, 8), seed=5)
    results = []
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            leaves = [t.clone().requires_grad_() for t in (v, z, w)]
            out = cauchy(*leaves, conj_pairs=True, impl="numba")
            out.abs().square().sum().backward()
            results.append((out.detach(), *(t.grad for t in leaves)))
    finally:
        torch.set_num_threads(previous)
    for x, y in zip(*results):
        assert torch.equal(x, y)


# --------------------------------------------------------------------------------------------
# The S4D and S4 kernels on the fused products
# --------------------------------------------------------------------------------------------


def _diag_params(H, M, channels, seed):
    g = torch.Generator().manual_seed(seed)
    dt = torch.rand(H, generator=g, dtype=F64) * 0.3 + 0.01
    A = torch.complex(-torch.rand(H, M, generator=g, dtype=F64) - 0.05, torch.randn(H, M, generator=g, dtype=F64) * 4)
    return [dt, A, cases.cplx(g, H, M), cases.cplx(g, channels, H, M)]


@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize("channels", [1, 2], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("method", ["zoh", "bilinear"])
def test_diag_ssm_kernel_numba(method, channels, dtype):
    L = 77
    cases.assert_matches_reference(
        lambda *a: diag_ssm_kernel(*a, L, method, impl="numba"),
        lambda *a: diag_ssm_kernel_ref(*a, L, method),
        _diag_params(3, 5, channels, seed=7),
        dtype,
        what=f"diag_ssm_kernel {method}",
    )


def _dplr_params(H, N, rank, channels, seed):
    g = torch.Generator().manual_seed(seed)
    dt = torch.rand(H, generator=g, dtype=F64) * 0.4 + 0.05
    Lam = torch.complex(-torch.rand(H, N, generator=g, dtype=F64) - 0.1, torch.randn(H, N, generator=g, dtype=F64) * 3)
    return [
        dt,
        Lam,
        cases.cplx(g, rank, H, N, scale=0.4),
        cases.cplx(g, rank, H, N, scale=0.4),
        cases.cplx(g, H, N),
        cases.cplx(g, channels, H, N),
    ]


@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize("conj_pairs", [False, True])
@pytest.mark.parametrize("rank, channels, L", [(1, 1, 12), (1, 2, 11), (2, 2, 16)])
def test_dplr_ssm_kernel_numba(rank, channels, L, conj_pairs, dtype):
    cases.assert_matches_reference(
        lambda *a: dplr_ssm_kernel(*a, L, conj_pairs=conj_pairs, impl="numba"),
        lambda *a: dplr_ssm_kernel_ref(*a, L, conj_pairs=conj_pairs),
        _dplr_params(2, 3, rank, channels, seed=rank + L),
        dtype,
        tol=1e-9 if dtype == F64 else 1e-4,
        what="dplr_ssm_kernel",
    )


def test_numba_missing_gives_a_clear_error(monkeypatch):
    monkeypatch.setattr(ssm_numba._KERNELS, "module", None)
    monkeypatch.setattr(ssm_numba._KERNELS, "error", "ImportError: No module named 'numba'")
    a, W = cases.vandermonde_inputs(2, 3)
    with pytest.raises(RuntimeError, match="needs the numba package"):
        ssm_numba.vandermonde_numba(a, W, 5)
    assert not ssm_numba.numba_available()
