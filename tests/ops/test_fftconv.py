"""fft_conv against the direct-convolution reference: values, gradients, conventions, errors."""

import pytest
import torch

from longrange.ops.fftconv import fast_fft_size, fft_conv, fft_conv_ref

DT = torch.float64


def _grads(fn, inputs, cotangent):
    inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*inputs)
    (out * cotangent).sum().backward()
    return out.detach(), [t.grad for t in inputs]


@pytest.mark.parametrize("two_sided", [False, True])
@pytest.mark.parametrize("lk", [3, 11, 17])
@pytest.mark.parametrize("with_skip", [False, True])
@pytest.mark.parametrize("chunk_bytes", [None, 1], ids=["one-group", "channel-by-channel"])
def test_fast_matches_reference_values_and_gradients(two_sided, lk, with_skip, chunk_bytes):
    torch.manual_seed(lk)
    b, h, l = 2, 3, 11
    u = torch.randn(b, h, l, dtype=DT)
    k = torch.randn(2, h, lk, dtype=DT) if two_sided else torch.randn(h, lk, dtype=DT)
    inputs = [u, k] + ([torch.randn(h, dtype=DT)] if with_skip else [])
    cot = torch.randn(b, h, l, dtype=DT)
    fast = fft_conv if chunk_bytes is None else (lambda *a: fft_conv(*a, chunk_bytes=chunk_bytes))
    y_fast, g_fast = _grads(fast, inputs, cot)
    y_ref, g_ref = _grads(fft_conv_ref, inputs, cot)
    torch.testing.assert_close(y_fast, y_ref, rtol=1e-10, atol=1e-12)
    for gf, gr in zip(g_fast, g_ref):
        torch.testing.assert_close(gf, gr, rtol=1e-10, atol=1e-12)


def test_tuple_and_stacked_two_sided_kernels_agree():
    torch.manual_seed(0)
    u = torch.randn(2, 3, 9, dtype=DT)
    k = torch.randn(2, 3, 9, dtype=DT)
    torch.testing.assert_close(fft_conv(u, k), fft_conv(u, (k[0], k[1])))


def test_two_sided_convention_by_hand():
    # y[t] = sum_{s<=t} kf[t-s] u[s] + sum_{s>t} kb[s-t-1] u[s]
    u = torch.tensor([[[1.0, 2.0, 3.0]]], dtype=DT)
    kf = torch.tensor([[10.0, 20.0, 30.0]], dtype=DT)
    kb = torch.tensor([[100.0, 200.0, 300.0]], dtype=DT)
    expected = torch.tensor(
        [[[10 * 1 + 100 * 2 + 200 * 3, 20 * 1 + 10 * 2 + 100 * 3, 30 * 1 + 20 * 2 + 10 * 3]]], dtype=DT
    )
    torch.testing.assert_close(fft_conv(u, (kf, kb)), expected)
    torch.testing.assert_close(fft_conv_ref(u, (kf, kb)), expected)


def test_causal_impulse_at_end_does_not_wrap_around():
    l = 16
    u = torch.zeros(1, 2, l, dtype=DT)
    u[..., -1] = 1.0
    k = torch.ones(2, l, dtype=DT)
    y = fft_conv(u, k)
    assert y[..., :-1].abs().max() < 1e-12
    torch.testing.assert_close(y[..., -1], torch.ones(1, 2, dtype=DT))


def test_two_sided_impulses_reach_only_the_intended_side():
    torch.manual_seed(1)
    l = 12
    kf, kb = torch.randn(1, l, dtype=DT), torch.randn(1, l, dtype=DT)
    first = torch.zeros(1, 1, l, dtype=DT)
    first[..., 0] = 1.0
    # an impulse at the start is only seen through the forward kernel
    torch.testing.assert_close(fft_conv(first, (kf, kb))[0], kf)
    last = torch.zeros(1, 1, l, dtype=DT)
    last[..., -1] = 1.0
    y = fft_conv(last, (kf, kb))[0, 0]
    torch.testing.assert_close(y[:-1], kb[0, : l - 1].flip(0))
    torch.testing.assert_close(y[-1], kf[0, 0])


def test_long_kernel_is_truncated_and_short_kernel_padded():
    torch.manual_seed(2)
    u = torch.randn(1, 2, 8, dtype=DT)
    k = torch.randn(2, 20, dtype=DT)
    torch.testing.assert_close(fft_conv(u, k), fft_conv(u, k[:, :8]))
    short = torch.randn(2, 3, dtype=DT)
    padded = torch.cat([short, torch.zeros(2, 5, dtype=DT)], dim=-1)
    torch.testing.assert_close(fft_conv(u, short), fft_conv(u, padded))


def test_output_has_input_dtype():
    torch.manual_seed(3)
    u, k = torch.randn(1, 2, 5), torch.randn(2, 5)
    assert fft_conv(u, k).dtype == torch.float32
    assert fft_conv(u, k.double()).dtype == torch.float32
    y16 = fft_conv(u.bfloat16(), k)  # computed in float32, returned in bfloat16
    assert y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.float(), fft_conv_ref(u.bfloat16().float(), k), rtol=2e-2, atol=2e-2)


def test_fast_fft_size():
    assert [fast_fft_size(n) for n in (1, 7, 11, 17, 1025, 2048)] == [1, 8, 12, 18, 1080, 2048]
    with pytest.raises(ValueError):
        fast_fft_size(0)


@pytest.mark.parametrize(
    "u_shape, k, D, match",
    [
        ((3, 5), torch.randn(3, 5), None, "batch, h, l"),
        ((1, 3, 5), torch.randn(4, 5), None, "h=3"),
        ((1, 3, 5), torch.randn(3, 3, 5), None, r"\(2, h, lk\)"),
        ((1, 3, 5), (torch.randn(3, 5), torch.randn(3, 4)), None, "differ in shape"),
        ((1, 3, 5), torch.randn(3, 5), torch.randn(4), "skip D"),
        ((1, 3, 5), torch.randn(3, 0), None, "at least 1"),
        ((1, 3, 5), torch.randn(3, 5, dtype=torch.cfloat), None, "real kernel"),
        ((1, 3, 5), torch.randn(5), None, "kernel must have shape"),
    ],
)
def test_bad_shapes_raise(u_shape, k, D, match):
    with pytest.raises(ValueError, match=match):
        fft_conv(torch.randn(*u_shape), k, D)
    with pytest.raises(ValueError, match=match):
        fft_conv_ref(torch.randn(*u_shape), k, D)
