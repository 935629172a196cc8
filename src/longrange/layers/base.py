"""The sequence-primitive interface and the optimiser hints that SSM parameters carry.

A sequence primitive maps ``x`` of shape (batch, length, d_model) to the same shape. Causal
primitives also generate step by step:

    state = layer.default_state(batch_size)
    y_t, state = layer.step(x_t, state)      # x_t, y_t: (batch, d_model)

and stepping through a sequence must give the same outputs as ``forward``.

Padding: ``forward(x, mask)`` takes an optional boolean ``mask`` of shape (batch, length), True at
real positions. Sequences are left-aligned (padding at the end). A primitive zeroes its input at
padded positions before mixing along the sequence, so that for a bidirectional primitive the
reverse direction starts from a zero state at the last real position and the outputs at real
positions do not depend on how much padding follows.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

#: Name of the attribute on a ``nn.Parameter`` holding its optimiser hint.
OPTIM_HINT_ATTR = "_optim"

#: The parameter group of SSM parameters (A, B, C, Δ, ...). The trainer gives this group a reduced
#: learning rate and no weight decay (both configurable there, defaults 0.1·lr and 0).
SSM_GROUP = "ssm"

#: The parameter group trained at the full learning rate without weight decay (e.g. skip terms D).
NO_DECAY_GROUP = "no_decay"


def set_optim_hint(param: nn.Parameter, group: str = SSM_GROUP, **overrides: Any) -> nn.Parameter:
    """Tag ``param`` with an optimiser hint that the trainer reads.

    ``group`` names a parameter group whose learning-rate scale and weight decay are set in the
    training config; ``overrides`` (``lr_scale=...``, ``weight_decay=...``) pin values for this
    parameter regardless of the config.
    """
    unknown = set(overrides) - {"lr_scale", "weight_decay"}
    if unknown:
        raise ValueError(f"unknown optimiser hint field(s) {sorted(unknown)}; expected lr_scale, weight_decay")
    setattr(param, OPTIM_HINT_ATTR, {"group": group, **overrides})
    return param


def get_optim_hint(param: nn.Parameter) -> dict[str, Any]:
    """The hint set by :func:`set_optim_hint`, or ``{}`` for an ordinary parameter."""
    return dict(getattr(param, OPTIM_HINT_ATTR, {}))


def apply_mask(x: Tensor, mask: Tensor | None) -> Tensor:
    """Zero ``x`` (batch, length, ...) at padded positions of ``mask`` (batch, length)."""
    if mask is None:
        return x
    if mask.shape != x.shape[:2]:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not match input of shape {tuple(x.shape)}")
    return x * mask.reshape(*mask.shape, *([1] * (x.dim() - 2))).to(x.dtype)


class SequencePrimitive(nn.Module):
    """Base class of all sequence-mixing layers: (batch, length, d_model) -> same shape.

    Subclasses set ``d_model`` and ``bidirectional`` and implement ``forward``. Causal subclasses
    implement ``default_state`` and ``step``.
    """

    d_model: int
    bidirectional: bool = False

    @property
    def causal(self) -> bool:
        return not self.bidirectional

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def default_state(self, batch_size: int, device: torch.device | None = None, dtype: torch.dtype | None = None) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no recurrent mode")

    def step(self, x: Tensor, state: Any) -> tuple[Tensor, Any]:
        raise NotImplementedError(f"{type(self).__name__} has no recurrent mode")

    def _check_step(self) -> None:
        if self.bidirectional:
            raise RuntimeError(
                f"{type(self).__name__} is bidirectional: a bidirectional layer has no recurrent (step) mode; "
                "build it with bidirectional=False for generation"
            )

    def _check_input(self, x: Tensor) -> None:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"{type(self).__name__} expects input of shape (batch, length, {self.d_model}), got {tuple(x.shape)}"
            )
