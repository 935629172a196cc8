"""Causal depthwise convolution: fast path vs reference, stepping vs full, errors."""

from __future__ import annotations

import pytest
import torch

from longrange.ops.conv import auto_impl, available_impls, causal_conv1d, causal_conv1d_ref, causal_conv1d_update
from longrange.ops.conv import numba as conv_numba

F64 = dict(dtype=torch.float64)


def inputs(b=2, d=3, l=9, w=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, d, l, generator=g, **F64),
        torch.randn(d, w, generator=g, **F64),
        torch.randn(d, generator=g, **F64),
    )


def test_ref_matches_definition():
    x, weight, bias = inputs(b=1, d=2, l=6, w=3)
    expected = torch.empty_like(x)
    for c in range(2):
        for t in range(6):
            acc = bias[c].clone()
            for k in range(3):
                src = t - 2 + k
                if src >= 0:
                    acc = acc + weight[c, k] * x[0, c, src]
            expected[0, c, t] = acc
    torch.testing.assert_close(causal_conv1d_ref(x, weight, bias), expected)


FAST = [
    pytest.param("torch"),
    pytest.param("numba", marks=pytest.mark.skipif(not conv_numba.numba_available(), reason="numba does not import")),
]


@pytest.mark.parametrize("impl", FAST)
@pytest.mark.parametrize("activation", [None, "silu", "swish"])
@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("w,l", [(4, 9), (1, 5), (3, 2), (4, 1), (4, 130), (3, 65), (2, 128)])  # numba: blocks of 64
def test_fast_matches_ref_values_and_grads(impl, activation, use_bias, w, l):
    x, weight, bias = inputs(l=l, w=w)
    bias = bias if use_bias else None
    leaves = [t.clone().requires_grad_() for t in (x, weight) + ((bias,) if use_bias else ())]

    def run(fn):
        ls = [t.detach().clone().requires_grad_() for t in leaves]
        y = fn(ls[0], ls[1], ls[2] if use_bias else None, activation)
        proj = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), **F64)
        return y, torch.autograd.grad((y * proj).sum(), ls)

    y_fast, g_fast = run(lambda *a: causal_conv1d(*a, impl=impl))
    y_ref, g_ref = run(causal_conv1d_ref)
    assert y_fast.shape == x.shape
    torch.testing.assert_close(y_fast, y_ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(g_fast, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_silu_and_swish_agree_and_apply_silu():
    x, weight, bias = inputs()
    plain = causal_conv1d(x, weight, bias)
    torch.testing.assert_close(causal_conv1d(x, weight, bias, "silu"), torch.nn.functional.silu(plain))
    torch.testing.assert_close(causal_conv1d(x, weight, bias, "swish"), torch.nn.functional.silu(plain))


def test_output_is_causal():
    x, weight, bias = inputs(l=8)
    x2 = x.clone()
    x2[..., 5:] += 1.0
    y, y2 = causal_conv1d(x, weight, bias), causal_conv1d(x2, weight, bias)
    torch.testing.assert_close(y[..., :5], y2[..., :5])
    assert not torch.allclose(y[..., 5], y2[..., 5])


@pytest.mark.parametrize("state_len_extra", [0, 1, 3])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_stepping_equals_full_convolution(state_len_extra, activation):
    x, weight, bias = inputs(l=11, w=4)
    full = causal_conv1d(x, weight, bias, activation)
    state = torch.zeros(2, 3, 4 - 1 + state_len_extra, **F64)
    ys = []
    for t in range(x.shape[-1]):
        y_t, new_state = causal_conv1d_update(x[..., t], state, weight, bias, activation)
        assert y_t.shape == (2, 3) and new_state.shape == state.shape
        torch.testing.assert_close(new_state[..., -1], x[..., t])
        state = new_state
        ys.append(y_t)
    torch.testing.assert_close(torch.stack(ys, -1), full, rtol=1e-12, atol=1e-12)


def test_multi_step_update_equals_full_convolution():
    x, weight, bias = inputs(l=10, w=3)
    full = causal_conv1d(x, weight, bias, "silu")
    state = torch.zeros(2, 3, 2, **F64)
    y1, state = causal_conv1d_update(x[..., :4], state, weight, bias, "silu")
    y2, state = causal_conv1d_update(x[..., 4:], state, weight, bias, "silu")
    torch.testing.assert_close(torch.cat([y1, y2], -1), full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state, x[..., -2:])


def test_update_does_not_modify_state_in_place():
    x, weight, bias = inputs(l=1)
    state = torch.randn(2, 3, 3, **F64)
    before = state.clone()
    causal_conv1d_update(x[..., 0], state, weight, bias)
    assert torch.equal(state, before)


def test_bad_inputs_raise():
    x, weight, bias = inputs()
    with pytest.raises(ValueError, match="x must have shape"):
        causal_conv1d(x[0], weight, bias)
    with pytest.raises(ValueError, match="weight must have shape"):
        causal_conv1d(x, weight[:, None, :], bias)
    with pytest.raises(ValueError, match="weight must have shape"):
        causal_conv1d(x, weight[:2], bias)
    with pytest.raises(ValueError, match="bias must have shape"):
        causal_conv1d(x, weight, bias[:2])
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d(x, weight, bias, "relu")
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d_ref(x, weight, bias, "gelu")
    with pytest.raises(ValueError, match="unknown impl"):
        causal_conv1d(x, weight, bias, impl="fft")
    if not x.is_cuda:
        with pytest.raises(RuntimeError, match="impl='cuda'"):
            causal_conv1d(x, weight, bias, impl="cuda")
    state = torch.zeros(2, 3, 3, **F64)
    with pytest.raises(ValueError, match="conv_state must have shape"):
        causal_conv1d_update(x[..., 0], state[..., :2], weight, bias)
    with pytest.raises(ValueError, match="conv_state must have shape"):
        causal_conv1d_update(x[..., 0], state[:1], weight, bias)
    with pytest.raises(ValueError, match="x must have shape"):
        causal_conv1d_update(x[0, 0], state, weight, bias)
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d_update(x[..., 0], state, weight, bias, "tanh")
    with pytest.raises(ValueError, match="weight must have shape"):
        causal_conv1d_update(x[..., 0], state, weight[:, :1].T, bias)


def test_deterministic_mode_avoids_the_cuda_kernel(monkeypatch):
    import longrange.ops.conv as conv
    from longrange import _optional

    assert conv.DETERMINISTIC_BACKWARD == {"torch": True, "ref": True, "numba": True, "cuda": False}
    monkeypatch.setattr(_optional, "causal_conv1d_cuda_fn", object())  # as if causal-conv1d's kernel imported
    assert conv.auto_impl("cuda", deterministic=False) == "cuda"
    assert conv.auto_impl("cuda", deterministic=True) == "torch"
    x, w = torch.randn(2, 3, 5), torch.randn(3, 4)
    before, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True)
    try:
        assert conv.auto_impl("cuda") == "torch"
        with pytest.raises(
            RuntimeError, match=r"causal_conv1d: impl='cuda' has a non-deterministic backward.*'torch', 'ref'"
        ):
            causal_conv1d(x, w, impl="cuda")
        torch.testing.assert_close(causal_conv1d(x, w), causal_conv1d_ref(x, w))
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)


numba_only = pytest.mark.skipif(not conv_numba.numba_available(), reason="numba does not import")


@numba_only
@pytest.mark.parametrize("threads", [1, 2])
def test_numba_channels_last_float32_at_model_width(threads):
    """A Mamba block's call: x the (b, d, l) view of a slice of a (b, l, 2d) tensor, float32, 96
    channels in blocks; values and gradients of the reference; the output a view of (b, l, d)
    memory; the same bits at the same thread count."""
    g = torch.Generator().manual_seed(2)
    wide = torch.randn(3, 150, 192, generator=g)
    weight, bias = torch.randn(96, 4, generator=g), torch.randn(96, generator=g)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        results = []
        for fn in (
            lambda *a: causal_conv1d(*a, activation="silu", impl="numba"),
            lambda *a: causal_conv1d(*a, activation="silu", impl="numba"),
            lambda *a: causal_conv1d_ref(*a, activation="silu"),
        ):
            leaves = [t.clone().requires_grad_() for t in (wide, weight, bias)]
            x = leaves[0][..., :96].transpose(1, 2)
            y = fn(x, leaves[1], leaves[2])
            (y * torch.cos(y.detach())).sum().backward()
            results.append((y, [t.grad for t in leaves]))
    finally:
        torch.set_num_threads(previous)
    (y, grads), (y_again, grads_again), (y_ref, grads_ref) = results
    assert y.shape == (3, 96, 150) and y.transpose(1, 2).is_contiguous()
    assert torch.equal(y, y_again) and all(torch.equal(a, b) for a, b in zip(grads, grads_again))
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert grads[0][..., 96:].abs().max() == 0  # the other half of the wide tensor gets no gradient


def test_auto_on_cpu_is_numba_for_float32_and_float64(monkeypatch):
    if conv_numba.numba_available():
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            assert auto_impl("cpu", 4, dtype) == "numba"
        assert "numba" in available_impls("cpu")
    assert "numba" not in available_impls("meta")
    monkeypatch.setattr(conv_numba._KERNELS, "module", None)
    monkeypatch.setattr(conv_numba._KERNELS, "error", "ModuleNotFoundError: No module named 'numba'")
    assert auto_impl("cpu") == "torch" and "numba" not in available_impls("cpu")
    x, weight, bias = inputs()
    torch.testing.assert_close(causal_conv1d(x, weight, bias), causal_conv1d_ref(x, weight, bias))
    with pytest.raises(RuntimeError, match="impl='numba' needs the numba package.*No module named 'numba'"):
        causal_conv1d(x, weight, bias, impl="numba")


@numba_only
def test_numba_in_bfloat16_computes_in_float32():
    x, weight, bias = inputs()
    y = causal_conv1d(x.bfloat16(), weight.bfloat16(), bias.bfloat16(), "silu", impl="numba")
    assert y.dtype == torch.bfloat16
    expected = causal_conv1d_ref(x.bfloat16().float(), weight.bfloat16().float(), bias.bfloat16().float(), "silu")
    torch.testing.assert_close(y.float(), expected, rtol=1e-2, atol=1e-2)


@numba_only
def test_numba_refuses_other_dtypes_and_devices():
    x, weight, bias = inputs()
    with pytest.raises(RuntimeError, match="impl=.numba. takes floating CPU tensors, got torch.int64"):
        causal_conv1d(x.long(), weight, bias, impl="numba")


@numba_only
def test_warm_up_loads_both_dtypes():
    from longrange.ops.conv import _numba_kernels as kernels

    conv_numba.warm_up()
    for kernel in (kernels.conv_forward, kernels.conv_backward):
        assert {str(sig[0].dtype) for sig in kernel.signatures} >= {"float32", "float64"}, kernel
