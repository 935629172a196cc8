"""Rotary positional embeddings (RoPE) with the options studied for state-space models.

The feature vector at position ``p`` is cut into interleaved pairs (x1, x2), (x3, x4), ... and
pair ``i`` (i = 1..dim/2) is rotated by the angle ``p · θ_i`` with

    θ_i = base ** (-2 (i - 1) / dim)

i.e. ``x`` is multiplied by a block-diagonal matrix of 2×2 rotations. The product is computed as
``x ⊗ cos + rot(x) ⊗ sin`` with ``rot(x) = (-x2, x1, -x4, x3, ...)``, never with a dense matrix.
When ``dim`` is odd the last feature belongs to no pair and passes through unrotated.

Options (all off by default, giving the standard RoPE):

- ``base``: 10000 (standard) or e.g. 10, which rotates every pair at a clearly different rate.
- ``trainable``: θ is an ``nn.Parameter`` initialised by the formula above instead of a buffer.
- ``normalize_len=T``: angles are scaled by ``π / (T - 1)`` so that over a sequence of length ``T``
  the largest relative rotation (positions 0 and T-1, fastest frequency θ_1 = 1) is exactly π.
  ``T`` is fixed at construction so that step-by-step rotation agrees with whole-sequence
  rotation; positions beyond ``T - 1`` are allowed and simply rotate further.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from longrange.errors import ConfigError


def rope_frequencies(
    dim: int, base: float, device: torch.device | None = None, dtype: torch.dtype | None = None
) -> Tensor:
    """θ_i = base^(-2(i-1)/dim) for i = 1..dim//2, shape (dim // 2,)."""
    exponents = torch.arange(0, dim // 2, device=device, dtype=torch.float64) * (-2.0 / dim)
    theta = torch.pow(torch.tensor(float(base), dtype=torch.float64, device=device), exponents)
    return theta.to(dtype or torch.get_default_dtype())


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate interleaved pairs of ``x`` (..., dim) by angles whose cos/sin are (..., dim // 2).

    ``cos`` and ``sin`` broadcast against ``x[..., :dim // 2]``. An odd last feature is kept as is.
    """
    n_pairs = cos.shape[-1]
    if x.dtype in (torch.float32, torch.float64) and not torch.compiler.is_compiling():
        # the pairs as complex numbers times e^{i angle}: one contiguous product forward and backward,
        # about 5x faster on a CPU than the products of the strided even and odd views below (whose
        # form Inductor fuses when compiled, and which half-precision inputs take)
        pairs = torch.view_as_complex(x[..., : 2 * n_pairs].contiguous().unflatten(-1, (n_pairs, 2)))
        rotated = torch.view_as_real(pairs * torch.complex(cos.to(x.dtype), sin.to(x.dtype))).flatten(-2)
    else:
        even = x[..., 0 : 2 * n_pairs : 2]
        odd = x[..., 1 : 2 * n_pairs : 2]
        rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
    if x.shape[-1] == 2 * n_pairs:
        return rotated
    return torch.cat((rotated, x[..., 2 * n_pairs :]), dim=-1)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Angles grow with the position: low-precision floats would lose them long before the
    # sequence ends, so tables are built in at least float32 and cast afterwards.
    return torch.float64 if dtype == torch.float64 else torch.float32


class RotaryEmbedding(nn.Module):
    """Rotary embedding of the last dimension (size ``dim``) of a sequence.

    ``forward(x, offset=0)`` takes ``x`` of shape (..., L, dim) and rotates row ``j`` as position
    ``offset + j``. ``offset`` is an int, or a LongTensor of shape (batch,) giving each sequence its
    own starting position (for generation with sequences at different lengths); in that case the
    first dimension of ``x`` is the batch, e.g. (batch, heads, L, dim).

    ``rotate_at(x_t, position)`` rotates a single step ``x_t`` of shape (..., dim) as ``position``
    (int, or (batch,) LongTensor with ``x_t``'s first dimension the batch).
    """

    def __init__(self, dim: int, base: float = 10000.0, trainable: bool = False, normalize_len: int | None = None):
        super().__init__()
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise ConfigError(f"RotaryEmbedding dim must be a positive int, got {dim!r}")
        if not (isinstance(base, (int, float)) and math.isfinite(base) and base > 1.0):
            raise ConfigError(f"RotaryEmbedding base must be a finite number > 1, got {base!r}")
        if normalize_len is not None and (
            not isinstance(normalize_len, int) or isinstance(normalize_len, bool) or normalize_len < 2
        ):
            raise ConfigError(f"RotaryEmbedding normalize_len must be None or an int >= 2, got {normalize_len!r}")
        self.dim = dim
        self.base = float(base)
        self.trainable = bool(trainable)
        self.normalize_len = normalize_len
        theta = rope_frequencies(dim, self.base)
        if self.trainable:
            self.theta = nn.Parameter(theta)
        else:
            # Fully determined by (dim, base): not saved in checkpoints.
            self.register_buffer("theta", theta, persistent=False)
        # (device, dtype) -> (cos, sin) tables for positions 0..n-1, grown on demand.
        self._tables: dict[tuple[torch.device, torch.dtype], tuple[Tensor, Tensor]] = {}

    @property
    def angle_scale(self) -> float:
        """Factor applied to ``position · θ_i``: π/(T-1) when normalised, else 1."""
        return math.pi / (self.normalize_len - 1) if self.normalize_len is not None else 1.0

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base:g}, trainable={self.trainable}, normalize_len={self.normalize_len}"

    def angles(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        """Rotation angles (..., dim // 2) for integer ``positions`` (...), computed from ``self.theta``."""
        theta = self.theta.to(dtype)
        return positions.to(dtype).unsqueeze(-1) * theta * self.angle_scale

    def _cos_sin(self, positions: Tensor, dtype: torch.dtype, needed: int) -> tuple[Tensor, Tensor]:
        """cos and sin of the angles at ``positions`` (...) all below ``needed``: (..., dim // 2) in ``dtype``."""
        if self.trainable:
            # θ changes during training and needs gradients: no cache.
            angle = self.angles(positions, _compute_dtype(dtype))
            return angle.cos().to(dtype), angle.sin().to(dtype)
        key = (positions.device, dtype)
        table = self._tables.get(key)
        if table is None or table[0].shape[0] < needed:
            size = max(needed, 2 * table[0].shape[0] if table is not None else 0, 64)
            # A table first built under inference_mode must still be usable when training resumes.
            with torch.inference_mode(False), torch.no_grad():
                # Built from the exact formula (not the possibly lower-precision buffer).
                theta = rope_frequencies(self.dim, self.base, device=positions.device, dtype=_compute_dtype(dtype))
                steps = torch.arange(size, device=positions.device, dtype=theta.dtype)
                angle = steps.unsqueeze(-1) * theta * self.angle_scale
                table = (angle.cos().to(dtype), angle.sin().to(dtype))
            self._tables[key] = table
        return table[0][positions], table[1][positions]

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        """Rotate ``x`` (..., L, dim) at positions ``offset .. offset + L - 1``; same shape out."""
        if x.dim() < 2 or x.shape[-1] != self.dim:
            raise ValueError(f"RotaryEmbedding expects input of shape (..., length, {self.dim}), got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"RotaryEmbedding expects a floating-point input, got {x.dtype}")
        length = x.shape[-2]
        steps = torch.arange(length, device=x.device)
        if isinstance(offset, Tensor):
            if offset.dim() != 1 or offset.dtype in (torch.bool,) or offset.is_floating_point():
                raise ValueError(
                    f"RotaryEmbedding offset tensor must be an integer tensor of shape (batch,), got "
                    f"{offset.dtype} of shape {tuple(offset.shape)}"
                )
            if x.dim() < 3 or offset.shape[0] != x.shape[0]:
                raise ValueError(
                    f"RotaryEmbedding offset of shape {tuple(offset.shape)} needs input of shape (batch, ..., length, dim) "
                    f"with batch = {offset.shape[0]}, got {tuple(x.shape)}"
                )
            offset = offset.to(x.device)
            if bool((offset < 0).any()):
                raise ValueError("RotaryEmbedding offsets must be >= 0")
            positions = offset.unsqueeze(-1) + steps  # (batch, L)
            needed = int(positions.max().item()) + 1 if positions.numel() else 1
            cos, sin = self._cos_sin(positions, x.dtype, needed)
            # (batch, L, n) -> (batch, 1, ..., 1, L, n) to broadcast over middle dimensions.
            shape = (x.shape[0],) + (1,) * (x.dim() - 3) + cos.shape[1:]
            cos, sin = cos.reshape(shape), sin.reshape(shape)
        else:
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ValueError(f"RotaryEmbedding offset must be an int >= 0 or a (batch,) LongTensor, got {offset!r}")
            cos, sin = self._cos_sin(steps + offset, x.dtype, offset + length)
        return apply_rotary(x, cos, sin)

    def rotate_at(self, x_t: Tensor, position: int | Tensor) -> Tensor:
        """Rotate one step ``x_t`` (..., dim) as ``position``; equals row ``position`` of ``forward``."""
        if x_t.dim() < 1 or x_t.shape[-1] != self.dim:
            raise ValueError(
                f"RotaryEmbedding.rotate_at expects input of shape (..., {self.dim}), got {tuple(x_t.shape)}"
            )
        return self.forward(x_t.unsqueeze(-2), offset=position).squeeze(-2)
