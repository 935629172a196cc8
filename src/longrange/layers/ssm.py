"""Pieces shared by the SSM primitives (S4, S4D, DLR, S6): argument checks, parameter storage, inits.

Conventions:

* Complex parameters are stored as real tensors with a trailing dimension of 2 (real, imag), so
  that ``module.double()`` / ``.half()`` convert them and every optimiser treats both parts alike
  (:func:`real_param`, :func:`as_complex`).
* Δ is drawn log-uniformly in [dt_min, dt_max] (:func:`sample_log_dt`) and stored under a
  transform (:func:`dt_parameter`): ``exp`` stores ``log_dt`` (Δ = exp(log_dt)); ``softplus``
  stores ``inv_dt`` (Δ = softplus(inv_dt)), the parameterisation of the newer S4 code.
* SSM parameters carry the optimiser hint ``group="ssm"`` (:func:`ssm_parameter`); the skip D
  carries ``group="no_decay"`` (:func:`skip_parameter`).
* :class:`ConvolutionalSSM` is the parallel mode of the primitives whose kernel is computed in
  full (S4, S4D, DLR): a causal or two-sided FFT convolution with that kernel.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.layers.base import NO_DECAY_GROUP, SSM_GROUP, SequencePrimitive, apply_mask, set_optim_hint
from longrange.ops.fftconv import fft_conv

REAL_TRANSFORMS = ("exp", "relu", "none")
SKIP_INITS = ("ones", "zeros", "randn")
#: How Δ is stored: ``exp`` (the parameter ``log_dt``, Δ = exp) or ``softplus`` (``inv_dt``, Δ = softplus).
DT_TRANSFORMS = ("exp", "softplus")
#: The newer S4 code clamps Δ at this value before inverting softplus (its ``inv_transform``).
SOFTPLUS_DT_FLOOR = 1e-4


def _prefix(where: str) -> str:
    return f"{where}: " if where else ""


def check_positive_int(name: str, value: object, where: str = "") -> None:
    """ConfigError unless ``value`` is a positive int (``where`` names the layer in the message)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{_prefix(where)}{name} must be a positive integer, got {value!r}")


def check_state_size(d_state: object, name: str = "d_state") -> None:
    """ConfigError unless the full state size is even and >= 2 (stored as conjugate pairs)."""
    if not isinstance(d_state, int) or isinstance(d_state, bool) or d_state < 2 or d_state % 2:
        raise ConfigError(
            f"{name} must be an even integer >= 2 (the state is stored as {name}/2 conjugate pairs), got {d_state!r}"
        )


def check_choice(name: str, value: object, choices: tuple[str, ...], where: str = "") -> None:
    if value not in choices:
        raise ConfigError(f"{_prefix(where)}{name} must be one of {choices}, got {value!r}")


def check_dt_range(dt_min: float, dt_max: float, where: str = "") -> None:
    if not (0 < dt_min <= dt_max):
        raise ConfigError(f"{_prefix(where)}need 0 < dt_min <= dt_max, got dt_min={dt_min!r}, dt_max={dt_max!r}")


def sample_log_dt(H: int, dt_min: float, dt_max: float) -> Tensor:
    """(H,) log step sizes, log-uniform in [dt_min, dt_max] (float64)."""
    check_dt_range(dt_min, dt_max)
    return math.log(dt_min) + torch.rand(H, dtype=torch.float64) * (math.log(dt_max) - math.log(dt_min))


def dt_parameter(log_dt: Tensor, transform: str) -> tuple[str, Tensor]:
    """(name, raw value) of the stored Δ parameter for log Δ values ``log_dt`` under ``transform``.

    ``exp``: ("log_dt", log_dt) unchanged. ``softplus``: ("inv_dt", softplus⁻¹(Δ)) with
    softplus⁻¹(x) = log(expm1(x)) and Δ clamped below at 1e-4 first, as the newer S4 code's
    ``inv_transform`` does; computed in float64.
    """
    check_choice("dt_transform", transform, DT_TRANSFORMS)
    if transform == "exp":
        return "log_dt", log_dt
    dt = torch.exp(log_dt.double()).clamp(min=SOFTPLUS_DT_FLOOR)
    return "inv_dt", torch.log(torch.expm1(dt))


def decode_dt(raw: Tensor, transform: str) -> Tensor:
    """Δ from its stored parameter (inverse of :func:`dt_parameter`): exp(raw) or softplus(raw)."""
    return torch.exp(raw) if transform == "exp" else F.softplus(raw)


def check_copies(name: str, value: object, d_model: int) -> int:
    """The number of trainable copies ``value`` of an SSM parameter shared across ``d_model``
    channels (None = one per channel); ConfigError unless it is a positive divisor of d_model."""
    if value is None:
        return d_model
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or d_model % value:
        raise ConfigError(
            f"{name} must be None (one per channel) or a positive divisor of d_model = {d_model}, got {value!r}"
        )
    return value


def tile_channels(t: Tensor, d_model: int, dim: int) -> Tensor:
    """``t`` with its ``dim`` of S copies tiled to ``d_model`` channels: channel h uses copy h mod S
    (the S4 code's ``repeat(x, 't n -> (v t) n')``); ``t`` itself when S = d_model."""
    copies = t.shape[dim]
    if copies == d_model:
        return t
    reps = [1] * t.dim()
    reps[dim] = d_model // copies
    return t.repeat(*reps)


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
    return set_optim_hint(p, SSM_GROUP, **overrides)


def skip_parameter(value: Tensor) -> nn.Parameter:
    return set_optim_hint(nn.Parameter(value.to(torch.get_default_dtype())), NO_DECAY_GROUP)


def complex_dtype_of(dtype: torch.dtype) -> torch.dtype:
    return {torch.float64: torch.complex128, torch.float32: torch.complex64, torch.float16: torch.complex32}.get(
        dtype, torch.complex64
    )


def check_step_input(layer: SequencePrimitive, x: Tensor, state: Tensor, state_tail: tuple[int, ...]) -> None:
    if x.dim() != 2 or x.shape[-1] != layer.d_model:
        raise ValueError(
            f"{type(layer).__name__}.step expects x of shape (batch, {layer.d_model}), got {tuple(x.shape)}"
        )
    expected = (x.shape[0], *state_tail)
    if tuple(state.shape) != expected:
        raise ValueError(
            f"{type(layer).__name__}.step: state of shape {tuple(state.shape)} does not match expected {expected}"
        )


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
        K = self.kernel(x.shape[1])
        # channels last in and out: (batch, length, d_model) in memory, and so is the input's
        # gradient (the pointwise ops beside the layer, a block's GELU, H3's products, and their
        # backwards run up to 10x slower on a transposed view mixed with contiguous operands); by
        # FFT the transposes are folded into the FFTs' padding
        return fft_conv(apply_mask(x, mask), K if self.bidirectional else K[0], self.D, channels_last=True)

    def zero_state(self, batch_size: int, modes: int, device=None, dtype=None) -> Tensor:
        """A complex zero state (batch, d_model, modes); dtype: the complex type of ``dtype``, by
        default of the parameters'."""
        self._check_step()
        param = next(self.parameters())
        dtype = complex_dtype_of(dtype or param.dtype)
        return torch.zeros(batch_size, self.d_model, modes, dtype=dtype, device=device or param.device)
