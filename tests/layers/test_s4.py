"""S4 layer: dense-matrix kernel reference, recurrent == convolutional mode at every length,
causality, padding, gradients, hints, errors; tying across channels and Δ under softplus."""

import math

import pytest
import torch

from longrange.errors import ConfigError
from longrange.layers.base import get_optim_hint
from longrange.layers.check_cases import step_through
from longrange.layers.hippo import legs_matrices, legs_nplr
from longrange.layers.s4 import S4
from longrange.ops.ssm_kernels import bilinear_dense, c_tilde_to_c, dense_ssm_kernel_ref

F64, C128 = torch.float64, torch.complex128


def _dense_reference_kernel(layer, L):
    """Kernel from the dense conjugate-complete Ā, B̄ and C = C̃ (I - Ā^l_max)^{-1}, by recurrence."""
    dA, dB, C_tilde = layer.dense_ssm()
    C = c_tilde_to_c(C_tilde, dA, layer.l_max)
    K = dense_ssm_kernel_ref(dA, dB, C, L)
    assert K.imag.abs().max() < 1e-9
    return K.real


def test_output_shape_and_dtype():
    y = S4(4, d_state=8, l_max=16)(torch.randn(2, 11, 4))
    assert y.shape == (2, 11, 4) and y.dtype == torch.float32


@pytest.mark.parametrize("L", [5, 16, 40])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_layer_kernel_equals_dense_reference(L, bidirectional):
    torch.manual_seed(L)
    layer = S4(3, d_state=8, l_max=16, dt_min=0.01, dt_max=0.3, bidirectional=bidirectional).double()
    torch.testing.assert_close(layer.kernel(L), _dense_reference_kernel(layer, L), rtol=1e-9, atol=1e-9)


def test_initial_layer_is_the_hippo_legs_ssm():
    """At init, Λ - P P^H in the eigenbasis is HiPPO-LegS: the kernel equals that of the dense
    real LegS SSM with the output vector mapped back to the original basis."""
    torch.manual_seed(0)
    N, H, L = 8, 2, 12
    default = torch.get_default_dtype()
    torch.set_default_dtype(F64)  # keep the init exact: float32 storage would round Λ, P, B
    try:
        layer = S4(H, d_state=N, l_max=L)
    finally:
        torch.set_default_dtype(default)
    _, _, _, V = legs_nplr(N)
    V_full = torch.cat([V, V.conj()], dim=-1)
    A, B = legs_matrices(N)
    dA, dB = bilinear_dense(layer.log_dt.exp(), A.to(C128).expand(H, N, N), B.to(C128).expand(H, N))
    lay_dA, _, C_tilde = layer.dense_ssm()
    C_eig = c_tilde_to_c(C_tilde, lay_dA, L)  # (1, H, N) in the eigenbasis
    C_orig = C_eig @ V_full.conj().T  # y = C_eig x̃ = C_eig V^H x
    assert C_orig.imag.abs().max() < 1e-10
    expected = dense_ssm_kernel_ref(dA, dB, C_orig, L).real
    torch.testing.assert_close(layer.kernel(L), expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("L", [7, 12, 29])
@pytest.mark.parametrize("rank, tie_pq", [(1, True), (2, False)])
def test_step_equals_forward_at_lengths_around_l_max(L, rank, tie_pq):
    torch.manual_seed(L + rank)
    layer = S4(3, d_state=6, rank=rank, tie_pq=tie_pq, l_max=12, dt_min=0.01, dt_max=0.5).double()
    if rank > 1:  # move P, Q away from the init so the extra rank and the untied Q matter
        with torch.no_grad():
            layer.P.add_(0.3 * torch.randn_like(layer.P))
            layer.Q.add_(0.3 * torch.randn_like(layer.Q))
    x = torch.randn(2, L, 3, dtype=F64)
    torch.testing.assert_close(step_through(layer, x), layer(x), rtol=1e-9, atol=1e-9)


def test_step_cache_follows_parameter_updates():
    torch.manual_seed(1)
    layer = S4(2, d_state=4, l_max=8).double()
    x = torch.randn(1, 8, 2, dtype=F64)
    with torch.no_grad():
        step_through(layer, x)
        layer.C_tilde.mul_(2.0)
        layer.log_dt.add_(0.1)
        stepped = step_through(layer, x)
        torch.testing.assert_close(stepped, layer(x), rtol=1e-9, atol=1e-9)


def test_gradients_through_step_mode():
    torch.manual_seed(2)
    layer = S4(2, d_state=4, l_max=6).double()
    step_through(layer, torch.randn(1, 6, 2, dtype=F64)).sum().backward()
    assert layer.C_tilde.grad is not None and layer.Lambda_imag.grad is not None


def test_causal_output_does_not_depend_on_future_inputs():
    torch.manual_seed(3)
    layer = S4(2, d_state=4, l_max=6).double()
    J = torch.autograd.functional.jacobian(layer, torch.randn(1, 6, 2, dtype=F64))[0, :, :, 0]
    for t in range(5):
        assert J[t, :, t + 1 :].abs().max() < 1e-12
    for t in range(6):
        assert J[t, :, : t + 1].abs().max() > 1e-6


def test_bidirectional_output_depends_on_future_inputs():
    torch.manual_seed(4)
    layer = S4(2, d_state=4, l_max=6, bidirectional=True).double()
    J = torch.autograd.functional.jacobian(layer, torch.randn(1, 6, 2, dtype=F64))[0, :, :, 0]
    for t in range(5):
        assert J[t, :, t + 1 :].abs().max() > 1e-6


def test_bidirectional_backward_part_is_the_shifted_reverse_scan():
    torch.manual_seed(5)
    bi = S4(3, d_state=6, l_max=10, bidirectional=True).double()
    fwd = S4(3, d_state=6, l_max=10).double()
    bwd = S4(3, d_state=6, l_max=10, d_init="zeros").double()
    shared = {k: v for k, v in bi.state_dict().items() if k != "C_tilde"}
    fwd.load_state_dict({**shared, "C_tilde": bi.C_tilde[:1].detach()})
    bwd.load_state_dict({**shared, "D": torch.zeros(3, dtype=F64), "C_tilde": bi.C_tilde[1:].detach()})
    x = torch.randn(2, 10, 3, dtype=F64)
    z = bwd(x.flip(1)).flip(1)
    backward_part = torch.cat([z[:, 1:], torch.zeros_like(z[:, :1])], dim=1)
    torch.testing.assert_close(bi(x), fwd(x) + backward_part)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_padding_does_not_change_real_positions(bidirectional):
    torch.manual_seed(6)
    layer = S4(3, d_state=6, l_max=16, bidirectional=bidirectional).double()
    x = torch.randn(2, 9, 3, dtype=F64)
    padded = torch.cat([x, 100 * torch.randn(2, 7, 3, dtype=F64)], dim=1)
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[:, :9] = True
    torch.testing.assert_close(layer(padded, mask)[:, :9], layer(x), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("bidirectional, tie_pq", [(False, True), (True, False)])
def test_all_parameters_receive_gradients_and_carry_hints(bidirectional, tie_pq):
    torch.manual_seed(7)
    layer = S4(3, d_state=6, l_max=8, bidirectional=bidirectional, tie_pq=tie_pq)
    layer(torch.randn(2, 8, 3)).square().sum().backward()
    names = {name for name, _ in layer.named_parameters()}
    assert ("Q" in names) == (not tie_pq)
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        assert get_optim_hint(p)["group"] == ("no_decay" if name == "D" else "ssm"), name


def test_parameter_count():
    H, N = 5, 8
    assert sum(p.numel() for p in S4(H, N).parameters()) == H * (1 + N + N + N + N + 1)
    assert sum(p.numel() for p in S4(H, N, rank=2, tie_pq=False).parameters()) == H * (1 + N + 4 * N + N + N + 1)


def test_bad_inputs_raise():
    layer = S4(3, d_state=4, l_max=8)
    with pytest.raises(ValueError, match=r"\(batch, length, 3\)"):
        layer(torch.randn(2, 5, 2))
    state = layer.default_state(2)
    assert state.shape == (2, 3, 4)
    with pytest.raises(ValueError, match=r"\(batch, 3\)"):
        layer.step(torch.randn(2, 3, 1), state)
    with pytest.raises(ValueError, match="state of shape"):
        layer.step(torch.randn(2, 3), state[..., :2])
    with pytest.raises(RuntimeError, match="bidirectional"):
        S4(3, d_state=4, bidirectional=True).step(torch.randn(1, 3), state)
    with pytest.raises(ConfigError, match="L must be"):
        layer.kernel(0)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(d_state=3), "d_state"),
        (dict(rank=0), "rank"),
        (dict(l_max=0), "l_max"),
        (dict(real_transform="x"), "real_transform"),
        (dict(n_ssm=2), "n_ssm"),
        (dict(n_ssm=0), "n_ssm"),
        (dict(n_ssm=True), "n_ssm"),
        (dict(n_ssm_A=4), "n_ssm_A"),
        (dict(dt_transform="relu"), "dt_transform"),
    ],
)
def test_bad_config_raises(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        S4(3, **kwargs)


# ------------------------------------------------------------------ tying across channels (n_ssm)
def _tied(n_ssm=None, n_ssm_A=None, tie_pq=True, seed=0, **kw):
    torch.manual_seed(seed)
    return S4(
        6, d_state=8, l_max=16, n_ssm=n_ssm, n_ssm_A=n_ssm_A, tie_pq=tie_pq, dt_min=0.01, dt_max=0.3, **kw
    ).double()


def test_default_copies_are_today_s_layer_bitwise():
    """n_ssm = n_ssm_A = None and dt_transform exp are the untied layer: the same parameters (names,
    shapes, values: the same draws) and the same outputs; so are the explicit per-channel values."""
    torch.manual_seed(3)
    x = torch.randn(2, 16, 6, dtype=F64)
    ref = _tied(seed=1)
    for layer in (_tied(seed=1, dt_transform="exp"), _tied(n_ssm=6, n_ssm_A=6, seed=1)):
        assert [(n, p.shape) for n, p in layer.named_parameters()] == [(n, p.shape) for n, p in ref.named_parameters()]
        for (n, a), b in zip(layer.named_parameters(), ref.parameters()):
            assert torch.equal(a, b), n
        assert torch.equal(layer(x), ref(x))


def test_tied_copies_are_shared_by_the_channels_they_tile():
    """Channel h uses copy h mod n_ssm of (Λ, P, B), as the S4 code's repeat 't n -> (v t) n'; Δ
    and C̃ stay per channel; the kernel equals the dense reference and stepping equals forward."""
    layer = _tied(n_ssm=2)
    with torch.no_grad():  # move the copies apart, so that sharing is visible
        for p in (layer.Lambda_imag, layer.P, layer.B):
            p.add_(0.2 * torch.randn_like(p))
    assert layer.Lambda_real.shape == (2, 4) and layer.P.shape == (1, 2, 4, 2) and layer.B.shape == (2, 4, 2)
    assert layer.log_dt.shape == (6,) and layer.C_tilde.shape == (1, 6, 4, 2)
    _, Lambda, P, Q, B, _ = layer.ssm()
    for h in range(6):
        assert (
            torch.equal(Lambda[h], Lambda[h % 2]) and torch.equal(B[h], B[h % 2]) and torch.equal(P[:, h], P[:, h % 2])
        )
    assert not torch.equal(Lambda[0], Lambda[1])
    torch.testing.assert_close(layer.kernel(20), _dense_reference_kernel(layer, 20), rtol=1e-9, atol=1e-9)
    x = torch.randn(2, 20, 6, dtype=F64)
    torch.testing.assert_close(step_through(layer, x), layer(x), rtol=1e-9, atol=1e-9)
    # A gradient reaches every copy (from all the channels that use it).
    layer(x).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


def test_v1_tying_shares_lambda_only():
    """The original S4 code: one Λ for all channels, B, P and (untied) Q per channel."""
    layer = _tied(n_ssm_A=1, tie_pq=False)
    assert layer.Lambda_real.shape == layer.Lambda_imag.shape == (1, 4)
    assert layer.P.shape == layer.Q.shape == (1, 6, 4, 2) and layer.B.shape == (6, 4, 2)
    x = torch.randn(1, 16, 6, dtype=F64)
    torch.testing.assert_close(step_through(layer, x), layer(x), rtol=1e-9, atol=1e-9)


def test_tied_parameter_counts_are_the_s4_code_s():
    """The newer S4 code's SSMKernelDPLR with n_ssm = S (src/models/sequence/kernels/ssm.py,
    register_params): inv_dt H, A_real S·N/2, A_imag S·N/2, B S·N/2 complex, P r·S·N/2 complex, C
    channels·H·N/2 complex; the block's D is H per channel."""

    def s4_code(H, N, S, r=1, channels=1):
        return H + S * N // 2 + S * N // 2 + 2 * S * N // 2 + 2 * r * S * N // 2 + 2 * channels * H * N // 2 + H

    for H, N, S, bi in [(256, 4, 1, True), (512, 64, 2, True), (128, 64, 64, True), (128, 256, 2, False)]:
        layer = S4(H, d_state=N, n_ssm=S, bidirectional=bi)
        assert sum(p.numel() for p in layer.parameters()) == s4_code(H, N, S, channels=2 if bi else 1)


# ------------------------------------------------------------------ Δ under softplus (dt_transform)
def _float64_layer(seed, **kw):
    default = torch.get_default_dtype()
    torch.set_default_dtype(F64)  # store the init exactly
    try:
        torch.manual_seed(seed)
        return S4(3, d_state=4, l_max=8, dt_min=0.001, dt_max=0.1, **kw)
    finally:
        torch.set_default_dtype(default)


def test_softplus_dt_against_a_hand_computation():
    """inv_dt = log(exp(Δ) - 1) of the same log-uniform draw, Δ = log(1 + exp(inv_dt))."""
    ref, layer = _float64_layer(5), _float64_layer(5, dt_transform="softplus")
    assert "log_dt" not in dict(layer.named_parameters()) and layer.inv_dt.shape == (3,)
    for h in range(3):
        dt = math.exp(ref.log_dt[h].item())
        assert layer.inv_dt[h].item() == pytest.approx(math.log(math.exp(dt) - 1.0), rel=1e-12)
    # At init the two parameterisations are the same SSM.
    torch.testing.assert_close(layer.kernel(8), ref.kernel(8), rtol=1e-12, atol=1e-14)
    assert get_optim_hint(layer.inv_dt)["group"] == "ssm"
    with torch.no_grad():
        layer.inv_dt.copy_(torch.tensor([-3.0, 0.0, 2.0], dtype=F64))
    assert layer.ssm()[0].tolist() == pytest.approx([math.log1p(math.exp(v)) for v in (-3.0, 0.0, 2.0)], rel=1e-14)
