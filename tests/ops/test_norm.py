"""The (gated) RMS norm (``longrange.ops.norm``): the numba kernels against the formula, values and
gradients, every gate mode, a scale shared or per head; its operators; its dispatch and errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from longrange.ops import custom_ops, used
from longrange.ops.norm import IMPLS, auto_impl, available_impls, default_impl, rms_norm, rms_norm_ref
from longrange.ops.norm import numba as norm_numba
from longrange.ops.norm.dispatch import NUMBA_MIN_WIDTH, NUMBA_NARROW_ELEMENTS, NUMBA_NARROW_WIDTH

numba_only = pytest.mark.skipif(not norm_numba.numba_available(), reason="numba does not import")

#: (x's shape, weight per head, gate, gate first)
CASES = [
    ((3, 5, 7), False, False, False),
    ((2, 3, 4, 6), True, False, False),
    ((2, 9, 2, 5), False, True, False),
    ((2, 9, 3, 5), True, True, False),
    ((4, 7, 1, 8), False, True, True),
    ((2, 6, 2, 4), True, True, True),
    ((1, 1, 1), False, True, True),  # one row of one feature
]


def _inputs(shape, per_head, gate, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    w = 1 + 0.3 * torch.randn(*(shape[-2:] if per_head else shape[-1:]), generator=g, dtype=torch.float64)
    gt = torch.randn(*shape, generator=g, dtype=torch.float64) if gate else None
    return [t if t is None else t.to(dtype).requires_grad_() for t in (x, w, gt)]


def _grads(out, leaves, seed=1):
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
    return torch.autograd.grad(out, [t for t in leaves if t is not None], weights)


def test_the_reference_is_the_formula():
    x, w, g = _inputs((2, 4, 3, 6), True, True, torch.float64)
    rms = lambda u: torch.sqrt(u.pow(2).mean(-1, keepdim=True) + 1e-5)  # noqa: E731
    torch.testing.assert_close(rms_norm_ref(x, w), x / rms(x) * w)
    torch.testing.assert_close(rms_norm_ref(x, w, g), x / rms(x) * w * g * torch.sigmoid(g))
    u = x * g * torch.sigmoid(g)
    torch.testing.assert_close(rms_norm_ref(x, w, g, gate_first=True), u / rms(u) * w)


@numba_only
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape, per_head, gate, gate_first", CASES)
def test_numba_matches_the_formula_values_and_gradients(shape, per_head, gate, gate_first, dtype):
    x, w, g = _inputs(shape, per_head, gate, dtype)
    fast = rms_norm(x, w, g, gate_first, eps=1e-5, impl="numba")
    slow = rms_norm_ref(x, w, g, gate_first, eps=1e-5)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-5)
    assert fast.dtype == dtype and fast.shape == x.shape
    torch.testing.assert_close(fast, slow, **tol)
    for a, b in zip(_grads(fast, [x, w, g]), _grads(slow, [x, w, g])):
        torch.testing.assert_close(a, b, **tol)


@numba_only
def test_many_rows_spread_over_tasks_sum_the_weight_gradient_in_a_fixed_order(monkeypatch):
    monkeypatch.setattr(norm_numba, "TASK_ELEMENTS", 16)  # tasks of two rows: many partial sums
    x, w, g = _inputs((3, 37, 2, 8), True, True, torch.float64)
    first = _grads(rms_norm(x, w, g, impl="numba"), [x, w, g])
    for a, b in zip(first, _grads(rms_norm_ref(x, w, g), [x, w, g])):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    again = _grads(rms_norm(x, w, g, impl="numba"), [x, w, g])
    for a, b in zip(first, again):
        assert torch.equal(a, b)  # the same bits


@numba_only
def test_bfloat16_and_non_contiguous_inputs():
    x, w, g = _inputs((2, 6, 16), False, True, torch.float64)
    xt = x.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()  # a non-contiguous view's layout
    assert not xt.is_contiguous()
    torch.testing.assert_close(rms_norm(xt, w, g, impl="numba"), rms_norm_ref(xt, w, g))
    xb, wb, gb = (t.detach().to(torch.bfloat16) for t in (x, w, g))
    out = rms_norm(xb, wb, gb, impl="numba")  # computed in float32, returned in bfloat16
    assert out.dtype == torch.bfloat16
    ref = rms_norm_ref(xb.float(), wb.float(), gb.float())
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)


@numba_only
def test_auto_runs_numba_on_cpus_and_reports_it():
    assert IMPLS == ("auto", "numba", "torch") and "numba" in available_impls("cpu")
    assert auto_impl("cpu") == "numba" and auto_impl("meta") == "torch"
    # rows narrower than NUMBA_MIN_WIDTH: the formula (the kernels' call costs more than it saves)
    assert auto_impl("cpu", width=NUMBA_MIN_WIDTH) == "numba" and auto_impl("cpu", width=16) == "torch"
    # rows of 16 to 31 features in large tensors: numba; rows of 8 never
    big, small = NUMBA_NARROW_ELEMENTS, NUMBA_NARROW_ELEMENTS - 1
    assert auto_impl("cpu", width=NUMBA_NARROW_WIDTH, elements=big) == "numba"
    assert auto_impl("cpu", width=NUMBA_NARROW_WIDTH, elements=small) == "torch"
    assert auto_impl("cpu", width=8, elements=10 * big) == "torch"
    assert auto_impl("meta", width=NUMBA_NARROW_WIDTH, elements=big) == "torch"
    x, w, g = _inputs((2, 3, NUMBA_MIN_WIDTH), False, True, torch.float32)
    narrow = _inputs((2, 3, 16), False, True, torch.float32)
    used.reset()
    rms_norm(x, w, g)
    rms_norm(*narrow)
    rms_norm(*narrow, impl="numba")  # by name it runs at any width
    rms_norm(*_inputs((NUMBA_NARROW_ELEMENTS // NUMBA_NARROW_WIDTH, NUMBA_NARROW_WIDTH), False, True, torch.float32))
    with default_impl("torch"):
        rms_norm(x, w, g)
    assert used.calls()["rms_norm"] == {"numba": 3, "torch": 2}


def test_bad_inputs_name_what_is_wrong():
    x = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match=r"rms_norm: weight must have shape \(D,\)=\(4,\) or \(heads, D\)=\(3, 4\)"):
        rms_norm(x, torch.ones(5))
    with pytest.raises(ValueError, match=r"rms_norm: gate must have x's shape \(2, 3, 4\), got \(2, 3\)"):
        rms_norm(x, torch.ones(4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="rms_norm: x must be a floating tensor"):
        rms_norm(torch.ones(2, 3, dtype=torch.long), torch.ones(3))
    with pytest.raises(ValueError, match="eps must be positive"):
        rms_norm(x, torch.ones(4), eps=0.0)
    with pytest.raises(ValueError, match="rms_norm.*'cuda'"):
        rms_norm(x, torch.ones(4), impl="cuda")
    with pytest.raises(RuntimeError, match="impl='numba'.*cannot run on meta"):
        rms_norm(x.to("meta"), torch.ones(4, device="meta"), impl="numba")


@numba_only
def test_the_operators_pass_opcheck_and_have_fakes_and_flops():
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    ops = custom_ops.operators()
    for op in (ops["rms_norm_numba"], ops["rms_norm_numba_backward"]):
        assert op in flop_registry
    x, w, g = (t.detach() for t in _inputs((6, 5), True, True, torch.float32))
    for gate, mode in ((None, 0), (g, 1), (g, 2)):
        args = [x.clone().requires_grad_(), gate, w.clone().requires_grad_(), 1e-5, mode]
        result = torch.library.opcheck(norm_numba._norm_op, args)
        assert set(result.values()) == {"SUCCESS"}, result
        y, rstd = norm_numba._norm_op(x, gate, w, 1e-5, mode)
        back = [x, gate, w, rstd, torch.ones_like(y), mode]
        result = torch.library.opcheck(norm_numba._norm_backward_op, back)
        assert set(result.values()) == {"SUCCESS"}, result
        meta = norm_numba._norm_op(*[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args[:3]], 1e-5, mode)
        assert [m.shape for m in meta] == [y.shape, rstd.shape] and meta[0].device.type == "meta"
    xs, ws, gs = _inputs((2, 3, 4, 5), True, True, torch.float32)
    with FlopCounterMode(display=False) as counter:
        rms_norm(xs, ws, gs, impl="numba").sum().backward()
    counts = {str(k).split(".")[-1]: v for k, v in counter.get_flop_counts()["Global"].items()}
    assert counts["rms_norm_numba"] == 120 * 8 and counts["rms_norm_numba_backward"] == 120 * 20


def test_the_head_norm_of_the_layers_is_the_op():
    """The matrix-state layers' HeadNorm runs ``rms_norm`` (the default implementation)."""
    from longrange.layers.mixer_parts import HeadNorm

    torch.manual_seed(0)
    norm = HeadNorm(6, gate_first=True, heads=2).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    o, g = torch.randn(3, 4, 2, 6, dtype=torch.float64), torch.randn(3, 4, 2, 6, dtype=torch.float64)
    u = o * F.silu(g)
    expected = u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(o, g), expected)


@pytest.mark.parametrize("width", [16, NUMBA_MIN_WIDTH, 64])
def test_the_blocks_rms_norm_is_the_op_and_the_formula(width):
    """The blocks' RMSNorm (before every mixer and MLP) runs ``rms_norm``: the formula's values and
    gradients at widths the numba kernels take and below them."""
    from longrange.blocks.norms import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(width)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, width, requires_grad=True)
    used.reset()
    out = norm(x)
    assert used.kernels() == {"rms_norm": auto_impl("cpu", width=width)}
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight
    torch.testing.assert_close(out, expected, rtol=2e-6, atol=2e-6)
    grads = torch.autograd.grad(out, [x, norm.weight], torch.ones_like(out))
    for a, b in zip(grads, torch.autograd.grad(expected, [x, norm.weight], torch.ones_like(out))):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)
