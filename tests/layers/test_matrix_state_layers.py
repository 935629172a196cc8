"""The matrix-state layers (Mamba-2, Mamba-3, GLA, DeltaNet, Gated DeltaNet): settings that cannot
build are errors naming the setting; an implementation can be chosen and is the one that runs; a
bidirectional layer has no step mode. (Step == forward, padding and causality: tests/models.)"""

from __future__ import annotations

import pytest
import torch

from longrange.errors import ConfigError
from longrange.layers import GLA, DeltaNet, GatedDeltaNet, Mamba2, Mamba3
from longrange.ops import used


@pytest.mark.parametrize(
    "build,match",
    [
        (lambda: Mamba2(16, headdim=7), r"Mamba-2: expand \* d_model = 32 is not divisible by headdim=7"),
        (lambda: Mamba2(16, headdim=8, ngroups=3), r"Mamba-2: the 4 heads .* not divisible by ngroups=3"),
        (lambda: Mamba2(16, A_init_range=(2.0, 1.0)), r"Mamba-2: A_init_range must be \(low, high\)"),
        (lambda: Mamba3(16, headdim=8, rope_fraction=0.3), r"Mamba-3: rope_fraction must be 0.5 or 1.0"),
        (lambda: Mamba3(16, d_state=2, headdim=8), r"Mamba-3: d_state=2 with rope_fraction=0.5 rotates no pair"),
        (lambda: GLA(16, n_heads=3), r"GLA: the key width expand_k \* d_model = 8 is not divisible by n_heads=3"),
        (lambda: GLA(16, impl="flash"), r"GLA: gla: unknown impl 'flash'; expected one of auto, fla, chunk, naive"),
        (lambda: DeltaNet(16, n_heads=5), r"DeltaNet: the key width .* not divisible by n_heads=5"),
        (
            lambda: GatedDeltaNet(16, n_heads=2, expand_v=0.3),
            r"Gated DeltaNet: expand_v \* head_dim must be a positive integer",
        ),
        (lambda: GatedDeltaNet(16, chunk_size=0), r"Gated DeltaNet: chunk_size must be"),
    ],
)
def test_settings_that_cannot_build_name_themselves(build, match):
    with pytest.raises(ConfigError, match=match):
        build()


@pytest.mark.parametrize(
    "layer,op",
    [
        (Mamba2(16, d_state=4, headdim=8, impl="naive"), "ssd"),
        (Mamba3(16, d_state=4, headdim=8, impl="naive"), "mamba3"),
        (GLA(16, n_heads=2, impl="naive"), "gla"),
        (DeltaNet(16, n_heads=2, impl="naive"), "delta_rule"),
        (GatedDeltaNet(16, n_heads=2, impl="naive"), "gated_delta_rule"),
    ],
)
def test_the_chosen_implementation_runs_and_agrees_with_the_default(layer, op):
    x = torch.randn(2, 9, 16)
    used.reset()
    naive = layer(x)
    assert used.calls()[op] == {"naive": 1}
    layer.impl = None  # the same weights with the default implementation
    used.reset()
    torch.testing.assert_close(layer(x), naive, rtol=1e-4, atol=1e-5)
    assert used.calls()[op] == {"chunk": 1}


def test_a_bidirectional_layer_has_no_step_mode():
    layer = GatedDeltaNet(16, n_heads=2, bidirectional=True)
    assert layer(torch.randn(1, 5, 16)).shape == (1, 5, 16)
    assert layer.state_size(5) is None
    with pytest.raises(RuntimeError, match="bidirectional"):
        layer.default_state(1)
