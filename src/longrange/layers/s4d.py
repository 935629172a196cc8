"""S4D: a bank of independent diagonal SSMs, one per channel, applied by FFT convolution.

Conventions shared with :mod:`longrange.layers.s4` and :mod:`longrange.layers.dlr`:

* ``d_model`` = H channels, each an independent single-input single-output SSM.
* ``d_state`` = N is the full (real) state size, stored as N/2 complex modes, one per conjugate
  pair; the output is ``2·Re`` of the sum over stored modes.
* Complex parameters are stored as real tensors with a trailing dimension of 2 (real, imag), so
  that ``module.double()`` / ``.half()`` convert them and every optimiser treats both parts alike.
* Δ is ``exp(log_dt)`` with ``log_dt`` drawn uniformly in [log dt_min, log dt_max].
* SSM parameters carry the optimiser hint ``group="ssm"``; the skip D carries ``group="no_decay"``.
* ``bidirectional=True`` adds a second, independent output vector C producing a backward kernel;
  both are combined into one two-sided convolution (see :mod:`longrange.ops.fftconv`).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.layers.base import NO_DECAY_GROUP, SequencePrimitive, apply_mask, set_optim_hint
from longrange.layers.hippo import S4D_INITS, s4d_init
from longrange.ops.fftconv import fft_conv
from longrange.ops.ssm_kernels import DISCRETIZATIONS, diag_ssm_kernel, discretize_diag

REAL_TRANSFORMS = ("exp", "relu", "none")
SKIP_INITS = ("ones", "zeros", "randn")


# ---- helpers shared by the SSM primitives --------------------------------------------------


def check_positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def check_state_size(d_state: object) -> None:
    if not isinstance(d_state, int) or isinstance(d_state, bool) or d_state < 2 or d_state % 2:
        raise ConfigError(
            f"d_state must be an even integer >= 2 (the state is stored as d_state/2 conjugate pairs), got {d_state!r}"
        )


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {choices}, got {value!r}")


def sample_log_dt(H: int, dt_min: float, dt_max: float) -> Tensor:
    """(H,) log step sizes, log-uniform in [dt_min, dt_max]."""
    if not (0 < dt_min <= dt_max):
        raise ConfigError(f"need 0 < dt_min <= dt_max, got dt_min={dt_min!r}, dt_max={dt_max!r}")
    return math.log(dt_min) + torch.rand(H, dtype=torch.float64) * (math.log(dt_max) - math.log(dt_min))


def skip_init(H: int, d_init: str) -> Tensor:
    check_choice("d_init", d_init, SKIP_INITS)
    if d_init == "ones":
        return torch.ones(H)
    if d_init == "zeros":
        return torch.zeros(H)
    return torch.randn(H)


def real_param(t: Tensor) -> Tensor:
    """A complex tensor as a real (..., 2) tensor for storage as a parameter."""
    if not t.is_complex():
        t = t.to(torch.complex128)
    return torch.view_as_real(t.contiguous()).clone()


def as_complex(p: Tensor) -> Tensor:
    """Inverse of :func:`real_param` (complex64 for float32 storage, complex128 for float64)."""
    return torch.view_as_complex(p if p.is_contiguous() else p.contiguous())


def encode_real_part(re: Tensor, transform: str) -> Tensor:
    """Raw parameter for a negative real part ``re`` under ``transform`` (inverse of decode)."""
    if transform == "exp":
        return torch.log(-re)
    if transform == "relu":
        return -re
    return re


def decode_real_part(raw: Tensor, transform: str) -> Tensor:
    """Real part of A from its raw parameter: ``exp``: -exp(raw); ``relu``: -relu(raw); ``none``: raw."""
    if transform == "exp":
        return -torch.exp(raw)
    if transform == "relu":
        return -torch.relu(raw)
    return raw


def ssm_parameter(value: Tensor, lr_scale: float | None) -> nn.Parameter:
    p = nn.Parameter(value.to(torch.get_default_dtype()))
    overrides = {} if lr_scale is None else {"lr_scale": lr_scale}
    return set_optim_hint(p, "ssm", **overrides)


def skip_parameter(value: Tensor) -> nn.Parameter:
    return set_optim_hint(nn.Parameter(value.to(torch.get_default_dtype())), NO_DECAY_GROUP)


def complex_dtype_of(dtype: torch.dtype) -> torch.dtype:
    return {torch.float64: torch.complex128, torch.float32: torch.complex64, torch.float16: torch.complex32}.get(
        dtype, torch.complex64
    )


def check_step_input(layer: SequencePrimitive, x: Tensor, state: Tensor, state_tail: tuple[int, ...]) -> None:
    if x.dim() != 2 or x.shape[-1] != layer.d_model:
        raise ValueError(f"{type(layer).__name__}.step expects x of shape (batch, {layer.d_model}), got {tuple(x.shape)}")
    expected = (x.shape[0], *state_tail)
    if tuple(state.shape) != expected:
        raise ValueError(
            f"{type(layer).__name__}.step: state of shape {tuple(state.shape)} does not match expected {expected}"
        )


# ---- the layer -----------------------------------------------------------------------------


class ConvolutionalSSM(SequencePrimitive):
    """A primitive whose parallel mode is a convolution with its kernel (S4, S4D, DLR).

    Subclasses provide ``kernel(L)`` of shape (channels, H, L) — channel 1, when bidirectional, is
    the backward kernel — and the skip ``D`` (H,) or None.
    """

    D: Tensor | None

    def kernel(self, L: int) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x (batch, length, d_model) -> same shape; ``mask`` (batch, length), True at real positions."""
        self._check_input(x)
        u = apply_mask(x, mask).transpose(1, 2)
        K = self.kernel(x.shape[1])
        y = fft_conv(u, K if self.bidirectional else K[0], self.D)
        return y.transpose(1, 2)


class S4D(ConvolutionalSSM):
    """Diagonal SSM layer (Gu et al., "On the Parameterization and Initialization of Diagonal SSMs").

    Per channel h and stored mode m: A = re(raw) + i·A_imag (see ``real_transform``), B, C
    complex, Δ = exp(log_dt); kernel ``K[l] = 2 Re Σ_m C B̄ Ā^l`` with ``discretization`` ZOH or
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

    Parameters per channel: 1 (log_dt) + N (A) + N (B) + N (C, 2N if bidirectional) + 1 (D).
    """

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
        self.log_dt = ssm_parameter(sample_log_dt(H, dt_min, dt_max), ssm_lr_scale)
        self.A_real = ssm_parameter(encode_real_part(A.real, real_transform), ssm_lr_scale)
        self.A_imag = ssm_parameter(A.imag, ssm_lr_scale)
        self.B = ssm_parameter(real_param(B), ssm_lr_scale)
        self.C = ssm_parameter(real_param(C), ssm_lr_scale)
        self.D = skip_parameter(skip_init(H, d_init))

    # -- SSM pieces -----------------------------------------------------------------------

    def ssm(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(dt (H,), A (H, N/2), B (H, N/2), C (channels, H, N/2)) in the parameters' dtype."""
        A = torch.complex(decode_real_part(self.A_real, self.real_transform), self.A_imag)
        return torch.exp(self.log_dt), A, as_complex(self.B), as_complex(self.C)

    def kernel(self, L: int) -> Tensor:
        """(channels, H, L) real kernel; channel 1 (if bidirectional) is the backward kernel."""
        dt, A, B, C = self.ssm()
        return diag_ssm_kernel(dt, A, B, C, L, self.discretization)

    # -- modes ----------------------------------------------------------------------------

    def default_state(self, batch_size: int, device=None, dtype=None) -> Tensor:
        """Zero state (batch, d_model, d_state/2), complex."""
        self._check_step()
        dtype = complex_dtype_of(dtype or self.log_dt.dtype)
        return torch.zeros(batch_size, self.d_model, self.d_state // 2, dtype=dtype, device=device or self.log_dt.device)

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """One step: x (batch, d_model) -> y (batch, d_model), new state; ``x_k = Ā x_{k-1} + B̄ u_k``."""
        self._check_step()
        check_step_input(self, x, state, (self.d_model, self.d_state // 2))
        dt, A, B, C = self.ssm()
        dA, dB = discretize_diag(dt, A, B, self.discretization)
        state = dA * state + dB * x.unsqueeze(-1)
        y = 2 * (C[0] * state).sum(-1).real + self.D * x
        return y.to(x.dtype), state
