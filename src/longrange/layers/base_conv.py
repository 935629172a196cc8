"""BaseConv (Arora et al. 2023, "Zoology: Measuring and Improving Recall in Efficient Language
Models", arXiv 2312.04927; HazyResearch/zoology ``zoology/mixers/base_conv.py``) as a sequence
primitive: a gated convolution, the convolution mixer that Based (Arora et al. 2024, arXiv
2402.18668) alternates with its linear attention.

The layer::

    y = conv(u) ⊙ (W u + b) + u            # use_act: SiLU(conv(u)) ⊙ SiLU(W u + b) + u

``W u + b`` is a (d x d) projection with bias; the ``+ u`` is the layer's own, inside the block's
residual (``residual: false`` drops it). ``conv`` is one of Zoology's three convolutions
(``zoology/mixers/convolution.py``):

* ``conv: short`` (the default; Zoology's ``ShortConvolution``): a depthwise causal convolution of
  width ``kernel_size`` with a bias, initialised as PyTorch's ``Conv1d``;
* ``conv: implicit`` (Zoology's ``kernel_size: -1`` with ``implicit_long_conv``, its
  ``ImplicitLongConvolution``): a causal filter as long as the input, ``h * u + u``, whose d
  channels at lag j are an MLP (``emb_dim`` -> ``filter_width``, ReLU, -> d, with biases) of the
  position features z_j = (j / (l_max - 1), cos(1e-4 ω_j), -sin(1e-4 ω_j)), ω_j = 2π j / l_max
  (Hyena's features, :func:`~longrange.layers.hyena.positional_features`, fixed, not trained);
* ``conv: explicit`` (its ``LongConvolution``): the same ``h * u + u`` with h a free (d, l_max)
  parameter drawn from N(0, 1), as published.

Zoology's Figure 2 "BaseConv" model alternates the short and the implicit long form (``kernel_size:
[3, -1, 3, -1]`` over four layers; ``presets/demo/recall/base-conv.yaml``). The long forms need
``l_max``, the longest input; the filter's first L lags serve an input of length L.

Bidirectional (``bidirectional=True``): two causal layers, the second over the reversed sequence,
summed (as S6). Step mode: the short convolution keeps its last ``kernel_size - 1`` inputs; the long
ones the inputs of every position so far (d x n numbers after n positions, Zoology's
``state_size``: d x the length); ``step`` == ``forward``. Padded positions: zeroed on input (so no
real position reads one) and on output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.layers.base import apply_mask
from longrange.layers.hyena import positional_features
from longrange.layers.mixer_parts import RecurrentMixer, ShortConv
from longrange.layers.registry import register_primitive
from longrange.layers.ssm import check_choice, check_positive_int
from longrange.ops.fftconv import fft_conv

_WHERE = "BaseConv"
#: The convolutions: Zoology's ShortConvolution, ImplicitLongConvolution and LongConvolution.
CONVS = ("short", "implicit", "explicit")


@dataclass(frozen=True)
class InputHistory:
    """A long convolution's step state: ``held`` (batch, d, n), the inputs of the n positions seen;
    at most ``limit`` (l_max) of them. ``kernel``: the filter's (d, l_max) lags, computed at the
    first step (a function of the parameters, not of the sequence: not counted as state)."""

    held: Tensor
    limit: int
    kernel: Tensor | None = None

    def elements(self, seq_len: int) -> int:
        return self.held.shape[1] * min(seq_len, self.limit)


class LongConv(nn.Module):
    """Zoology's long convolutions, ``h * u + u`` over (batch, length, d), h causal and as long as
    the input: ``implicit`` (an MLP of fixed position features) or ``explicit`` (a free filter)."""

    def __init__(self, d_model: int, l_max: int, implicit: bool, emb_dim: int = 3, filter_width: int = 16):
        super().__init__()
        self.d_model, self.l_max, self.implicit = d_model, l_max, implicit
        if implicit:
            z, _ = positional_features(l_max, emb_dim)
            self.register_buffer("z", z.to(torch.get_default_dtype()))
            self.mlp = nn.Sequential(nn.Linear(emb_dim, filter_width), nn.ReLU(), nn.Linear(filter_width, d_model))
        else:
            self.weight = nn.Parameter(torch.randn(d_model, l_max))

    def filter(self, L: int) -> Tensor:
        """(d, L): the filter's first L lags."""
        if not 1 <= L <= self.l_max:
            raise ValueError(f"{_WHERE}: its long filter is defined over l_max={self.l_max} positions, asked for {L}")
        return self.mlp(self.z[:L]).T if self.implicit else self.weight[:, :L]

    def forward(self, u: Tensor) -> Tensor:
        return fft_conv(u, self.filter(u.shape[1]), channels_last=True) + u

    def zero_state(self, batch_size: int, device=None, dtype=None) -> InputHistory:
        return InputHistory(torch.zeros(batch_size, self.d_model, 0, device=device, dtype=dtype), self.l_max)

    def step(self, u: Tensor, state: InputHistory) -> tuple[Tensor, InputHistory]:
        n = state.held.shape[-1] + 1
        if n > self.l_max:
            raise ValueError(
                f"{_WHERE}: step at position {n - 1} is beyond l_max={self.l_max}, the length of its long filter"
            )
        held = torch.cat([state.held, u.unsqueeze(-1)], dim=-1)
        kernel = state.kernel if state.kernel is not None else self.filter(self.l_max)
        taps = kernel[:, :n].flip(-1).to(u.dtype)  # taps[:, s] = h[n - 1 - s]: weighs the input at s
        return (held * taps).sum(-1) + u, InputHistory(held, state.limit, kernel)


@register_primitive("base-conv")
class BaseConv(RecurrentMixer):
    """Zoology's gated convolution (see the module docstring).

    Args:
        d_model: width d.
        kernel_size: width of the short depthwise causal convolution (Zoology's and Based's default 3).
        use_act: SiLU on both branches before their product.
        residual: add the input to the gated product (as published).
        bidirectional: two causal layers, one over the reversed sequence, summed.
        conv: ``short``, ``implicit`` or ``explicit`` (the long convolutions; module docstring).
        l_max: the longest input, the length of a long convolution's filter (needed by the long ones).
        emb_dim: the implicit filter's position features (odd, >= 3; Zoology's 3).
        filter_width: the hidden width of the implicit filter's MLP (Zoology's 16).
    """

    OPTION_NOTES: ClassVar[dict[str, str]] = {"l_max": "the longest input; needed by conv: implicit or explicit"}

    def __init__(
        self,
        d_model: int,
        kernel_size: int = 3,
        use_act: bool = False,
        residual: bool = True,
        bidirectional: bool = False,
        conv: str = "short",
        l_max: int | None = None,
        emb_dim: int = 3,
        filter_width: int = 16,
    ):
        super().__init__()
        check_positive_int("d_model", d_model, where=_WHERE)
        check_positive_int("kernel_size", kernel_size, where=_WHERE)
        check_choice("conv", conv, CONVS, where=_WHERE)
        if conv != "short":
            if l_max is None:
                raise ConfigError(f"{_WHERE}: conv={conv!r} needs l_max, the longest input (its filter's length)")
            check_positive_int("l_max", l_max, where=_WHERE)
            check_positive_int("filter_width", filter_width, where=_WHERE)
            if emb_dim < 3 or emb_dim % 2 == 0:
                raise ConfigError(f"{_WHERE}: emb_dim must be odd and >= 3 (time, cosine and sine), got {emb_dim}")
        self.d_model, self.kernel_size, self.conv_kind, self.l_max = d_model, kernel_size, conv, l_max
        self.use_act, self.residual, self.bidirectional = bool(use_act), bool(residual), bool(bidirectional)
        options = dict(
            kernel_size=kernel_size,
            use_act=use_act,
            residual=residual,
            conv=conv,
            l_max=l_max,
            emb_dim=emb_dim,
            filter_width=filter_width,
        )
        if self._init_directions((lambda: BaseConv(d_model, **options)) if self.bidirectional else None):
            return
        if conv == "short":
            self.conv = ShortConv(d_model, kernel_size, bias=True, activation=None)
        else:
            self.conv = LongConv(d_model, l_max, conv == "implicit", emb_dim=emb_dim, filter_width=filter_width)
        self.projection = nn.Linear(d_model, d_model)

    def extra_repr(self) -> str:
        size = f"kernel_size={self.kernel_size}" if self.conv_kind == "short" else f"l_max={self.l_max}"
        return (
            f"d_model={self.d_model}, conv={self.conv_kind}, {size}, use_act={self.use_act}, "
            f"residual={self.residual}, bidirectional={self.bidirectional}"
        )

    def _gate(self, u: Tensor, conv: Tensor) -> Tensor:
        proj = self.projection(u)
        y = F.silu(conv) * F.silu(proj) if self.use_act else conv * proj
        return y + u if self.residual else y

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x: (batch, length, d_model); mask: (batch, length), True at real positions."""
        return apply_mask(super().forward(x, mask), mask)

    def _mix(self, x: Tensor, mask: Tensor | None) -> Tensor:
        return self._gate(x, self.conv(x))

    def _zero_state(self, batch_size: int, device, dtype) -> dict[str, Tensor | InputHistory]:
        return {"conv": self.conv.zero_state(batch_size, device, dtype)}

    def _step(self, x: Tensor, state: dict) -> tuple[Tensor, dict]:
        conv, window = self.conv.step(x, state["conv"])
        return self._gate(x, conv), {"conv": window}
