"""Mamba-2 (Dao & Gu 2024, "Transformers are SSMs", arXiv 2405.21060) as a sequence primitive.

The layer of the authors' ``mamba_ssm/modules/mamba2.py`` (d_inner = expand · d_model, heads of
``headdim`` channels, H = d_inner / headdim, B and C shared within ``ngroups`` groups)::

    (z, x, B, C, dt) = in_proj(u)                 # d_inner, d_inner, G·N, G·N, H   (no bias)
    (x, B, C) = SiLU(conv1d(x, B, C))             # depthwise causal, width d_conv, with bias
    dt = softplus(dt + dt_bias);  A = -exp(A_log) # (H,) per head
    y = SSD(x, dt, A, B, C) + D · x               # S_t = exp(dt_t A) S_{t-1} + dt_t B_t^T x_t,  y_t = C_t S_t
    out = out_proj(RMSNorm(y · SiLU(z)))          # the gated norm over each group of d_inner / G channels

computed by :func:`longrange.ops.matrix_state.ssd`. Initialisation as published: A uniform in
``A_init_range`` (1 to 16), dt log-uniform in [dt_min, dt_max] floored at dt_init_floor (dt_bias
its inverse softplus), D = 1; A_log, dt_bias and D are trained without weight decay at the full
learning rate. ``d_state`` is N (the published default is 128; the model's ``d_state`` is passed).
The recurrent state per sequence is (H, N, headdim) for the SSM plus the convolution's last
``d_conv - 1`` inputs. Mamba-2 is a whole layer: use it in ``block: residual`` (its own block is
norm -> Mamba-2 -> residual, without an MLP: ``model.mlp: none``).
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
    ShortConv,
    inverse_softplus_dt,
    no_decay,
    split_heads,
    ssd_heads,
)
from longrange.layers.registry import register_primitive
from longrange.layers.ssm import check_dt_range, check_positive_int
from longrange.ops.matrix_state import dispatch as matrix_state


@register_primitive("mamba2")
class Mamba2(RecurrentMixer):
    """The Mamba-2 layer (see the module docstring)."""

    OPTION_NOTES: ClassVar[dict[str, str]] = {
        "impl": 'the op\'s default for the process: "auto" unless changed by its set_default_impl'
    }

    def __init__(
        self,
        d_model: int,
        d_state: int = 128,
        expand: int = 2,
        headdim: int = 64,
        ngroups: int = 1,
        d_conv: int = 4,
        A_init_range: tuple[float, float] | list[float] = (1.0, 16.0),
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        chunk_size: int = 64,
        bidirectional: bool = False,
        impl: str | None = None,
    ):
        super().__init__()
        where = "Mamba-2"
        for name, value in (
            ("d_model", d_model),
            ("d_state", d_state),
            ("expand", expand),
            ("headdim", headdim),
            ("ngroups", ngroups),
            ("d_conv", d_conv),
            ("chunk_size", chunk_size),
        ):
            check_positive_int(name, value, where=where)
        check_dt_range(dt_min, dt_max, where=where)
        lo, hi = A_init_range
        if not 0 < lo <= hi:
            raise ConfigError(f"{where}: A_init_range must be (low, high) with 0 < low <= high, got {A_init_range!r}")
        d_inner, heads = ssd_heads(where, d_model, expand, headdim, ngroups)
        matrix_state.check_impl("ssd", impl, where)
        self.d_model, self.d_state, self.d_inner, self.headdim = d_model, d_state, d_inner, headdim
        self.n_heads, self.ngroups, self.chunk_size, self.impl = heads, ngroups, chunk_size, impl
        self.bidirectional = bool(bidirectional)
        kwargs = dict(
            d_state=d_state,
            expand=expand,
            headdim=headdim,
            ngroups=ngroups,
            d_conv=d_conv,
            A_init_range=A_init_range,
            dt_min=dt_min,
            dt_max=dt_max,
            dt_init_floor=dt_init_floor,
            chunk_size=chunk_size,
            impl=impl,
        )
        if self._init_directions((lambda: Mamba2(d_model, **kwargs)) if self.bidirectional else None):
            return
        bc = ngroups * d_state
        self.in_proj = nn.Linear(d_model, 2 * d_inner + 2 * bc + heads, bias=False)
        self.conv = ShortConv(d_inner + 2 * bc, d_conv, bias=True, activation="silu")
        self.A_log = no_decay(torch.log(torch.empty(heads).uniform_(lo, hi)))
        self.dt_bias = no_decay(inverse_softplus_dt(heads, dt_min, dt_max, dt_init_floor))
        self.D = no_decay(torch.ones(heads))
        # mamba-ssm's RMSNormGated: a scale per channel, the norm over each group's d_inner / G channels
        self.norm = HeadNorm(d_inner // ngroups, gate_first=True, heads=ngroups if ngroups > 1 else None)
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, d_state={self.d_state}, heads={self.n_heads}x{self.headdim}, "
            f"ngroups={self.ngroups}, bidirectional={self.bidirectional}"
        )

    def _split(self, zxbcdt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(z, xBC, dt) of the input projection."""
        d, bc = self.d_inner, self.ngroups * self.d_state
        return zxbcdt.split([d, d + 2 * bc, self.n_heads], dim=-1)

    def _heads(self, xbc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(x (..., H, P), B (..., G, N), C (..., G, N)) of the convolved channels."""
        d, bc = self.d_inner, self.ngroups * self.d_state
        x, B, C = xbc.split([d, bc, bc], dim=-1)
        return split_heads(x, self.n_heads), split_heads(B, self.ngroups), split_heads(C, self.ngroups)

    def _out(self, y: Tensor, z: Tensor) -> Tensor:
        """The gated norm per group and the output projection; y, z: (..., d_inner)."""
        y = self.norm(split_heads(y, self.ngroups), split_heads(z, self.ngroups))
        return self.out_proj(y.flatten(-2))

    def _mix(self, u: Tensor, mask: Tensor | None) -> Tensor:
        z, xbc, dt = self._split(self.in_proj(u))
        x, B, C = self._heads(self.conv(xbc))
        dt = F.softplus(dt + self.dt_bias)
        y = matrix_state.ssd(
            x, dt, -torch.exp(self.A_log), B, C, D=self.D, mask=mask, chunk_size=self.chunk_size, impl=self.impl
        )
        return self._out(y.flatten(-2), z)

    def _zero_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> dict[str, Tensor]:
        return {
            "conv": self.conv.zero_state(batch_size, device, dtype),
            "ssm": torch.zeros(
                batch_size,
                self.n_heads,
                self.d_state,
                self.headdim,
                device=device,
                dtype=torch.float64 if dtype == torch.float64 else torch.float32,
            ),
        }

    def _step(self, u: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        z, xbc, dt = self._split(self.in_proj(u))
        xbc, conv = self.conv.step(xbc, state["conv"])
        x, B, C = self._heads(xbc)
        dt = F.softplus(dt + self.dt_bias)
        y, ssm = matrix_state.ssd_step(x, dt, -torch.exp(self.A_log), B, C, state["ssm"], D=self.D)
        return self._out(y.flatten(-2).to(u.dtype), z), {"conv": conv, "ssm": ssm}
