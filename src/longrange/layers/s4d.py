"""S4D: a bank of independent diagonal SSMs, one per channel, applied by FFT convolution.

Conventions shared with :mod:`longrange.layers.s4` and :mod:`longrange.layers.dlr` (their
helpers are in :mod:`longrange.layers.ssm`):

* ``d_model`` = H channels, each an independent single-input single-output SSM.
* ``d_state`` = N is the full (real) state size, stored as N/2 complex modes, one per conjugate
  pair; the output is ``2·Re`` of the sum over stored modes.
* Complex parameters are stored as real tensors with a trailing dimension of 2 (real, imag), so
  that ``module.double()`` / ``.half()`` convert them and every optimiser treats both parts alike.
* Δ is drawn log-uniformly in [dt_min, dt_max] and stored as ``log_dt`` (Δ = exp(log_dt)) or, with
  ``dt_transform="softplus"``, as ``inv_dt`` (Δ = softplus(inv_dt)).
* SSM parameters carry the optimiser hint ``group="ssm"``; the skip D carries ``group="no_decay"``.
* ``bidirectional=True`` adds a second, independent output vector C producing a backward kernel;
  both are combined into one two-sided convolution (see :mod:`longrange.ops.fftconv`).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from longrange.layers.hippo import S4D_INITS, s4d_init
from longrange.layers.registry import register_primitive
from longrange.layers.ssm import (
    REAL_TRANSFORMS,
    ConvolutionalSSM,
    as_complex,
    check_choice,
    check_positive_int,
    check_state_size,
    check_step_input,
    decode_dt,
    decode_real_part,
    dt_parameter,
    encode_real_part,
    real_param,
    sample_log_dt,
    skip_init,
    skip_parameter,
    ssm_parameter,
)
from longrange.ops.ssm_kernels import DISCRETIZATIONS, diag_ssm_kernel, discretize_diag


@register_primitive("s4d")
class S4D(ConvolutionalSSM):
    """Diagonal SSM layer (Gu et al., "On the Parameterization and Initialization of Diagonal SSMs").

    Per channel h and stored mode m: A = re(raw) + i·A_imag (see ``real_transform``), B, C
    complex, Δ = exp(log_dt) (or softplus(inv_dt), see ``dt_transform``); kernel
    ``K[l] = 2 Re Σ_m C B̄ Ā^l`` with ``discretization`` ZOH or
    bilinear, output ``y = K * u + D u``.

    Args:
        d_model: channels H.
        d_state: full state size N (even); N/2 complex modes are stored.
        init: A and B init: ``legs`` (Λ and V^H B of the LegS NPLR form), ``lin``, ``inv``,
            ``real``, ``random`` (see :func:`longrange.layers.hippo.s4d_init`). C is complex
            standard normal (each of the real and imaginary parts with variance 1/2).
        discretization: ``zoh`` or ``bilinear``; the recurrent mode uses the same one.
        dt_min, dt_max: range of the log-uniform Δ init.
        bidirectional: add a second C for a backward kernel (two-sided convolution).
        real_transform: ``exp`` (Re A = -exp(raw)), ``relu`` (-relu(raw)) or ``none``.
        d_init: skip D init, ``ones`` (default), ``zeros`` or ``randn``.
        ssm_lr_scale: if given, pins the learning-rate scale of the SSM parameters in their hint;
            otherwise the trainer's ``ssm`` group setting applies.
        dt_transform: how Δ is stored: ``exp`` (``log_dt``) or ``softplus`` (``inv_dt``, the newer
            S4 code's default); the init range is the same.

    Parameters per channel: 1 (Δ) + N (A) + N (B) + N (C, 2N if bidirectional) + 1 (D).
    """

    OPTION_NOTES: ClassVar[dict[str, str]] = {"ssm_lr_scale": "not pinned: train.ssm_lr_scale applies"}

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        init: str = "legs",
        discretization: str = "zoh",
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        bidirectional: bool = False,
        real_transform: str = "exp",
        d_init: str = "ones",
        ssm_lr_scale: float | None = None,
        dt_transform: str = "exp",
    ):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_state_size(d_state)
        check_choice("init", init, S4D_INITS)
        check_choice("discretization", discretization, DISCRETIZATIONS)
        check_choice("real_transform", real_transform, REAL_TRANSFORMS)
        self.d_model, self.d_state, self.bidirectional = d_model, d_state, bool(bidirectional)
        self.init, self.discretization, self.real_transform = init, discretization, real_transform
        H, M = d_model, d_state // 2

        A, B = s4d_init(init, d_state, H)
        channels = 2 if self.bidirectional else 1
        C = torch.randn(channels, H, M, dtype=torch.complex128)
        self.dt_name, raw_dt = dt_parameter(sample_log_dt(H, dt_min, dt_max), dt_transform)
        self.dt_transform = dt_transform
        setattr(self, self.dt_name, ssm_parameter(raw_dt, ssm_lr_scale))
        self.A_real = ssm_parameter(encode_real_part(A.real, real_transform), ssm_lr_scale)
        self.A_imag = ssm_parameter(A.imag, ssm_lr_scale)
        self.B = ssm_parameter(real_param(B), ssm_lr_scale)
        self.C = ssm_parameter(real_param(C), ssm_lr_scale)
        self.D = skip_parameter(skip_init(H, d_init))

    # -- SSM pieces -----------------------------------------------------------------------

    def ssm(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(dt (H,), A (H, N/2), B (H, N/2), C (channels, H, N/2)) in the parameters' dtype."""
        A = torch.complex(decode_real_part(self.A_real, self.real_transform), self.A_imag)
        return decode_dt(getattr(self, self.dt_name), self.dt_transform), A, as_complex(self.B), as_complex(self.C)

    def kernel(self, L: int) -> Tensor:
        """(channels, H, L) real kernel; channel 1 (if bidirectional) is the backward kernel."""
        dt, A, B, C = self.ssm()
        return diag_ssm_kernel(dt, A, B, C, L, self.discretization)

    # -- modes ----------------------------------------------------------------------------

    def default_state(self, batch_size: int, device=None, dtype=None) -> Tensor:
        """Zero state (batch, d_model, d_state/2), complex."""
        return self.zero_state(batch_size, self.d_state // 2, device, dtype)

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """One step: x (batch, d_model) -> y (batch, d_model), new state; ``x_k = Ā x_{k-1} + B̄ u_k``."""
        self._check_step()
        check_step_input(self, x, state, (self.d_model, self.d_state // 2))
        dt, A, B, C = self.ssm()
        dA, dB = discretize_diag(dt, A, B, self.discretization)
        state = dA * state + dB * x.unsqueeze(-1)
        y = 2 * (C[0] * state).sum(-1).real + self.D * x
        return y.to(x.dtype), state
