"""TransformerBlock: composition formula, step == forward, padding, causality, errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from longrange.blocks.transformer import TransformerBlock
from longrange.errors import ConfigError
from longrange.layers.attention import Attention, KVCache

DT = torch.float64


def make_block(**kwargs) -> TransformerBlock:
    torch.manual_seed(0)
    block = TransformerBlock(8, n_heads=2, **kwargs).double()
    with torch.no_grad():  # norms away from the identity so that they matter in the checks
        for name, p in block.named_parameters():
            if name.startswith("norm"):
                p.add_(0.3 * torch.randn_like(p))
    return block


def reference_block(block: TransformerBlock, x, mask=None, prenorm=True):
    """The block written out with functional layer norms and linear maps."""

    def ln(norm, t):
        return F.layer_norm(t, (t.shape[-1],), norm.weight, norm.bias, norm.eps)

    def mlp(t):
        first, _, second = block.mlp
        return F.gelu(t @ first.weight.T + first.bias) @ second.weight.T + second.bias

    if prenorm:
        x = x + block.mixer(ln(block.norm1, x), mask)
        return x + mlp(ln(block.norm2, x))
    x = ln(block.norm1, x + block.mixer(x, mask))
    return ln(block.norm2, x + mlp(x))


@pytest.mark.parametrize("prenorm", [True, False])
def test_matches_written_out_formula(prenorm):
    block = make_block(prenorm=prenorm, rope=True)
    x = torch.randn(2, 6, 8, dtype=DT)
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    torch.testing.assert_close(block(x, mask), reference_block(block, x, mask, prenorm), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(block(x), reference_block(block, x, None, prenorm), rtol=1e-12, atol=1e-12)


def test_mixer_is_the_attention():
    block = TransformerBlock(16, n_heads=4, mlp_ratio=2.0)
    assert isinstance(block.mixer, Attention) and block.mixers == [block.mixer]
    inside = sum(p.numel() for p in block.mixer.parameters())
    assert inside == 4 * 16 * 16 + 4 * 16
    mlp = (16 * 32 + 32) + (32 * 16 + 16)
    assert sum(p.numel() for p in block.parameters()) == inside + mlp + 2 * 2 * 16


def test_attn_dim_and_attn_bias_reach_the_attention():
    block = TransformerBlock(16, n_heads=4, mlp_ratio=2.0, attn_dim=8, attn_bias=False)
    assert block.mixer.attn_dim == 8 and block.mixer.head_dim == 2
    assert block.mixer.qkv.bias is None and block.mixer.out_proj.bias is None
    inside = sum(p.numel() for p in block.mixer.parameters())
    assert inside == 16 * 24 + 8 * 16
    mlp = (16 * 32 + 32) + (32 * 16 + 16)  # the MLP keeps its biases
    assert sum(p.numel() for p in block.parameters()) == inside + mlp + 2 * 2 * 16


@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize("prenorm", [True, False])
def test_attn_dim_step_equals_forward(prenorm, window):
    block = make_block(prenorm=prenorm, rope=True, attn_dim=4, attn_bias=False, window=window).eval()
    x = torch.randn(2, 7, 8, dtype=DT)
    y = block(x)
    state = block.default_state(2)
    for t in range(7):
        y_t, state = block.step(x[:, t], state)
        torch.testing.assert_close(y_t, y[:, t], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("block_size", [None, 3])
@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("norm", ["layer", "rms", "batch", "none"])
@pytest.mark.parametrize("prenorm", [True, False])
def test_step_equals_forward(prenorm, norm, rope, block_size):
    block = make_block(prenorm=prenorm, norm=norm, rope=rope, block_size=block_size, activation="silu")
    if norm == "batch":  # give the running statistics non-trivial values
        block.train()
        block(torch.randn(4, 7, 8, dtype=DT) * 2 + 1)
    block.eval()
    x = torch.randn(2, 7, 8, dtype=DT)
    y = block(x)
    state = block.default_state(2)
    assert isinstance(state, KVCache)
    for t in range(7):
        y_t, state = block.step(x[:, t], state)
        torch.testing.assert_close(y_t, y[:, t], rtol=1e-10, atol=1e-10)


def test_causality_via_gradients():
    block = make_block(rope=True)
    x = torch.randn(1, 6, 8, dtype=DT, requires_grad=True)
    y = block(x)
    for t in range(6):
        (g,) = torch.autograd.grad(y[0, t].sum(), x, retain_graph=True)
        influence = g[0].abs().sum(-1)
        assert (influence[t + 1 :] == 0).all() and (influence[: t + 1] > 0).all()


@pytest.mark.parametrize("norm", ["layer", "batch"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_padding_invariance(bidirectional, norm):
    block = make_block(bidirectional=bidirectional, norm=norm, block_size=4)
    block.train()  # batch statistics are taken over real positions only
    x = torch.randn(2, 5, 8, dtype=DT)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    y = block(x, mask)
    x_long = torch.cat([x, 30 * torch.randn(2, 4, 8, dtype=DT)], dim=1)
    mask_long = torch.cat([mask, torch.zeros(2, 4, dtype=torch.bool)], dim=1)
    y_long = block(x_long, mask_long)
    torch.testing.assert_close(y_long[mask_long], y[mask], rtol=1e-10, atol=1e-10)
    assert torch.isfinite(y_long).all()


def test_bidirectional_block():
    block = make_block(bidirectional=True)
    assert block.bidirectional and block.mixer.bidirectional
    x = torch.randn(1, 5, 8, dtype=DT, requires_grad=True)
    (g,) = torch.autograd.grad(block(x)[0, 0].sum(), x)
    assert (g[0].abs().sum(-1) > 0).all()
    with pytest.raises(RuntimeError, match="bidirectional"):
        block.default_state(1)
    with pytest.raises(RuntimeError, match="bidirectional"):
        block.step(torch.randn(1, 8, dtype=DT), None)


def test_dropout_only_in_training():
    torch.manual_seed(1)
    block = TransformerBlock(8, n_heads=2, dropout=0.5).double()
    x = torch.randn(2, 5, 8, dtype=DT)
    block.eval()
    y = block(x)
    torch.testing.assert_close(block(x), y, rtol=0, atol=0)
    block.train()
    assert not torch.allclose(block(x), y)


def test_batch_norm_step_needs_eval():
    block = make_block(norm="batch")
    block.train()
    with pytest.raises(RuntimeError, match=r"norm='batch'.*eval"):
        block.step(torch.randn(2, 8, dtype=DT), block.default_state(2))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(activation="tanh"), "activation 'tanh'"),
        (dict(mlp_ratio=0), "mlp_ratio"),
        (dict(dropout=-0.1), "dropout"),
        (dict(norm="group"), "norm 'group'"),
        (dict(n_heads=3), "not divisible by n_heads=3"),
        (dict(n_heads=4, attn_dim=6), "attn_dim=6 is not divisible by n_heads=4"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        TransformerBlock(8, **kwargs)


def test_bad_input_shape():
    block = TransformerBlock(8, n_heads=2)
    with pytest.raises(ValueError, match=r"TransformerBlock expects input of shape \(batch, length, 8\)"):
        block(torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match=r"TransformerBlock.step expects input of shape \(batch, 8\)"):
        block.step(torch.randn(2, 3, 8), block.default_state(2))
