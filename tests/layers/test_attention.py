"""Attention against a naive softmax(QKᵀ/√d)V reference; blocks, padding, causality, KV-cache stepping."""

from __future__ import annotations

import math

import pytest
import torch

from longrange.errors import ConfigError
from longrange.layers.attention import Attention, KVCache
from longrange.layers.rope import rope_frequencies

DT = torch.float64


def dense_rope(t: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate rows of t (B, H, L, d) by explicit block-diagonal rotation matrices at positions 0..L-1."""
    d, length = t.shape[-1], t.shape[-2]
    theta = rope_frequencies(d, base, dtype=t.dtype)
    rows = []
    for p in range(length):
        r = torch.eye(d, dtype=t.dtype)
        for i, th in enumerate(theta.tolist()):
            c, s = math.cos(p * th), math.sin(p * th)
            r[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, -s], [s, c]], dtype=t.dtype)
        rows.append(t[..., p, :] @ r.T)
    return torch.stack(rows, dim=-2)


def naive_attention(layer: Attention, x: torch.Tensor, mask=None) -> torch.Tensor:
    """softmax(QKᵀ/√d + M)V with an explicit (B, 1, L, L) admissibility matrix M.

    Queries, keys and values have ``layer.attn_dim`` features (``h`` heads of ``attn_dim / h``);
    the admissible keys follow causality, blocks and sliding windows as the module docstring states.
    """
    b, length, _ = x.shape
    h, dh = layer.n_heads, layer.head_dim
    width = h * dh
    if mask is not None:
        x = x * mask[..., None].to(x.dtype)
    qkv = x @ layer.qkv.weight.T
    if layer.qkv.bias is not None:
        qkv = qkv + layer.qkv.bias
    q, k, v = (t.reshape(b, length, h, dh).transpose(1, 2) for t in qkv.split(width, dim=-1))
    if layer.rope is not None:
        q, k = dense_rope(q, layer.rope.base), dense_rope(k, layer.rope.base)
    scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
    pos = torch.arange(length)
    allowed = torch.ones(length, length, dtype=torch.bool)
    if not layer.bidirectional:
        allowed &= pos[:, None] >= pos[None, :]
    if layer.block_size is not None:
        allowed &= (pos[:, None] // layer.block_size) == (pos[None, :] // layer.block_size)
    if layer.window is not None:  # own window and one back and forward
        allowed &= ((pos[:, None] // layer.window) - (pos[None, :] // layer.window)).abs() <= 1
    allowed = allowed.expand(b, 1, length, length)
    if mask is not None:
        allowed = allowed & mask[:, None, None, :]
    has_key = allowed.any(-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~(allowed | ~has_key), float("-inf")), dim=-1) * has_key
    out = (probs @ v).transpose(1, 2).reshape(b, length, width)
    out = out @ layer.out_proj.weight.T
    if layer.out_proj.bias is not None:
        out = out + layer.out_proj.bias
    if mask is not None:
        out = out * mask[..., None].to(out.dtype)
    return out


def make_mask(kind: str, batch: int, length: int) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "padded":  # left-aligned, one sequence unpadded, one fully padded
        lengths = torch.tensor([length, 3, 1, 0])[:batch]
        return torch.arange(length)[None, :] < lengths[:, None]
    if kind == "scattered":  # not left-aligned: holes anywhere, including at position 0
        g = torch.Generator().manual_seed(7)
        m = torch.rand(batch, length, generator=g) > 0.4
        m[0, 0] = False
        m[1] = False
        return m
    raise AssertionError(kind)


def make_layer(**kwargs) -> Attention:
    torch.manual_seed(0)
    layer = Attention(8, n_heads=2, **kwargs).double()
    if layer.qkv.bias is not None:
        with torch.no_grad():  # non-zero biases so the reference checks them too
            layer.qkv.bias.normal_()
            layer.out_proj.bias.normal_()
    return layer


def grads(layer, x, fn, probe):
    x = x.clone().requires_grad_(True)
    layer.zero_grad()
    (fn(x) * probe).sum().backward()
    return [x.grad] + [p.grad.clone() for p in layer.parameters()]


@pytest.mark.parametrize("block_size", [None, 3, 4])
@pytest.mark.parametrize("mask_kind", ["none", "padded", "scattered"])
@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_matches_naive_values_and_gradients(bidirectional, rope, mask_kind, block_size):
    layer = make_layer(
        bidirectional=bidirectional, rope=rope, block_size=block_size, rope_base=10.0 if rope else 10000.0
    )
    torch.manual_seed(1)
    x = torch.randn(4, 8, 8, dtype=DT)
    mask = make_mask(mask_kind, 4, 8)
    y = layer(x, mask)
    ref = naive_attention(layer, x, mask)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)
    probe = torch.randn_like(y)
    for g, g_ref in zip(
        grads(layer, x, lambda t: layer(t, mask), probe),
        grads(layer, x, lambda t: naive_attention(layer, t, mask), probe),
    ):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("block_size", [None, 3])
def test_causality_via_gradients(block_size):
    layer = make_layer(rope=True, block_size=block_size)
    x = torch.randn(1, 7, 8, dtype=DT, requires_grad=True)
    y = layer(x)
    for t in range(7):
        (g,) = torch.autograd.grad(y[0, t].sum(), x, retain_graph=True)
        influence = g[0].abs().sum(-1)
        assert (influence[t + 1 :] == 0).all(), f"output {t} depends on a later input"
        start = 0 if block_size is None else (t // block_size) * block_size
        assert (influence[start : t + 1] > 0).all(), f"output {t} ignores an input it may see"
        assert (influence[:start] == 0).all(), f"output {t} sees across a block boundary"


def test_bidirectional_sees_the_future():
    layer = make_layer(bidirectional=True)
    x = torch.randn(1, 5, 8, dtype=DT, requires_grad=True)
    (g,) = torch.autograd.grad(layer(x)[0, 0].sum(), x)
    assert (g[0].abs().sum(-1) > 0).all()


@pytest.mark.parametrize("block_size", [None, 3])
@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_padding_invariance(bidirectional, rope, block_size):
    layer = make_layer(bidirectional=bidirectional, rope=rope, block_size=block_size)
    torch.manual_seed(3)
    lengths = [5, 2]
    x = torch.randn(2, 5, 8, dtype=DT)
    mask = torch.arange(5)[None] < torch.tensor(lengths)[:, None]
    y = layer(x, mask)
    # Extra padding filled with garbage must not change the outputs at real positions.
    x_long = torch.cat([x, 100 * torch.randn(2, 6, 8, dtype=DT)], dim=1)
    mask_long = torch.cat([mask, torch.zeros(2, 6, dtype=torch.bool)], dim=1)
    x_long[~mask_long] = 50.0
    y_long = layer(x_long, mask_long)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(y_long[b, :n], y[b, :n], rtol=1e-12, atol=1e-12)
        # ... and equal the unpadded sequence on its own.
        torch.testing.assert_close(layer(x[b : b + 1, :n])[0], y[b, :n], rtol=1e-12, atol=1e-12)
    assert (y_long[~mask_long] == 0).all()


def test_fully_padded_sequence_is_finite():
    for bidirectional in (False, True):
        layer = make_layer(bidirectional=bidirectional)
        x = torch.randn(2, 4, 8, dtype=DT, requires_grad=True)
        mask = torch.tensor([[True, True, False, False], [False] * 4])
        y = layer(x, mask)
        assert torch.isfinite(y).all() and (y[1] == 0).all()
        y.sum().backward()
        assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("block_size", [None, 1, 3])
@pytest.mark.parametrize("rope", [False, True])
def test_step_equals_forward(rope, block_size):
    layer = make_layer(rope=rope, block_size=block_size)
    torch.manual_seed(4)
    x = torch.randn(3, 8, 8, dtype=DT)
    y = layer(x)
    state = layer.default_state(3)
    assert isinstance(state, KVCache) and state.k.shape == (3, 2, 0, 4) and state.k.dtype == DT
    for t in range(8):
        y_t, state = layer.step(x[:, t], state)
        torch.testing.assert_close(y_t, y[:, t], rtol=1e-10, atol=1e-10)
        assert state.position == t + 1
        cached = t + 1 if block_size is None else t % block_size + 1
        assert state.k.shape == (3, 2, cached, 4) and state.v.shape == (3, 2, cached, 4)


def test_step_does_not_mutate_state():
    layer = make_layer()
    state0 = layer.default_state(1)
    x = torch.randn(1, 8, dtype=DT)
    _, state1 = layer.step(x, state0)
    y_a, _ = layer.step(x, state1)
    y_b, _ = layer.step(x, state1)
    assert state0.k.shape[2] == 0 and state1.k.shape[2] == 1
    torch.testing.assert_close(y_a, y_b, rtol=0, atol=0)


def test_default_state_device_and_dtype():
    layer = Attention(8, n_heads=4)
    s = layer.default_state(2)
    assert s.k.dtype == torch.float32 and s.k.shape == (2, 4, 0, 2) and s.position == 0
    s = layer.default_state(2, dtype=DT, device=torch.device("cpu"))
    assert s.v.dtype == DT


def test_float32_matches_float64():
    layer = make_layer(rope=True, block_size=3)
    x = torch.randn(2, 7, 8, dtype=DT)
    mask = make_mask("padded", 2, 7)
    y64 = layer(x, mask)
    y32 = layer.float()(x.float(), mask)
    assert y32.dtype == torch.float32
    torch.testing.assert_close(y32.double(), y64, rtol=1e-4, atol=1e-5)


def test_dropout_only_in_training():
    torch.manual_seed(5)
    layer = Attention(8, n_heads=2, dropout=0.5, bidirectional=True).double()
    x = torch.randn(2, 6, 8, dtype=DT)
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x), rtol=0, atol=0)
    reference = naive_attention(layer, x)
    torch.testing.assert_close(layer(x), reference, rtol=1e-10, atol=1e-10)
    layer.train()
    assert not torch.allclose(layer(x), reference)


def test_no_bias_and_parameter_count():
    layer = Attention(16, n_heads=4, bias=False, rope=True)
    assert layer.qkv.bias is None and layer.out_proj.bias is None
    assert sum(p.numel() for p in layer.parameters()) == 4 * 16 * 16
    assert sum(p.numel() for p in Attention(16, n_heads=4).parameters()) == 4 * 16 * 16 + 4 * 16


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(d_model=10, n_heads=3), r"d_model=10 is not divisible by n_heads=3"),
        (dict(d_model=8, n_heads=0), "n_heads"),
        (dict(d_model=0), "d_model"),
        (dict(d_model=8, block_size=0), "block_size"),
        (dict(d_model=8, block_size=2.5), "block_size"),
        (dict(d_model=8, dropout=1.0), "dropout"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Attention(**kwargs)
    assert issubclass(ConfigError, ValueError)


def test_bad_inputs():
    layer = Attention(8, n_heads=2)
    with pytest.raises(ValueError, match=r"\(batch, length, 8\).*\(2, 5, 6\)"):
        layer(torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match=r"\(batch, length, 8\)"):
        layer(torch.randn(5, 8))
    with pytest.raises(ValueError, match=r"mask of shape \(2, 4\).*\(2, 5, 8\)"):
        layer(torch.randn(2, 5, 8), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        layer(torch.randn(2, 5, 8), torch.ones(2, 5))
    state = layer.default_state(2)
    with pytest.raises(ValueError, match=r"step expects input of shape \(batch, 8\)"):
        layer.step(torch.randn(2, 1, 8), state)
    with pytest.raises(ValueError, match=r"cache of shape \(2, 2, 0, 4\)"):
        layer.step(torch.randn(3, 8), state)
    with pytest.raises(TypeError, match="KVCache"):
        layer.step(torch.randn(2, 8), (state.k, state.v))


def test_bidirectional_has_no_step_mode():
    layer = Attention(8, n_heads=2, bidirectional=True)
    with pytest.raises(RuntimeError, match="bidirectional"):
        layer.default_state(1)
    with pytest.raises(RuntimeError, match="bidirectional"):
        layer.step(torch.randn(1, 8), None)


def test_odd_head_dim_with_rope():
    torch.manual_seed(8)
    layer = Attention(6, n_heads=2, rope=True, block_size=4).double()  # head_dim 3: last feature unrotated
    x = torch.randn(2, 6, 6, dtype=DT)
    torch.testing.assert_close(layer(x), naive_attention(layer, x), rtol=1e-10, atol=1e-10)
    y, state = layer(x), layer.default_state(2)
    for t in range(6):
        y_t, state = layer.step(x[:, t], state)
        torch.testing.assert_close(y_t, y[:, t], rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- attn_dim, bias
LOCALITY = {"dense": {}, "blocked": {"block_size": 3}, "window": {"window": 2}}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("locality", list(LOCALITY))
@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("attn_dim", [4, 12])
def test_attn_dim_matches_naive_values_and_gradients(attn_dim, bidirectional, rope, locality, bias):
    layer = make_layer(attn_dim=attn_dim, bidirectional=bidirectional, rope=rope, bias=bias, **LOCALITY[locality])
    assert layer.head_dim == attn_dim // 2 and layer.qkv.weight.shape == (3 * attn_dim, 8)
    assert layer.out_proj.weight.shape == (8, attn_dim)
    torch.manual_seed(1)
    x = torch.randn(3, 9, 8, dtype=DT)  # 9 > 2 windows: the sliding-window kernel, not the dense path
    mask = make_mask("padded", 3, 9)
    y, ref = layer(x, mask), naive_attention(layer, x, mask)
    assert y.shape == (3, 9, 8)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)
    probe = torch.randn_like(y)
    for g, g_ref in zip(
        grads(layer, x, lambda t: layer(t, mask), probe),
        grads(layer, x, lambda t: naive_attention(layer, t, mask), probe),
    ):
        torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("locality", list(LOCALITY))
@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("attn_dim", [4, 6, 12])  # head_dim 2, 3 (odd: a feature RoPE leaves alone), 6
def test_attn_dim_step_equals_forward(attn_dim, rope, locality):
    layer = make_layer(attn_dim=attn_dim, rope=rope, bias=attn_dim != 6, **LOCALITY[locality])
    torch.manual_seed(4)
    x = torch.randn(2, 9, 8, dtype=DT)
    y = layer(x)
    state = layer.default_state(2)
    assert state.k.shape == (2, 2, 0, attn_dim // 2)
    for t in range(9):
        y_t, state = layer.step(x[:, t], state)
        assert y_t.shape == (2, 8)
        torch.testing.assert_close(y_t, y[:, t], rtol=1e-10, atol=1e-10)


def test_attn_dim_need_not_divide_d_model():
    layer = make_layer(attn_dim=6).float()  # d_model 8, 2 heads of 3
    layer10 = Attention(10, n_heads=4, attn_dim=8)  # d_model 10 is not divisible by 4 heads; attn_dim is
    assert layer10.head_dim == 2 and layer10(torch.randn(1, 5, 10)).shape == (1, 5, 10)
    assert layer(torch.randn(2, 5, 8)).shape == (2, 5, 8)


def test_attn_dim_parameter_counts_and_bias_free():
    with_bias = Attention(16, n_heads=4, attn_dim=8)
    assert sum(p.numel() for p in with_bias.parameters()) == 16 * 3 * 8 + 3 * 8 + 8 * 16 + 16
    bias_free = Attention(16, n_heads=4, attn_dim=8, bias=False)
    assert not [n for n, _ in bias_free.named_parameters() if "bias" in n]
    assert sum(p.numel() for p in bias_free.parameters()) == 16 * 3 * 8 + 8 * 16
    assert "attn_dim=8" in repr(bias_free) and "bias=False" in repr(bias_free)


def test_default_attn_dim_is_d_model_bitwise():
    """attn_dim=None and attn_dim=d_model build the same parameters (names, shapes, values) and outputs."""
    torch.manual_seed(3)
    a = Attention(8, n_heads=2, rope=True)
    torch.manual_seed(3)
    b = Attention(8, n_heads=2, rope=True, attn_dim=8)
    assert a.attn_dim == 8 and "attn_dim" not in repr(a)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) == ["qkv.weight", "qkv.bias", "out_proj.weight", "out_proj.bias"]
    for name in sa:
        assert torch.equal(sa[name], sb[name])
    x = torch.randn(2, 5, 8)
    assert torch.equal(a(x), b(x))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(d_model=8, n_heads=4, attn_dim=6), r"attn_dim=6 is not divisible by n_heads=4"),
        (dict(d_model=8, attn_dim=0), "attn_dim must be None"),
        (dict(d_model=8, attn_dim=4.0), "attn_dim must be None"),
        (dict(d_model=8, attn_dim=True), "attn_dim must be None"),
    ],
)
def test_bad_attn_dim(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Attention(**kwargs)
