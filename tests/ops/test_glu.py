"""SwiGLU (``longrange.ops.glu``): the numba kernels against the formula, values and gradients; its
operators; its dispatch and errors; the gated MLP that runs it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from longrange.ops import custom_ops, used
from longrange.ops.glu import IMPLS, auto_impl, available_impls, default_impl, swiglu, swiglu_ref
from longrange.ops.glu import numba as glu_numba

numba_only = pytest.mark.skipif(not glu_numba.numba_available(), reason="numba does not import")

SHAPES = [(3, 5, 14), (2, 9, 2, 8), (1, 1, 2), (4, 352)]


def _input(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype).requires_grad_()


def _grad(out, h, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.autograd.grad(out, h, torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype))[0]


def test_the_reference_is_the_formula():
    h = _input((2, 3, 8), torch.float64)
    gate, up = h[..., :4], h[..., 4:]
    torch.testing.assert_close(swiglu_ref(h), gate * torch.sigmoid(gate) * up)


@numba_only
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_numba_matches_the_formula_values_and_gradients(shape, dtype):
    h = _input(shape, dtype)
    fast, slow = swiglu(h, impl="numba"), swiglu_ref(h)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-6, atol=2e-6)
    assert fast.dtype == dtype and fast.shape == (*shape[:-1], shape[-1] // 2)
    torch.testing.assert_close(fast, slow, **tol)
    torch.testing.assert_close(_grad(fast, h), _grad(slow, h), **tol)


@numba_only
def test_many_rows_over_many_tasks_bfloat16_and_non_contiguous_inputs(monkeypatch):
    monkeypatch.setattr(glu_numba, "TASK_ELEMENTS", 8)  # tasks of one or two rows
    h = _input((3, 37, 12), torch.float64)
    torch.testing.assert_close(_grad(swiglu(h, impl="numba"), h), _grad(swiglu_ref(h), h))
    ht = h.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()  # non-contiguous
    assert not ht.is_contiguous()
    torch.testing.assert_close(swiglu(ht, impl="numba"), swiglu_ref(ht))
    torch.testing.assert_close(_grad(swiglu(ht, impl="numba"), ht), _grad(swiglu_ref(ht), ht))
    hb = h.detach().to(torch.bfloat16)
    out = swiglu(hb, impl="numba")  # computed in float32, returned in bfloat16
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), swiglu_ref(hb.float()), rtol=1e-2, atol=1e-2)


@numba_only
def test_auto_runs_numba_on_cpus_and_reports_it():
    assert IMPLS == ("auto", "numba", "torch") and "numba" in available_impls("cpu")
    assert auto_impl("cpu") == "numba" and auto_impl("meta") == "torch"
    h = _input((2, 3, 8), torch.float32)
    used.reset()
    swiglu(h)
    with default_impl("torch"):
        swiglu(h)
    swiglu(h, impl="torch")
    assert used.calls()["swiglu"] == {"numba": 1, "torch": 2}


def test_bad_inputs_name_what_is_wrong():
    with pytest.raises(ValueError, match=r"swiglu: h must be a floating tensor \(\.\.\., 2 H\).*shape \(2, 3\)"):
        swiglu(torch.randn(2, 3))  # an odd last dimension: no halves
    with pytest.raises(ValueError, match="swiglu: h must be a floating tensor"):
        swiglu(torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="swiglu.*'cuda'"):
        swiglu(torch.randn(2, 4), impl="cuda")
    with pytest.raises(RuntimeError, match="impl='numba'.*cannot run on meta"):
        swiglu(torch.randn(2, 4, device="meta"), impl="numba")


@numba_only
def test_the_operators_pass_opcheck_and_have_fakes_and_flops():
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    ops = custom_ops.operators()
    for op in (ops["swiglu_numba"], ops["swiglu_numba_backward"]):
        assert op in flop_registry
    h = _input((6, 10), torch.float32).detach()
    result = torch.library.opcheck(glu_numba._glu_op, [h.clone().requires_grad_()])
    assert set(result.values()) == {"SUCCESS"}, result
    y = glu_numba._glu_op(h)
    result = torch.library.opcheck(glu_numba._glu_backward_op, [h, torch.ones_like(y)])
    assert set(result.values()) == {"SUCCESS"}, result
    assert glu_numba._glu_op(h.to("meta")).shape == y.shape == (6, 5)
    with FlopCounterMode(display=False) as counter:
        swiglu(_input((2, 3, 10), torch.float32), impl="numba").sum().backward()
    counts = {str(k).split(".")[-1]: v for k, v in counter.get_flop_counts()["Global"].items()}
    assert counts["swiglu_numba"] == 30 * 5 and counts["swiglu_numba_backward"] == 30 * 11


@numba_only
@pytest.mark.usefixtures("inductor_cpu")
def test_compiled_swiglu_equals_eager():
    h = _input((2, 5, 8), torch.float32)
    compiled = torch.compile(lambda t: swiglu(t, impl="numba"), fullgraph=True)
    torch.testing.assert_close(compiled(h), swiglu(h, impl="numba"))
    torch.testing.assert_close(_grad(compiled(h), h), _grad(swiglu(h, impl="numba"), h))


def test_the_gated_mlp_runs_the_op():
    """The blocks' SwiGLU MLP is ``down(silu(gate(x)) * up(x))`` with the activation by the op."""
    from longrange.blocks.residual import SwiGLU

    torch.manual_seed(0)
    mlp = SwiGLU(6, 8).double()
    x = torch.randn(3, 4, 6, dtype=torch.float64)
    gate, up = (x @ mlp.gate_up.weight.T).chunk(2, dim=-1)
    used.reset()
    out = mlp(x)
    assert used.kernels() == {"swiglu": auto_impl("cpu")}
    torch.testing.assert_close(out, (F.silu(gate) * up) @ mlp.down.weight.T)
