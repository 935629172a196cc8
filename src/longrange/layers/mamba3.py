"""Mamba-3 (Lahoti et al. 2026, arXiv 2603.15569), single-input single-output or multi-input
multi-output, as a sequence primitive.

The layer of the authors' ``mamba_ssm/modules/mamba3.py`` (d_inner = expand · d_model, H = d_inner /
headdim heads, B and C shared within ``ngroups`` groups; no short convolution, which Mamba-3 drops).
SISO (``mimo_rank=1``, their ``is_mimo=False``)::

    (z, x, B, C, dd_dt, dd_A, trap, angles) = in_proj(u)      # no bias; angles: n_angles, shared by the heads
    dt = softplus(dd_dt + dt_bias);  A = min(-heavy_tail(dd_A), -A_floor)   # data-dependent A per head
    B, C = RMSNorm(B), RMSNorm(C)                             # over d_state, then + B_bias, C_bias (per head)
    y = Mamba3(x, dt, A, B, C, trap, angles) + D · x          # trapezoidal write, data-dependent rotations
    out = out_proj(y · SiLU(z))                               # or RMSNorm(y) · SiLU(z) per head (outproj_norm)

with ``heavy_tail(a) = 1 + a`` for a >= 0 and ``1 / (1 - a)`` below, and the recurrence of
:mod:`longrange.ops.matrix_state.mamba3` (computed by :func:`longrange.ops.matrix_state.mamba3`).
``rope_fraction`` (0.5 or 1) of the state's entries are rotated, in ``n_angles = rope_fraction · N / 2``
pairs. Initialisation as published: dt log-uniform in [dt_min, dt_max] floored (dt_bias its inverse
softplus), B_bias = C_bias = 1, D = 1; dt_bias and D without weight decay. The recurrent state per
sequence is the SSM state (H, N, headdim), the cumulative angles (H, n_angles) and the previous
position's key (H, N) and input (H, headdim). Use it in ``block: residual`` with ``model.mlp: none``.

MIMO (``mimo_rank=r`` > 1, their ``is_mimo=True, mimo_rank=r``): B and C have ``r`` ranks (the
input projection gives r x ngroups x N of each, normed over N, with biases per head and rank, (H, r,
N)); the input and the gate are projected up to the ranks by per-head, per-rank, per-channel scales
``mimo_x`` and ``mimo_z`` (H, r, headdim), and the ranks' outputs summed down by ``mimo_o``::

    x_j = x · mimo_x[j],   z_j = z · mimo_z[j]                          # j < r
    y_j = Mamba3-MIMO(x_., dt, A, B_., C_., trap, angles)_j + D · x_j   # rank-r writes and reads
    y   = sum_j (y_j · SiLU(z_j)) · mimo_o[j]                           # or RMSNorm(y_j) · SiLU(z_j)
    out = out_proj(y)

(:mod:`longrange.ops.matrix_state.mamba3_mimo`), initialised as published: ``mimo_x = mimo_o =
1 / r``, ``mimo_z = 1``. The state keeps the same SSM matrix (H, N, headdim) and the previous
position's r keys and inputs: r times as many reads and writes per position at the same state.
``chunk_size`` counts positions; its default is 64 for SISO and ``64 // r`` for MIMO (chunks of
64 rank-positions, as the authors recommend). mamba-ssm's MIMO kernel (TileLang) is not wrapped:
MIMO runs the chunked PyTorch form on every device.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.layers.mixer_parts import (
    HeadNorm,
    RecurrentMixer,
    inverse_softplus_dt,
    no_decay,
    split_heads,
    ssd_heads,
)
from longrange.layers.registry import register_primitive
from longrange.layers.ssm import check_dt_range, check_positive_int
from longrange.ops.matrix_state import dispatch as matrix_state
from longrange.ops.matrix_state.mamba3 import Mamba3State
from longrange.ops.matrix_state.mamba3_mimo import default_chunk_size


def heavy_tail(a: Tensor) -> Tensor:
    """``1 + a`` for ``a >= 0``, ``1 / (1 - a)`` below: positive, continuous, differentiable at 0."""
    return a.clamp_min(0) + torch.reciprocal(1 - a.clamp_max(0))


@register_primitive("mamba3")
class Mamba3(RecurrentMixer):
    """The Mamba-3 SISO layer (see the module docstring)."""

    OPTION_NOTES: ClassVar[dict[str, str]] = {
        "chunk_size": "64 single-input (mimo_rank 1), 64 // mimo_rank multi-input",
        "impl": 'the op\'s default for the process: "auto" unless changed by its set_default_impl',
    }

    def __init__(
        self,
        d_model: int,
        d_state: int = 128,
        expand: int = 2,
        headdim: int = 64,
        ngroups: int = 1,
        rope_fraction: float = 0.5,
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        A_floor: float = 1e-4,
        outproj_norm: bool = False,
        mimo_rank: int = 1,
        chunk_size: int | None = None,
        bidirectional: bool = False,
        impl: str | None = None,
    ):
        super().__init__()
        where = "Mamba-3"
        for name, value in (
            ("d_model", d_model),
            ("d_state", d_state),
            ("expand", expand),
            ("headdim", headdim),
            ("ngroups", ngroups),
            ("mimo_rank", mimo_rank),
        ):
            check_positive_int(name, value, where=where)
        if chunk_size is not None:
            check_positive_int("chunk_size", chunk_size, where=where)
        check_dt_range(dt_min, dt_max, where=where)
        if rope_fraction not in (0.5, 1.0):
            raise ConfigError(f"{where}: rope_fraction must be 0.5 or 1.0 (as published), got {rope_fraction!r}")
        if not A_floor > 0:
            raise ConfigError(f"{where}: A_floor must be positive, got {A_floor!r}")
        d_inner, heads = ssd_heads(where, d_model, expand, headdim, ngroups)
        rotated = int(d_state * rope_fraction)
        n_angles = (rotated - rotated % 2) // 2
        if n_angles < 1:
            raise ConfigError(
                f"{where}: d_state={d_state} with rope_fraction={rope_fraction} rotates no pair of entries; "
                "raise d_state to at least 4"
            )
        matrix_state.check_impl("mamba3" if mimo_rank == 1 else "mamba3_mimo", impl, where)
        self.d_model, self.d_state, self.d_inner, self.headdim = d_model, d_state, d_inner, headdim
        self.n_heads, self.ngroups, self.n_angles, self.rank = heads, ngroups, n_angles, mimo_rank
        if chunk_size is None:
            chunk_size = default_chunk_size(mimo_rank)
        self.A_floor, self.chunk_size, self.impl = float(A_floor), chunk_size, impl
        self.bidirectional = bool(bidirectional)
        kwargs = dict(
            d_state=d_state,
            expand=expand,
            headdim=headdim,
            ngroups=ngroups,
            rope_fraction=rope_fraction,
            dt_min=dt_min,
            dt_max=dt_max,
            dt_init_floor=dt_init_floor,
            A_floor=A_floor,
            outproj_norm=outproj_norm,
            mimo_rank=mimo_rank,
            chunk_size=chunk_size,
            impl=impl,
        )
        if self._init_directions((lambda: Mamba3(d_model, **kwargs)) if self.bidirectional else None):
            return
        bc = mimo_rank * ngroups * d_state
        self.in_proj = nn.Linear(d_model, 2 * d_inner + 2 * bc + 3 * heads + n_angles, bias=False)
        self.dt_bias = no_decay(inverse_softplus_dt(heads, dt_min, dt_max, dt_init_floor))
        bias_shape = (heads, d_state) if mimo_rank == 1 else (heads, mimo_rank, d_state)
        self.B_bias = nn.Parameter(torch.ones(bias_shape))
        self.C_bias = nn.Parameter(torch.ones(bias_shape))
        self.B_norm = HeadNorm(d_state)
        self.C_norm = HeadNorm(d_state)
        if mimo_rank > 1:  # the up- and down-projections over the ranks, as published
            self.mimo_x = nn.Parameter(torch.full((heads, mimo_rank, headdim), 1.0 / mimo_rank))
            self.mimo_z = nn.Parameter(torch.ones(heads, mimo_rank, headdim))
            self.mimo_o = nn.Parameter(torch.full((heads, mimo_rank, headdim), 1.0 / mimo_rank))
        self.D = no_decay(torch.ones(heads))
        self.norm = HeadNorm(headdim, heads=heads) if outproj_norm else None
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, d_state={self.d_state}, heads={self.n_heads}x{self.headdim}, "
            f"ngroups={self.ngroups}, angles={self.n_angles}, mimo_rank={self.rank}, "
            f"bidirectional={self.bidirectional}"
        )

    def _inputs(self, u: Tensor) -> tuple[Tensor, ...]:
        """(z, x, B, C, dt, A, trap, angles) per head, from the input projection of ``u`` (..., d_model);
        with MIMO, x and z projected up to the ranks (..., r, heads, headdim) and B, C (..., r, groups, N)."""
        d, h, r = self.d_inner, self.n_heads, self.rank
        bc = r * self.ngroups * self.d_state
        z, x, B, C, dd_dt, dd_A, trap, angles = self.in_proj(u).split([d, d, bc, bc, h, h, h, self.n_angles], dim=-1)
        dt = F.softplus(dd_dt + self.dt_bias)
        wide = torch.promote_types(dd_A.dtype, torch.float32)  # at least float32, as published; float64 kept
        A = (-heavy_tail(dd_A.to(wide))).clamp_max(-self.A_floor).to(dd_A.dtype)
        groups = (self.ngroups, self.d_state) if r == 1 else (r, self.ngroups, self.d_state)
        B, C = self.B_norm(B.unflatten(-1, groups)), self.C_norm(C.unflatten(-1, groups))
        angles = angles.unsqueeze(-2).expand(*angles.shape[:-1], h, self.n_angles)
        z, x = split_heads(z, h), split_heads(x, h)
        if r > 1:
            x = torch.einsum("...hp,hrp->...rhp", x, self.mimo_x)
            z = torch.einsum("...hp,hrp->...rhp", z, self.mimo_z)
        return z, x, B, C, dt, A, trap, angles

    def _out(self, y: Tensor, z: Tensor) -> Tensor:
        y = self.norm(y, z) if self.norm is not None else y * F.silu(z)
        if self.rank > 1:
            y = torch.einsum("...rhp,hrp->...hp", y, self.mimo_o)
        return self.out_proj(y.flatten(-2))

    def _mix(self, u: Tensor, mask: Tensor | None) -> Tensor:
        z, x, B, C, dt, A, trap, angles = self._inputs(u)
        op = matrix_state.mamba3 if self.rank == 1 else matrix_state.mamba3_mimo
        y = op(
            x,
            dt,
            A,
            B,
            C,
            trap,
            angles,
            self.B_bias,
            self.C_bias,
            self.D,
            mask=mask,
            chunk_size=self.chunk_size,
            impl=self.impl,
        )
        return self._out(y, z)

    def _zero_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> Mamba3State:
        f = torch.float64 if dtype == torch.float64 else torch.float32
        b, h, n, p = batch_size, self.n_heads, self.d_state, self.headdim
        zeros = lambda *shape: torch.zeros(*shape, device=device, dtype=f)  # noqa: E731
        ranks = () if self.rank == 1 else (self.rank,)  # MIMO: the previous position's r keys and inputs
        return Mamba3State(
            ssm=zeros(b, h, n, p), angle=zeros(b, h, self.n_angles), k=zeros(b, h, *ranks, n), v=zeros(b, h, *ranks, p)
        )

    def _step(self, u: Tensor, state: Mamba3State) -> tuple[Tensor, Mamba3State]:
        z, x, B, C, dt, A, trap, angles = self._inputs(u)
        step = matrix_state.mamba3_step if self.rank == 1 else matrix_state.mamba3_mimo_step
        y, state = step(x, dt, A, B, C, trap, angles, state, self.B_bias, self.C_bias, self.D)
        return self._out(y.to(u.dtype), z), state
