"""Attention without a mask (``longrange.ops.attention.attention``): the numba kernels against the
written-out softmax, values and gradients; its operators; the dispatch rule and its errors; the
padded causal path and the attention layer that run it."""

from __future__ import annotations

import pytest
import torch

from longrange.ops import custom_ops, used
from longrange.ops.attention import (
    IMPLS,
    NUMBA_MAX_LENGTH,
    NUMBA_MAX_WIDTH,
    NUMBA_MAX_WIDTH_BIDIRECTIONAL,
    admissible_ref,
    attention,
    attention_ref,
    auto_impl,
    available_impls,
    default_impl,
    masked_attention,
)
from longrange.ops.attention import numba as attention_numba

numba_only = pytest.mark.skipif(not attention_numba.numba_available(), reason="numba does not import")

# lengths around the kernels' blocks of 16 keys (1, 15, 16, 17, 33) and MAD's 127; head widths 1-16
SHAPES = [(2, 3, 17, 4), (1, 2, 1, 8), (2, 1, 16, 1), (1, 2, 15, 16), (1, 2, 33, 3), (1, 1, 127, 4)]


def _qkv(shape, dtype, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [
        (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype).requires_grad_() for _ in range(3)
    ]


def _values_and_grads(fn, qkv, seed=1):
    out = fn(*qkv)
    g = torch.Generator().manual_seed(seed)
    grads = torch.autograd.grad(out, qkv, torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype))
    return [out.detach(), *grads]


def _dense(causal, length):
    return lambda q, k, v: attention_ref(q, k, v, admissible_ref(length, None, causal, None))


@numba_only
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_numba_matches_the_written_out_softmax_values_and_gradients(shape, causal):
    """float64 against the reference to rounding; float32 against the float64 reference."""
    for dtype, tol in ((torch.float64, dict(rtol=1e-10, atol=1e-12)), (torch.float32, dict(rtol=1e-5, atol=2e-6))):
        qkv = _qkv(shape, dtype)
        fast = _values_and_grads(lambda *t: attention(*t, causal, impl="numba"), qkv)
        exact = _values_and_grads(_dense(causal, shape[2]), _qkv(shape, torch.float64))
        assert fast[0].dtype == dtype and fast[0].shape == shape
        for a, b in zip(fast, exact):
            torch.testing.assert_close(a.double(), b, **tol)


@numba_only
def test_large_scores_stay_finite_and_exact():
    """Scores of several hundred (logits a softmax without its maximum subtracted would overflow)."""
    qkv = _qkv((1, 2, 40, 4), torch.float32, scale=12.0)
    fast = _values_and_grads(lambda *t: attention(*t, True, impl="numba"), qkv)
    exact = _values_and_grads(_dense(True, 40), [t.detach().double().requires_grad_() for t in qkv])
    assert all(torch.isfinite(t).all() for t in fast)
    for a, b in zip(fast, exact):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


@numba_only
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_a_nan_in_the_inputs_reaches_the_output_as_in_pytorchs_kernel(where):
    """A diverging model's NaN is not hidden by the kernel's maximum (which skips NaN scores)."""
    q, k, v = (t.detach() for t in _qkv((1, 2, 20, 4), torch.float32))
    {"q": q, "k": k, "v": v}[where][0, 1, 5, 2] = float("nan")
    fast, slow = attention(q, k, v, True, impl="numba"), attention(q, k, v, True, impl="sdpa")
    assert torch.equal(fast.isnan(), slow.isnan()) and fast.isnan().any()


@numba_only
def test_half_precision_and_non_contiguous_inputs():
    q, k, v = _qkv((2, 5, 3, 4), torch.float64)  # (N, L, heads, D), viewed as (N, heads, L, D)
    views = [t.transpose(1, 2) for t in (q, k, v)]
    assert not views[0].is_contiguous()
    fast = _values_and_grads(lambda *t: attention(*t, True, impl="numba"), views)
    exact = _values_and_grads(_dense(True, 5), views)
    for a, b in zip(fast, exact):
        torch.testing.assert_close(a, b)
    qb, kb, vb = (t.detach().to(torch.bfloat16) for t in views)
    out = attention(qb, kb, vb, False, impl="numba")  # computed in float32, returned in bfloat16
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), _dense(False, 5)(qb.float(), kb.float(), vb.float()), rtol=1e-2, atol=1e-2)


@numba_only
def test_the_backward_is_deterministic():
    qkv = _qkv((3, 4, 50, 4), torch.float32)
    first = _values_and_grads(lambda *t: attention(*t, True, impl="numba"), qkv)
    second = _values_and_grads(lambda *t: attention(*t, True, impl="numba"), qkv)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@numba_only
@pytest.mark.parametrize("impl", ["numba", "sdpa"])
def test_causal_attention_with_padding_at_the_end_runs_the_op_and_zeroes_padded_rows(impl):
    q, k, v = _qkv((2, 2, 9, 4), torch.float64)
    key_mask = torch.arange(9)[None, :] < torch.tensor([[9], [6]])
    used.reset()
    with default_impl(impl):
        fast = _values_and_grads(lambda *t: masked_attention(*t, key_mask, causal=True), [q, k, v])
    assert used.calls()["attention"] == {impl: 1}
    exact = _values_and_grads(lambda *t: attention_ref(*t, admissible_ref(9, key_mask, True, None)), [q, k, v])
    for a, b in zip(fast, exact):
        torch.testing.assert_close(a, b)
    assert fast[0][1, :, 6:].abs().max() == 0


@numba_only
def test_auto_follows_the_measured_rule_and_reports_what_ran():
    assert IMPLS == ("auto", "numba", "sdpa", "ref") and "numba" in available_impls("cpu")
    assert available_impls("meta") == ("sdpa", "ref")
    assert auto_impl("cpu", width=4, length=127) == "numba"  # MAD's CPU protocol
    assert auto_impl("cpu", width=NUMBA_MAX_WIDTH, length=NUMBA_MAX_LENGTH) == "numba"
    assert auto_impl("cpu", width=NUMBA_MAX_WIDTH + 1, length=24) == "sdpa"  # the recall Transformer's 16
    assert auto_impl("cpu", width=4, length=NUMBA_MAX_LENGTH + 1) == "sdpa"
    assert auto_impl("cpu", width=NUMBA_MAX_WIDTH_BIDIRECTIONAL, length=127, causal=False) == "numba"
    assert auto_impl("cpu", width=NUMBA_MAX_WIDTH_BIDIRECTIONAL + 1, length=127, causal=False) == "sdpa"
    assert auto_impl("cpu", width=4, length=127, dropout_p=0.1) == "sdpa"
    assert auto_impl("cpu", dtype=torch.long, width=4, length=127) == "sdpa"
    assert auto_impl("meta", width=4, length=127) == "sdpa"
    q, k, v = (t.detach() for t in _qkv((1, 2, 8, 4), torch.float32))
    used.reset()
    attention(q, k, v, True)
    attention(q, k, v, True, impl="sdpa")
    attention(q, k, v, False, dropout_p=0.5)
    with default_impl("sdpa"):
        attention(q, k, v, True)
    assert used.calls()["attention"] == {"numba": 1, "sdpa": 3}


@numba_only
def test_bad_inputs_and_impls_name_what_is_wrong():
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match=r"attention: q, k and v must be tensors \(N, heads, L, D\).*\(2, 8, 4\)"):
        attention(q, q, q[0], True)
    with pytest.raises(ValueError, match="attention: unknown impl 'flash'"):
        attention(q, q, q, True, impl="flash")
    with pytest.raises(RuntimeError, match=r"impl='numba' has no dropout, got dropout_p=0.1; available here: sdpa$"):
        attention(q, q, q, True, dropout_p=0.1, impl="numba")
    with pytest.raises(RuntimeError, match="impl='numba' takes q, k and v of one shape"):
        attention(q, q, torch.randn(1, 2, 8, 6), True, impl="numba")
    with pytest.raises(RuntimeError, match="impl='numba' cannot run on meta"):
        attention(*(torch.randn(1, 2, 8, 4, device="meta") for _ in range(3)), True, impl="numba")
    # the reference is the written-out softmax
    q, k, v = _qkv((1, 2, 8, 4), torch.float64)
    torch.testing.assert_close(attention(q, k, v, True, impl="ref"), _dense(True, 8)(q, k, v))
    q = q.detach().float()
    # what SDPA takes, it still takes: values of another width
    assert attention(q, q, torch.randn(1, 2, 8, 6), True).shape == (1, 2, 8, 6)


@numba_only
def test_the_operators_pass_opcheck_and_count_flops_as_pytorch_counts_attention():
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    from longrange.bench.plan import flop_counter

    ops = custom_ops.operators()
    for op in (ops["attention_numba"], ops["attention_numba_backward"]):
        assert op in flop_registry
    q, k, v = (t.detach().reshape(6, 17, 4) for t in _qkv((2, 3, 17, 4), torch.float32))
    for causal in (True, False):
        result = torch.library.opcheck(attention_numba._attention_op, [q.clone().requires_grad_(), k, v, 0.5, causal])
        assert set(result.values()) == {"SUCCESS"}, result
    out, lse = attention_numba._attention_op(q, k, v, 0.5, True)
    result = torch.library.opcheck(
        attention_numba._attention_backward_op, [q, k, v, out, lse, torch.ones_like(out), 0.5, True]
    )
    assert set(result.values()) == {"SUCCESS"}, result
    fake = attention_numba._attention_op(q.to("meta"), k.to("meta"), v.to("meta"), 0.5, True)
    assert fake[0].shape == out.shape and fake[1].shape == lse.shape == (6, 17)
    counts = {}
    for impl in ("numba", "sdpa"):  # the benchmarks' counter (bench.plan) counts PyTorch's CPU kernel too
        qkv = _qkv((2, 3, 17, 4), torch.float32)
        with flop_counter() as counter:
            attention(*qkv, True, impl=impl).sum().backward()
        counts[impl] = counter.get_total_flops()
    assert counts["numba"] == counts["sdpa"] == 14 * 6 * 17 * 17 * 4
    with FlopCounterMode(display=False) as counter:
        attention(*_qkv((2, 3, 17, 4), torch.float32), True, impl="numba").sum().backward()
    assert counter.get_total_flops() == 14 * 6 * 17 * 17 * 4


@numba_only
@pytest.mark.usefixtures("inductor_cpu")
def test_compiled_attention_equals_eager():
    qkv = _qkv((2, 4, 20, 4), torch.float32)
    compiled = torch.compile(lambda q, k, v: attention(q, k, v, True, impl="numba"), fullgraph=True)
    eager = _values_and_grads(lambda *t: attention(*t, True, impl="numba"), qkv)
    for a, b in zip(_values_and_grads(compiled, qkv), eager):
        torch.testing.assert_close(a, b)


@numba_only
def test_the_attention_layer_runs_the_op_at_narrow_heads():
    """MAD's multi-head attention (heads of 4) trains through the numba kernels, and its values and
    gradients are those of PyTorch's kernel."""
    from longrange.layers.attention import Attention

    torch.manual_seed(0)
    layer = Attention(16, n_heads=4).double()  # causal
    x = torch.randn(2, 30, 16, dtype=torch.float64, requires_grad=True)
    results = {}
    for impl in ("numba", "sdpa"):
        used.reset()
        with default_impl(impl):
            out = layer(x)
        assert used.kernels()["attention"] == impl
        results[impl] = [out.detach(), *torch.autograd.grad(out.square().sum(), [x, *layer.parameters()])]
    for a, b in zip(results["numba"], results["sdpa"]):
        torch.testing.assert_close(a, b)
