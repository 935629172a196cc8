"""DLR: the diagonal linear RNN of Gupta, Mehta & Berant (2022), used in "Never Train from Scratch".

Per channel h, with complex diagonal Λ and the all-ones input vector:

    x_n = Λ x_{n-1} + 1 · u_n,        y_n = Re(C_h x_n) + D_h u_n

so the convolution kernel is ``K[h, l] = Re Σ_m C[h, m] Λ_m^l``, computed by a Vandermonde product
(:func:`longrange.ops.ssm_kernels.vandermonde_kernel`) and applied with :func:`fft_conv`.

Parameterisation (as in the public DLR code of the "Never Train from Scratch" authors):
``Λ = exp(-ν² + iθ)``, so |Λ| <= 1 for any ν; ν and θ are trainable, C complex.
Inits, with δ_m log-uniform in [dt_min, dt_max] (defaults 1e-4, 0.1) and M modes:

* ``structured``: ``-ν² = -δ_m / 2``, ``θ_m = 2π m / M`` (phases evenly spread around the circle,
  moduli close to 1: slowly decaying kernels — the DLR code's "omega" init);
* ``random``: ``-ν² = -δ_m / 2``, ``θ_m`` standard normal (taken modulo 2π) — its "randn" init.

C has real and imaginary parts drawn from N(0, c_scale²), c_scale = 1/M by default. By default
the modes Λ are shared by all channels (``shared_modes=True``, as in the DLR code, where the kernel
is one (H, M) x (M, L) product); ``shared_modes=False`` gives each channel its own.

State size: ``d_state`` counts real dimensions, as for S4/S4D: M = d_state/2 complex modes with a
real-part readout (a real system of size d_state). The DLR paper's "N = 1024" complex modes is
``d_state=2048`` here.

``bidirectional=True`` adds an independent C for a backward kernel (shared Λ), combined in one
two-sided convolution.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from longrange.layers.registry import register_primitive
from longrange.layers.ssm import (
    ConvolutionalSSM,
    as_complex,
    check_choice,
    check_positive_int,
    check_state_size,
    check_step_input,
    real_param,
    sample_log_dt,
    skip_init,
    skip_parameter,
    ssm_parameter,
)
from longrange.ops.ssm_kernels import vandermonde_kernel

DLR_INITS = ("structured", "random")


@register_primitive("dlr")
class DLR(ConvolutionalSSM):
    """Diagonal linear RNN layer (see the module doc for the recurrence and the inits).

    Args:
        d_model: channels H.
        d_state: real state size (even); d_state/2 complex modes.
        init: ``structured`` or ``random``.
        dt_min, dt_max: range of the log-uniform δ setting the initial decay -δ/2 of each mode.
        bidirectional: add a backward kernel (two-sided convolution).
        shared_modes: share Λ across channels (default) or give each channel its own.
        use_skip: include the skip D u (default True).
        d_init: skip D init (``ones``, ``zeros``, ``randn``).
        c_scale: standard deviation of the real and imaginary parts of C (default 1/M).
        ssm_lr_scale: optional pinned learning-rate scale for ν, θ and C.
    """

    OPTION_NOTES: ClassVar[dict[str, str]] = {
        "c_scale": "1 / M, M = d_state / 2 complex modes",
        "ssm_lr_scale": "not pinned: train.ssm_lr_scale applies",
    }

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        init: str = "structured",
        dt_min: float = 1e-4,
        dt_max: float = 0.1,
        bidirectional: bool = False,
        shared_modes: bool = True,
        use_skip: bool = True,
        d_init: str = "ones",
        c_scale: float | None = None,
        ssm_lr_scale: float | None = None,
    ):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_state_size(d_state)
        check_choice("init", init, DLR_INITS)
        self.d_model, self.d_state, self.init = d_model, d_state, init
        self.bidirectional, self.shared_modes, self.use_skip = bool(bidirectional), bool(shared_modes), bool(use_skip)
        H, M = d_model, d_state // 2
        rows = 1 if self.shared_modes else H

        delta = torch.exp(sample_log_dt(rows * M, dt_min, dt_max)).reshape(rows, M)
        if init == "structured":
            theta = (2 * math.pi * torch.arange(M, dtype=torch.float64) / M).expand(rows, M).clone()
        else:
            theta = torch.remainder(torch.randn(rows, M, dtype=torch.float64), 2 * math.pi)
        self.nu = ssm_parameter(torch.sqrt(delta / 2), ssm_lr_scale)
        self.theta = ssm_parameter(theta, ssm_lr_scale)
        channels = 2 if self.bidirectional else 1
        scale = 1.0 / M if c_scale is None else c_scale
        C = torch.complex(
            torch.randn(channels, H, M, dtype=torch.float64), torch.randn(channels, H, M, dtype=torch.float64)
        )
        self.C = ssm_parameter(real_param(scale * C), ssm_lr_scale)
        self.D = skip_parameter(skip_init(H, d_init)) if self.use_skip else None

    def log_lambda(self) -> Tensor:
        """log Λ = -ν² + iθ, shape (1, M) when shared or (H, M)."""
        return torch.complex(-self.nu.square(), self.theta)

    def kernel(self, L: int) -> Tensor:
        """(channels, H, L) real kernel ``Re Σ_m C Λ^l``."""
        check_positive_int("L", L)
        return vandermonde_kernel(self.log_lambda(), as_complex(self.C), L)

    def default_state(self, batch_size: int, device=None, dtype=None) -> Tensor:
        """Zero state (batch, d_model, d_state/2), complex."""
        return self.zero_state(batch_size, self.d_state // 2, device, dtype)

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """One step: x (batch, d_model) -> y (batch, d_model), new state; ``x_n = Λ x_{n-1} + u_n``."""
        self._check_step()
        check_step_input(self, x, state, (self.d_model, self.d_state // 2))
        state = torch.exp(self.log_lambda()) * state + x.unsqueeze(-1)
        y = (as_complex(self.C)[0] * state).sum(-1).real
        if self.D is not None:
            y = y + self.D * x
        return y.to(x.dtype), state
