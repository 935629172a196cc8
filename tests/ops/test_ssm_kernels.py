"""SSM kernels (diagonal and DPLR) against explicit recurrences: values and gradients in float64."""

import pytest
import torch

from longrange.layers.hippo import legs_matrices, legs_nplr
from longrange.ops.ssm_kernels import (
    bilinear_dense,
    c_tilde_to_c,
    c_to_c_tilde,
    cauchy,
    cauchy_ref,
    complete_conj,
    dense_ssm_kernel_ref,
    diag_ssm_kernel,
    diag_ssm_kernel_ref,
    dplr_dense,
    dplr_generating_kernel,
    dplr_ssm_kernel,
    dplr_ssm_kernel_ref,
)

F64, C128 = torch.float64, torch.complex128


def _value_and_grads(fn, inputs, cotangent):
    inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*inputs)
    (out * cotangent).sum().backward()
    return out.detach(), [t.grad for t in inputs]


def _assert_same(fn_fast, fn_ref, inputs, out_shape, tol=1e-10):
    cot = torch.randn(*out_shape, dtype=F64)
    y_fast, g_fast = _value_and_grads(fn_fast, inputs, cot)
    y_ref, g_ref = _value_and_grads(fn_ref, inputs, cot)
    assert y_fast.shape == tuple(out_shape)
    torch.testing.assert_close(y_fast, y_ref, rtol=tol, atol=tol)
    for i, (gf, gr) in enumerate(zip(g_fast, g_ref)):
        assert gf is not None and gr is not None, f"input {i} got no gradient"
        torch.testing.assert_close(gf, gr, rtol=tol, atol=tol, msg=f"gradient of input {i} differs")


def _diag_params(H, M, B_rows=None, C_lead=()):
    dt = torch.rand(H, dtype=F64) * 0.3 + 0.01
    A = torch.complex(-torch.rand(H, M, dtype=F64) - 0.05, torch.randn(H, M, dtype=F64) * 4)
    B = torch.randn(B_rows or H, M, dtype=C128)
    C = torch.randn(*C_lead, H, M, dtype=C128)
    return dt, A, B, C


@pytest.mark.parametrize("method", ["zoh", "bilinear"])
@pytest.mark.parametrize("B_rows, C_lead", [(None, ()), (1, ()), (None, (2,))])
def test_diag_kernel_matches_recurrence(method, B_rows, C_lead):
    torch.manual_seed(0)
    H, M, L = 3, 4, 13
    inputs = list(_diag_params(H, M, B_rows, C_lead))
    _assert_same(
        lambda *a: diag_ssm_kernel(*a, L, method),
        lambda *a: diag_ssm_kernel_ref(*a, L, method),
        inputs,
        (*C_lead, H, L),
    )


@pytest.mark.parametrize("method", ["zoh", "bilinear"])
def test_diag_kernel_is_finite_for_long_lengths(method):
    torch.manual_seed(1)
    dt, A, B, C = _diag_params(2, 3)
    K = diag_ssm_kernel(dt, A, B, C, 20000, method)
    assert torch.isfinite(K).all()
    torch.testing.assert_close(K[..., :50], diag_ssm_kernel_ref(dt, A, B, C, 50, method))


def test_diag_kernel_float32_close_to_float64():
    torch.manual_seed(2)
    dt, A, B, C = _diag_params(2, 3)
    K64 = diag_ssm_kernel(dt, A, B, C, 300)
    K32 = diag_ssm_kernel(dt.float(), A.to(torch.complex64), B.to(torch.complex64), C.to(torch.complex64), 300)
    assert K32.dtype == torch.float32
    torch.testing.assert_close(K32.double(), K64, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "shapes, match",
    [
        (dict(dt=(2,), A=(3,), B=(3,), C=(3,)), "A must have shape"),
        (dict(dt=(3,), A=(2, 3), B=(2, 3), C=(2, 3)), "dt must have shape"),
        (dict(dt=(2,), A=(2, 3), B=(3, 3), C=(2, 3)), "B must have shape"),
        (dict(dt=(2,), A=(2, 3), B=(2, 3), C=(2, 4)), "C must have shape"),
    ],
)
def test_diag_kernel_bad_shapes_raise(shapes, match):
    args = {k: torch.randn(*v, dtype=C128 if k != "dt" else F64) for k, v in shapes.items()}
    with pytest.raises(ValueError, match=match):
        diag_ssm_kernel(args["dt"], args["A"], args["B"], args["C"], 5)


def test_diag_kernel_bad_method_and_length_raise():
    dt, A, B, C = _diag_params(2, 3)
    with pytest.raises(ValueError, match="discretization"):
        diag_ssm_kernel(dt, A, B, C, 5, "euler")
    with pytest.raises(ValueError, match="positive int"):
        diag_ssm_kernel(dt, A, B, C, 0)


def test_cauchy_matches_explicit_sum():
    torch.manual_seed(3)
    v, w = torch.randn(2, 5, dtype=C128), torch.randn(2, 5, dtype=C128)
    z = torch.randn(2, 7, dtype=C128)
    expected = torch.zeros(2, 7, dtype=C128)
    for b in range(2):
        for k in range(7):
            for n in range(5):
                expected[b, k] += v[b, n] / (z[b, k] - w[b, n])
    torch.testing.assert_close(cauchy(v, z, w), expected)
    torch.testing.assert_close(cauchy_ref(v, z, w), expected)
    with pytest.raises(ValueError, match="last dimension"):
        cauchy(v, z, w[:, :4])


@pytest.mark.parametrize("chunk_elements", [None, 7, 1])
def test_chunked_cauchy_matches_materialised_values_and_gradients(chunk_elements):
    """Broadcast leading dimensions, chunks that do not divide K, gradients w.r.t. v, z and w."""
    torch.manual_seed(8)
    v = torch.randn(3, 1, 5, dtype=C128)
    z = torch.randn(1, 7, dtype=C128)
    w = torch.randn(2, 5, dtype=C128)
    cot = torch.randn(3, 2, 7, dtype=C128)

    def loss(fn, *args):
        out = fn(*args)
        return out, (out * cot).real.sum()

    leaves = [t.clone().requires_grad_(True) for t in (v, z, w)]
    out_fast, l_fast = loss(lambda *a: cauchy(*a, chunk_elements=chunk_elements), *leaves)
    g_fast = torch.autograd.grad(l_fast, leaves)
    out_ref, l_ref = loss(cauchy_ref, *leaves)
    g_ref = torch.autograd.grad(l_ref, leaves)
    torch.testing.assert_close(out_fast, out_ref)
    for gf, gr in zip(g_fast, g_ref):
        assert gf.shape == gr.shape
        torch.testing.assert_close(gf, gr)


def test_chunked_cauchy_gradcheck():
    torch.manual_seed(9)
    args = [torch.randn(2, 4, dtype=C128, requires_grad=True) for _ in range(2)]
    w = torch.randn(2, 4, dtype=C128, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v, z, w: cauchy(v, z, w, chunk_elements=8), (args[0], args[1], w))


def _dplr_params(H, N, rank, C_lead=()):
    dt = torch.rand(H, dtype=F64) * 0.4 + 0.05
    Lam = torch.complex(-torch.rand(H, N, dtype=F64) - 0.1, torch.randn(H, N, dtype=F64) * 3)
    P = torch.randn(rank, H, N, dtype=C128) * 0.4
    Q = torch.randn(rank, H, N, dtype=C128) * 0.4
    B = torch.randn(H, N, dtype=C128)
    C = torch.randn(*C_lead, H, N, dtype=C128)
    return dt, Lam, P, Q, B, C


@pytest.mark.parametrize("rank", [1, 2])
@pytest.mark.parametrize("L", [7, 8, 12])
@pytest.mark.parametrize("conj_pairs", [False, True])
def test_dplr_kernel_matches_dense_recurrence(rank, L, conj_pairs):
    torch.manual_seed(10 * rank + L)
    H, N = 2, 4
    inputs = list(_dplr_params(H, N, rank, C_lead=(2,)))
    _assert_same(
        lambda *a: dplr_ssm_kernel(*a, L, conj_pairs=conj_pairs),
        lambda *a: dplr_ssm_kernel_ref(*a, L, conj_pairs=conj_pairs),
        inputs,
        (2, H, L),
        tol=1e-9,
    )


def test_dplr_rank_one_accepts_unbatched_factors():
    torch.manual_seed(4)
    dt, Lam, P, Q, B, C = _dplr_params(2, 5, 1)
    torch.testing.assert_close(dplr_ssm_kernel(dt, Lam, P[0], Q[0], B, C, 9), dplr_ssm_kernel(dt, Lam, P, Q, B, C, 9))


@pytest.mark.parametrize("conj_pairs", [False, True])
def test_generating_kernel_from_c_tilde(conj_pairs):
    """Any C̃ gives the exact kernel of C = C̃ (I - Ā^L)^{-1}, and the conversions are inverse."""
    torch.manual_seed(5)
    H, N, L = 2, 4, 10
    dt, Lam, P, Q, B, C_tilde = _dplr_params(H, N, 1)
    full = (lambda t: complete_conj(t)) if conj_pairs else (lambda t: t)
    dA, dB = bilinear_dense(dt, dplr_dense(full(Lam), full(P), full(Q)), full(B))
    C = c_tilde_to_c(full(C_tilde), dA, L)
    torch.testing.assert_close(c_to_c_tilde(C, dA, L), full(C_tilde))
    K = dplr_generating_kernel(dt, Lam, P, Q, B, C_tilde, L, conj_pairs=conj_pairs)
    torch.testing.assert_close(K, dense_ssm_kernel_ref(dA, dB, C, L).real, rtol=1e-9, atol=1e-9)


def test_conjugate_pair_storage_equals_completed_system():
    torch.manual_seed(6)
    dt, Lam, P, Q, B, C = _dplr_params(2, 3, 2)
    half = dplr_generating_kernel(dt, Lam, P, Q, B, C, 11, conj_pairs=True)
    full = dplr_generating_kernel(dt, *(complete_conj(t) for t in (Lam, P, Q, B, C)), 11, conj_pairs=False)
    torch.testing.assert_close(half, full)


@pytest.mark.parametrize("L", [9, 16])
def test_legs_nplr_kernel_equals_dense_legs_kernel(L):
    """S4's parameterisation of HiPPO-LegS reproduces the kernel of the dense LegS SSM."""
    torch.manual_seed(7)
    N, H = 8, 2
    A, B = legs_matrices(N)
    Lam, P, B_eig, V = legs_nplr(N)
    c = torch.randn(H, N, dtype=F64)  # output vector in the original (real) basis
    dt = torch.tensor([0.01, 0.2], dtype=F64)
    dA, dB = bilinear_dense(dt, A.to(C128).expand(H, N, N), B.to(C128).expand(H, N))
    expected = dense_ssm_kernel_ref(dA, dB, c.to(C128), L)
    assert expected.imag.abs().max() < 1e-12
    C_eig = c.to(C128) @ V  # y = c x = c V_full x̃ -> first half of the pair
    K = dplr_ssm_kernel(
        dt,
        Lam.expand(H, -1),
        P.expand(1, H, -1),
        P.expand(1, H, -1),
        B_eig.expand(H, -1),
        C_eig,
        L,
        conj_pairs=True,
    )
    torch.testing.assert_close(K, expected.real, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(Lam=torch.randn(2, 4, dtype=F64)), "Lambda must be a complex"),
        (dict(dt=torch.rand(3, dtype=F64)), "dt must have shape"),
        (dict(P=torch.randn(1, 2, 5, dtype=C128)), "P must have shape"),
        (dict(Q=torch.randn(2, 2, 4, dtype=C128)), "same rank"),
        (dict(B=torch.randn(2, 5, dtype=C128)), "B must have shape"),
        (dict(C=torch.randn(2, 3, dtype=C128)), "C must have shape"),
    ],
)
def test_dplr_bad_shapes_raise(change, match):
    dt, Lam, P, Q, B, C = _dplr_params(2, 4, 1)
    args = dict(dt=dt, Lam=Lam, P=P, Q=Q, B=B, C=C)
    args.update(change)
    for fn in (dplr_ssm_kernel, dplr_generating_kernel, dplr_ssm_kernel_ref):
        with pytest.raises(ValueError, match=match):
            fn(args["dt"], args["Lam"], args["P"], args["Q"], args["B"], args["C"], 6)


def test_deterministic_mode_avoids_pykeops_for_the_cauchy_kernel(monkeypatch):
    from longrange.ops.ssm_kernels import dispatch
    from longrange.train.environment import set_deterministic

    # As if pykeops had found its CUDA toolchain on a machine whose Triton cannot run.
    monkeypatch.setattr(dispatch, "_runs", lambda impl, device: impl in ("pykeops", "chunked", "ref"))
    assert dispatch.auto_impl("cauchy", "cuda") == "pykeops"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # which set_deterministic would leave set
    restore = set_deterministic(True)
    try:
        assert dispatch.auto_impl("cauchy", "cuda") == "chunked"
        with pytest.raises(RuntimeError, match="pykeops.*non-deterministic backward.*chunked"):
            dispatch.resolve_impl("cauchy", "pykeops", "cuda")
    finally:
        restore()


def test_the_cauchy_kernel_reports_the_implementation_it_ran():
    from longrange.ops import used
    from longrange.ops.ssm_kernels import cauchy, cauchy_impl

    used.reset()
    v, w = torch.randn(2, 4, dtype=torch.complex64), torch.randn(2, 4, dtype=torch.complex64)
    cauchy(v, torch.randn(2, 3, dtype=torch.complex64), w)
    assert used.kernels() == {"cauchy": cauchy_impl("cpu")} and cauchy_impl("cpu") in ("numba", "chunked")
