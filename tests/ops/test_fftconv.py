"""fft_conv, by FFT and by one product with the Toeplitz matrix, against the direct-convolution
reference: values, gradients, conventions, the choice of ``"auto"``, errors."""

import pytest
import torch

from longrange.ops import used
from longrange.ops.fftconv import DIRECT_MAX_LENGTH, DISPATCHER, fast_fft_size, fft_conv, fft_conv_ref

DT = torch.float64


def _grads(fn, inputs, cotangent):
    inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*inputs)
    (out * cotangent).sum().backward()
    return out.detach(), [t.grad for t in inputs]


IMPLS = ("fft", "direct")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("two_sided", [False, True])
@pytest.mark.parametrize("lk", [3, 11, 17])
@pytest.mark.parametrize("with_skip", [False, True])
@pytest.mark.parametrize("chunk_bytes", [None, 1], ids=["one-group", "channel-by-channel"])
def test_fast_matches_reference_values_and_gradients(impl, two_sided, lk, with_skip, chunk_bytes):
    torch.manual_seed(lk)
    b, h, l = 2, 3, 11
    u = torch.randn(b, h, l, dtype=DT)
    k = torch.randn(2, h, lk, dtype=DT) if two_sided else torch.randn(h, lk, dtype=DT)
    inputs = [u, k] + ([torch.randn(h, dtype=DT)] if with_skip else [])
    cot = torch.randn(b, h, l, dtype=DT)
    kw = {"impl": impl} if chunk_bytes is None else {"impl": impl, "chunk_bytes": chunk_bytes}
    y_fast, g_fast = _grads(lambda *a: fft_conv(*a, **kw), inputs, cot)
    y_ref, g_ref = _grads(fft_conv_ref, inputs, cot)
    torch.testing.assert_close(y_fast, y_ref, rtol=1e-10, atol=1e-12)
    for gf, gr in zip(g_fast, g_ref):
        torch.testing.assert_close(gf, gr, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("two_sided", [False, True])
@pytest.mark.parametrize("l", [1, 2, DIRECT_MAX_LENGTH, DIRECT_MAX_LENGTH + 1])
def test_both_sides_of_autos_threshold_match_the_reference(two_sided, l):
    """Lengths where "auto" runs the matrix product and where it runs the FFT; a one-position input."""
    torch.manual_seed(l)
    b, h = 2, 3
    u = torch.randn(b, h, l, dtype=DT)
    k = torch.randn(2, h, l, dtype=DT) if two_sided else torch.randn(h, l, dtype=DT)
    inputs, cot = [u, k, torch.randn(h, dtype=DT)], torch.randn(b, h, l, dtype=DT)
    y_ref, g_ref = _grads(fft_conv_ref, inputs, cot)
    for impl in ("auto", *IMPLS):
        y, g = _grads(lambda *a, impl=impl: fft_conv(*a, impl=impl), inputs, cot)
        torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
        for a, r in zip(g, g_ref):
            torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_float32_matches_the_float64_reference(impl):
    torch.manual_seed(4)
    u, k = torch.randn(4, 8, 40), torch.randn(2, 8, 40) / 8
    inputs, cot = [u, k], torch.randn(4, 8, 40)
    y, g = _grads(lambda *a: fft_conv(*a, impl=impl), inputs, cot)
    y_ref, g_ref = _grads(fft_conv_ref, [t.double() for t in inputs], cot.double())
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-4, atol=1e-5)
    for a, r in zip(g, g_ref):
        torch.testing.assert_close(a.double(), r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("impl", IMPLS)
def test_float32_with_the_skip_folded_into_the_kernel_matches_float64(impl):
    """The skip runs as the kernel's tap at lag 0 (``with_skip``), through the FFT's rounding: in
    float32, with a skip as large as the kernel's taps summed and the input a transposed view (as
    the layers pass it), still float32's accuracy against the float64 reference."""
    torch.manual_seed(5)
    u = torch.randn(4, 40, 8).transpose(1, 2)
    k, D = torch.randn(8, 40) / 8, 4 * torch.randn(8)
    inputs, cot = [u, k, D], torch.randn(4, 8, 40)
    y, g = _grads(lambda *a: fft_conv(*a, impl=impl), inputs, cot)
    y_ref, g_ref = _grads(fft_conv_ref, [t.double() for t in inputs], cot.double())
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-5, atol=1e-5)
    for a, r in zip(g, g_ref):
        torch.testing.assert_close(a.double(), r, rtol=1e-5, atol=1e-4)


def test_only_the_inputs_gradient_when_the_kernel_is_fixed():
    torch.manual_seed(5)
    u = torch.randn(2, 3, 9, dtype=DT, requires_grad=True)
    k = torch.randn(2, 3, 9, dtype=DT)
    for impl in IMPLS:
        (g,) = torch.autograd.grad(fft_conv(u, k, impl=impl).sum(), u)
        (g_ref,) = torch.autograd.grad(fft_conv_ref(u, k).sum(), u)
        torch.testing.assert_close(g, g_ref)


def test_auto_convolves_short_cpu_inputs_directly():
    assert DISPATCHER.auto_impl("cpu", length=DIRECT_MAX_LENGTH) == "direct"
    assert DISPATCHER.auto_impl("cpu", length=DIRECT_MAX_LENGTH + 1) == "fft"
    assert DISPATCHER.auto_impl("cuda", length=8) == "fft"  # the crossover is not measured there
    assert DISPATCHER.auto_impl("meta", length=8) == "fft"
    u, k = torch.randn(1, 2, DIRECT_MAX_LENGTH + 1), torch.randn(2, 3)
    used.reset()
    fft_conv(u[..., :DIRECT_MAX_LENGTH], k)
    fft_conv(u, k)
    fft_conv(u, k, impl="ref")
    assert used.calls()["fft_conv"] == {"direct": 1, "fft": 1, "ref": 1}


def test_the_default_implementation_can_be_set():
    u, k = torch.randn(1, 2, 5), torch.randn(2, 3)
    used.reset()
    with DISPATCHER.default_impl("fft"):
        fft_conv(u, k)
    fft_conv(u, k)
    assert used.calls()["fft_conv"] == {"fft": 1, "direct": 1}


def test_unknown_impl_names_the_function_and_its_impls():
    with pytest.raises(
        ValueError, match=r"fft_conv: unknown impl 'fast'; expected one of \('auto', 'fft', 'direct', 'ref'\)"
    ):
        fft_conv(torch.randn(1, 2, 5), torch.randn(2, 3), impl="fast")


@pytest.mark.parametrize("impl", IMPLS)
def test_tuple_and_stacked_two_sided_kernels_agree(impl):
    torch.manual_seed(0)
    u = torch.randn(2, 3, 9, dtype=DT)
    k = torch.randn(2, 3, 9, dtype=DT)
    torch.testing.assert_close(fft_conv(u, k, impl=impl), fft_conv(u, (k[0], k[1]), impl=impl))


@pytest.mark.parametrize("impl", IMPLS)
def test_two_sided_convention_by_hand(impl):
    # y[t] = sum_{s<=t} kf[t-s] u[s] + sum_{s>t} kb[s-t-1] u[s]
    u = torch.tensor([[[1.0, 2.0, 3.0]]], dtype=DT)
    kf = torch.tensor([[10.0, 20.0, 30.0]], dtype=DT)
    kb = torch.tensor([[100.0, 200.0, 300.0]], dtype=DT)
    expected = torch.tensor(
        [[[10 * 1 + 100 * 2 + 200 * 3, 20 * 1 + 10 * 2 + 100 * 3, 30 * 1 + 20 * 2 + 10 * 3]]], dtype=DT
    )
    torch.testing.assert_close(fft_conv(u, (kf, kb), impl=impl), expected)
    torch.testing.assert_close(fft_conv_ref(u, (kf, kb)), expected)


@pytest.mark.parametrize("impl", IMPLS)
def test_causal_impulse_at_end_does_not_wrap_around(impl):
    l = 16
    u = torch.zeros(1, 2, l, dtype=DT)
    u[..., -1] = 1.0
    k = torch.ones(2, l, dtype=DT)
    y = fft_conv(u, k, impl=impl)
    assert y[..., :-1].abs().max() < 1e-12
    torch.testing.assert_close(y[..., -1], torch.ones(1, 2, dtype=DT))


@pytest.mark.parametrize("impl", IMPLS)
def test_two_sided_impulses_reach_only_the_intended_side(impl):
    torch.manual_seed(1)
    l = 12
    kf, kb = torch.randn(1, l, dtype=DT), torch.randn(1, l, dtype=DT)
    first = torch.zeros(1, 1, l, dtype=DT)
    first[..., 0] = 1.0
    # an impulse at the start is only seen through the forward kernel
    torch.testing.assert_close(fft_conv(first, (kf, kb), impl=impl)[0], kf)
    last = torch.zeros(1, 1, l, dtype=DT)
    last[..., -1] = 1.0
    y = fft_conv(last, (kf, kb), impl=impl)[0, 0]
    torch.testing.assert_close(y[:-1], kb[0, : l - 1].flip(0))
    torch.testing.assert_close(y[-1], kf[0, 0])


@pytest.mark.parametrize("impl", IMPLS)
def test_long_kernel_is_truncated_and_short_kernel_padded(impl):
    torch.manual_seed(2)
    u = torch.randn(1, 2, 8, dtype=DT)
    k = torch.randn(2, 20, dtype=DT)
    torch.testing.assert_close(fft_conv(u, k, impl=impl), fft_conv(u, k[:, :8], impl=impl))
    short = torch.randn(2, 3, dtype=DT)
    padded = torch.cat([short, torch.zeros(2, 5, dtype=DT)], dim=-1)
    torch.testing.assert_close(fft_conv(u, short, impl=impl), fft_conv(u, padded, impl=impl))


@pytest.mark.parametrize("impl", [*IMPLS, "ref"])
def test_output_has_input_dtype(impl):
    torch.manual_seed(3)
    u, k = torch.randn(1, 2, 5), torch.randn(2, 5)
    assert fft_conv(u, k, impl=impl).dtype == torch.float32
    assert fft_conv(u, k.double(), impl=impl).dtype == torch.float32
    y16 = fft_conv(u.bfloat16(), k, impl=impl)  # computed in float32, returned in bfloat16
    assert y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.float(), fft_conv_ref(u.bfloat16().float(), k), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("impl", [*IMPLS, "ref"])
@pytest.mark.parametrize("two_sided", [False, True])
def test_under_bf16_autocast_the_convolution_computes_in_float32_forward_and_backward(impl, two_sided):
    """As a bf16-autocast training step calls it (S4D, DLR, H3 at the demo's short lengths take
    ``direct``): the products are not autocast to bf16, and the backward runs (it met a bf16
    gradient against a float32 matrix before: "expected scalar type Float but found BFloat16")."""
    torch.manual_seed(4)
    u, g = torch.randn(3, 4, 9), torch.randn(3, 4, 9)
    k = (torch.randn(4, 9), torch.randn(4, 9)) if two_sided else torch.randn(4, 9)
    leaves = [u, *k] if two_sided else [u, k]

    def run(*xs):
        return fft_conv(xs[0], tuple(xs[1:]) if two_sided else xs[1], impl=impl)

    plain, plain_grads = _grads(run, leaves, g)
    inputs = [t.clone().requires_grad_(True) for t in leaves]
    with torch.autocast(
        "cpu", dtype=torch.bfloat16
    ):  # the forward under autocast, the backward after, as a trainer runs them
        out = run(*inputs)
    (out * g).sum().backward()
    auto, auto_grads = out.detach(), [t.grad for t in inputs]
    assert auto.dtype == torch.float32
    torch.testing.assert_close(auto, plain, rtol=1e-5, atol=1e-5)
    for a, b in zip(auto_grads, plain_grads):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", [*IMPLS, "ref"])
def test_every_implementation_gives_shapes_on_the_meta_device(impl):
    """As a plan traces it (no data; the meta device has no autocast to turn off)."""
    u, k = torch.randn(2, 3, 8, device="meta"), torch.randn(3, 8, device="meta")
    assert fft_conv(u, k, impl=impl).shape == (2, 3, 8)


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


# ----------------------------------------------------------------------------------------------
# channels_last: (batch, l, h) in and out, as the layers call it


@pytest.mark.parametrize("impl", [*IMPLS, "ref"])
@pytest.mark.parametrize("two_sided", [False, True])
@pytest.mark.parametrize("l", [1, 11, 40])
@pytest.mark.parametrize("chunk_bytes", [None, 1], ids=["one-group", "channel-by-channel"])
def test_channels_last_matches_the_reference_values_and_gradients(impl, two_sided, l, chunk_bytes):
    torch.manual_seed(l)
    b, h, lk = 2, 3, 17
    x = torch.randn(b, l, h, dtype=DT)
    k = torch.randn(2, h, lk, dtype=DT) if two_sided else torch.randn(h, lk, dtype=DT)
    D = torch.randn(h, dtype=DT)
    cot = torch.randn(b, l, h, dtype=DT)
    kw = {"impl": impl, "channels_last": True} | ({} if chunk_bytes is None else {"chunk_bytes": chunk_bytes})
    y, grads = _grads(lambda *a: fft_conv(*a, **kw), [x, k, D], cot)
    y_ref, grads_ref = _grads(lambda u, k, D: fft_conv_ref(u.transpose(1, 2), k, D).transpose(1, 2), [x, k, D], cot)
    assert y.shape == (b, l, h) and y.is_contiguous()
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_channels_last_reads_strided_and_lower_precision_inputs_and_lays_out_its_gradient(impl):
    torch.manual_seed(0)
    b, l, h = 3, 30, 4
    whole = torch.randn(b, l, 3 * h, dtype=torch.float64)
    k, D = torch.randn(h, l, dtype=torch.float64), torch.randn(h, dtype=torch.float64)
    expected = fft_conv_ref(whole[..., h : 2 * h].transpose(1, 2), k, D).transpose(1, 2)
    # a slice of the last dimension (Hyena's gates and values are such slices of one projection)
    leaf = whole.clone().requires_grad_()
    y = fft_conv(leaf[..., h : 2 * h], k, D, impl=impl, channels_last=True)
    torch.testing.assert_close(y, expected, rtol=1e-10, atol=1e-12)
    y.backward(torch.ones_like(y))
    assert leaf.grad[..., :h].abs().max() == 0 and leaf.grad[..., 2 * h :].abs().max() == 0
    x = whole[..., :h].float().contiguous().requires_grad_()
    out = fft_conv(x, k.float(), D.float(), impl=impl, channels_last=True)
    out.backward(torch.ones_like(out))
    assert x.grad.shape == (b, l, h) and x.grad.is_contiguous() and x.grad.dtype == torch.float32
    half = fft_conv(x.detach().bfloat16(), k.float(), D.float(), impl=impl, channels_last=True)
    assert half.dtype == torch.bfloat16 and half.shape == (b, l, h)
    torch.testing.assert_close(half.float(), out.detach(), rtol=2e-2, atol=2e-2)


def test_channels_last_errors_name_the_layout():
    with pytest.raises(ValueError, match=r"\(batch, l, h\) \(channels_last\), got \(2, 3\)"):
        fft_conv(torch.randn(2, 3), torch.randn(3, 4), channels_last=True)
    with pytest.raises(ValueError, match="does not match input with h=5 channels"):
        fft_conv(torch.randn(2, 7, 5), torch.randn(3, 4), channels_last=True)
    with pytest.raises(ValueError, match=r"skip D must have shape \(5,\)"):
        fft_conv(torch.randn(2, 7, 5), torch.randn(5, 4), torch.randn(3), channels_last=True)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("chunk_bytes", [None, 1], ids=["one-group", "channel-by-channel"])
def test_only_the_kernels_gradient_when_the_input_is_fixed(channels_last, chunk_bytes):
    torch.manual_seed(1)
    u, k = torch.randn(2, 3, 30, dtype=DT), torch.randn(3, 30, dtype=DT)
    kw = {"impl": "fft"} | ({} if chunk_bytes is None else {"chunk_bytes": chunk_bytes})
    x = u.transpose(1, 2).contiguous() if channels_last else u
    (grad,) = torch.autograd.grad(fft_conv(x, k.requires_grad_(), channels_last=channels_last, **kw).square().sum(), k)
    (ref,) = torch.autograd.grad(fft_conv_ref(u, k).square().sum(), k)
    torch.testing.assert_close(grad, ref, rtol=1e-10, atol=1e-12)


def test_cpu_groups_of_channels_are_even_and_within_the_budget(monkeypatch):
    """On a CPU the channels are transformed in even groups whose spectra fit FFT_GROUP_BYTES."""
    import longrange.ops.fftconv as F
    from longrange.ops.chunking import balanced_group_size

    assert balanced_group_size(64, 1, 63) == 32 and balanced_group_size(64, 1, 64) == 64
    assert balanced_group_size(10, 1, 3) == 3 and balanced_group_size(7, 100, 1) == 1
    seen = []
    real = F._fft_conv_core
    monkeypatch.setattr(F, "_fft_conv_core", lambda *a: seen.append(a[-1]) or real(*a))
    per_channel = 4 * (2 * 256 // 2 + 1) * 2 * 4  # batch 4, n 512, float32 complex spectra
    monkeypatch.setattr(F, "FFT_GROUP_BYTES", 20 * per_channel)
    fft_conv(torch.randn(4, 256, 64), torch.randn(64, 256), impl="fft", channels_last=True)
    assert seen == [16]  # 64 channels, at most 20 a group: four groups of 16
