"""Heads: padding-aware pooling (mean, last, max, cls) and the linear / MLP heads."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from longrange.errors import ConfigError
from longrange.models.config import ModelConfig
from longrange.models.heads import PooledHead, RetrievalHead, pool
from longrange.models.model import build_model, parameter_report


def small(**kw) -> ModelConfig:
    base = dict(block="transformer", primitive="attention", n_layers=1, d_model=8, n_heads=2)
    base.update(kw)
    return ModelConfig(**base)


def test_max_pooling_ignores_padding_even_when_it_is_largest():
    h = torch.randn(3, 6, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    h[~mask] = 1e6  # padded features larger than any real one
    out = pool(h, mask, "max")
    expected = torch.stack([h[i, : int(n)].amax(0) for i, n in enumerate(mask.sum(1))])
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    # Negative padding values do not win either, and an all-negative real row keeps its maximum.
    h2 = -h.abs() - 1.0
    h2[~mask] = -1e-9
    torch.testing.assert_close(
        pool(h2, mask, "max"), torch.stack([h2[i, : int(n)].amax(0) for i, n in enumerate(mask.sum(1))])
    )
    torch.testing.assert_close(pool(h, None, "max"), h.amax(1))


def test_max_pooling_gradient_reaches_only_the_winning_real_positions():
    h = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    pool(h, mask, "max").sum().backward()
    assert h.grad[0, 3:].abs().sum() == 0
    assert torch.all(h.grad.sum(1) == 1.0)  # one winner per (sequence, feature)


def test_max_pooling_of_an_empty_sequence_is_zero_and_finite():
    h = torch.randn(2, 4, 3, requires_grad=True)
    mask = torch.tensor([[0, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    out = pool(h, mask, "max")
    assert torch.equal(out[0], torch.zeros(3))
    out.sum().backward()
    assert torch.isfinite(h.grad).all()


@pytest.mark.parametrize("direction", ["causal", "bidirectional"])
def test_last_and_max_pool_the_real_positions_of_a_padded_batch(direction):
    """Last = the model's output at the last real position; max = the maximum over real outputs."""
    torch.manual_seed(0)
    cfg = small(direction=direction)
    model = build_model(cfg.replace(pooling="last"), input_kind="numeric", d_input=2, head="classify", n_out=3).eval()
    x = torch.randn(3, 7, 2)
    lengths = torch.tensor([7, 3, 5])
    h, mask, _ = model.encode(x, lengths)
    expected_last = torch.stack([h[i, int(n) - 1] for i, n in enumerate(lengths)])
    torch.testing.assert_close(model(x, lengths), model.head.linear(expected_last))
    model.head.pooling = "max"
    expected_max = torch.stack([h[i, : int(n)].amax(0) for i, n in enumerate(lengths)])
    torch.testing.assert_close(model(x, lengths), model.head.linear(expected_max))


def test_mlp_head_shape_activation_and_parameter_count():
    d, n_out = 8, 3
    linear = build_model(small(), input_kind="numeric", d_input=2, head="classify", n_out=n_out)
    two = build_model(small(head_layers=2), input_kind="numeric", d_input=2, head="classify", n_out=n_out)
    wide = build_model(
        small(head_layers=2, head_hidden=16, head_activation="relu"),
        input_kind="numeric",
        d_input=2,
        head="regress",
        n_out=n_out,
    )
    assert parameter_report(linear)["head"] == d * n_out + n_out
    assert parameter_report(two)["head"] == (d * d + d) + (d * n_out + n_out)
    assert parameter_report(wide)["head"] == (d * 16 + 16) + (16 * n_out + n_out)
    assert parameter_report(two)["total"] - parameter_report(linear)["total"] == d * d + d
    assert isinstance(two.head.mlp[1], nn.GELU) and isinstance(wide.head.mlp[1], nn.ReLU)
    x = torch.randn(2, 5, 2)
    assert wide(x).shape == (2, n_out)
    # The MLP is Linear -> activation -> Linear on the pooled features.
    head = wide.head
    feats = torch.randn(2, 5, d)
    expected = head.mlp[2](torch.relu(head.mlp[0](feats.mean(1))))
    torch.testing.assert_close(head(feats, None), expected)


def test_linear_head_keeps_its_parameter_names():
    head = PooledHead(8, 3)
    assert sorted(head.state_dict()) == ["linear.bias", "linear.weight"]
    assert sorted(PooledHead(8, 3, layers=2).state_dict()) == [
        "mlp.0.bias",
        "mlp.0.weight",
        "mlp.2.bias",
        "mlp.2.weight",
    ]


def test_retrieval_head_takes_hidden_width_and_activation():
    model = build_model(
        small(head_hidden=5, head_activation="relu"), input_kind="tokens", vocab_size=20, head="retrieval", n_out=2
    )
    assert isinstance(model.head, RetrievalHead)
    assert model.head.mlp[0].out_features == 5 and isinstance(model.head.mlp[1], nn.ReLU)
    default = build_model(small(), input_kind="tokens", vocab_size=20, head="retrieval", n_out=2)
    assert default.head.mlp[0].out_features == 8 and isinstance(default.head.mlp[1], nn.GELU)
    assert parameter_report(default)["head"] == (4 * 8 * 8 + 8) + (8 * 2 + 2)


def test_three_layer_head_shapes_and_parameter_count():
    """head_layers 3: Linear(d, hidden) -> act -> Linear(hidden, hidden // 2) -> act -> Linear (LRA's
    Dense(mlp_dim) -> ReLU -> Dense(mlp_dim // 2) -> ReLU -> Dense)."""
    d, n_out, hidden = 8, 3, 10
    model = build_model(
        small(head_layers=3, head_hidden=hidden, head_activation="relu"),
        input_kind="numeric",
        d_input=2,
        head="classify",
        n_out=n_out,
    )
    mlp = model.head.mlp
    assert [tuple(m.weight.shape) for m in mlp if isinstance(m, nn.Linear)] == [(hidden, d), (5, hidden), (n_out, 5)]
    assert isinstance(mlp[1], nn.ReLU) and isinstance(mlp[3], nn.ReLU)
    assert parameter_report(model)["head"] == (d * hidden + hidden) + (hidden * 5 + 5) + (5 * n_out + n_out)
    feats = torch.randn(2, 5, d)
    expected = mlp[4](torch.relu(mlp[2](torch.relu(mlp[0](feats.mean(1))))))
    torch.testing.assert_close(model.head(feats, None), expected)
    assert model(torch.randn(2, 5, 2)).shape == (2, n_out)


def test_lra_retrieval_head_is_three_layers_on_the_concatenation():
    """LRA's classifier_head_dual (matching task, no NLI interaction): Dense(mlp) -> ReLU ->
    Dense(mlp // 2) -> ReLU -> Dense on [a, b]; at LRA's retrieval sizes (d 128, mlp_dim 512) it has
    256*512+512 + 512*256+256 + 256*2+2 = 263,426 parameters."""
    d, hidden = 128, 512
    model = build_model(
        small(d_model=d, n_heads=4, head_layers=3, head_hidden=hidden, head_activation="relu"),
        input_kind="tokens",
        vocab_size=20,
        head="retrieval",
        n_out=2,
    )
    head = model.head
    linears = [m for m in head.mlp if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [
        (2 * d, hidden),
        (hidden, hidden // 2),
        (hidden // 2, 2),
    ]
    assert parameter_report(model)["head"] == 263_426
    h1, h2 = torch.randn(3, 6, d), torch.randn(3, 4, d)
    a, b = h1.mean(1), h2.mean(1)
    expected = linears[2](torch.relu(linears[1](torch.relu(linears[0](torch.cat([a, b], -1))))))
    torch.testing.assert_close(head(h1, None, h2, None), expected)
    # head_layers 1 and 2 keep the S4/SPT head on [a, b, a*b, a-b].
    for layers in (1, 2):
        two = build_model(small(head_layers=layers), input_kind="tokens", vocab_size=20, head="retrieval", n_out=2)
        assert parameter_report(two)["head"] == (4 * 8 * 8 + 8) + (8 * 2 + 2)


def test_token_head_stays_linear_and_replace_head_follows_the_config():
    model = build_model(small(head_layers=2), input_kind="numeric", d_input=2, head="tokens", n_out=4)
    assert isinstance(model.head.linear, nn.Linear)
    model.replace_head("classify", 3)
    assert hasattr(model.head, "mlp") and model(torch.randn(2, 4, 2)).shape == (2, 3)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(pooling="maximum"), "model.pooling"),
        (dict(head_layers=4), "model.head_layers"),
        (dict(head_hidden=0), "model.head_hidden"),
        (dict(head_layers=0), "model.head_layers"),
        (dict(head_activation="tanh"), "model.head_activation"),
    ],
)
def test_head_config_errors_name_the_field(kw, match):
    with pytest.raises(ConfigError, match=match):
        small(**kw)


def test_sincos_positions_follow_fairseqs_formula():
    from longrange.models.heads import sincos_positions

    emb = sincos_positions(5, 7)
    half, rate = 3, math.log(10000) / 2
    angle = torch.arange(5.0)[:, None] * torch.exp(torch.arange(3.0) * -rate)[None]
    torch.testing.assert_close(emb[:, :half], torch.sin(angle))
    torch.testing.assert_close(emb[:, half : 2 * half], torch.cos(angle))
    assert (emb[:, -1] == 0).all() and emb.shape == (5, 7)  # odd width: a zero column


def test_the_decode_last_head_reads_the_last_real_position_only():
    """MAD's autoencoder head: every output comes from the last real position's features (plus its
    own position's embedding), so no output can read its own input token."""
    from longrange.models.heads import LastPositionDecoder

    torch.manual_seed(0)
    head = LastPositionDecoder(8, 5)
    h = torch.randn(2, 6, 8)
    out = head(h)
    assert out.shape == (2, 6, 5)
    changed = h.clone()
    changed[:, :-1] = torch.randn(2, 5, 8)  # every position but the last
    torch.testing.assert_close(head(changed), out)
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])  # the second sequence ends at position 3
    masked = head(h, mask)
    torch.testing.assert_close(masked[0], out[0])
    moved = h.clone()
    moved[1, 3], moved[1, 5] = h[1, 5], torch.randn(8)  # its last real position now holds the old last
    torch.testing.assert_close(head(moved, mask)[1], out[1])
    assert not torch.allclose(out[:, 0], out[:, 1])  # positions differ by their embeddings


def test_a_model_with_the_decode_last_head_selects_positions_and_has_no_step():
    model = build_model(small(direction="causal"), input_kind="tokens", vocab_size=12, head="decode-last", n_out=12)
    x = torch.randint(0, 12, (3, 7))
    full = model(x)
    positions = torch.rand(3, 7) > 0.5
    torch.testing.assert_close(model(x, positions=positions), full[positions])
    with pytest.raises(RuntimeError, match="decode-last.*no recurrent step"):
        model.step(x[:, 0], model.default_state(3))
