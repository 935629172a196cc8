"""S6, the selective SSM of Mamba, as a sequence primitive: (batch, length, d_model) -> same.

Per position t and channel c (``N = d_state``, ``r = dt_rank``)::

    (dt_low_t, B_t, C_t) = x_proj(x_t)                 # r, N, N values, shared by all channels
    delta_t = softplus(dt_proj.weight @ dt_low_t + dt_proj.bias)        # (d_model,)
    A = -exp(A_log)                                                     # (d_model, N)
    h_t = exp(delta_t * A) * h_{t-1} + delta_t * B_t * x_t              # (d_model, N)
    y_t = <C_t, h_t> + D * x_t

computed by :func:`longrange.ops.scan.selective_scan` (delta's bias and softplus are applied
inside the scan, as Mamba does). There is no gating here: the Mamba block gates.

``d_model`` is the width the SSM sees; inside the Mamba block that is the expanded width
(``expand * d``). ``dt_rank="auto"`` means ``ceil(d_model / 16)`` of this layer's own width,
whereas Mamba uses ``ceil(d / 16)`` of the block width before expansion: the Mamba block passes
its own integer ``dt_rank``.

Initialisation (as in Mamba): ``dt_proj.weight`` uniform in ``±dt_rank**-0.5``; ``dt_proj.bias``
the inverse softplus of dt, dt log-uniform in [dt_min, dt_max] and floored at ``dt_init_floor``;
``x_proj`` PyTorch's default Linear init; ``D = 1``; ``A_init="real"``: ``A[c, n] = -(n + 1)``
(S4D-Real, Mamba's choice); ``A_init="legs"``: ``A = -1/2`` everywhere (the real part of the
diagonal HiPPO-LegS matrix). ``A_log`` carries the optimiser hint ``group="ssm"``, ``D``
``group="no_decay"``.

RoPE hook: ``forward(x, mask=None, x_rot=None)`` and ``step(x_t, state, x_rot_t=None)``. With
``x_rot`` (the RoPE-rotated input, same shape as ``x``) given, the quantities named in
``rope_targets`` (a subset of ``{"B", "C", "delta", "x"}``) are computed from ``x_rot`` instead of
``x``; ``"x"`` means the scanned input itself is ``x_rot``. Without ``x_rot`` everything comes
from ``x``.

``bidirectional=True`` wraps two independent causal S6 in :class:`FlipSum` (no recurrent mode).

``scan_impl`` chooses the implementation of the scan (the ``impl`` of
:func:`~longrange.ops.scan.selective_scan`): None (default) takes the process-wide default
(:func:`~longrange.ops.scan.set_default_impl`, normally "auto", the fastest usable), "ref" the
Python reference loop over time (slow; for tests), or a named fast path.

``allow_neg_eigval=True`` extends the eigenvalues of the transition from [0, 1] to [-1, 1] (Grazzi
et al. 2025, arXiv 2411.12537: their Mamba [-1, 1]): the decay is ``2 exp(delta A) - 1`` in place
of ``exp(delta A)``, which a recurrence needs to track parity. No kernel computes that decay: the
scan is :func:`~longrange.ops.scan.signed.selective_scan_signed`, a loop over time in PyTorch
(``scan_impl`` must then be unset).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.layers.base import SequencePrimitive, apply_mask
from longrange.layers.bidirectional import FlipSum
from longrange.layers.registry import register_primitive
from longrange.layers.ssm import (
    check_choice,
    check_dt_range,
    check_positive_int,
    check_step_input,
    sample_log_dt,
    skip_parameter,
    ssm_parameter,
)
from longrange.ops.scan import IMPLS as SCAN_IMPLS
from longrange.ops.scan import selective_scan
from longrange.ops.scan.signed import selective_scan_signed

ROPE_TARGETS = ("B", "C", "delta", "x")
A_INITS = ("real", "legs")


def s6_A_log_init(d_model: int, d_state: int, A_init: str) -> Tensor:
    """(d_model, d_state) values of ``A_log`` with ``A = -exp(A_log)``."""
    if A_init == "real":
        A = torch.arange(1, d_state + 1, dtype=torch.float64).expand(d_model, d_state)
    elif A_init == "legs":
        A = torch.full((d_model, d_state), 0.5, dtype=torch.float64)
    else:
        check_choice("A_init", A_init, A_INITS, where="S6")
    return torch.log(A)


def s6_dt_bias_init(d_model: int, dt_min: float, dt_max: float, dt_init_floor: float) -> Tensor:
    """(d_model,) inverse softplus of dt, dt log-uniform in [dt_min, dt_max], floored at dt_init_floor."""
    dt = torch.exp(sample_log_dt(d_model, dt_min, dt_max)).clamp(min=dt_init_floor)
    return dt + torch.log(-torch.expm1(-dt))  # softplus^{-1}(dt) = log(exp(dt) - 1), computed stably


@register_primitive("s6")
class S6(SequencePrimitive):
    """The selective SSM of Mamba (see the module docstring)."""

    OPTION_NOTES: ClassVar[dict[str, str]] = {
        "scan_impl": 'the selective scan\'s default for the process: "auto" unless changed by its set_default_impl'
    }

    def __init__(
        self,
        d_model: int,
        d_state: int = 16,
        dt_rank: int | str = "auto",
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        A_init: str = "real",
        bidirectional: bool = False,
        rope_targets: tuple[str, ...] | list[str] = (),
        scan_impl: str | None = None,
        allow_neg_eigval: bool = False,
    ):
        super().__init__()
        check_positive_int("d_model", d_model, where="S6")
        check_positive_int("d_state", d_state, where="S6")
        if dt_rank == "auto":
            dt_rank = math.ceil(d_model / 16)
        check_positive_int("dt_rank", dt_rank, where="S6")
        check_dt_range(dt_min, dt_max, where="S6")
        if not dt_init_floor >= 0:
            raise ConfigError(f"S6: dt_init_floor must be >= 0, got {dt_init_floor!r}")
        check_choice("A_init", A_init, A_INITS, where="S6")
        if scan_impl is not None:
            check_choice("scan_impl", scan_impl, tuple(SCAN_IMPLS), where="S6")
        if not isinstance(allow_neg_eigval, bool):
            raise ConfigError(f"S6: allow_neg_eigval must be true or false, got {allow_neg_eigval!r}")
        if allow_neg_eigval and scan_impl is not None:
            raise ConfigError(
                f"S6: scan_impl {scan_impl!r} computes the decay exp(delta A); allow_neg_eigval needs "
                "2 exp(delta A) - 1, which only its own scan computes: leave scan_impl unset"
            )
        if isinstance(rope_targets, str):
            raise ConfigError(
                f"S6: rope_targets must be a list of names from {ROPE_TARGETS}, got the string {rope_targets!r}"
            )
        unknown = [t for t in rope_targets if t not in ROPE_TARGETS]
        if unknown:
            raise ConfigError(f"S6: unknown rope_targets {unknown}; allowed: {ROPE_TARGETS}")
        self.d_model = d_model
        self.d_state = d_state
        self.dt_rank = dt_rank
        self.bidirectional = bool(bidirectional)
        self.rope_targets = tuple(dict.fromkeys(rope_targets))
        self.scan_impl = scan_impl
        self.allow_neg_eigval = allow_neg_eigval
        if self.bidirectional:
            kwargs = dict(
                d_model=d_model,
                d_state=d_state,
                dt_rank=dt_rank,
                dt_min=dt_min,
                dt_max=dt_max,
                dt_init_floor=dt_init_floor,
                A_init=A_init,
                rope_targets=rope_targets,
                scan_impl=scan_impl,
                allow_neg_eigval=allow_neg_eigval,
            )
            self.directions = FlipSum(S6(**kwargs), S6(**kwargs))
            return
        self.x_proj = nn.Linear(d_model, dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(dt_rank, d_model, bias=True)
        with torch.no_grad():
            bound = dt_rank**-0.5
            self.dt_proj.weight.uniform_(-bound, bound)
            self.dt_proj.bias.copy_(s6_dt_bias_init(d_model, dt_min, dt_max, dt_init_floor))
        # Its initialisation sets the time scales: a whole-model scheme (model.init) keeps it, as
        # mamba_ssm marks it.
        self.dt_proj.bias._no_reinit = True
        self.A_log = ssm_parameter(s6_A_log_init(d_model, d_state, A_init), lr_scale=None)
        self.D = skip_parameter(torch.ones(d_model))

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, d_state={self.d_state}, dt_rank={self.dt_rank}, "
            f"bidirectional={self.bidirectional}, rope_targets={self.rope_targets}"
            + (", allow_neg_eigval=True" if self.allow_neg_eigval else "")
        )

    # ---- routing of the RoPE-rotated input ----------------------------------------------------

    def _check_rot(self, x: Tensor, x_rot: Tensor | None, what: str) -> None:
        if x_rot is None:
            return
        if not self.rope_targets:
            raise ValueError(f"S6 got {what} but rope_targets is empty; set rope_targets to use the rotated input")
        if x_rot.shape != x.shape:
            raise ValueError(f"S6: {what} must have the shape of the input {tuple(x.shape)}, got {tuple(x_rot.shape)}")

    def _selection(self, x: Tensor, x_rot: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(u, delta without bias, B, C) on the last axis: (..., d_model), (..., d_model), (..., N), (..., N)."""
        rot = set(self.rope_targets) if x_rot is not None else set()
        proj = self.x_proj(x) if {"delta", "B", "C"} - rot else None
        proj_rot = self.x_proj(x_rot) if {"delta", "B", "C"} & rot else None
        r, N = self.dt_rank, self.d_state

        def part(name: str, start: int, stop: int) -> Tensor:
            return (proj_rot if name in rot else proj)[..., start:stop]

        dt_low, B, C = part("delta", 0, r), part("B", r, r + N), part("C", r + N, r + 2 * N)
        u = x_rot if "x" in rot else x
        return u, F.linear(dt_low, self.dt_proj.weight), B, C

    # ---- parallel and recurrent modes ----------------------------------------------------------

    #: :meth:`forward` takes ``gate``: the Mamba block's SiLU gate applied inside the scan.
    fuses_gate = True

    def forward(
        self, x: Tensor, mask: Tensor | None = None, x_rot: Tensor | None = None, gate: Tensor | None = None
    ) -> Tensor:
        """x, x_rot: (batch, length, d_model); mask: (batch, length), True at real positions.

        ``gate`` (batch, length, d_model): the output is ``y * silu(gate)``, computed in the scan's
        kernel (its ``z``) rather than as three more passes over (batch, length, d_model) tensors
        forward and backward (a causal layer only)."""
        self._check_input(x)
        self._check_rot(x, x_rot, "x_rot")
        if gate is not None and (self.bidirectional or gate.shape != x.shape):
            raise ValueError(
                f"S6: gate must have the input's shape {tuple(x.shape)} in a causal layer, got "
                f"{tuple(gate.shape)}" + (" in a bidirectional one" if self.bidirectional else "")
            )
        if self.bidirectional:
            return self.directions(x, mask, x_rot=x_rot)
        x = apply_mask(x, mask)
        x_rot = apply_mask(x_rot, mask) if x_rot is not None else None
        u, delta, B, C = self._selection(x, x_rot)
        scan = selective_scan_signed if self.allow_neg_eigval else selective_scan
        y = scan(
            u.transpose(1, 2),
            delta.transpose(1, 2),
            -torch.exp(self.A_log),
            B.transpose(1, 2),
            C.transpose(1, 2),
            D=self.D,
            z=None if gate is None else gate.transpose(1, 2),
            delta_bias=self.dt_proj.bias,
            delta_softplus=True,
            **({} if self.allow_neg_eigval else {"impl": self.scan_impl}),
        )
        return y.transpose(1, 2)

    def default_state(self, batch_size: int, device=None, dtype=None) -> Tensor:
        """The zero SSM state, (batch_size, d_model, d_state)."""
        self._check_step()
        return torch.zeros(
            batch_size,
            self.d_model,
            self.d_state,
            device=device if device is not None else self.A_log.device,
            dtype=dtype if dtype is not None else self.A_log.dtype,
        )

    def step(self, x: Tensor, state: Tensor, x_rot_t: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """One position: x, x_rot_t (batch, d_model); state (batch, d_model, d_state) -> (y, new state)."""
        self._check_step()
        check_step_input(self, x, state, (self.d_model, self.d_state))
        self._check_rot(x, x_rot_t, "x_rot_t")
        u, delta, B, C = self._selection(x, x_rot_t)
        delta = F.softplus(delta + self.dt_proj.bias)
        A = -torch.exp(self.A_log)
        decay = torch.exp(delta[..., None] * A)
        if self.allow_neg_eigval:
            decay = 2 * decay - 1
        h = decay * state + (delta * u)[..., None] * B[:, None, :]
        y = (h * C[:, None, :]).sum(-1) + self.D * u
        return y, h
