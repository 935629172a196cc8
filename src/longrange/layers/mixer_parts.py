"""Parts shared by the layers around matrix-state recurrences (Mamba-2, Mamba-3, GLA, DeltaNet,
Gated DeltaNet): the short causal convolution, the head-wise gated RMS norm, and the base class
that gives every such layer its bidirectional form, its padding rule and its step mode.

A layer derived from :class:`RecurrentMixer` implements three methods on causal inputs:

* ``_mix(x, mask)``: (batch, length, d_model) -> same, the parallel (chunked) form;
* ``_zero_state(batch_size, device, dtype)``: the state at the start of a sequence (a dict);
* ``_step(x_t, state)``: one position, (batch, d_model) -> (output, new state).

The base class zeroes the input at padded positions, builds the bidirectional layer as two
independent causal layers in :class:`~longrange.layers.bidirectional.FlipSum` (as S6 does), and
refuses the step mode of a bidirectional layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.layers.base import NO_DECAY_GROUP, SequencePrimitive, apply_mask, set_optim_hint
from longrange.layers.bidirectional import FlipSum
from longrange.layers.ssm import check_positive_int, sample_log_dt
from longrange.ops.conv import causal_conv1d, causal_conv1d_update
from longrange.ops.norm import rms_norm


class ShortConv(nn.Module):
    """Depthwise causal convolution over (batch, length, channels), width ``width``, with an
    optional bias and SiLU: the short convolution in front of the recurrences of Mamba-2 and of
    FLA's layers. Its step keeps the last ``width - 1`` inputs."""

    def __init__(self, channels: int, width: int = 4, bias: bool = False, activation: str | None = "silu"):
        super().__init__()
        check_positive_int("conv width", width)
        self.channels, self.width, self.activation = channels, width, activation
        conv = nn.Conv1d(channels, channels, width, groups=channels, bias=bias)  # PyTorch's initialisation
        self.weight = nn.Parameter(conv.weight.detach().squeeze(1).clone())
        self.bias = nn.Parameter(conv.bias.detach().clone()) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return causal_conv1d(x.transpose(1, 2), self.weight, self.bias, activation=self.activation).transpose(1, 2)

    def zero_state(self, batch_size: int, device=None, dtype=None) -> Tensor:
        return torch.zeros(
            batch_size,
            self.channels,
            self.width - 1,
            device=device or self.weight.device,
            dtype=dtype or self.weight.dtype,
        )

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        return causal_conv1d_update(x, state, self.weight, self.bias, activation=self.activation)


class HeadNorm(nn.Module):
    """RMS norm over each head's features of (..., heads, dim), with a learned scale of ``dim``
    shared by the heads (FLA's norms), or with ``heads`` one scale per head and feature, (heads,
    dim) (mamba-ssm's ``RMSNormGated`` over groups of a head's width); optionally gated:
    ``gate_first=False`` (FLA's fused gated norm): ``norm(o) * silu(g)``; ``gate_first=True``
    (Mamba-2's ``norm_before_gate=False``): ``norm(o * silu(g))``."""

    def __init__(self, dim: int, eps: float = 1e-5, gate_first: bool = False, heads: int | None = None):
        super().__init__()
        self.eps, self.gate_first = eps, gate_first
        self.weight = nn.Parameter(torch.ones(dim) if heads is None else torch.ones(heads, dim))

    def forward(self, o: Tensor, gate: Tensor | None = None) -> Tensor:
        # one pass over each row on CPUs (numba), the formula elsewhere: longrange.ops.norm
        return rms_norm(o, self.weight, gate, self.gate_first, self.eps)


def inverse_softplus_dt(n: int, dt_min: float, dt_max: float, dt_init_floor: float) -> Tensor:
    """(n,) inverse softplus of dt, dt log-uniform in [dt_min, dt_max] and floored (Mamba's dt_bias)."""
    dt = torch.exp(sample_log_dt(n, dt_min, dt_max)).clamp(min=dt_init_floor)
    return dt + torch.log(-torch.expm1(-dt))


def no_decay(value: Tensor) -> nn.Parameter:
    """A parameter trained at the full learning rate without weight decay (A_log, dt_bias, D of
    Mamba-2 and Gated DeltaNet, as their authors train them)."""
    return set_optim_hint(nn.Parameter(value.float()), NO_DECAY_GROUP)


def split_heads(x: Tensor, heads: int) -> Tensor:
    """(..., heads * dim) -> (..., heads, dim)."""
    return x.reshape(*x.shape[:-1], heads, x.shape[-1] // heads)


def check_heads(where: str, width: int, heads: int, what: str) -> int:
    """``width / heads`` (a ConfigError unless it divides evenly)."""
    check_positive_int("n_heads", heads, where=where)
    if width % heads:
        raise ConfigError(f"{where}: {what} {width} is not divisible by n_heads={heads}")
    return width // heads


def ssd_heads(where: str, d_model: int, expand: int, headdim: int, ngroups: int) -> tuple[int, int]:
    """(d_inner, heads) of a Mamba-2 or Mamba-3 layer: d_inner = expand · d_model in heads of
    ``headdim`` channels, the heads in ``ngroups`` groups (ConfigErrors naming what does not divide)."""
    d_inner = expand * d_model
    if d_inner % headdim:
        raise ConfigError(f"{where}: expand * d_model = {d_inner} is not divisible by headdim={headdim}")
    heads = d_inner // headdim
    if heads % ngroups:
        raise ConfigError(
            f"{where}: the {heads} heads (expand * d_model / headdim) are not divisible by ngroups={ngroups}"
        )
    return d_inner, heads


class RecurrentMixer(SequencePrimitive):
    """Base of the matrix-state layers (see the module docstring)."""

    def _init_directions(self, make: Callable[[], RecurrentMixer] | None) -> bool:
        """With ``make`` (the bidirectional case): build the two causal directions and return True."""
        if make is None:
            return False
        self.directions = FlipSum(make(), make())
        return True

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x: (batch, length, d_model); mask: (batch, length), True at real positions."""
        self._check_input(x)
        if self.bidirectional:
            return self.directions(x, mask)
        return self._mix(apply_mask(x, mask), mask)

    def default_state(self, batch_size: int, device=None, dtype=None) -> dict[str, Tensor]:
        self._check_step()
        p = next(self.parameters())
        return self._zero_state(batch_size, device or p.device, dtype or p.dtype)

    def step(self, x: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """One position: x (batch, d_model) -> (output (batch, d_model), new state)."""
        self._check_step()
        if x.dim() != 2 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"{type(self).__name__}.step expects input of shape (batch, {self.d_model}), got {tuple(x.shape)}"
            )
        return self._step(x, state)

    def _mix(self, x: Tensor, mask: Tensor | None) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _zero_state(
        self, batch_size: int, device: torch.device, dtype: torch.dtype
    ) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError

    def _step(self, x: Tensor, state: dict[str, Any]) -> tuple[Tensor, dict[str, Any]]:  # pragma: no cover - abstract
        raise NotImplementedError


class QKVMixer(RecurrentMixer):
    """A layer with query, key and value projections (an optional short convolution over them), a
    state of (d_k x d_v) per head and a head-wise output norm, gated by an output projection where
    it has one (GLA, DeltaNet, Gated DeltaNet). A subclass builds the modules named below and
    implements ``_heads`` (the per-head inputs of its recurrence), ``_recur`` and ``_recur_step``.

    Modules: ``q_proj``, ``k_proj``, ``v_proj`` (to ``key_dim``, ``key_dim``, ``value_dim``), ``conv``
    (a :class:`ShortConv` over the three, or None), ``g_proj`` (the output gate, or None), ``norm``
    (a :class:`HeadNorm` of ``dv``), ``o_proj``."""

    n_heads: int
    dk: int
    dv: int

    def _heads(self, qkv: Tensor, x: Tensor) -> tuple[Tensor, ...]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _recur(self, heads: tuple[Tensor, ...], mask: Tensor | None) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _recur_step(self, heads: tuple[Tensor, ...], S: Tensor) -> tuple[Tensor, Tensor]:  # pragma: no cover
        raise NotImplementedError

    def _qkv(self, x: Tensor) -> Tensor:
        return torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)

    def _out(self, o: Tensor, x: Tensor) -> Tensor:
        gate = split_heads(self.g_proj(x), self.n_heads) if self.g_proj is not None else None
        return self.o_proj(self.norm(o, gate).flatten(-2))

    def _mix(self, x: Tensor, mask: Tensor | None) -> Tensor:
        qkv = self._qkv(x)
        if self.conv is not None:
            qkv = self.conv(qkv)
        return self._out(self._recur(self._heads(qkv, x), mask), x)

    def _zero_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> dict[str, Tensor]:
        state = {
            "S": torch.zeros(
                batch_size,
                self.n_heads,
                self.dk,
                self.dv,
                device=device,
                dtype=torch.float64 if dtype == torch.float64 else torch.float32,
            )
        }
        if self.conv is not None:
            state["conv"] = self.conv.zero_state(batch_size, device, dtype)
        return state

    def _step(self, x: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        qkv, new = self._qkv(x), {}
        if self.conv is not None:
            qkv, new["conv"] = self.conv.step(qkv, state["conv"])
        o, new["S"] = self._recur_step(self._heads(qkv, x), state["S"])
        return self._out(o.to(x.dtype), x), new
