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

from typing import Any, ClassVar

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


def state_elements(state: Any, seq_len: int) -> int:
    """The number of real numbers a recurrent state holds per sequence (its batch is 1; a complex
    element counts two): the tensors of nested dicts, lists and tuples; an object with ``elements(seq_len)`` (attention's KV cache, which
    grows with the length) counts itself."""
    if isinstance(state, Tensor):
        return state.numel() * (2 if state.is_complex() else 1)  # real numbers
    if hasattr(state, "elements"):
        return int(state.elements(seq_len))
    if isinstance(state, dict):
        return sum(state_elements(v, seq_len) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_elements(v, seq_len) for v in state)
    return 0  # counters, positions


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
    #: What an option whose default is None means, by option name: ``longrange list primitive NAME``
    #: prints it beside the None (tests/test_listing.py asks every built-in primitive for one).
    OPTION_NOTES: ClassVar[dict[str, str]] = {}

    @property
    def causal(self) -> bool:
        return not self.bidirectional

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def default_state(
        self, batch_size: int, device: torch.device | None = None, dtype: torch.dtype | None = None
    ) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no recurrent mode")

    def step(self, x: Tensor, state: Any) -> tuple[Tensor, Any]:
        raise NotImplementedError(f"{type(self).__name__} has no recurrent mode")

    def state_size(self, seq_len: int) -> int | None:
        """Elements of recurrent state this layer carries per sequence when it generates, at the end
        of a sequence of ``seq_len`` positions (Zoology's ``state_size``: the axis on which recall is
        compared fairly): the state of :meth:`default_state` (for attention, the KV cache, which
        grows with the length). None for a bidirectional layer, which does not generate. Counted on
        the meta device: nothing is allocated."""
        if self.bidirectional:
            return None
        return state_elements(self.default_state(1, device=torch.device("meta")), seq_len)

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
