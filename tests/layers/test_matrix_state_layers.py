"""The matrix-state layers (Mamba-2, Mamba-3, GLA, DeltaNet, Gated DeltaNet): settings that cannot
build are errors naming the setting; an implementation can be chosen and is the one that runs; a
bidirectional layer has no step mode. (Step == forward, padding and causality: tests/models.)"""

from __future__ import annotations

import pytest
import torch

from longrange.errors import ConfigError
from longrange.layers import GLA, DeltaNet, GatedDeltaNet, Mamba2, Mamba3
from longrange.ops import used
from longrange.ops.matrix_state import dispatch as ms


@pytest.mark.parametrize(
    "build,match",
    [
        (lambda: Mamba2(16, headdim=7), r"Mamba-2: expand \* d_model = 32 is not divisible by headdim=7"),
        (lambda: Mamba2(16, headdim=8, ngroups=3), r"Mamba-2: the 4 heads .* not divisible by ngroups=3"),
        (lambda: Mamba2(16, A_init_range=(2.0, 1.0)), r"Mamba-2: A_init_range must be \(low, high\)"),
        (lambda: Mamba3(16, headdim=8, rope_fraction=0.3), r"Mamba-3: rope_fraction must be 0.5 or 1.0"),
        (lambda: Mamba3(16, d_state=2, headdim=8), r"Mamba-3: d_state=2 with rope_fraction=0.5 rotates no pair"),
        (lambda: Mamba3(16, headdim=8, mimo_rank=0), r"Mamba-3: mimo_rank must be a positive integer"),
        (lambda: Mamba3(16, headdim=8, chunk_size=0), r"Mamba-3: chunk_size must be a positive integer"),
        (
            lambda: Mamba3(16, headdim=8, mimo_rank=2, impl="mamba"),
            r"Mamba-3: mamba3_mimo: unknown impl 'mamba'; expected one of auto, chunk, naive",
        ),
        (lambda: GLA(16, n_heads=3), r"GLA: the key width expand_k \* d_model = 8 is not divisible by n_heads=3"),
        (
            lambda: GLA(16, impl="flash"),
            r"GLA: gla: unknown impl 'flash'; expected one of auto, fla, numba, chunk, naive",
        ),
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
        (Mamba3(16, d_state=4, headdim=8, mimo_rank=2, impl="naive"), "mamba3_mimo"),
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
    # On CPUs the delta rules' small states run the numba kernels where numba imports.
    assert used.calls()[op] == {ms.DISPATCHERS[op].auto_impl("cpu", state_elements=64): 1}


def test_a_bidirectional_layer_has_no_step_mode():
    layer = GatedDeltaNet(16, n_heads=2, bidirectional=True)
    assert layer(torch.randn(1, 5, 16)).shape == (1, 5, 16)
    assert layer.state_size(5) is None
    with pytest.raises(RuntimeError, match="bidirectional"):
        layer.default_state(1)


def test_mamba3_mimo_is_the_published_layer_around_its_recurrence():
    """MIMO of rank r: B and C with r ranks and biases per head and rank, the input and the gate
    scaled up to the ranks and the ranks' outputs summed down (initialised 1/r, 1, 1/r as
    published), the per-head output norm with one scale per head and channel (mamba-ssm's
    RMSNormGated over groups of headdim), the chunk in positions of r ranks (64 // r by default);
    rank 1 is SISO, without the up and down scales."""
    layer = Mamba3(16, d_state=8, headdim=8, mimo_rank=4, outproj_norm=True)
    h = layer.n_heads
    assert layer.in_proj.out_features == 2 * 32 + 2 * 4 * 8 + 3 * h + 2
    assert layer.B_bias.shape == layer.C_bias.shape == (h, 4, 8)
    torch.testing.assert_close(layer.mimo_x.detach(), torch.full((h, 4, 8), 0.25))
    torch.testing.assert_close(layer.mimo_z.detach(), torch.ones(h, 4, 8))
    torch.testing.assert_close(layer.mimo_o.detach(), torch.full((h, 4, 8), 0.25))
    assert layer.norm.weight.shape == (h, 8) and layer.chunk_size == 16
    siso = Mamba3(16, d_state=8, headdim=8)
    assert siso.B_bias.shape == (h, 8) and not hasattr(siso, "mimo_x") and siso.chunk_size == 64
    assert "mimo_rank=4" in repr(layer)
    from longrange.ops.matrix_state.mamba3_mimo import default_chunk_size

    assert [default_chunk_size(r) for r in (1, 2, 4, 128)] == [64, 32, 16, 1]  # one rule, the op's and the layer's
    assert Mamba3(16, d_state=8, headdim=8, mimo_rank=2).chunk_size == 32


def test_mamba3_mimo_layer_matches_its_formula():
    """The layer's forward, written out from the published module (up-projection, the recurrence by
    the loop over time, the per-rank gate, the down-projection) on random weights."""
    from longrange.layers.mamba3 import heavy_tail
    from longrange.ops.matrix_state.mamba3_mimo import mamba3_mimo_naive

    torch.manual_seed(0)
    layer = Mamba3(16, d_state=8, headdim=8, mimo_rank=3, ngroups=2).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    u = torch.randn(2, 7, 16, dtype=torch.float64)
    h, r, g, n, d = layer.n_heads, 3, 2, 8, layer.d_inner
    with torch.no_grad():
        z, x, B, C, dd_dt, dd_A, trap, angles = layer.in_proj(u).split([d, d, r * g * n, r * g * n, h, h, h, 2], -1)
        rms = lambda t, w: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5) * w  # noqa: E731
        B = rms(B.reshape(2, 7, r, g, n), layer.B_norm.weight)
        C = rms(C.reshape(2, 7, r, g, n), layer.C_norm.weight)
        dt = torch.nn.functional.softplus(dd_dt + layer.dt_bias)
        A = (-heavy_tail(dd_A)).clamp_max(-layer.A_floor)
        x = x.reshape(2, 7, h, 8)
        xr = torch.stack([x * layer.mimo_x[:, j] for j in range(r)], 2)
        zr = torch.stack([z.reshape(2, 7, h, 8) * layer.mimo_z[:, j] for j in range(r)], 2)
        y = mamba3_mimo_naive(
            xr, dt, A, B, C, trap, angles[:, :, None].expand(2, 7, h, 2), layer.B_bias, layer.C_bias, layer.D
        )
        y = sum((y[:, :, j] * torch.nn.functional.silu(zr[:, :, j])) * layer.mimo_o[:, j] for j in range(r))
        want = layer.out_proj(y.flatten(-2))
        torch.testing.assert_close(layer(u), want, rtol=1e-10, atol=1e-10)


def test_mamba2_gated_norm_scales_each_channel_as_mamba_ssm_does():
    """mamba-ssm's ``RMSNormGated(d_ssm, group_size=d_ssm // ngroups)``: the norm over each group's
    channels, a scale per channel (not one shared by the groups)."""
    import torch.nn.functional as F

    from longrange.layers.mixer_parts import split_heads

    layer = Mamba2(16, d_state=4, headdim=8, ngroups=2).double()  # d_inner 32 in 2 groups of 16
    assert layer.norm.weight.shape == (2, 16)
    assert Mamba2(16, d_state=4, headdim=8).norm.weight.shape == (32,)  # one group: the shape it always had
    with torch.no_grad():
        layer.norm.weight.uniform_(0.5, 1.5)
    y, z = torch.randn(2, 5, 32, dtype=torch.float64), torch.randn(2, 5, 32, dtype=torch.float64)
    got = layer.norm(split_heads(y, 2), split_heads(z, 2)).reshape(2, 5, 32)
    u = (y * F.silu(z)).reshape(2, 5, 2, 16)
    expected = (u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + 1e-5)).reshape(2, 5, 32) * layer.norm.weight.reshape(
        32
    )
    torch.testing.assert_close(got, expected)
