"""RotaryEmbedding against the dense block-diagonal rotation matrix, and its invariants."""

from __future__ import annotations

import math

import pytest
import torch

from longrange.errors import ConfigError
from longrange.layers.rope import RotaryEmbedding, apply_rotary, rope_frequencies

DT = torch.float64


def dense_rotation(theta: torch.Tensor, position: float, dim: int) -> torch.Tensor:
    """The (dim, dim) matrix R_{θ,k}: 2×2 rotations by position·θ_i on the diagonal, 1 for an odd tail."""
    r = torch.eye(dim, dtype=theta.dtype)
    for i, th in enumerate(theta.tolist()):
        a = position * th
        c, s = math.cos(a), math.sin(a)
        r[2 * i, 2 * i], r[2 * i, 2 * i + 1] = c, -s
        r[2 * i + 1, 2 * i], r[2 * i + 1, 2 * i + 1] = s, c
    return r


def dense_rope(x: torch.Tensor, theta: torch.Tensor, positions, scale: float = 1.0) -> torch.Tensor:
    """Apply R_{θ,p} to each row x[..., j, :] with p = positions[j]; x of shape (..., L, dim)."""
    rows = [x[..., j, :] @ dense_rotation(theta, float(p) * scale, x.shape[-1]).T for j, p in enumerate(positions)]
    return torch.stack(rows, dim=-2)


@pytest.mark.parametrize("dim", [8, 7, 2, 1])
@pytest.mark.parametrize("base", [10.0, 10000.0])
def test_matches_dense_rotation_matrix(dim, base):
    torch.manual_seed(0)
    rope = RotaryEmbedding(dim, base=base)
    x = torch.randn(2, 3, 5, dim, dtype=DT)
    theta = rope_frequencies(dim, base, dtype=DT)
    torch.testing.assert_close(rope(x), dense_rope(x, theta, range(5)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rope(x, offset=4), dense_rope(x, theta, range(4, 9)), rtol=1e-12, atol=1e-12)


def test_frequencies_formula():
    theta = rope_frequencies(8, 10000.0, dtype=DT)
    expected = torch.tensor([10000.0 ** (-2 * (i - 1) / 8) for i in range(1, 5)], dtype=DT)
    torch.testing.assert_close(theta, expected, rtol=1e-14, atol=0)
    assert theta[0] == 1.0
    assert RotaryEmbedding(8).theta.shape == (4,)
    assert RotaryEmbedding(9).theta.shape == (4,)


def test_pair_layout_is_interleaved():
    # x = e_1 at position 1 with θ_1 = 1 rotates into (cos 1, sin 1) on features 1 and 2.
    rope = RotaryEmbedding(4)
    x = torch.zeros(2, 4, dtype=DT)
    x[1, 0] = 1.0
    y = rope(x)
    torch.testing.assert_close(y[1], torch.tensor([math.cos(1.0), math.sin(1.0), 0.0, 0.0], dtype=DT))
    torch.testing.assert_close(y[0], x[0])


def test_odd_dim_keeps_last_feature():
    rope = RotaryEmbedding(5)
    x = torch.randn(6, 5, dtype=DT)
    y = rope(x, offset=3)
    torch.testing.assert_close(y[:, -1], x[:, -1], rtol=0, atol=0)
    assert not torch.allclose(y[1:, :4], x[1:, :4])


@pytest.mark.parametrize("base", [10.0, 10000.0])
def test_relative_position_property(base):
    torch.manual_seed(1)
    rope = RotaryEmbedding(6, base=base)
    q, k = torch.randn(6, dtype=DT), torch.randn(6, dtype=DT)

    def score(m, n):
        return torch.dot(rope.rotate_at(q, m), rope.rotate_at(k, n))

    for shift in (0, 3, 17):
        torch.testing.assert_close(score(5 + shift, 2 + shift), score(5, 2), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(score(1 + shift, 4 + shift), score(1, 4), rtol=1e-10, atol=1e-10)
    # A different distance gives a different score (so the check above is not vacuous).
    assert not torch.allclose(score(5, 2), score(6, 2))


def test_norm_preserved():
    torch.manual_seed(2)
    rope = RotaryEmbedding(9, base=10.0)
    x = torch.randn(3, 11, 9, dtype=DT)
    torch.testing.assert_close(rope(x, offset=100).norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=1e-12)


def test_normalized_max_angle_is_pi():
    T = 9
    rope = RotaryEmbedding(4, normalize_len=T)
    x = torch.zeros(T, 4, dtype=DT)
    x[:, 0] = 1.0  # unit vector in the fastest pair
    y = rope(x)
    angle = torch.atan2(y[:, 1], y[:, 0])
    torch.testing.assert_close(angle[-1].abs(), torch.tensor(math.pi, dtype=DT), rtol=0, atol=1e-12)
    # First and last tokens point in opposite directions; angles grow linearly in between.
    torch.testing.assert_close(torch.dot(y[0], y[-1]), torch.tensor(-1.0, dtype=DT), rtol=0, atol=1e-12)
    torch.testing.assert_close(angle[:-1], torch.arange(T - 1, dtype=DT) * math.pi / (T - 1), rtol=0, atol=1e-12)
    theta = rope_frequencies(4, 10000.0, dtype=DT)
    torch.testing.assert_close(rope(x), dense_rope(x, theta, range(T), scale=math.pi / (T - 1)), rtol=1e-12, atol=1e-12)


def test_normalized_step_matches_forward_beyond_length():
    rope = RotaryEmbedding(6, normalize_len=5)
    x = torch.randn(2, 8, 6, dtype=DT)
    full = rope(x)
    for t in range(8):
        torch.testing.assert_close(rope.rotate_at(x[:, t], t), full[:, t], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("normalize_len", [None, 16])
def test_trainable_theta_gets_gradients(normalize_len):
    torch.manual_seed(3)
    rope = RotaryEmbedding(6, trainable=True, normalize_len=normalize_len).double()
    assert isinstance(rope.theta, torch.nn.Parameter)
    assert "theta" in dict(rope.named_parameters())
    torch.testing.assert_close(rope.theta.detach(), rope_frequencies(6, 10000.0, dtype=DT))
    x = torch.randn(2, 7, 6, dtype=DT)
    rope(x).pow(3).sum().backward()
    assert rope.theta.grad is not None and torch.isfinite(rope.theta.grad).all()
    assert (rope.theta.grad.abs() > 0).all()
    # Same rotation as the dense matrix built from the parameter's current values.
    scale = rope.angle_scale
    expected = dense_rope(x, rope.theta.detach(), range(7), scale=scale)
    torch.testing.assert_close(rope(x), expected, rtol=1e-12, atol=1e-12)
    # ... and as the fixed version at initialisation, up to the float32 rounding of the init.
    fixed = RotaryEmbedding(6, normalize_len=normalize_len)
    torch.testing.assert_close(rope(x), fixed(x), rtol=1e-6, atol=1e-6)
    # After an update, the rotation follows the new θ (no stale cache).
    with torch.no_grad():
        rope.theta.mul_(1.5)
    expected = dense_rope(x, rope.theta.detach(), range(7), scale=scale)
    torch.testing.assert_close(rope(x), expected, rtol=1e-12, atol=1e-12)


def test_trainable_theta_gradient_matches_finite_differences():
    rope = RotaryEmbedding(4, base=10.0, trainable=True).double()
    x = torch.randn(1, 5, 4, dtype=DT)
    theta = rope.theta.detach().clone().requires_grad_(True)

    def f(th):
        return apply_rotary(
            x, (torch.arange(5, dtype=DT)[:, None] * th).cos(), (torch.arange(5, dtype=DT)[:, None] * th).sin()
        ).sum()

    assert torch.autograd.gradcheck(f, (theta,))
    rope(x).sum().backward()
    torch.testing.assert_close(rope.theta.grad, torch.autograd.grad(f(theta), theta)[0])


def test_fixed_theta_is_a_buffer_not_saved():
    rope = RotaryEmbedding(8)
    assert len(list(rope.parameters())) == 0
    assert "theta" in dict(rope.named_buffers())
    assert rope.state_dict() == {}


def test_rotate_at_equals_forward_rows():
    torch.manual_seed(4)
    rope = RotaryEmbedding(8, base=10.0)
    x = torch.randn(2, 3, 6, 8, dtype=DT)
    full = rope(x, offset=2)
    for t in range(6):
        torch.testing.assert_close(rope.rotate_at(x[:, :, t], t + 2), full[:, :, t], rtol=0, atol=1e-14)


def test_per_sequence_offsets():
    torch.manual_seed(5)
    rope = RotaryEmbedding(8)
    x = torch.randn(3, 2, 4, 8, dtype=DT)
    offsets = torch.tensor([0, 5, 130])  # 130 forces the cached table to grow
    y = rope(x, offset=offsets)
    for b, o in enumerate(offsets.tolist()):
        torch.testing.assert_close(y[b], rope(x[b], offset=o), rtol=0, atol=1e-14)
    # rotate_at with per-sequence positions on (batch, heads, dim)
    torch.testing.assert_close(rope.rotate_at(x[:, :, 1], offsets + 1), y[:, :, 1], rtol=0, atol=1e-14)


def test_cache_consistent_across_lengths_and_dtypes():
    rope = RotaryEmbedding(6)
    x = torch.randn(300, 6, dtype=DT)
    long = rope(x)
    short = rope(x[:10])
    torch.testing.assert_close(long[:10], short, rtol=0, atol=0)
    y32 = rope(x.float())
    assert y32.dtype == torch.float32
    torch.testing.assert_close(y32, long.float(), rtol=1e-5, atol=1e-5)


def test_table_built_in_inference_mode_serves_training():
    rope = RotaryEmbedding(4)
    with torch.inference_mode():
        rope(torch.randn(5, 4))
    x = torch.randn(5, 4, requires_grad=True)
    rope(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_float32_precision_at_long_positions():
    # The angle table is built in float32 at least, from the exact formula.
    rope = RotaryEmbedding(4)
    x = torch.randn(1, 4, dtype=DT)
    y64 = rope(x, offset=20000)
    y32 = rope(x.float(), offset=20000)
    torch.testing.assert_close(y32.double(), y64, rtol=0, atol=5e-3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dim=0), "dim"),
        (dict(dim=4.0), "dim"),
        (dict(dim=4, base=1.0), "base"),
        (dict(dim=4, base=float("inf")), "base"),
        (dict(dim=4, normalize_len=1), "normalize_len"),
        (dict(dim=4, normalize_len=3.5), "normalize_len"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        RotaryEmbedding(**kwargs)


def test_bad_inputs():
    rope = RotaryEmbedding(4)
    with pytest.raises(ValueError, match=r"\(\.\.\., length, 4\).*\(2, 5\)"):
        rope(torch.randn(2, 5))
    with pytest.raises(ValueError, match="length"):
        rope(torch.randn(4))
    with pytest.raises(ValueError, match="floating"):
        rope(torch.ones(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="offset"):
        rope(torch.randn(3, 4), offset=-1)
    with pytest.raises(ValueError, match="offset"):
        rope(torch.randn(3, 4), offset=1.5)
    with pytest.raises(ValueError, match="batch = 3"):
        rope(torch.randn(2, 3, 4), offset=torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="integer tensor"):
        rope(torch.randn(2, 3, 4), offset=torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=">= 0"):
        rope(torch.randn(2, 3, 4), offset=torch.tensor([0, -1]))
    with pytest.raises(ValueError, match=r"rotate_at.*\(\.\.\., 4\)"):
        rope.rotate_at(torch.randn(2, 5), 0)


@pytest.mark.parametrize("dim", [8, 7])
def test_the_complex_product_and_the_strided_form_agree_in_values_and_gradients(dim, monkeypatch):
    """float32/float64 rotate the pairs as complex numbers; compiled code and half precision take the
    products of the even and odd views. Both against the dense rotation, on a transposed input (the
    attention heads' layout), values and gradients, float64."""
    torch.manual_seed(1)
    theta = rope_frequencies(dim, 100.0, dtype=DT)
    angles = torch.arange(6, dtype=DT)[:, None] * theta
    cos, sin = angles.cos(), angles.sin()
    base = torch.randn(2, 6, 3, dim, dtype=DT)  # (batch, length, heads, dim), used as (batch, heads, length, dim)
    grad = torch.randn(2, 3, 6, dim, dtype=DT)

    def run():
        x = base.clone().requires_grad_(True)
        y = apply_rotary(x.transpose(1, 2), cos, sin)
        y.backward(grad)
        return y.detach(), x.grad

    complex_y, complex_g = run()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    strided_y, strided_g = run()
    x = base.clone().requires_grad_(True)
    want = dense_rope(x.transpose(1, 2), theta, range(6))
    want.backward(grad)
    for y, g in ((complex_y, complex_g), (strided_y, strided_g)):
        torch.testing.assert_close(y, want.detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g, x.grad, rtol=1e-12, atol=1e-12)


def test_half_precision_takes_the_strided_form():
    torch.manual_seed(2)
    x = torch.randn(2, 4, 5, 8)
    cos, sin = torch.rand(5, 4), torch.rand(5, 4)
    y = apply_rotary(x.bfloat16(), cos.bfloat16(), sin.bfloat16())
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), apply_rotary(x, cos, sin), rtol=2e-2, atol=2e-2)
