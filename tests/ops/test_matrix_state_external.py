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


def test_a_kernel_with_non_finite_gradients_is_not_usable(monkeypatch):
    def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False):
        return q.sqrt() * 0 + v, None  # sqrt of negative entries: NaN gradients, finite outputs

    _fake_fla(monkeypatch, chunk_delta_rule)
    fn, reason = external._probe("delta_rule", torch.device("cpu"))
    assert fn is None and "non-finite outputs or gradients" in reason


def test_a_kernel_that_computes_another_function_is_not_usable(monkeypatch):
    """A maintained kernel must agree with our chunked form on the probe's float32 input: one whose
    layout or definition differs (here: the keys and values swapped) is not used, and says why."""
    from longrange.ops.matrix_state import delta_rule

    def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False):
        return delta_rule.delta_rule_chunk(q, v, k, beta), None  # keys and values swapped

    _fake_fla(monkeypatch, chunk_delta_rule)
    fn, reason = external._probe("delta_rule", torch.device("cpu"))
    assert fn is None and "differs from the chunked PyTorch form" in reason


def test_a_kernel_that_agrees_with_the_chunked_form_is_usable(monkeypatch):
    from longrange.ops.matrix_state import delta_rule

    def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False):
        return delta_rule.delta_rule_chunk(q, k, v, beta, scale), None

    _fake_fla(monkeypatch, chunk_delta_rule)
    fn, reason = external._probe("delta_rule", torch.device("cpu"))
    assert reason is None and fn is not None
