"""On every selected device (``--device``), what ``impl="auto"`` runs agrees with the float64 CPU
reference of each op, in float32, values and gradients."""

from __future__ import annotations

import torch

from longrange.ops.conv import causal_conv1d, causal_conv1d_ref
from longrange.ops.fftconv import fft_conv, fft_conv_ref
from longrange.ops.scan import selective_scan, selective_scan_ref
from longrange.ops.ssm_kernels import cauchy, cauchy_ref, vandermonde_kernel, vandermonde_kernel_ref


def _check(fn, ref, inputs, device, rtol=1e-4, atol=1e-5):
    """fn on float32 (complex64) copies on ``device`` against ref on float64 (complex128) CPU copies."""
    low = [t.to(device, torch.complex64 if t.is_complex() else torch.float32).requires_grad_() for t in inputs]
    high = [t.detach().to(torch.complex128 if t.is_complex() else torch.float64).requires_grad_() for t in low]
    out, expected = fn(*low), ref(*high)
    assert out.device.type == device.type
    torch.testing.assert_close(out.detach().cpu().to(expected.dtype), expected.detach(), rtol=rtol, atol=atol)
    g = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    if expected.is_complex():
        g = torch.complex(g, g.flip(-1))
    grads = torch.autograd.grad(out, low, g.to(device, out.dtype))
    grads_ref = torch.autograd.grad(expected, high, g)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a.cpu().to(b.dtype), b, rtol=10 * rtol, atol=10 * atol)


def test_selective_scan_auto(device):
    g = torch.Generator().manual_seed(0)
    b, d, n, l = 2, 8, 4, 33
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    inputs = [
        r(b, d, l),
        r(b, d, l),
        -torch.rand(d, n, generator=g) - 0.1,
        r(b, n, l),
        r(b, n, l),
        r(d),
        r(b, d, l),
        r(d),
    ]

    def scan(fn):
        return lambda u, dt, A, B, C, D, z, bias: fn(u, dt, A, B, C, D, z, bias, delta_softplus=True)

    _check(scan(selective_scan), scan(selective_scan_ref), inputs, device)


def test_causal_conv1d_auto(device):
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(2, 8, 19, generator=g), torch.randn(8, 4, generator=g), torch.randn(8, generator=g)]
    _check(
        lambda x, w, b: causal_conv1d(x, w, b, "silu"),
        lambda x, w, b: causal_conv1d_ref(x, w, b, "silu"),
        inputs,
        device,
    )


def test_fft_conv(device):
    g = torch.Generator().manual_seed(2)
    inputs = [torch.randn(2, 6, 40, generator=g), torch.randn(2, 6, 40, generator=g), torch.randn(6, generator=g)]
    _check(lambda u, k, D: fft_conv(u, k, D), lambda u, k, D: fft_conv_ref(u, k, D), inputs, device)


def test_cauchy_auto(device):
    g = torch.Generator().manual_seed(3)
    c = lambda *s: torch.complex(torch.randn(*s, generator=g), torch.randn(*s, generator=g))  # noqa: E731
    inputs = [c(3, 8), c(3, 16) + 4, c(3, 8)]
    _check(cauchy, cauchy_ref, inputs, device)


def test_cauchy_conjugate_pairs_auto(device):
    g = torch.Generator().manual_seed(4)
    c = lambda *s: torch.complex(torch.randn(*s, generator=g), torch.randn(*s, generator=g))  # noqa: E731
    inputs = [c(4, 3, 8), c(3, 16) + 4, c(3, 8)]
    _check(
        lambda v, z, w: cauchy(v, z, w, conj_pairs=True),
        lambda v, z, w: cauchy_ref(v, z, w, conj_pairs=True),
        inputs,
        device,
    )


def test_vandermonde_auto(device):
    g = torch.Generator().manual_seed(5)
    log_dA = torch.complex(-torch.rand(3, 6, generator=g) * 0.1 - 0.01, torch.randn(3, 6, generator=g))
    W = torch.complex(torch.randn(2, 3, 6, generator=g), torch.randn(2, 3, 6, generator=g))
    _check(
        lambda a, w: vandermonde_kernel(a, w, 70), lambda a, w: vandermonde_kernel_ref(a, w, 70), [log_dA, W], device
    )
