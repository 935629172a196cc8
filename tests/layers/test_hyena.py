"""Hyena: the layer against an explicit-loop reference (values and gradients), the implicit filter
(features, shape, decay window), step == forward, what each direction sees, padding, optimiser
hints, bad options, and the layer inside residual, Mamba and simple blocks."""

from __future__ import annotations

import math

import pytest
import torch

from longrange.errors import ConfigError
from longrange.layers import Hyena
from longrange.layers.base import NO_DECAY_GROUP, get_optim_hint
from longrange.layers.check_cases import step_through
from longrange.layers.hyena import FILTER_GROUP, HyenaCache, ImplicitFilter, positional_features
from longrange.models.backbone import make_primitive
from longrange.models.config import ModelConfig
from longrange.models.model import build_model
from longrange.train import TrainConfig, build_optimizer, param_groups

pytestmark = pytest.mark.usefixtures("float64_default")  # tests/conftest.py


def layer(d=4, l_max=12, order=2, bidirectional=False, seed=0, **kw) -> Hyena:
    torch.manual_seed(seed)
    return Hyena(d, l_max=l_max, order=order, filter_order=8, bidirectional=bidirectional, **kw).eval()


def reference(m: Hyena, x: torch.Tensor) -> torch.Tensor:
    """The operator written out with explicit sums over taps and positions (no FFT)."""
    B, L, _ = x.shape
    N, K, d = m.order, m.short_filter_order, m.inner  # d: the inner width D
    u = x @ m.in_proj.weight.T + m.in_proj.bias  # (B, L, (N+1)D / G)
    u = torch.cat([u] * m.proj_groups, dim=-1)  # tiled: [a, a, ..., a]
    w, b = m.short_conv.weight, m.short_conv.bias  # (C, K), (C,)
    ahead = (K - 1) // 2 if m.bidirectional else 0
    conv = []
    for t in range(L):
        acc = b.expand(B, -1)
        for j in range(K):  # tap j reads the input at t - (K - 1) + j (+ ahead when centred)
            s = t - (K - 1) + j + ahead
            if 0 <= s < L:
                acc = acc + w[:, j] * u[:, s]
        conv.append(acc)
    u = torch.stack(conv, dim=1)
    *gates, v = u.split(d, dim=-1)
    if m.head_dim > 1:
        return _heads_reference(m, gates[0], gates[1], v) @ m.out_proj.weight.T + m.out_proj.bias
    k = m.filter(L).reshape(-1, d, N - 1, L)  # (kernels, d, N-1, L)
    bias = m.bias.view(d, N - 1)
    for o, gate in enumerate(reversed(gates[1:])):
        z = v * gate
        out = []
        for t in range(L):
            acc = bias[:, o] * z[:, t]
            for s in range(L):
                if s <= t:
                    acc = acc + k[0, :, o, t - s] * z[:, s]
                elif m.bidirectional:
                    acc = acc + k[1, :, o, s - t - 1] * z[:, s]
            out.append(acc)
        v = torch.stack(out, dim=1)
    return (gates[0] * v) @ m.out_proj.weight.T + m.out_proj.bias


def _heads_reference(m: Hyena, q: torch.Tensor, v: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The multi-head form by its formula, head by head and position by position: y_t[h, j] =
    sum_i q_t[h, i] (sum_{s <= t} g_h[t - s] k_s[h, i] v_s[h, j] + b_h k_t[h, i] v_t[h, j]), with
    the backward kernel for s > t when bidirectional."""
    B, L, D = q.shape
    P = m.head_dim
    g = m.filter(L)  # (kernels, heads, L)
    heads = []
    for h in range(D // P):
        at = slice(h * P, (h + 1) * P)
        out = []
        for t in range(L):
            state = m.bias[h] * k[:, t, at, None] * v[:, t, None, at]  # (B, P, P)
            for s in range(L):
                outer = k[:, s, at, None] * v[:, s, None, at]
                if s <= t:
                    state = state + g[0, h, t - s] * outer
                elif m.bidirectional:
                    state = state + g[1, h, s - t - 1] * outer
            out.append(torch.einsum("bi,bij->bj", q[:, t, at], state))
        heads.append(torch.stack(out, dim=1))
    return torch.cat(heads, dim=-1)


# -- the long convolution by FFT against explicit sums ---------------------------------------------


@pytest.mark.parametrize("order", [2, 3])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_fft_path_matches_explicit_sums_values_and_gradients(order, bidirectional):
    _matches_reference(layer(order=order, bidirectional=bidirectional, short_filter_order=4 if bidirectional else 3))


def _matches_reference(m: Hyena) -> None:
    """The layer's values and gradients (input and parameters) against :func:`reference`."""
    x = torch.randn(2, 9, 4, requires_grad=True)
    y = m(x)
    y_ref = reference(m, x)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-11)
    params = [x, *m.parameters()]
    g = torch.randn_like(y)
    grads = torch.autograd.grad((y * g).sum(), params)
    grads_ref = torch.autograd.grad((y_ref * g).sum(), params)
    for p, a, r in zip(params, grads, grads_ref):
        torch.testing.assert_close(a, r, rtol=1e-9, atol=1e-10, msg=lambda msg: f"{tuple(p.shape)}: {msg}")


#: MAD's two layouts at a small width: 4 times wider inside with the projection tiled 4 times
#: (its ``hyena``), and heads of outer products (its ``mh-hyena``: heads of 2 here, tiled 3 times).
WIDER = dict(inner_factor=4, proj_groups=4)
HEADS = dict(head_dim=2, proj_groups=3)


@pytest.mark.parametrize("options", [WIDER, HEADS, dict(head_dim=4, inner_factor=2)], ids=["wider", "heads", "heads2"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_inner_width_tiling_and_heads_match_explicit_sums(options, bidirectional):
    _matches_reference(
        layer(order=2, bidirectional=bidirectional, short_filter_order=4 if bidirectional else 3, **options)
    )


def test_mad_layouts_have_mad_s_parameter_counts():
    """MAD's hyena and mh-hyena at width 128 and length 128 (athms/mad-lab configs/layers/hyena.yml,
    mh-hyena.yml): in_proj 128 -> 384 (tiled to 1536) and out_proj 512 -> 128; in_proj 128 -> 96
    (tiled to 384), 8 heads of 16 with one filter each, out_proj 128 -> 128."""
    common = dict(l_max=128, order=2, short_filter_order=3, num_inner_mlps=2, emb_dim=3, pos_emb_lr_scale=1.0)
    wide = Hyena(128, filter_order=4, inner_factor=4, proj_groups=4, **common)
    heads = Hyena(128, filter_order=2, head_dim=16, proj_groups=4, **common)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    # in_proj + short filters + z + filter network (first, 2 inner, last, sine frequencies) + biases + out_proj
    assert count(wide) == (128 * 384 + 384) + 1536 * 4 + 128 * 3 + (16 + 2 * 20 + 4 * 512 + 4) + 512 + (512 * 128 + 128)
    assert count(heads) == (128 * 96 + 96) + 384 * 4 + 128 * 3 + (8 + 2 * 6 + 2 * 8 + 2) + 8 + (128 * 128 + 128)
    assert count(wide) == 124348 and heads.channels == 8 and heads.filter(128).shape == (1, 8, 128)


@pytest.mark.parametrize("options", [WIDER, HEADS], ids=["wider", "heads"])
def test_step_equals_forward_wider_and_in_heads(options):
    m = layer(order=2, l_max=10, **options)
    x = torch.randn(2, 10, 4)
    torch.testing.assert_close(step_through(m, x), m(x), rtol=1e-10, atol=1e-11)
    state = m.default_state(2)
    for t in range(3):
        _, state = m.step(x[:, t], state)
    held = state.conv.numel() + sum(h.numel() for h in state.history)
    assert held == 2 * m.state_size(3)  # per sequence: the short filter's inputs and 2·D (k, v) or D per position
    per_position = 2 * m.inner if m.head_dim > 1 else m.inner
    assert m.state_size(3) == 3 * m.inner * (m.short_filter_order - 1) + per_position * 3


@pytest.mark.parametrize("options", [WIDER, HEADS], ids=["wider", "heads"])
def test_wider_and_heads_ignore_padding(options):
    m = layer(order=2, **options)
    x = torch.randn(2, 11, 4)
    mask = torch.arange(11) < torch.tensor([7, 4])[:, None]
    y = m(torch.where(mask[..., None], x, 100 * torch.randn_like(x)), mask)
    for b, n in enumerate([7, 4]):
        torch.testing.assert_close(y[b, :n], m(x[b : b + 1, :n])[0], rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_every_conv_impl_agrees_with_the_explicit_matrix(bidirectional):
    m = layer(order=3, bidirectional=bidirectional)
    x = torch.randn(2, 10, 4)
    m.conv_impl = "ref"
    y, grads = _output_and_grads(m, x)
    for impl in ("fft", "direct", "auto"):
        m.conv_impl = impl
        y_impl, grads_impl = _output_and_grads(m, x)
        torch.testing.assert_close(y_impl, y, rtol=1e-10, atol=1e-11)
        for a, r in zip(grads_impl, grads):
            torch.testing.assert_close(a, r, rtol=1e-9, atol=1e-10)


def _output_and_grads(m, x):
    m.zero_grad()
    y = m(x)
    (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
    return y.detach(), [p.grad.clone() for p in m.parameters() if p.grad is not None]


# -- the implicit filter ----------------------------------------------------------------------------


def test_positional_features_as_published():
    z, t = positional_features(10, 5)  # time and two bands, f = (1e-4, 1)
    assert z.shape == (10, 5) and t.shape == (10, 1)
    j = torch.arange(10.0)
    torch.testing.assert_close(t[:, 0], j / 9)
    omega = 2 * math.pi * j / 10
    for col, f in ((1, 1e-4), (2, 1.0)):
        torch.testing.assert_close(z[:, col], torch.cos(f * omega))
        torch.testing.assert_close(z[:, col + 2], -torch.sin(f * omega))


def test_filter_shape_window_and_decay():
    torch.manual_seed(0)
    f = ImplicitFilter(24, 64, width=16)
    h = f(40)
    assert h.shape == (1, 24, 40)
    assert f.freq.shape == (16,) and torch.all(f.freq == 1.0)  # published w = 1
    # the filter is the network's output times the window exp(-t |δ|) + shift
    window = f.window(40)
    torch.testing.assert_close(h[0], (f.unmodulated(40) * window).T)
    # the window falls along the sequence in every channel, the fastest channel to the target at
    # 30 % of l_max, the slowest at 150 %
    assert torch.all(window[1:] < window[:-1])
    full = f.window(64)
    t = f.t[:, 0]
    torch.testing.assert_close(full[:, -1], torch.exp(math.log(1e-2) * t / 0.3))
    torch.testing.assert_close(full[:, 0], torch.exp(math.log(1e-2) * t / 1.5))
    # the modulated filter's magnitude falls along the sequence; the network's own does not
    mag = f(64)[0].abs().mean(0)
    raw = f.unmodulated(64).abs().mean(1)
    assert mag[-16:].mean() < 0.1 * mag[:16].mean()
    assert raw[-16:].mean() > 0.3 * raw[:16].mean()
    # a filter over l_max positions: the first L taps do not depend on L
    torch.testing.assert_close(f(64)[..., :40], h)


def test_filter_options_shift_modulate_and_two_kernels():
    torch.manual_seed(0)
    plain = ImplicitFilter(6, 16, width=8, modulate=False)
    torch.testing.assert_close(plain(16)[0], plain.unmodulated(16).T)
    shifted = ImplicitFilter(6, 16, width=8, shift=0.5)
    torch.testing.assert_close(shifted.window(16), torch.exp(-shifted.t * shifted.deltas.abs()) + 0.5)
    two = ImplicitFilter(6, 16, width=8, kernels=2)
    k = two(10)
    assert k.shape == (2, 6, 10)
    torch.testing.assert_close(k[1], (two.unmodulated(10)[:, 6:] * two.window(10)).T)  # one window, both kernels
    with pytest.raises(ValueError, match="l_max=16"):
        two(17)


def test_layer_filters_per_channel_and_convolution():
    m = layer(d=5, order=4, l_max=12)
    assert m.filter.channels == 5 * 3 and m.bias.shape == (15,)
    assert m.kernels(7).shape == (1, 5, 3, 7)
    assert layer(d=5, order=4, bidirectional=True).kernels(7).shape == (2, 5, 3, 7)


def test_optimiser_hints_as_published():
    m = layer()
    hints = {name: get_optim_hint(p) for name, p in m.named_parameters()}
    for name in ("filter.freq", "filter.first.weight", "filter.inner.1.bias", "filter.last.weight"):
        assert hints[name] == {"group": FILTER_GROUP, "lr_scale": 1.0, "weight_decay": 0.0}
    assert hints["filter.z"] == {"group": FILTER_GROUP, "lr_scale": 0.01, "weight_decay": 0.0}
    assert hints["bias"] == {"group": NO_DECAY_GROUP}
    assert hints["in_proj.weight"] == {} and "filter.deltas" not in hints and "filter.t" not in hints
    fixed = layer(pos_emb_lr_scale=0.0, filter_lr_scale=0.5, filter_weight_decay=0.1)
    assert "filter.z" not in dict(fixed.named_parameters()) and "z" in dict(fixed.filter.named_buffers())
    assert get_optim_hint(fixed.filter.freq) == {"group": FILTER_GROUP, "lr_scale": 0.5, "weight_decay": 0.1}
    groups = {g["name"]: g for g in param_groups(m, TrainConfig(lr=0.01, weight_decay=0.05))}
    assert groups["hyena_filter[lr_scale=1,weight_decay=0]"]["lr"] == pytest.approx(0.01)
    assert groups["hyena_filter[lr_scale=0.01,weight_decay=0]"]["param_names"] == ["filter.z"]
    assert groups["hyena_filter[lr_scale=1,weight_decay=0]"]["weight_decay"] == 0.0


# -- step mode, directions, padding --------------------------------------------------------------------


@pytest.mark.parametrize("order,short", [(2, 3), (3, 4)])
def test_step_equals_forward(order, short):
    m = layer(order=order, short_filter_order=short, l_max=10)
    x = torch.randn(2, 10, 4)
    torch.testing.assert_close(step_through(m, x), m(x), rtol=1e-10, atol=1e-11)


def test_state_grows_with_length_up_to_l_max():
    m = layer(d=4, order=3, l_max=10)  # short conv: 4 · 4 channels, 2 inputs kept; 2 histories of 4 channels
    assert m.state_size(1) == 16 * 2 + 2 * 4 * 1
    assert m.state_size(7) == 16 * 2 + 2 * 4 * 7
    assert m.state_size(50) == 16 * 2 + 2 * 4 * 10
    state = m.default_state(1)
    for _ in range(7):
        _, state = m.step(torch.randn(1, 4), state)
    assert isinstance(state, HyenaCache) and state.position == 7
    held = state.conv.numel() + sum(h.numel() for h in state.history)
    assert held == m.state_size(7)
    for _ in range(3):
        _, state = m.step(torch.randn(1, 4), state)
    with pytest.raises(ValueError, match="beyond l_max=10"):
        m.step(torch.randn(1, 4), state)


def test_bidirectional_sees_the_future_and_causal_does_not():
    x = torch.randn(1, 9, 4)
    for bidirectional in (False, True):
        m = layer(bidirectional=bidirectional)
        later = x.clone()
        later[:, 6:] += torch.randn(1, 3, 4)
        changed = (m(later) - m(x)).abs().amax(-1)[0]
        assert torch.all(changed[6:] > 1e-6)
        if bidirectional:
            assert torch.all(changed[:6] > 1e-8), changed
        else:
            assert torch.all(changed[:6] == 0)


def test_bidirectional_layer_has_no_step_mode():
    m = layer(bidirectional=True)
    assert m.state_size(5) is None
    with pytest.raises(RuntimeError, match="bidirectional"):
        m.default_state(1)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_outputs_at_real_positions_ignore_padding(bidirectional):
    m = layer(order=3, bidirectional=bidirectional)
    lengths = [7, 4]
    x = torch.randn(2, 11, 4)
    mask = torch.arange(11) < torch.tensor(lengths)[:, None]
    y = m(x, mask)
    other = torch.where(mask[..., None], x, 100 * torch.randn_like(x))  # different padding content
    y_other = m(other, mask)
    for b, n in enumerate(lengths):
        alone = m(x[b : b + 1, :n])[0]
        torch.testing.assert_close(y[b, :n], alone, rtol=1e-10, atol=1e-11)
        torch.testing.assert_close(y_other[b, :n], alone, rtol=1e-10, atol=1e-11)


# -- bad options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(order=1), r"Hyena: order must be at least 2"),
        (dict(emb_dim=4), r"Hyena: emb_dim must be odd and >= 3"),
        (dict(emb_dim=1), r"Hyena: emb_dim must be odd and >= 3"),
        (dict(l_max=0), r"Hyena: l_max must be a positive integer"),
        (dict(l_max=None), r"Hyena: l_max must be a positive integer"),
        (dict(short_filter_order=0), r"Hyena: short_filter_order must be a positive integer"),
        (dict(target=2.0), r"Hyena: target .* must be in \(0, 1\)"),
        (dict(dropout=1.0), r"Hyena: dropout must be in \[0, 1\)"),
        (dict(conv_impl="cuda"), r"Hyena: conv_impl must be one of \('auto', 'fft', 'direct', 'ref'\)"),
        (dict(num_inner_mlps=-1), r"Hyena: num_inner_mlps must be a non-negative integer"),
        (dict(inner_factor=0), r"Hyena: inner_factor must be a positive integer"),
        (dict(proj_groups=5), r"Hyena: proj_groups=5 must divide the \(order \+ 1\) x inner width = 24 channels"),
        (dict(head_dim=3), r"Hyena: head_dim=3 must divide the inner width 8"),
        (dict(head_dim=2, order=3), r"Hyena: the multi-head form \(head_dim=2 > 1\) is of order 2, got order 3"),
    ],
)
def test_bad_options_name_themselves(kw, match):
    with pytest.raises(ConfigError, match=match):
        Hyena(8, **{"l_max": 16, **kw})


def test_l_max_is_required_and_bounds_the_input():
    with pytest.raises(ConfigError, match=r"primitive 'hyena' needs the option\(s\) l_max"):
        make_primitive("hyena", 8)
    m = make_primitive("hyena", 8, l_max=6, filter_order=8)
    assert m(torch.randn(1, 6, 8)).shape == (1, 6, 8)
    with pytest.raises(ValueError, match=r"input length 7 exceeds l_max=6"):
        m(torch.randn(1, 7, 8))
    with pytest.raises(ValueError, match=r"Hyena expects input of shape \(batch, length, 8\)"):
        m(torch.randn(1, 6, 5))
    with pytest.raises(ValueError, match=r"Hyena.step expects input of shape \(batch, 8\)"):
        m.step(torch.randn(1, 5), m.default_state(1))


# -- inside blocks ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "block,extra",
    [
        ("residual", dict(mlp="swiglu")),
        ("residual", dict(direction="bidirectional")),
        ("mamba", {}),
        ("mamba", dict(direction="bidirectional")),
        ("simple", {}),
        ("simple", dict(direction="bidirectional")),
    ],
)
def test_builds_and_trains_one_step_in_blocks(block, extra):
    cfg = ModelConfig(
        block=block,
        primitive="hyena",
        n_layers=2,
        d_model=8,
        d_state=4,
        n_heads=2,
        primitive_options={"l_max": 16, "filter_order": 8, "order": 3},
        **extra,
    )
    torch.manual_seed(0)
    model = build_model(cfg, input_kind="numeric", head="classify", n_out=3, d_input=2)
    mixers = model.backbone.mixers()
    assert all(isinstance(m, Hyena) for m in mixers)
    d_mixer = 8 * cfg.expand if block == "mamba" else 8  # the Mamba block builds it at d_inner
    assert {m.d_model for m in mixers} == {d_mixer}
    assert all(m.bidirectional == (block != "mamba" and cfg.bidirectional) for m in mixers)
    x, labels = torch.randn(3, 12, 2), torch.tensor([0, 1, 2])
    optimizer = build_optimizer(model, TrainConfig(lr=1e-2))
    before = [p.detach().clone() for p in model.parameters()]
    loss = torch.nn.functional.cross_entropy(model(x, lengths=torch.tensor([12, 9, 5])), labels)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    optimizer.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    if not cfg.bidirectional:  # the backbone's step mode equals its forward
        model.eval()
        h = torch.randn(2, 10, 8)
        state = model.backbone.default_state(2)
        steps = []
        for t in range(10):
            y, state = model.backbone.step(h[:, t], state)
            steps.append(y)
        torch.testing.assert_close(torch.stack(steps, 1), model.backbone(h), rtol=1e-9, atol=1e-10)


def test_hyena_builds_on_meta_after_another_library_patched_linspace(monkeypatch):
    """PyTorch lists the functions a ``torch.device(...)`` context redirects once and caches the
    list; transformers' ``from_pretrained`` patches ``torch.linspace`` meanwhile, so that afterwards
    linspace is not redirected. Hyena names the device of its linspace calls itself."""
    import torch.utils._device as device_mod

    from longrange.layers.hyena import positional_features

    real = torch.linspace
    device_mod._device_constructors.cache_clear()
    try:
        monkeypatch.setattr(torch, "linspace", lambda *a, **k: real(*a, **k))
        device_mod._device_constructors()  # cached with the patched function
        monkeypatch.setattr(torch, "linspace", real)
        with torch.device("meta"):
            assert torch.linspace(0.0, 1.0, 3).device.type == "cpu"  # the fault this guards against
            z, t = positional_features(16, 5)
            layer = Hyena(8, l_max=16)
        assert z.device.type == t.device.type == "meta"
        assert all(p.device.type == "meta" for p in layer.parameters())
    finally:
        device_mod._device_constructors.cache_clear()
