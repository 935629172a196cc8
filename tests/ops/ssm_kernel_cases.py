"""Inputs and checks shared by the tests of the SSM-kernel implementations (numba, Triton): each
implementation's values and gradients against the float64 references."""

from __future__ import annotations

import torch

from longrange.ops.ssm_kernels import cauchy, cauchy_ref, vandermonde_kernel, vandermonde_kernel_ref

F64, C128 = torch.float64, torch.complex128


def cplx(g: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (
        torch.complex(torch.randn(*shape, generator=g, dtype=F64), torch.randn(*shape, generator=g, dtype=F64)) * scale
    )


def vandermonde_inputs(H: int, M: int, lead: tuple[int, ...] = (), shared: bool = False, seed: int = 0):
    """(log_dA, W) with decaying modes of S4D-like frequencies: log_dA (H or 1, M), W (*lead, H, M)."""
    g = torch.Generator().manual_seed(seed)
    rows = 1 if shared else H
    dt = torch.rand(rows, 1, generator=g, dtype=F64) * 0.09 + 0.01
    A = torch.complex(
        -0.5 - torch.rand(rows, M, generator=g, dtype=F64),
        torch.pi * torch.arange(M, dtype=F64) + torch.randn(rows, M, generator=g, dtype=F64),
    )
    return dt * A, cplx(g, *lead, H, M)


def cauchy_inputs(v_shape, z_shape, w_shape, seed: int = 0):
    """(v, z, w): z on S4's imaginary axis-like curve, poles w in the left half plane."""
    g = torch.Generator().manual_seed(seed)
    v = cplx(g, *v_shape)
    z = torch.complex(
        0.2 * torch.rand(*z_shape, generator=g, dtype=F64), 4 * torch.randn(*z_shape, generator=g, dtype=F64)
    )
    w = torch.complex(
        -0.1 - torch.rand(*w_shape, generator=g, dtype=F64), 3 * torch.randn(*w_shape, generator=g, dtype=F64)
    )
    return v, z, w


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if t.is_complex():
        return t.to(torch.complex128 if dtype == F64 else torch.complex64)
    return t.to(dtype)


def values_and_grads(fn, inputs, cotangent, dtype, device="cpu"):
    """fn(*inputs) in ``dtype`` on ``device`` and the gradients of <out, cotangent> (float64, CPU)."""
    leaves = [_cast(t, dtype).to(device).requires_grad_() for t in inputs]
    out = fn(*leaves)
    loss = (out * _cast(cotangent, out.real.dtype).to(device).conj()).real.sum()
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)  # L = 1: the modes are unused
    grads = [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]
    to64 = lambda t: t.detach().cpu().to(C128 if t.is_complex() else F64)  # noqa: E731
    return to64(out), [to64(g) for g in grads]


def assert_matches_reference(fn, ref, inputs, dtype, device="cpu", tol=None, what=""):
    """``fn`` in ``dtype`` against ``ref`` in float64: values and the gradient of every input,
    relative to each compared tensor's largest entry."""
    tol = tol or (1e-10 if dtype == F64 else 2e-5)
    expected, grads_ref = values_and_grads(ref, inputs, _cotangent(ref, inputs), F64)
    out, grads = values_and_grads(fn, inputs, _cotangent(ref, inputs), dtype, device)
    assert out.shape == expected.shape, what
    _close(out, expected, tol, f"{what} values")
    for i, (a, b) in enumerate(zip(grads, grads_ref)):
        assert a.shape == b.shape, f"{what} gradient {i}"
        _close(a, b, 10 * tol, f"{what} gradient {i}")


def _cotangent(ref, inputs):
    with torch.no_grad():
        out = ref(*inputs)
    g = torch.Generator().manual_seed(99)
    c = torch.randn(out.shape, generator=g, dtype=F64)
    return torch.complex(c, torch.randn(out.shape, generator=g, dtype=F64)) if out.is_complex() else c


def _close(a: torch.Tensor, b: torch.Tensor, tol: float, what: str) -> None:
    assert torch.isfinite(a).all(), f"{what}: not finite"
    scale = b.abs().max().item() if b.numel() else 0.0
    err = (a - b).abs().max().item() if b.numel() else 0.0
    assert err <= tol * max(scale, 1e-30), f"{what}: max error {err:.3g} > {tol:g} x max {scale:.3g}"


def vandermonde(impl: str, L: int):
    return lambda a, W: vandermonde_kernel(a, W, L, impl=impl)


def vandermonde_ref(L: int):
    return lambda a, W: vandermonde_kernel_ref(a, W, L)


def cauchy_with(impl: str, conj_pairs: bool):
    return lambda v, z, w: cauchy(v, z, w, conj_pairs=conj_pairs, impl=impl)


def cauchy_reference(conj_pairs: bool):
    return lambda v, z, w: cauchy_ref(v, z, w, conj_pairs)
