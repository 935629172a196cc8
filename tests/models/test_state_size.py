"""The recurrent state a model carries per sequence when it generates (Zoology's state size): what
each primitive's step mode really keeps, counted without allocating it."""

from __future__ import annotations

import pytest
import torch

from longrange.layers import S6, Attention
from longrange.layers.deltanet import GatedDeltaNet
from longrange.layers.gla import GLA
from longrange.layers.mamba2 import Mamba2
from longrange.layers.mamba3 import Mamba3
from longrange.models.config import ModelConfig
from longrange.models.model import build_model, parameter_report, state_size


def model(**kw):
    cfg = ModelConfig(**{**dict(block="mamba", primitive="s6", n_layers=2, d_model=8, d_state=4, n_heads=2), **kw})
    return build_model(cfg, input_kind="tokens", vocab_size=11, head="tokens", n_out=11)


def stepped_elements(layer, length: int) -> int:
    """The elements of the layer's state after stepping through ``length`` positions (what it holds)."""
    from longrange.layers.base import state_elements

    state = layer.default_state(1)
    for _ in range(length):
        _, state = layer.step(torch.randn(1, layer.d_model), state)
    return state_elements(state, length)


@pytest.mark.parametrize(
    "layer,expected",
    [
        (S6(8, d_state=4), 8 * 4),
        (Mamba2(8, d_state=4, headdim=4), 4 * 4 * 4 + (16 + 2 * 4) * 3),  # 4 heads of 4x4, conv over x, B, C
        (Mamba3(8, d_state=4, headdim=4), 4 * 4 * 4 + 4 * 1 + 4 * 4 + 4 * 4),  # S, 1 angle pair, last k and x
        # MIMO of rank 3: the same S and angles, the last position's 3 keys and 3 inputs per head
        (Mamba3(8, d_state=4, headdim=4, mimo_rank=3), 4 * 4 * 4 + 4 * 1 + 4 * 3 * 4 + 4 * 3 * 4),
        (GLA(8, n_heads=2), 2 * 2 * 4),  # d_k = 0.5 * 8 / 2, d_v = 8 / 2
        (GatedDeltaNet(8, n_heads=2), 2 * 4 * 8 + (2 * 8 + 16) * 3),  # d_v = 2 d_k; conv over q, k, v
    ],
)
def test_a_recurrent_layer_counts_its_fixed_state(layer, expected):
    assert layer.state_size(100) == expected == stepped_elements(layer, 5)


def test_attention_counts_its_cache_at_the_length():
    dense = Attention(8, n_heads=2)
    assert dense.state_size(100) == 2 * 100 * 8
    assert dense.state_size(7) == stepped_elements(dense, 7) == 2 * 7 * 8
    windowed = Attention(8, n_heads=2, window=3)
    assert windowed.state_size(100) == 2 * 6 * 8  # at most two windows are kept
    assert max(stepped_elements(windowed, n) for n in range(1, 13)) == 2 * 6 * 8


def test_bidirectional_layers_and_models_have_none():
    assert S6(8, bidirectional=True).state_size(10) is None
    assert state_size(model(direction="bidirectional"), 10) is None


def test_the_model_sums_its_blocks_and_the_report_carries_it():
    m = model()  # two Mamba blocks: expand 2 -> 16 channels, conv windows of 3, S6 states 16 x 4
    assert state_size(m, 50) == 2 * (16 * 3 + 16 * 4)
    assert parameter_report(m, seq_len=50)["state"] == 2 * (16 * 3 + 16 * 4)
    assert "state" not in parameter_report(m)
    t = model(block="transformer", primitive="attention")
    assert state_size(t, 50) == 2 * 2 * 50 * 8
