"""RWKV-4 time mixing: the layer against its definition, its initialisation against the RWKV
code's loops, its place in a model's stack, step == forward, state size and option errors."""

from __future__ import annotations

import math

import pytest
import torch

from longrange.errors import ConfigError
from longrange.layers.rwkv import RWKV
from longrange.models.config import ModelConfig
from longrange.models.model import build_model, state_size
from longrange.ops.wkv import wkv_ref

pytestmark = pytest.mark.usefixtures("float64_default")  # tests/conftest.py


def zoology_init(d: int, layer_idx: int, n_layer: int) -> dict[str, list[float]]:
    """RWKVTimeMixer.__init__'s loops (zoology/mixers/rwkv.py), written out element by element."""
    ratio_0_to_1 = layer_idx / (n_layer - 1)
    ratio_1_to_almost0 = 1.0 - layer_idx / n_layer
    decay = [-5 + 8 * (h / (d - 1)) ** (0.7 + 1.3 * ratio_0_to_1) for h in range(d)]
    first = [math.log(0.3) + ((i + 1) % 3 - 1) * 0.5 for i in range(d)]
    x = [i / d for i in range(d)]
    return {
        "time_decay": decay,
        "time_first": first,
        "mix_k": [xi**ratio_1_to_almost0 for xi in x],
        "mix_v": [xi**ratio_1_to_almost0 + 0.3 * ratio_0_to_1 for xi in x],
        "mix_r": [xi ** (0.5 * ratio_1_to_almost0) for xi in x],
    }


def test_the_initialisation_is_the_rwkv_codes_for_each_layer_of_the_stack():
    for index in (0, 1, 11):
        layer = RWKV(10, init_layers=12)
        layer.place_in_stack(index, 2)  # init_layers counts, not the model's 2
        for name, values in zoology_init(10, index, 12).items():
            torch.testing.assert_close(getattr(layer, name).detach(), torch.tensor(values), msg=name)
    assert sum(p.numel() for p in RWKV(10).parameters()) == 4 * 10 * 10 + 5 * 10


def test_the_backbone_places_each_layer_and_init_layers_overrides_the_models_count():
    def layers(**options):
        cfg = ModelConfig(
            block="residual", primitive="rwkv", n_layers=3, d_model=8, mlp="none", primitive_options=options
        )
        torch.manual_seed(0)
        model = build_model(cfg, input_kind="tokens", head="tokens", n_out=5, vocab_size=5)
        return [b.mixer for b in model.backbone.blocks]

    for i, mixer in enumerate(layers()):
        assert mixer.layer_index == i
        torch.testing.assert_close(mixer.mix_v.detach(), torch.tensor(zoology_init(8, i, 3)["mix_v"]))
    for i, mixer in enumerate(layers(init_layers=12)):  # Zoology's: RWKVTimeMixer's default n_layer
        torch.testing.assert_close(mixer.time_decay.detach(), torch.tensor(zoology_init(8, i, 12)["time_decay"]))
    with pytest.raises(ConfigError, match="layer 2 of the model is not below init_layers 2"):
        layers(init_layers=2)
    # In a stack, the place among the sequence-mixing layers: a channel mixer is part of the layer before it.
    stack = ModelConfig(block="residual", n_layers=4, d_model=8, layers=["rwkv", "swiglu"])
    blocks = build_model(stack, input_kind="tokens", head="tokens", n_out=5, vocab_size=5).backbone.blocks
    assert [blocks[i].mixer.layer_index for i in (0, 2)] == [0, 1]
    torch.testing.assert_close(blocks[2].mixer.mix_v.detach(), torch.tensor(zoology_init(8, 1, 2)["mix_v"]))
    bi = ModelConfig(block="residual", primitive="rwkv", n_layers=2, d_model=8, direction="bidirectional")
    model = build_model(bi, input_kind="tokens", head="tokens", n_out=5, vocab_size=5)
    second = model.backbone.blocks[1].mixer.directions
    assert second.fwd.layer_index == second.bwd.layer_index == 1


def test_forward_is_the_token_shift_the_gates_and_the_wkv_as_written():
    torch.manual_seed(0)
    layer = RWKV(6, init_layers=4, chunk_size=3)
    layer.place_in_stack(1, 4)
    x = torch.randn(2, 9, 6)
    shifted = torch.cat([torch.zeros(2, 1, 6), x[:, :-1]], dim=1)

    def mixed(mu):
        return x * mu + shifted * (1 - mu)

    k, v = layer.key(mixed(layer.mix_k)), layer.value(mixed(layer.mix_v))
    r = torch.sigmoid(layer.receptance(mixed(layer.mix_r)))
    wkv, _ = wkv_ref(torch.exp(layer.time_decay), layer.time_first, k, v)
    torch.testing.assert_close(layer(x), layer.output(r * wkv))


def test_step_equals_forward_and_the_state_is_4d_numbers():
    torch.manual_seed(1)
    layer = RWKV(6, init_layers=2, chunk_size=4)
    x = torch.randn(3, 11, 6)
    state, ys = layer.default_state(3), []
    for t in range(11):
        y, state = layer.step(x[:, t], state)
        ys.append(y)
    torch.testing.assert_close(torch.stack(ys, 1), layer(x))
    assert layer.state_size(100) == 4 * 6
    assert RWKV(6, bidirectional=True).state_size(10) is None
    with pytest.raises(RuntimeError, match="bidirectional"):
        RWKV(6, bidirectional=True).default_state(1)
    cfg = ModelConfig(block="residual", primitive="rwkv", n_layers=2, d_model=8, mlp="none")
    assert state_size(build_model(cfg, input_kind="tokens", head="tokens", n_out=5, vocab_size=5), 24) == 2 * 4 * 8


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(init_layers=0), "RWKV: init_layers must be a positive integer"),
        (dict(chunk_size=0), "RWKV: chunk_size must be a positive integer"),
        (dict(impl="fast"), r"RWKV: impl: wkv: unknown impl 'fast'"),
    ],
)
def test_bad_options_are_errors_naming_them(options, message):
    with pytest.raises(ConfigError, match=message):
        RWKV(8, **options)


def test_a_place_outside_the_layers_counted_is_an_error():
    with pytest.raises(ConfigError, match="layer 3 of the model is not below init_layers 3"):
        RWKV(8, init_layers=3).place_in_stack(3, 5)
    with pytest.raises(ValueError, match="place_in_stack: the index must be an integer >= 0, got -1"):
        RWKV(8).place_in_stack(-1, 2)


def test_a_step_with_a_foreign_state_is_an_error_naming_it():
    layer = RWKV(4)
    with pytest.raises(ValueError, match=r"RWKV.step: the state is a dict of x, num, den, scale"):
        layer.step(torch.zeros(2, 4), torch.zeros(2, 4))
    state = layer.default_state(3)
    with pytest.raises(ValueError, match=r"RWKV.step: state\['x'\] has shape \(3, 4\), the input \(2, 4\)"):
        layer.step(torch.zeros(2, 4), state)
