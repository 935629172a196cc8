"""The maintained CUDA kernels of the matrix-state ops (``ops/matrix_state/external.py``): what our
wrapper hands them and when they count as usable, tried on a CPU with stand-ins for the packages.

A kernel counts as usable only after it ran forward and backward in float32 and in bfloat16 on a
small input: on an H100, flash-linear-attention's gated delta rule ran its forward and then refused
its backward (a Triton version it knows to be wrong on Hopper), and under bf16 autocast its kernels
refused our mixed-dtype inputs. The stand-ins reproduce those two failures here.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from longrange.ops.matrix_state import external


def test_fla_gets_q_k_v_and_beta_in_one_dtype_and_the_log_decays_in_float32():
    q, k = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8)  # float32: normalised under autocast
    v, beta = torch.randn(1, 4, 2, 8, dtype=torch.bfloat16), torch.rand(1, 4, 2)
    g = -torch.rand(1, 4, 2, dtype=torch.bfloat16)
    out = external.fla_dtypes("gated_delta_rule", [q, k, v, g, beta])
    assert [t.dtype for t in out] == [torch.bfloat16] * 3 + [torch.float32, torch.bfloat16]
    assert [t.dtype for t in external.fla_dtypes("delta_rule", [q, k, v, beta])] == [torch.bfloat16] * 4
    assert [t.dtype for t in external.fla_dtypes("gla", [q, k, v, g.expand(1, 4, 2).unsqueeze(-1)])] == [
        torch.bfloat16
    ] * 3 + [torch.float32]
    same = external.fla_dtypes("delta_rule", [q, k, q, beta])  # all float32: left as they are
    assert all(t.dtype == torch.float32 for t in same) and same[0] is q


class _RefusesBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results")


def _fake_fla(monkeypatch, fn):
    module = types.ModuleType("fake_fla_ops")
    module.chunk_delta_rule = fn
    monkeypatch.setitem(sys.modules, "fake_fla_ops", module)
    monkeypatch.setitem(external.SOURCES, "delta_rule", ("fla", "fake_fla_ops", "chunk_delta_rule"))
    monkeypatch.setattr(external._optional, "installed", lambda package: True)


@pytest.mark.parametrize("failure", ["backward", "bf16", None])
def test_a_kernel_is_usable_only_if_it_runs_forward_and_backward_in_float32_and_bf16(monkeypatch, failure):
    seen = []

    def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False):
        seen.append((q.dtype, k.dtype, v.dtype, beta.dtype))
        if failure == "bf16" and q.dtype == torch.bfloat16:
            raise TypeError("Both operands must be same dtype. Got fp32 and bf16")
        from longrange.ops.matrix_state.delta_rule import delta_rule_chunk

        o = delta_rule_chunk(q, k, v, beta, scale)  # the same function as ours
        return (_RefusesBackward.apply(o) if failure == "backward" else o), None

    _fake_fla(monkeypatch, chunk_delta_rule)
    fn, reason = external._probe("delta_rule", torch.device("cpu"))
    if failure is None:
        assert fn is not None and reason is None
        assert seen == [(torch.float32,) * 4, (torch.bfloat16,) * 4]
        return
    assert fn is None
    if failure == "backward":
        assert "float32 input, forward and backward" in reason and "on Hopper GPUs" in reason
    else:
        assert "bfloat16 input" in reason and "same dtype" in reason


def test_a_kernel_with_non_finite_gradients_is_not_usable(monkeypatch, capsys):
    def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False):
        return q.sqrt() * 0 + v, None  # sqrt of negative entries: NaN gradients, finite outputs

    _fake_fla(monkeypatch, chunk_delta_rule)
    fn, reason = external._probe("delta_rule", torch.device("cpu"))
    assert fn is None and "non-finite outputs or gradients" in reason
    assert ": not usable (" in capsys.readouterr().err


def test_a_kernel_that_computes_another_function_is_not_usable(monkeypatch):
    """A maintained kernel must agree with our chunked form on the probe's float32 input: one whose
    layout or definition differs (here: the keys and values swapped) is not used, and says why."""
    from longrange.ops.matrix_state import delta_rule

    def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False):
        return delta_rule.delta_rule_chunk(q, v, k, beta), None  # keys and values swapped

    _fake_fla(monkeypatch, chunk_delta_rule)
    fn, reason = external._probe("delta_rule", torch.device("cpu"))
    assert fn is None and "differs from the chunked PyTorch form" in reason


def test_a_kernel_that_agrees_with_the_chunked_form_is_usable(monkeypatch, capsys):
    from longrange.ops.matrix_state import delta_rule

    def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False):
        return delta_rule.delta_rule_chunk(q, k, v, beta, scale), None

    _fake_fla(monkeypatch, chunk_delta_rule)
    fn, reason = external._probe("delta_rule", torch.device("cpu"))
    assert reason is None and fn is not None
    # the probe says what it waits on (a first use compiles and autotunes: minutes), then its verdict
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("longrange: probing fake_fla_ops.chunk_delta_rule on cpu") and "minutes" in err[0]
    assert err[1].startswith("longrange: fake_fla_ops.chunk_delta_rule on cpu: usable (")


def test_a_probe_of_a_package_that_is_not_installed_says_nothing(monkeypatch, capsys):
    monkeypatch.setattr(external._optional, "installed", lambda package: False)
    fn, reason = external._probe("delta_rule", torch.device("cpu"))
    assert fn is None and "not installed" in reason and capsys.readouterr().err == ""


# ---------------------------------------------------------------------------------------------- Mamba-3


def _authors_siso(calls=None):
    """A stand-in for mamba-ssm's ``mamba3_siso_combined`` with the authors' layouts (Q = C, K = B,
    V = x; ADT, DT, Trap as (batch, heads, length); states (angle, ssm transposed, k, v)), computed by
    our loop over time, without a padding mask as the kernel has none: a padded position (dt = 0) still
    becomes the previous key and input, which the wrapper must correct."""
    from longrange.ops.matrix_state.mamba3 import Mamba3State, mamba3_naive

    def mamba3_siso_combined(
        Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None, Input_States=None, chunk_size=64,
        return_final_states=False, cu_seqlens=None,
    ):  # fmt: skip
        assert (
            Z is None
            and cu_seqlens is None
            and ADT.shape == DT.shape == Trap.shape == (V.shape[0], V.shape[2], V.shape[1])
        )
        assert Angles.shape[-1] <= Q.shape[-1] // 2 and Angles.shape[-1] % 2 == 0  # as the kernel asserts
        if calls is not None:
            calls.append({"Q": Q, "K": K, "V": V, "states": Input_States})
        dt = DT.transpose(1, 2)
        A = torch.where(DT > 0, ADT / DT.clamp_min(1e-30), torch.zeros_like(ADT)).transpose(1, 2)
        init = None
        if Input_States is not None:
            theta, S, k, v = Input_States
            init = Mamba3State(ssm=S.transpose(-1, -2), angle=theta, k=k, v=v)
        out = mamba3_naive(V, dt, A, K, Q, Trap.transpose(1, 2), Angles, K_bias, Q_bias, D, init, return_final_states)
        if not return_final_states:
            return out
        y, st = out
        return y, st.angle, st.ssm.transpose(-1, -2), st.k, st.v

    return mamba3_siso_combined


def _mamba3_inputs(b=3, l=9, h=4, g=2, n=8, p=4, m=2, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    u = lambda *s: torch.rand(*s, generator=gen, dtype=dtype)  # noqa: E731
    from longrange.ops.matrix_state.mamba3 import Mamba3State

    args = (r(b, l, h, p), 0.05 + 0.3 * u(b, l, h), -0.5 - u(b, l, h), r(b, l, g, n), r(b, l, g, n), r(b, l, h))
    args += (r(b, l, h, m), 0.3 * r(h, n), 0.3 * r(h, n), r(h))
    state = Mamba3State(ssm=r(b, h, n, p), angle=6 * u(b, h, m), k=r(b, h, n), v=r(b, h, p))
    return args, state


@pytest.mark.parametrize("with_state", [False, True])
def test_the_mamba3_kernel_wrapper_gives_our_op_values_and_gradients_with_left_aligned_padding(with_state):
    """Through the wrapper, the authors' function (here a stand-in in its layouts) computes our op:
    outputs zero at padding, the final state of each sequence's last real position (its key and input
    rebuilt: the kernel's are those of the last padded position), gradients as the loop's."""
    from longrange.ops.matrix_state.mamba3 import mamba3_naive

    args, state = _mamba3_inputs()
    lengths = torch.tensor([9, 5, 0])  # one sequence whole, one padded at its end, one all padding
    mask = torch.arange(9)[None, :] < lengths[:, None]
    init = state if with_state else None
    leaves = [a.clone().requires_grad_() for a in args]
    wrapped = external._wrap("mamba3", _authors_siso())
    y, final = wrapped(*leaves, init, True, mask=mask)
    ref_leaves = [a.clone().requires_grad_() for a in args]
    y_ref, final_ref = mamba3_naive(*ref_leaves, init, True, mask=mask)
    torch.testing.assert_close(y, y_ref)
    for name in final_ref._fields:
        torch.testing.assert_close(getattr(final, name), getattr(final_ref, name), msg=name)
    weights = [torch.randn_like(t) for t in (y_ref, *final_ref)]
    sum((w * t).sum() for w, t in zip(weights, (y, *final))).backward()
    sum((w * t).sum() for w, t in zip(weights, (y_ref, *final_ref))).backward()
    for i, (a, b_) in enumerate(zip(leaves, ref_leaves)):
        torch.testing.assert_close(a.grad, b_.grad, msg=f"gradient of argument {i}")
    assert external._wrap("mamba3", _authors_siso())(*args, init, False).shape == y.shape  # no mask, no state out


def test_the_mamba3_kernel_gets_the_authors_layouts():
    calls = []
    args, state = _mamba3_inputs(b=2, l=5)
    external._wrap("mamba3", _authors_siso(calls))(*args, state, False)
    x, _, _, B, C, *_ = args
    (call,) = calls
    assert call["Q"] is C and call["K"] is B and call["V"] is x
    theta, S, k, v = call["states"]
    torch.testing.assert_close(S, state.ssm.transpose(-1, -2))  # transposed, as the kernel keeps it
    assert theta.shape == state.angle.shape and k.shape == state.k.shape and v.shape == state.v.shape


def test_mamba3s_kernel_runs_only_where_it_fits_and_auto_picks_it_on_half_precision_only(monkeypatch):
    """mamba-ssm's Mamba-3 kernel computes in bfloat16: "auto" leaves float32 inputs to the chunked
    form; it takes power-of-two widths and left-aligned sequences, and impl='mamba' says so."""
    from longrange.ops.matrix_state import dispatch

    cuda = torch.device("cuda")
    monkeypatch.setitem(external._probed, ("mamba3", str(cuda)), (lambda *a, **k: None, None))
    d = dispatch.DISPATCHERS["mamba3"]
    fits = {"p": 16, "n": 32, "prefix_mask": True}
    assert d.auto_impl(cuda, dtype=torch.bfloat16, **fits) == "mamba"
    assert d.auto_impl(cuda, dtype=torch.float16, **fits) == "mamba"
    assert d.auto_impl(cuda, dtype=torch.float32, **fits) == "chunk"
    assert d.auto_impl(cuda, dtype=torch.bfloat16, **{**fits, "p": 12}) == "chunk"
    assert d.auto_impl(cuda, dtype=torch.bfloat16, **{**fits, "prefix_mask": False}) == "chunk"
    assert d.auto_impl(cuda, deterministic=True, dtype=torch.bfloat16, **fits) == "chunk"
    assert d.auto_impl("cpu", dtype=torch.bfloat16, **fits, state_elements=64 * 64, key_width=64) == "chunk"
    assert d.resolve("mamba", cuda, dtype=torch.float32, **fits) == "mamba"  # asked for: float32 too
    with pytest.raises(RuntimeError, match=r"mamba3: impl='mamba' needs power-of-two head and state widths; got p=12"):
        d.resolve("mamba", cuda, **{**fits, "p": 12})
    with pytest.raises(RuntimeError, match="takes left-aligned sequences only"):
        d.resolve("mamba", cuda, **{**fits, "prefix_mask": False})
    # an odd number of rotation angles (d_state=4 at rope_fraction 0.5: one), which the kernel asserts
    # against (an AssertionError on an H200)
    assert d.auto_impl(cuda, dtype=torch.bfloat16, **fits, m=2) == "mamba"
    assert d.auto_impl(cuda, dtype=torch.bfloat16, **fits, m=1) == "chunk"
    with pytest.raises(RuntimeError, match="needs an even, positive number of rotation angles; got 1"):
        d.resolve("mamba", cuda, **fits, m=1)


def test_a_padding_mask_is_left_aligned_when_each_row_is_real_positions_then_padding():
    assert external.is_prefix_mask(None)
    assert external.is_prefix_mask(torch.tensor([[True, True, False], [False, False, False], [True] * 3]))
    assert not external.is_prefix_mask(torch.tensor([[True, False, True]]))
    assert not external.is_prefix_mask(torch.tensor([[False, True, True]]))


def test_mamba3s_probe_runs_the_kernel_through_the_wrapper_and_compares_it(monkeypatch):
    """The probe's Mamba-3 input (float32 dt, A, biases and D at either dtype) goes through the wrapper
    to the kernel, forward and backward, and its float32 output is compared with the chunked form."""
    module = types.ModuleType("fake_mamba3")
    module.mamba3_siso_combined = _authors_siso()
    monkeypatch.setitem(sys.modules, "fake_mamba3", module)
    monkeypatch.setitem(external.SOURCES, "mamba3", ("mamba_ssm", "fake_mamba3", "mamba3_siso_combined"))
    monkeypatch.setattr(external._optional, "installed", lambda package: True)
    fn, reason = external._probe("mamba3", torch.device("cpu"))
    assert reason is None and fn is not None

    def swapped(Q, K, *rest, **kw):  # B and C exchanged: another function
        return _authors_siso()(K, Q, *rest, **kw)

    module.mamba3_siso_combined = swapped
    fn, reason = external._probe("mamba3", torch.device("cpu"))
    assert fn is None and "differs from the chunked PyTorch form" in reason


def test_longrange_check_gives_mamba3s_kernel_inputs_it_takes_and_the_bf16_tolerance(monkeypatch):
    """On CUDA, ``longrange check`` compares mamba-ssm's Mamba-3 kernel (where it runs) with the loop
    on power-of-two widths and a left-aligned mask, at bfloat16's tolerance in every dtype (the kernel
    computes in bfloat16), the parameters in float32 as the layer keeps them."""
    from longrange.ops import check_cases
    from longrange.ops.checking import TOLERANCE

    for op in external.SOURCES:  # no package is probed: the others' kernels do not run here
        monkeypatch.setitem(external._probed, (op, "cuda"), (None, "not installed"))
    monkeypatch.setitem(external._probed, ("mamba3", "cuda"), (lambda *a, **k: None, None))
    cases = {(c.op, c.impl): c for c in check_cases.matrix_state_cases("cuda", torch.float32)}
    kernel, chunk = cases["mamba3", "mamba"], cases["mamba3", "chunk"]
    assert "dk=16 dv=16" in kernel.shape and "dk=4 dv=3" in chunk.shape
    assert kernel.tol == TOLERANCE[torch.bfloat16] and chunk.tol == TOLERANCE[torch.float32]
    _, inputs, _, _ = check_cases._matrix_state_inputs("mamba3", 16, 16)
    assert set(check_cases.MAMBA3_FLOAT32) <= set(inputs)
    assert inputs["angles"].shape[-1] % 2 == 0  # the kernel takes an even number of angles


def test_longrange_check_holds_the_tf32_kernels_to_tf32s_tolerance_in_float32(monkeypatch):
    """mamba-ssm's SSD kernel (and flash-linear-attention's) multiply float32 operands in TF32: on an
    H200 its float32 error was 1.9e-3 against the loop, above float32's 1e-4; their float32 cases
    take TF32_TOLERANCE, bfloat16 cases and our own implementations keep theirs."""
    from longrange.ops import check_cases
    from longrange.ops.checking import TF32_TOLERANCE, TOLERANCE

    for op in external.SOURCES:
        monkeypatch.setitem(external._probed, (op, "cuda"), (lambda *a, **k: None, None))
    for dtype in (torch.float32, torch.bfloat16):
        cases = {(c.op, c.impl): c for c in check_cases.matrix_state_cases("cuda", dtype)}
        for op, impl in (("ssd", "mamba"), ("gla", "fla"), ("delta_rule", "fla"), ("gated_delta_rule", "fla")):
            assert cases[op, impl].tol == (TF32_TOLERANCE if dtype == torch.float32 else TOLERANCE[dtype])
            assert cases[op, "chunk"].tol == TOLERANCE[dtype]
        assert cases["mamba3", "mamba"].tol == TOLERANCE[torch.bfloat16]
    assert TOLERANCE[torch.float32] < 1.9e-3 < TF32_TOLERANCE < TOLERANCE[torch.bfloat16]
