"""BaseConv: the layer against its formula written out (values and gradients), step == forward,
what each direction sees, padding, its state, bad options, and Based's stack of it and linear
attention from its preset."""

from __future__ import annotations

import pytest
import torch

from longrange.errors import ConfigError
from longrange.layers import BaseConv
from longrange.layers.check_cases import step_through

pytestmark = pytest.mark.usefixtures("float64_default")  # tests/conftest.py


def layer(seed=0, **kw) -> BaseConv:
    torch.manual_seed(seed)
    return BaseConv(6, **kw).eval()


def zoology_features(l_max: int) -> torch.Tensor:
    """Zoology's PositionalEmbedding at emb_dim 3 (zoology/mixers/convolution.py), written out:
    time in [0, 1], and the cosine and minus the sine of one band at frequency 1e-4."""
    j = torch.arange(l_max, dtype=torch.float64)
    phase = 1e-4 * 2 * torch.pi * j / l_max
    return torch.stack([j / (l_max - 1), torch.cos(phase), -torch.sin(phase)], -1)


def long_filter(m: BaseConv, L: int) -> torch.Tensor:
    """(d, L): the implicit filter as Zoology's MLP over its features, or the explicit one."""
    c = m.conv
    if not c.implicit:
        return c.weight[:, :L]
    first, last = c.mlp[0], c.mlp[2]
    hidden = torch.relu(zoology_features(c.l_max)[:L] @ first.weight.T + first.bias)
    return (hidden @ last.weight.T + last.bias).T


def formula(m: BaseConv, x: torch.Tensor) -> torch.Tensor:
    """conv(u) * (W u + b) + u, the convolution as explicit sums over its taps."""
    K, L = m.kernel_size, x.shape[1]
    if m.conv_kind == "short":
        w, b = m.conv.weight, m.conv.bias  # (d, K): tap j reads the input K - 1 - j steps back
        conv = torch.stack(
            [b + sum(w[:, j] * x[:, t - (K - 1) + j] for j in range(K) if t - (K - 1) + j >= 0) for t in range(L)], 1
        )
    else:  # h * u + u, h at lag j weighing the input j steps back
        h = long_filter(m, L)
        conv = torch.stack([x[:, t] + sum(h[:, j] * x[:, t - j] for j in range(t + 1)) for t in range(L)], 1)
    proj = x @ m.projection.weight.T + m.projection.bias
    y = torch.nn.functional.silu(conv) * torch.nn.functional.silu(proj) if m.use_act else conv * proj
    return y + x if m.residual else y


LONG = [dict(conv="implicit", l_max=12), dict(conv="explicit", l_max=9, use_act=True)]


@pytest.mark.parametrize("kw", [{}, dict(use_act=True), dict(residual=False, kernel_size=4), *LONG])
def test_forward_is_the_gated_convolution(kw):
    m = layer(**kw)
    x = torch.randn(2, 9, 6, requires_grad=True)
    y, y_ref = m(x), formula(m, x)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    params = [x, *m.parameters()]
    grads = torch.autograd.grad(y.square().sum(), params)
    grads_ref = torch.autograd.grad(y_ref.square().sum(), params)
    for a, r in zip(grads, grads_ref):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("kernel_size", [1, 3, 5])
def test_step_equals_forward_and_keeps_the_last_inputs(kernel_size):
    m = layer(kernel_size=kernel_size, use_act=True)
    x = torch.randn(2, 8, 6)
    torch.testing.assert_close(step_through(m, x), m(x), rtol=1e-12, atol=1e-12)
    assert m.state_size(8) == 6 * (kernel_size - 1)


@pytest.mark.parametrize("kw", LONG)
def test_a_long_convolution_steps_as_it_runs_and_holds_every_input(kw):
    m = layer(**kw)
    x = torch.randn(2, 9, 6)
    torch.testing.assert_close(step_through(m, x), m(x), rtol=1e-12, atol=1e-12)
    assert m.state_size(8) == 6 * 8 and m.state_size(100) == 6 * kw["l_max"]  # Zoology's d x length
    assert "l_max=" in repr(m) and f"conv={kw['conv']}" in repr(m)


def test_a_long_convolution_refuses_inputs_longer_than_its_filter():
    m = layer(conv="implicit", l_max=5)
    with pytest.raises(ValueError, match=r"BaseConv: its long filter is defined over l_max=5 positions, asked for 6"):
        m(torch.randn(1, 6, 6))
    state = m.default_state(1)
    for _ in range(5):
        _, state = m.step(torch.randn(1, 6), state)
    with pytest.raises(ValueError, match=r"BaseConv: step at position 5 is beyond l_max=5"):
        m.step(torch.randn(1, 6), state)


def test_the_implicit_filter_s_features_are_fixed_and_its_network_trains():
    m = layer(conv="implicit", l_max=7)
    torch.testing.assert_close(m.conv.z, zoology_features(7))
    trained = {n for n, p in m.named_parameters()}
    assert "conv.z" not in trained and {"conv.mlp.0.weight", "conv.mlp.2.bias"} <= trained
    assert sum(p.numel() for p in m.conv.parameters()) == (3 * 16 + 16) + (16 * 6 + 6)


def test_bidirectional_sees_the_future_and_causal_does_not():
    x = torch.randn(1, 9, 6)
    later = x.clone()
    later[:, 6:] += torch.randn(1, 3, 6)
    for bidirectional in (False, True):
        changed = (layer(bidirectional=bidirectional)(later) - layer(bidirectional=bidirectional)(x)).abs().amax(-1)[0]
        assert torch.all(changed[6:] > 1e-8)
        if bidirectional:  # a window of 3: the two positions before the change see it
            assert torch.all(changed[4:6] > 1e-8) and torch.all(changed[:4] == 0)
        else:
            assert torch.all(changed[:6] == 0)


@pytest.mark.parametrize("kw", [{}, LONG[0]])
def test_outputs_at_real_positions_ignore_padding_and_padded_outputs_are_zero(kw):
    m = layer(**kw)
    x = torch.randn(2, 10, 6)
    mask = torch.arange(10) < torch.tensor([7, 4])[:, None]
    y = m(torch.where(mask[..., None], x, 50 * torch.randn_like(x)), mask)
    for b, n in enumerate([7, 4]):
        torch.testing.assert_close(y[b, :n], m(x[b : b + 1, :n])[0])
    assert torch.all(y[~mask] == 0)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(kernel_size=0), r"BaseConv: kernel_size must be a positive integer"),
        (dict(d_model=0), r"d_model"),
        (dict(conv="long"), r"BaseConv: conv must be one of \('short', 'implicit', 'explicit'\), got 'long'"),
        (dict(conv="implicit"), r"BaseConv: conv='implicit' needs l_max, the longest input"),
        (dict(conv="explicit", l_max=0), r"BaseConv: l_max must be a positive integer"),
        (dict(conv="implicit", l_max=8, emb_dim=4), r"BaseConv: emb_dim must be odd and >= 3"),
    ],
)
def test_bad_options_name_themselves(kw, match):
    with pytest.raises(ConfigError, match=match):
        BaseConv(**{"d_model": 6, **kw})


def test_based_preset_alternates_base_conv_and_taylor_linear_attention():
    from longrange.experiment.config import resolve
    from longrange.models import layer_report
    from longrange.models.model import build_model

    exp = resolve("demo/recall/based")
    from longrange.layers import LinearAttention

    model = build_model(exp.model, input_kind="tokens", vocab_size=32, head="classify", n_out=32)
    rows = layer_report(model, seq_len=24)
    assert [r["name"] for r in rows] == ["base-conv", "linear-attention"]
    (attention,) = [m for m in model.modules() if isinstance(m, LinearAttention)]
    assert (attention.feature_map, attention.f, attention.n_heads, attention.values) == ("taylor", 16, 1, 64)
    assert rows[0]["state"] == 64 * 2 and rows[1]["state"] == (1 + 16 + 136) * (64 + 1)


def test_zoology_s_figure_2_base_conv_preset_is_a_short_then_an_implicit_long_convolution():
    from longrange.experiment.config import resolve
    from longrange.models import layer_report
    from longrange.models.model import build_model

    exp = resolve("demo/recall/base-conv")
    model = build_model(exp.model, input_kind="tokens", vocab_size=32, head="classify", n_out=32)
    convs = [m for m in model.modules() if isinstance(m, BaseConv)]
    assert [(c.conv_kind, c.kernel_size, c.l_max) for c in convs] == [("short", 3, None), ("implicit", 3, 24)]
    rows = layer_report(model, seq_len=24)
    assert [r["state"] for r in rows] == [64 * 2, 64 * 24]
