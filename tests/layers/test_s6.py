"""S6: initialisation, parameter count, step vs forward, causality, padding, RoPE routing, errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from longrange.errors import ConfigError
from longrange.layers.base import get_optim_hint
from longrange.layers.s6 import S6
from longrange.ops.scan import selective_scan_ref

F64 = dict(dtype=torch.float64)


def make(seed=0, **kw) -> S6:
    torch.manual_seed(seed)
    kw.setdefault("d_model", 6)
    kw.setdefault("d_state", 4)
    return S6(**kw).double()


def rand(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), **F64)


def test_parameter_count_formula():
    d, N = 40, 8
    r = math.ceil(d / 16)
    layer = S6(d, N)
    count = sum(p.numel() for p in layer.parameters())
    assert layer.dt_rank == r == 3
    assert count == d * (r + 2 * N) + (r * d + d) + d * N + d
    assert sum(p.numel() for p in S6(d, N, bidirectional=True).parameters()) == 2 * count
    assert S6(d, N, dt_rank=5).dt_rank == 5


def test_initialisation():
    torch.manual_seed(0)
    d, N = 64, 5
    layer = S6(d, N, dt_rank=4, dt_min=0.01, dt_max=0.05)
    torch.testing.assert_close(-torch.exp(layer.A_log), -torch.arange(1.0, N + 1).expand(d, N))
    torch.testing.assert_close(-torch.exp(S6(d, N, A_init="legs").A_log), torch.full((d, N), -0.5))
    assert torch.equal(layer.D.detach(), torch.ones(d))
    assert layer.dt_proj.weight.abs().max() <= 4**-0.5
    dt = F.softplus(layer.dt_proj.bias.detach())
    assert dt.min() >= 0.01 - 1e-6 and dt.max() <= 0.05 + 1e-6
    floored = S6(d, N, dt_min=1e-6, dt_max=2e-6, dt_init_floor=1e-3)
    torch.testing.assert_close(F.softplus(floored.dt_proj.bias.detach()), torch.full((d,), 1e-3))
    assert get_optim_hint(layer.A_log) == {"group": "ssm"}
    assert get_optim_hint(layer.D) == {"group": "no_decay"}
    assert get_optim_hint(layer.dt_proj.weight) == {}


def manual_forward(layer: S6, x, u=None, dt_src=None, B_src=None, C_src=None, **scan):
    """The S6 equations written out, with each quantity's source chosen explicitly."""
    r, N = layer.dt_rank, layer.d_state
    u = x if u is None else u
    W = layer.x_proj.weight
    dt_low = (x if dt_src is None else dt_src) @ W[:r].T
    B = (x if B_src is None else B_src) @ W[r : r + N].T
    C = (x if C_src is None else C_src) @ W[r + N :].T
    delta = dt_low @ layer.dt_proj.weight.T
    y = selective_scan_ref(
        u.transpose(1, 2),
        delta.transpose(1, 2),
        -torch.exp(layer.A_log),
        B.transpose(1, 2),
        C.transpose(1, 2),
        layer.D,
        delta_bias=layer.dt_proj.bias,
        delta_softplus=True,
        **scan,
    )
    return y.transpose(1, 2)


def test_forward_matches_equations_and_reference_path():
    layer = make()
    x = rand(2, 9, 6)
    y = layer(x)
    assert y.shape == x.shape and y.dtype == torch.float64
    torch.testing.assert_close(y, manual_forward(layer, x), rtol=1e-10, atol=1e-10)
    slow = make(scan_impl="ref")
    torch.testing.assert_close(slow(x), y, rtol=1e-10, atol=1e-10)


def step_through(layer, x, x_rot=None):
    state = layer.default_state(x.shape[0])
    assert state.shape == (x.shape[0], layer.d_model, layer.d_state) and state.dtype == torch.float64
    ys = []
    for t in range(x.shape[1]):
        y_t, state = layer.step(x[:, t], state, None if x_rot is None else x_rot[:, t])
        ys.append(y_t)
    return torch.stack(ys, 1)


def test_step_equals_forward():
    layer = make()
    x = rand(3, 11, 6)
    torch.testing.assert_close(step_through(layer, x), layer(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("targets", [("B",), ("C",), ("delta",), ("x",), ("B", "C", "delta", "x")])
def test_step_equals_forward_with_rotated_input(targets):
    layer = make(rope_targets=targets)
    x, x_rot = rand(2, 8, 6), rand(2, 8, 6, seed=2)
    torch.testing.assert_close(step_through(layer, x, x_rot), layer(x, x_rot=x_rot), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("target,route", [("B", "B_src"), ("C", "C_src"), ("delta", "dt_src"), ("x", "u")])
def test_rope_targets_route_only_the_named_quantity(target, route):
    layer = make(rope_targets=(target,))
    x, x_rot = rand(2, 7, 6), rand(2, 7, 6, seed=3)
    y = layer(x, x_rot=x_rot)
    torch.testing.assert_close(y, manual_forward(layer, x, **{route: x_rot}), rtol=1e-10, atol=1e-10)
    assert not torch.allclose(y, layer(x))
    # without x_rot everything comes from x
    torch.testing.assert_close(layer(x), manual_forward(layer, x), rtol=1e-10, atol=1e-10)


def test_rope_target_B_changes_output_only_through_B():
    layer = make(rope_targets=("B",))
    x, r1, r2 = rand(1, 6, 6), rand(1, 6, 6, seed=4), rand(1, 6, 6, seed=5)
    # Zero B's rows of x_proj: the rotated input then has no path to the output.
    with torch.no_grad():
        layer.x_proj.weight[layer.dt_rank : layer.dt_rank + layer.d_state] = 0
    torch.testing.assert_close(layer(x, x_rot=r1), layer(x, x_rot=r2))


def test_causal_output_ignores_future_inputs():
    layer = make()
    x = rand(2, 10, 6).requires_grad_()
    y = layer(x)
    t = 4
    (grad,) = torch.autograd.grad(y[:, t].sum(), x)
    assert grad[:, t + 1 :].abs().max() == 0
    assert grad[:, : t + 1].abs().sum(-1).min() > 0


def test_bidirectional_output_depends_on_later_inputs():
    layer = make(bidirectional=True)
    assert layer.bidirectional and not layer.causal
    x = rand(2, 10, 6).requires_grad_()
    (grad,) = torch.autograd.grad(layer(x)[:, 4].sum(), x)
    assert grad[:, 5:].abs().sum(-1).min() > 0 and grad[:, :4].abs().sum(-1).min() > 0


def test_bidirectional_is_sum_of_two_independent_directions():
    layer = make(bidirectional=True, rope_targets=("C",))
    fwd, bwd = layer.directions.fwd, layer.directions.bwd
    assert not torch.equal(fwd.dt_proj.bias, bwd.dt_proj.bias)
    x, x_rot = rand(2, 7, 6), rand(2, 7, 6, seed=6)
    expected = fwd(x, x_rot=x_rot) + bwd(x.flip(1), x_rot=x_rot.flip(1)).flip(1)
    torch.testing.assert_close(layer(x, x_rot=x_rot), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_padding_does_not_change_real_positions(bidirectional):
    layer = make(bidirectional=bidirectional, rope_targets=("B", "x"))
    lengths = [5, 8]
    x, x_rot = rand(2, 8, 6), rand(2, 8, 6, seed=7)
    extra = 4  # more padding after every sequence, filled with garbage
    x_long = torch.cat([x, rand(2, extra, 6, seed=8)], 1)
    x_rot_long = torch.cat([x_rot, rand(2, extra, 6, seed=9)], 1)
    mask = torch.arange(8)[None] < torch.tensor(lengths)[:, None]
    mask_long = torch.arange(8 + extra)[None] < torch.tensor(lengths)[:, None]
    x_garbage = torch.where(mask[..., None], x, rand(2, 8, 6, seed=10))
    y = layer(x_garbage, mask, x_rot=x_rot)
    y_long = layer(x_long, mask_long, x_rot=x_rot_long)
    for i, n in enumerate(lengths):
        torch.testing.assert_close(y_long[i, :n], y[i, :n], rtol=1e-10, atol=1e-10)
        # the same sequence alone, unpadded
        alone = layer(x[i : i + 1, :n], x_rot=x_rot[i : i + 1, :n])
        torch.testing.assert_close(y[i, :n], alone[0], rtol=1e-10, atol=1e-10)


def test_padded_positions_are_zeroed_before_the_scan():
    layer = make()
    x = rand(1, 6, 6)
    mask = torch.tensor([[True, True, True, False, False, False]])
    y = layer(x, mask)
    torch.testing.assert_close(y, layer(x * mask[..., None]))
    assert torch.equal(y[0, 3:], torch.zeros(3, 6, **F64))


def test_gradients_reach_every_parameter():
    for layer in (make(), make(bidirectional=True), make(rope_targets=("B", "C", "delta", "x"))):
        x = rand(2, 9, 6)
        kwargs = {"x_rot": rand(2, 9, 6, seed=2)} if layer.rope_targets else {}
        layer(x, **kwargs).square().sum().backward()
        for name, p in layer.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_float32_module_runs_in_float32():
    torch.manual_seed(0)
    layer = S6(8, 4)
    y = layer(torch.randn(2, 5, 8))
    assert y.dtype == torch.float32 and torch.isfinite(y).all()


def test_bad_configuration_raises():
    with pytest.raises(ConfigError, match="unknown rope_targets"):
        S6(8, rope_targets=("B", "q"))
    with pytest.raises(ConfigError, match="rope_targets"):
        S6(8, rope_targets="B")
    with pytest.raises(ConfigError, match="A_init"):
        S6(8, A_init="lin")
    with pytest.raises(ConfigError, match="dt_rank"):
        S6(8, dt_rank=0)
    with pytest.raises(ConfigError, match="dt_rank"):
        S6(8, dt_rank="big")
    with pytest.raises(ConfigError, match="d_state"):
        S6(8, d_state=0)
    with pytest.raises(ConfigError, match="dt_min"):
        S6(8, dt_min=0.1, dt_max=0.01)
    with pytest.raises(ConfigError, match="scan_impl"):
        S6(8, scan_impl="fast")


@pytest.mark.parametrize("bidirectional", [False, True])
def test_scan_impl_ref_runs_the_reference_loop(monkeypatch, bidirectional):
    from longrange.ops.scan import dispatch as scan

    calls = []

    def spy(*args, **kwargs):
        calls.append(1)
        return selective_scan_ref(*args, **kwargs)

    monkeypatch.setattr(scan, "selective_scan_ref", spy)
    x = rand(2, 5, 6)
    make(bidirectional=bidirectional)(x)
    assert calls == []  # the default takes a fast path
    make(bidirectional=bidirectional, scan_impl="ref")(x)
    assert len(calls) == (2 if bidirectional else 1)


def test_bad_inputs_raise():
    layer = make()
    with pytest.raises(ValueError, match=r"\(batch, length, 6\)"):
        layer(rand(2, 5, 7))
    with pytest.raises(ValueError, match="rope_targets is empty"):
        layer(rand(2, 5, 6), x_rot=rand(2, 5, 6))
    rope = make(rope_targets=("B",))
    with pytest.raises(ValueError, match="x_rot must have the shape"):
        rope(rand(2, 5, 6), x_rot=rand(2, 4, 6))
    with pytest.raises(ValueError, match="mask"):
        layer(rand(2, 5, 6), torch.ones(2, 4, dtype=torch.bool))
    state = layer.default_state(2)
    with pytest.raises(ValueError, match=r"x of shape \(batch, 6\)"):
        layer.step(rand(2, 7), state)
    with pytest.raises(ValueError, match="state of shape"):
        layer.step(rand(2, 6), state[:, :, :2])
    with pytest.raises(ValueError, match="x_rot_t must have the shape"):
        rope.step(rand(2, 6), state, rand(2, 5))
    bi = make(bidirectional=True)
    with pytest.raises(RuntimeError, match="no recurrent"):
        bi.default_state(2)
    with pytest.raises(RuntimeError, match="no recurrent"):
        bi.step(rand(2, 6), state)


# ---------------------------------------------------------------------- eigenvalues in [-1, 1]
def test_negative_eigenvalues_take_the_decay_2_exp_minus_1():
    """allow_neg_eigval (Grazzi et al.'s Mamba [-1, 1]): the reference scan with decay 2 exp(delta A) - 1,
    forward and step; gradients reach every parameter; the default layer is unchanged."""
    layer = make(allow_neg_eigval=True)
    with torch.no_grad():
        layer.dt_proj.bias.fill_(2.0)  # softplus(delta) near 2: decays exp(-2 n) - well below 1/2, so negative
    x = rand(2, 9, 6)
    y = layer(x)
    torch.testing.assert_close(y, manual_forward(layer, x, negative_eigenvalues=True), rtol=1e-10, atol=1e-10)
    assert not torch.allclose(y, manual_forward(layer, x))
    torch.testing.assert_close(step_through(layer, x), y, rtol=1e-10, atol=1e-10)
    y.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())
    plain = make()
    torch.testing.assert_close(plain(x), manual_forward(plain, x), rtol=1e-10, atol=1e-10)


def test_negative_eigenvalues_with_the_gate_and_both_directions():
    layer = make(allow_neg_eigval=True)
    x, gate = rand(2, 7, 6), rand(2, 7, 6, seed=5)
    torch.testing.assert_close(layer(x, gate=gate), layer(x) * F.silu(gate), rtol=1e-10, atol=1e-10)
    both = make(allow_neg_eigval=True, bidirectional=True)
    assert all(d.allow_neg_eigval for d in both.directions.modules() if isinstance(d, S6) and d is not both)
    assert both(x).shape == x.shape


def test_negative_eigenvalues_refuse_a_scan_implementation():
    with pytest.raises(ConfigError, match=r"S6: scan_impl 'numba' computes the decay exp\(delta A\); allow_neg_eigval"):
        S6(4, 2, allow_neg_eigval=True, scan_impl="numba")
    with pytest.raises(ConfigError, match="S6: allow_neg_eigval must be true or false, got 1"):
        S6(4, 2, allow_neg_eigval=1)
