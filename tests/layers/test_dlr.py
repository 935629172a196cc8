"""DLR layer: kernel vs recurrence, recurrent == convolutional mode, causality, padding,
gradients, hints, errors."""

import math

import pytest
import torch

from longrange.errors import ConfigError
from longrange.layers.base import get_optim_hint
from longrange.layers.check_cases import step_through
from longrange.layers.dlr import DLR
from longrange.ops.ssm_kernels import vandermonde_kernel, vandermonde_kernel_ref

F64 = torch.float64


def test_output_shape_and_dtype():
    y = DLR(4, d_state=8)(torch.randn(2, 11, 4))
    assert y.shape == (2, 11, 4) and y.dtype == torch.float32


@pytest.mark.parametrize("chunk_bytes", [None, 1], ids=["one-group", "channel-by-channel"])
@pytest.mark.parametrize("shared", [True, False])
def test_vandermonde_kernel_matches_recurrence_values_and_gradients(shared, chunk_bytes):
    torch.manual_seed(0)
    log_dA = torch.complex(-torch.rand(1 if shared else 3, 4, dtype=F64), torch.randn(1 if shared else 3, 4, dtype=F64))
    W = torch.randn(2, 3, 4, dtype=torch.complex128)
    cot = torch.randn(2, 3, 10, dtype=F64)
    outs, grads = [], []
    fast = vandermonde_kernel if chunk_bytes is None else (lambda *a: vandermonde_kernel(*a, chunk_bytes=chunk_bytes))
    for fn in (fast, vandermonde_kernel_ref):
        a, w = log_dA.clone().requires_grad_(True), W.clone().requires_grad_(True)
        y = fn(a, w, 10)
        (y * cot).sum().backward()
        outs.append(y.detach())
        grads.append((a.grad, w.grad))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-10, atol=1e-12)
    for g0, g1 in zip(*grads):
        torch.testing.assert_close(g0, g1, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="vandermonde_kernel"):
        vandermonde_kernel(log_dA[:, :3], W, 5)


@pytest.mark.parametrize("init", ["structured", "random"])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("use_skip", [True, False])
def test_step_equals_forward(init, shared, use_skip):
    torch.manual_seed(1)
    layer = DLR(3, d_state=8, init=init, shared_modes=shared, use_skip=use_skip, dt_min=0.01).double()
    x = torch.randn(2, 19, 3, dtype=F64)
    torch.testing.assert_close(step_through(layer, x), layer(x), rtol=1e-10, atol=1e-10)


def test_inits():
    torch.manual_seed(2)
    M = 8
    structured = DLR(2, d_state=2 * M, init="structured", dt_min=1e-4, dt_max=0.1)
    lam = structured.log_lambda().exp()
    assert lam.shape == (1, M)
    assert (lam.abs() <= 1).all() and (lam.abs() > math.exp(-0.05) - 1e-6).all()
    torch.testing.assert_close(structured.theta[0], 2 * math.pi * torch.arange(M) / M)
    random = DLR(2, d_state=2 * M, init="random", shared_modes=False)
    assert random.theta.shape == (2, M)
    assert (random.theta >= 0).all() and (random.theta < 2 * math.pi).all()


def test_causal_output_does_not_depend_on_future_inputs():
    torch.manual_seed(3)
    layer = DLR(2, d_state=4).double()
    J = torch.autograd.functional.jacobian(layer, torch.randn(1, 6, 2, dtype=F64))[0, :, :, 0]
    for t in range(5):
        assert J[t, :, t + 1 :].abs().max() < 1e-12
    for t in range(6):
        assert J[t, :, : t + 1].abs().max() > 1e-6


def test_bidirectional_output_depends_on_future_inputs():
    torch.manual_seed(4)
    layer = DLR(2, d_state=4, bidirectional=True).double()
    J = torch.autograd.functional.jacobian(layer, torch.randn(1, 6, 2, dtype=F64))[0, :, :, 0]
    for t in range(5):
        assert J[t, :, t + 1 :].abs().max() > 1e-6


def test_bidirectional_backward_part_is_the_shifted_reverse_scan():
    torch.manual_seed(5)
    bi = DLR(3, d_state=6, bidirectional=True).double()
    fwd = DLR(3, d_state=6).double()
    bwd = DLR(3, d_state=6, use_skip=False).double()
    shared = {k: v for k, v in bi.state_dict().items() if k != "C"}
    fwd.load_state_dict({**shared, "C": bi.C[:1].detach()})
    bwd.load_state_dict({k: v for k, v in shared.items() if k != "D"} | {"C": bi.C[1:].detach()})
    x = torch.randn(2, 9, 3, dtype=F64)
    z = bwd(x.flip(1)).flip(1)
    backward_part = torch.cat([z[:, 1:], torch.zeros_like(z[:, :1])], dim=1)
    torch.testing.assert_close(bi(x), fwd(x) + backward_part)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_padding_does_not_change_real_positions(bidirectional):
    torch.manual_seed(6)
    layer = DLR(3, d_state=6, bidirectional=bidirectional).double()
    x = torch.randn(2, 7, 3, dtype=F64)
    padded = torch.cat([x, 100 * torch.randn(2, 6, 3, dtype=F64)], dim=1)
    mask = torch.zeros(2, 13, dtype=torch.bool)
    mask[:, :7] = True
    torch.testing.assert_close(layer(padded, mask)[:, :7], layer(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_all_parameters_receive_gradients_and_carry_hints(bidirectional):
    torch.manual_seed(7)
    layer = DLR(3, d_state=6, bidirectional=bidirectional)
    layer(torch.randn(2, 10, 3)).square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        assert get_optim_hint(p)["group"] == ("no_decay" if name == "D" else "ssm"), name


def test_parameter_count():
    H, N = 5, 8
    M = N // 2
    assert sum(p.numel() for p in DLR(H, N).parameters()) == 2 * M + H * N + H
    assert sum(p.numel() for p in DLR(H, N, shared_modes=False, use_skip=False).parameters()) == 2 * H * M + H * N


def test_bad_inputs_raise():
    layer = DLR(3, d_state=4)
    with pytest.raises(ValueError, match=r"\(batch, length, 3\)"):
        layer(torch.randn(2, 5, 2))
    state = layer.default_state(2)
    with pytest.raises(ValueError, match=r"\(batch, 3\)"):
        layer.step(torch.randn(2, 2), state)
    with pytest.raises(ValueError, match="state of shape"):
        layer.step(torch.randn(2, 3), state[:1])
    with pytest.raises(RuntimeError, match="bidirectional"):
        DLR(3, d_state=4, bidirectional=True).default_state(1)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(d_state=7), "d_state"),
        (dict(init="omega"), "init"),
        (dict(dt_min=0.0), "dt_min"),
        (dict(d_init="x"), "d_init"),
    ],
)
def test_bad_config_raises(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        DLR(3, **kwargs)
