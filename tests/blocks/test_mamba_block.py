"""The Mamba block's SiLU gate applied inside S6's scan (``fused_gate``) against the block's own
product ``y * silu(z)``: the same values and gradients, with and without padding and RoPE."""

from __future__ import annotations

import copy

import pytest
import torch

from longrange.blocks.mamba import MambaBlock, RopeOptions
from longrange.layers.s4d import S4D
from longrange.layers.s6 import S6

pytestmark = pytest.mark.usefixtures("float64_default")  # tests/conftest.py


def _pair(rope: RopeOptions | None = None, impl: str | None = None) -> tuple[MambaBlock, MambaBlock]:
    torch.manual_seed(0)
    fused = MambaBlock(
        6, make_ssm=lambda width: S6(width, d_state=3, rope_targets=("B", "x"), scan_impl=impl), rope=rope
    )
    plain = copy.deepcopy(fused)
    plain.fused_gate = False
    return fused, plain


@pytest.mark.parametrize("impl", ["numba", "chunked", "ref"])
@pytest.mark.parametrize("rope", [None, RopeOptions(targets=("B", "x"))], ids=["no-rope", "rope"])
def test_the_gate_inside_the_scan_equals_the_block_s_product(impl, rope):
    if impl == "numba":
        pytest.importorskip("numba")
    fused, plain = _pair(rope, impl)
    assert fused.fused_gate and not plain.fused_gate
    x = torch.randn(2, 9, 6)
    mask = torch.tensor([[True] * 9, [True] * 6 + [False] * 3])
    for m in (None, mask):
        outs = []
        for block in (fused, plain):
            block.zero_grad()
            xi = x.clone().requires_grad_()
            y = block(xi, m)
            (y * torch.linspace(-1, 1, 6)).sum().backward()
            outs.append((y, xi.grad, {n: p.grad.clone() for n, p in block.named_parameters()}))
        torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-10, atol=1e-12)
        for name, grad in outs[1][2].items():
            torch.testing.assert_close(outs[0][2][name], grad, rtol=1e-9, atol=1e-12, msg=name)


def test_the_gate_stays_outside_for_two_branches_and_for_ssms_without_it():
    assert not MambaBlock(6, make_ssm=lambda width: S6(width, d_state=3), direction="bidirectional").fused_gate
    assert not MambaBlock(6, make_ssm=lambda width: S6(width, d_state=3), direction="placebo").fused_gate
    assert not MambaBlock(6, make_ssm=lambda width: S4D(width, d_state=4)).fused_gate


def test_a_gate_of_the_wrong_shape_or_on_a_bidirectional_s6_is_an_error():
    x = torch.randn(2, 5, 6)
    with pytest.raises(ValueError, match=r"gate must have the input's shape \(2, 5, 6\).*got \(2, 5, 7\)"):
        S6(6, d_state=3)(x, gate=torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match="bidirectional"):
        S6(6, d_state=3, bidirectional=True)(x, gate=torch.randn(2, 5, 6))
