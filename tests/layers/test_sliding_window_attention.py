"""The attention layer with sliding windows (``window``): against a dense masked reference with
RoPE and padding, causal stepping with a window-limited KV cache, and the model option."""

from __future__ import annotations

import math

import pytest
import torch

from longrange.errors import ConfigError
from longrange.layers.attention import Attention
from longrange.models.config import ModelConfig
from longrange.models.model import build_model
from longrange.ops.sliding_window import sliding_window_mask_ref

DT = torch.float64


def make_layer(**kwargs) -> Attention:
    torch.manual_seed(0)
    layer = Attention(8, n_heads=2, **kwargs).double()
    with torch.no_grad():
        layer.qkv.bias.normal_()
        layer.out_proj.bias.normal_()
    return layer


def dense_reference(layer: Attention, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The layer's projections and RoPE, then full softmax attention under the dense window mask."""
    b, length, d_model = x.shape
    h, dh = layer.n_heads, layer.head_dim
    if mask is not None:
        x = x * mask[..., None].to(x.dtype)
    q, k, v = layer.qkv(x).view(b, length, 3, h, dh).permute(2, 0, 3, 1, 4)
    if layer.rope is not None:
        q, k = layer.rope(q), layer.rope(k)
    allowed = sliding_window_mask_ref(length, mask, not layer.bidirectional, layer.window).expand(b, h, length, length)
    has_key = allowed.any(-1, keepdim=True)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(dh)).masked_fill(~(allowed | ~has_key), float("-inf"))
    out = (torch.softmax(scores, -1) * has_key) @ v
    out = layer.out_proj(out.transpose(1, 2).reshape(b, length, d_model))
    return out if mask is None else out * mask[..., None].to(out.dtype)


@pytest.mark.parametrize("length", [5, 9, 10, 13])  # up to two windows (dense path) and more, not dividing
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_layer_matches_dense_window_reference(bidirectional, rope, padded, length):
    layer = make_layer(bidirectional=bidirectional, rope=rope, window=3)
    torch.manual_seed(1)
    x = torch.randn(3, length, 8, dtype=DT, requires_grad=True)
    mask = (torch.arange(length)[None] < torch.tensor([length, length - 4, 1])[:, None]) if padded else None
    y, ref = layer(x, mask), dense_reference(layer, x, mask)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-12)
    probe = torch.randn_like(y)
    params = [x, *layer.parameters()]
    for a, b in zip(torch.autograd.grad(y, params, probe), torch.autograd.grad(ref, params, probe)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("window", [1, 3, 4])
def test_step_with_window_limited_cache_equals_forward(window, rope):
    layer = make_layer(rope=rope, window=window)
    torch.manual_seed(4)
    x = torch.randn(2, 13, 8, dtype=DT)
    y = layer(x)
    state = layer.default_state(2)
    for t in range(13):
        y_t, state = layer.step(x[:, t], state)
        torch.testing.assert_close(y_t, y[:, t], rtol=1e-10, atol=1e-12)
        # The cache holds the previous window and this window up to t: at most 2·window steps.
        cached = min(t + 1, window + t % window + 1)
        assert state.k.shape[2] == cached <= 2 * window


def test_padding_does_not_leak_into_real_outputs():
    layer = make_layer(bidirectional=True, rope=True, window=2)
    x = torch.randn(2, 9, 8, dtype=DT)
    mask = torch.arange(9)[None] < torch.tensor([9, 6])[:, None]
    y = layer(x, mask)
    x_long = torch.cat([x, torch.full((2, 5, 8), 50.0, dtype=DT)], 1)
    mask_long = torch.cat([mask, torch.zeros(2, 5, dtype=torch.bool)], 1)
    x_long[~mask_long] = 50.0
    y_long = layer(x_long, mask_long)
    torch.testing.assert_close(y_long[:, :9][mask], y[mask], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(layer(x[1:, :6]), y[1:, :6], rtol=1e-12, atol=1e-12)
    assert (y_long[~mask_long] == 0).all()


def test_window_options_are_checked():
    with pytest.raises(ConfigError, match="window must be None or a positive int"):
        Attention(8, window=0)
    with pytest.raises(ConfigError, match="not both"):
        Attention(8, window=4, block_size=4)
    with pytest.raises(ConfigError, match="model.attn_window"):
        ModelConfig(block="transformer", primitive="attention", attn_window=4, attn_block_size=4)
    with pytest.raises(ConfigError, match="model.attn_window applies to attention"):
        ModelConfig(block="mamba", primitive="s6", attn_window=4)
    with pytest.raises(ConfigError, match="model.attn_window must be None or a positive int"):
        ModelConfig(block="transformer", primitive="attention", attn_window=-1)


@pytest.mark.parametrize("block", ["transformer", "mamba"])
def test_model_option_reaches_the_attention_layers(block):
    cfg = ModelConfig(block=block, primitive="attention", n_layers=2, d_model=8, n_heads=2, attn_window=3)
    model = build_model(cfg, input_kind="tokens", vocab_size=11, head="tokens", n_out=11).double().eval()
    assert all(m.window == 3 for m in model.backbone.mixers())
    x = torch.randint(5, 11, (2, 10))
    parallel = model(x)
    state = model.default_state(2, dtype=DT)
    steps = []
    for t in range(10):
        out, state = model.step(x[:, t], state)
        steps.append(out)
    torch.testing.assert_close(torch.stack(steps, 1), parallel, rtol=1e-10, atol=1e-12)
    if block != "transformer":
        return  # a Mamba block's convolution widens the receptive field
    # Each layer reaches one window back: after 2 layers, position 9 (window 3) sees windows 1..3.
    e = model.encoder.embedding(x).detach().requires_grad_(True)
    h = model.backbone(e, torch.ones(2, 10, dtype=torch.bool))
    (g,) = torch.autograd.grad(h[:, 9], e, torch.randn(2, 8, dtype=DT))
    assert g[:, :3].abs().max() == 0 and (g[:, 3:].abs().sum(-1) > 0).all()
