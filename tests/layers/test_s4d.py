"""S4D layer: shapes, recurrent == convolutional mode, causality, padding, gradients, hints, errors."""

import math

import pytest
import torch

from longrange.errors import ConfigError
from longrange.layers.base import get_optim_hint
from longrange.layers.check_cases import step_through
from longrange.layers.hippo import S4D_INITS
from longrange.layers.s4d import S4D
from longrange.ops.ssm_kernels import diag_ssm_kernel_ref

F64 = torch.float64


def test_output_shape_and_dtype():
    layer = S4D(4, d_state=8)
    y = layer(torch.randn(2, 13, 4))
    assert y.shape == (2, 13, 4) and y.dtype == torch.float32


@pytest.mark.parametrize("init", S4D_INITS)
@pytest.mark.parametrize("discretization", ["zoh", "bilinear"])
def test_step_equals_forward(init, discretization):
    torch.manual_seed(0)
    layer = S4D(3, d_state=8, init=init, discretization=discretization, dt_min=0.01, dt_max=0.5).double()
    x = torch.randn(2, 17, 3, dtype=F64)
    torch.testing.assert_close(step_through(layer, x), layer(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("real_transform", ["exp", "relu", "none"])
def test_layer_kernel_matches_recurrence_reference(real_transform):
    torch.manual_seed(1)
    layer = S4D(3, d_state=6, real_transform=real_transform, bidirectional=True).double()
    dt, A, B, C = layer.ssm()
    assert (A.real < 0).all()
    torch.testing.assert_close(layer.kernel(9), diag_ssm_kernel_ref(dt, A, B, C, 9, "zoh"))


def _jacobian(layer, x):
    return torch.autograd.functional.jacobian(lambda inp: layer(inp), x)  # (1, L, H, 1, L, H)


def test_causal_output_does_not_depend_on_future_inputs():
    torch.manual_seed(2)
    layer = S4D(2, d_state=4).double()
    J = _jacobian(layer, torch.randn(1, 6, 2, dtype=F64))[0, :, :, 0]  # (t, h, s, h')
    for t in range(5):
        assert J[t, :, t + 1 :].abs().max() < 1e-12  # FFT rounding only
    for t in range(6):
        assert J[t, :, : t + 1].abs().max() > 1e-6


def test_bidirectional_output_depends_on_future_inputs():
    torch.manual_seed(3)
    layer = S4D(2, d_state=4, bidirectional=True).double()
    J = _jacobian(layer, torch.randn(1, 6, 2, dtype=F64))[0, :, :, 0]
    for t in range(5):
        assert J[t, :, t + 1 :].abs().max() > 1e-6


def test_bidirectional_backward_part_is_the_shifted_reverse_scan():
    """The backward kernel acts as a causal SSM with the second C run on the reversed sequence,
    seen one step later: y_bwd[t] = sum_{s>t} k_bwd[s-t-1] u[s]."""
    torch.manual_seed(4)
    bi = S4D(3, d_state=6, bidirectional=True).double()
    fwd = S4D(3, d_state=6).double()
    bwd = S4D(3, d_state=6, d_init="zeros").double()
    state = {k: v for k, v in bi.state_dict().items() if k != "C"}
    fwd.load_state_dict({**state, "C": bi.C[:1].detach()})
    bwd.load_state_dict({**state, "D": torch.zeros(3, dtype=F64), "C": bi.C[1:].detach()})
    x = torch.randn(2, 9, 3, dtype=F64)
    z = bwd(x.flip(1)).flip(1)
    backward_part = torch.cat([z[:, 1:], torch.zeros_like(z[:, :1])], dim=1)
    torch.testing.assert_close(bi(x), fwd(x) + backward_part)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_padding_does_not_change_real_positions(bidirectional):
    torch.manual_seed(5)
    layer = S4D(3, d_state=6, bidirectional=bidirectional).double()
    x = torch.randn(2, 7, 3, dtype=F64)
    padded = torch.cat([x, 100 * torch.randn(2, 5, 3, dtype=F64)], dim=1)
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[:, :7] = True
    torch.testing.assert_close(layer(padded, mask)[:, :7], layer(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_all_parameters_receive_gradients_and_carry_hints(bidirectional):
    torch.manual_seed(6)
    layer = S4D(3, d_state=6, init="lin", bidirectional=bidirectional)
    layer(torch.randn(2, 10, 3)).square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        expected = "no_decay" if name == "D" else "ssm"
        assert get_optim_hint(p)["group"] == expected, name
    # weight decay and learning rate come from the trainer's "ssm" group unless pinned
    assert "weight_decay" not in get_optim_hint(layer.log_dt)


def test_lr_scale_hint_override():
    layer = S4D(2, d_state=4, ssm_lr_scale=0.1)
    assert get_optim_hint(layer.A_imag)["lr_scale"] == 0.1
    assert "lr_scale" not in get_optim_hint(layer.D)


def test_parameter_count():
    H, N = 5, 8
    assert sum(p.numel() for p in S4D(H, N).parameters()) == H * (1 + N + N + N + 1)
    assert sum(p.numel() for p in S4D(H, N, bidirectional=True).parameters()) == H * (1 + N + N + 2 * N + 1)


def test_dt_initialised_in_range():
    layer = S4D(200, d_state=4, dt_min=0.001, dt_max=0.1)
    dt = layer.log_dt.exp()
    assert dt.min() >= 0.001 * (1 - 1e-6) and dt.max() <= 0.1 * (1 + 1e-6)


def test_softplus_dt_against_a_hand_computation():
    """dt_transform softplus stores inv_dt = log(exp(Δ) - 1) of the same draw; Δ = log(1 + exp(inv_dt))."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(2)
        ref = S4D(4, d_state=4, init="lin")
        torch.manual_seed(2)
        layer = S4D(4, d_state=4, init="lin", dt_transform="softplus")
    finally:
        torch.set_default_dtype(default)
    assert "log_dt" not in dict(layer.named_parameters())
    for h in range(4):
        assert layer.inv_dt[h].item() == pytest.approx(math.log(math.expm1(math.exp(ref.log_dt[h].item()))), rel=1e-12)
    torch.testing.assert_close(layer.kernel(10), ref.kernel(10), rtol=1e-12, atol=1e-14)
    with torch.no_grad():
        layer.inv_dt.copy_(torch.tensor([-2.0, -0.5, 0.5, 3.0]))
    assert layer.ssm()[0].tolist() == pytest.approx(
        [math.log1p(math.exp(v)) for v in (-2.0, -0.5, 0.5, 3.0)], rel=1e-14
    )


def test_float32_forward_close_to_float64():
    torch.manual_seed(7)
    layer = S4D(3, d_state=8)
    x = torch.randn(2, 30, 3)
    y32 = layer(x)
    y64 = layer.double()(x.double())
    torch.testing.assert_close(y32.double(), y64, rtol=1e-4, atol=1e-4)


def test_bad_inputs_raise():
    layer = S4D(3, d_state=4)
    with pytest.raises(ValueError, match=r"\(batch, length, 3\)"):
        layer(torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match=r"\(batch, length, 3\)"):
        layer(torch.randn(5, 3))
    with pytest.raises(ValueError, match="mask"):
        layer(torch.randn(2, 5, 3), torch.ones(2, 4, dtype=torch.bool))
    state = layer.default_state(2)
    with pytest.raises(ValueError, match=r"\(batch, 3\)"):
        layer.step(torch.randn(2, 4), state)
    with pytest.raises(ValueError, match="state of shape"):
        layer.step(torch.randn(3, 3), state)
    with pytest.raises(RuntimeError, match="bidirectional"):
        S4D(3, d_state=4, bidirectional=True).default_state(1)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(d_state=5), "d_state"),
        (dict(d_state=0), "d_state"),
        (dict(init="hippo"), "init"),
        (dict(discretization="euler"), "discretization"),
        (dict(real_transform="softplus"), "real_transform"),
        (dict(d_init="two"), "d_init"),
        (dict(dt_min=0.2, dt_max=0.1), "dt_min"),
        (dict(dt_transform="sigmoid"), "dt_transform"),
    ],
)
def test_bad_config_raises(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        S4D(3, **kwargs)
    with pytest.raises(ConfigError, match="d_model"):
        S4D(0)


@pytest.mark.parametrize("name", ["s4", "s4d", "dlr"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_the_convolutional_layers_return_their_output_laid_out_as_it_is_shaped(name, bidirectional):
    """(batch, length, d_model) in memory as well as in shape: a transposed view here made the GELU of
    the Simple block after it, and its backward, several times slower (docs/small-models.md, "Second round")."""
    from longrange.models.backbone import make_primitive

    layer = make_primitive(name, 8, d_state=4, bidirectional=bidirectional)
    y = layer(torch.randn(2, 16, 8))
    assert y.shape == (2, 16, 8) and y.is_contiguous()
