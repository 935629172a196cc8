"""Linear attention: every feature map against the quadratic formula (values and gradients), Based's
Taylor features against their published all-products form, step == forward, what each direction
sees, padding, the state's size, bad options and the layer in a model."""

from __future__ import annotations

import math

import pytest
import torch

from longrange.errors import ConfigError
from longrange.layers import LinearAttention
from longrange.layers.check_cases import step_through
from longrange.layers.linear_attention import FEATURE_MAPS, feature_size, taylor_features
from longrange.models.config import ModelConfig
from longrange.models.model import build_model

pytestmark = pytest.mark.usefixtures("float64_default")  # tests/conftest.py


def layer(feature_map="elu", d=8, heads=2, seed=0, **kw) -> LinearAttention:
    torch.manual_seed(seed)
    return LinearAttention(d, n_heads=heads, feature_map=feature_map, **kw).eval()


def quadratic(m: LinearAttention, x: torch.Tensor) -> torch.Tensor:
    """The layer as attention with a lower-triangular score matrix φ(q_t)·φ(k_s), s <= t, each row
    divided by its sum (plus eps) when normalised: MAD's and Based's ``quadratic`` views."""
    B, L, _ = x.shape
    h = m.n_heads
    q = m._features(m.q_proj(x).view(B, L, h, m.f), "q")
    k = m._features(m.k_proj(x).view(B, L, h, m.f), "k")
    v = m.v_proj(x).view(B, L, h, m.values)
    scores = torch.einsum("blhf,bshf->bhls", q, k).tril()
    o = torch.einsum("bhls,bshv->blhv", scores, v)
    if m.normalize:
        o = o / (scores.sum(-1).transpose(1, 2).unsqueeze(-1) + m.eps)
    return m.o_proj(o.reshape(B, L, -1))


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_every_feature_map_matches_the_quadratic_form(feature_map, normalize):
    m = layer(feature_map, normalize=normalize, chunk_size=4)
    x = torch.randn(2, 11, 8, requires_grad=True)  # 11: not a multiple of the chunk
    y, y_ref = m(x), quadratic(m, x)
    torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-10)
    params = [x, *m.parameters()]
    g = torch.randn_like(y)
    grads = torch.autograd.grad((y * g).sum(), params)
    grads_ref = torch.autograd.grad((y_ref * g).sum(), params)
    for p, a, r in zip(params, grads, grads_ref):
        torch.testing.assert_close(a, r, rtol=1e-8, atol=1e-9, msg=lambda msg: f"{tuple(p.shape)}: {msg}")


def test_taylor_features_give_based_s_kernel_with_its_distinct_products():
    f = 5
    x, y = torch.randn(3, f), torch.randn(3, f)
    fx, fy = taylor_features(x), taylor_features(y)
    assert fx.shape == (3, feature_size("taylor", f)) == (3, 1 + f + f * (f + 1) // 2)
    dot = (x * y).sum(-1)
    torch.testing.assert_close((fx * fy).sum(-1), 1 + dot / math.sqrt(f) + dot**2 / (2 * f))

    def all_products(z):  # Based's forward pass (zoology/mixers/feature_maps/taylor.py): every x_i x_j
        square = (z.unsqueeze(-1) * z.unsqueeze(-2)).flatten(-2) / math.sqrt(2)
        return torch.cat([torch.ones_like(z[..., :1]), z / f**0.25, square / math.sqrt(f)], dim=-1)

    torch.testing.assert_close((fx * fy).sum(-1), (all_products(x) * all_products(y)).sum(-1))


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_step_equals_forward(feature_map):
    m = layer(feature_map)
    x = torch.randn(2, 9, 8)
    torch.testing.assert_close(step_through(m, x), m(x), rtol=1e-9, atol=1e-10)


def test_state_is_features_by_values_and_the_normaliser():
    m = layer("taylor", d=8, heads=2, feature_dim=3)  # F = 1 + 3 + 6 = 10, values of 4 (and z)
    assert m.state_size(1) == m.state_size(100) == 2 * 10 * 5
    assert layer("elu", normalize=False).state_size(7) == 2 * 4 * 4
    state = m.default_state(1)
    assert state["S"].shape == (1, 2, 10, 5)


def test_bidirectional_sees_the_future_and_causal_does_not():
    x = torch.randn(1, 9, 8)
    later = x.clone()
    later[:, 6:] += torch.randn(1, 3, 8)
    for bidirectional in (False, True):
        m = layer("taylor", bidirectional=bidirectional)
        changed = (m(later) - m(x)).abs().amax(-1)[0]
        assert torch.all(changed[6:] > 1e-8)
        assert torch.all(changed[:6] > 1e-8) if bidirectional else torch.all(changed[:6] == 0)


@pytest.mark.parametrize("feature_map", ["taylor", "hadamard"])
def test_outputs_at_real_positions_ignore_padding(feature_map):
    m = layer(feature_map)
    x = torch.randn(2, 11, 8)
    mask = torch.arange(11) < torch.tensor([7, 4])[:, None]
    y = m(torch.where(mask[..., None], x, 100 * torch.randn_like(x)), mask)
    for b, n in enumerate([7, 4]):
        torch.testing.assert_close(y[b, :n], m(x[b : b + 1, :n])[0], rtol=1e-9, atol=1e-10)
    assert torch.all(y[1, 4:] == 0)


def test_hadamard_maps_are_two_unless_tied():
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    untied, tied = layer("hadamard", d=16, heads=4), layer("hadamard", d=16, heads=4, tie_feature_map=True)
    assert count(untied) == 4 * 16 * 16 + 4 * (4 * 4 + 4)  # q, k, v, o; two maps of two (4 x 4) layers
    assert count(tied) == 4 * 16 * 16 + 2 * (4 * 4 + 4)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(feature_map="softmax"), r"linear attention: feature_map must be one of \('identity', 'elu'"),
        (dict(heads=3), r"linear attention: d_model = 8 is not divisible by n_heads=3"),
        (dict(feature_dim=0), r"linear attention: feature_dim must be a positive integer"),
        (dict(expand_v=0.01), r"linear attention: expand_v must give a positive value width, got 0"),
        (dict(eps=-1.0), r"linear attention: eps must be >= 0"),
        (dict(impl="cuda-kernel"), r"linear attention: .*cuda-kernel"),
    ],
)
def test_bad_options_name_themselves(kw, match):
    with pytest.raises(ConfigError, match=match):
        layer(**kw)


@pytest.mark.parametrize("direction", ["causal", "bidirectional"])
def test_trains_one_step_in_a_residual_block_with_an_mlp(direction):
    cfg = ModelConfig(
        block="residual",
        primitive="linear-attention",
        n_layers=2,
        d_model=8,
        n_heads=2,
        mlp="swiglu",
        direction=direction,
        primitive_options={"feature_map": "taylor", "feature_dim": 2},
    )
    model = build_model(cfg, input_kind="tokens", vocab_size=5, head="tokens", n_out=5)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 5, (3, 7))
    before = [p.detach().clone() for p in model.parameters()]
    loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
