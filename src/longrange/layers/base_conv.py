"""BaseConv (Arora et al. 2023, "Zoology: Measuring and Improving Recall in Efficient Language
Models", arXiv 2312.04927; HazyResearch/zoology ``zoology/mixers/base_conv.py``) as a sequence
primitive: a gated short convolution, the convolution mixer that Based (Arora et al. 2024, arXiv
2402.18668) alternates with its linear attention.

The layer::

    y = conv(u) ⊙ (W u + b) + u            # use_act: SiLU(conv(u)) ⊙ SiLU(W u + b) + u

``conv`` is a depthwise causal convolution of width ``kernel_size`` with a bias, initialised as
PyTorch's ``Conv1d`` (Zoology's ``ShortConvolution``); ``W u + b`` a (d x d) projection with bias; the
``+ u`` is the layer's own, inside the block's residual (``residual: false`` drops it). Zoology's
long-convolution variant (``kernel_size: -1``, an implicit long filter) is not built here: Hyena's
filters are the toolkit's long convolutions.

Bidirectional (``bidirectional=True``): two causal layers, the second over the reversed sequence,
summed (as S6). Step mode: the convolution's last ``kernel_size - 1`` inputs; ``step`` ==
``forward``. Padded positions: zeroed on input (so no real position reads one) and on output.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from longrange.layers.base import apply_mask
from longrange.layers.mixer_parts import RecurrentMixer, ShortConv
from longrange.layers.registry import register_primitive
from longrange.layers.ssm import check_positive_int

_WHERE = "BaseConv"


@register_primitive("base-conv")
class BaseConv(RecurrentMixer):
    """Zoology's gated short convolution (see the module docstring).

    Args:
        d_model: width d.
        kernel_size: width of the depthwise causal convolution (Zoology's and Based's default 3).
        use_act: SiLU on both branches before their product.
        residual: add the input to the gated product (as published).
        bidirectional: two causal layers, one over the reversed sequence, summed.
    """

    def __init__(
        self,
        d_model: int,
        kernel_size: int = 3,
        use_act: bool = False,
        residual: bool = True,
        bidirectional: bool = False,
    ):
        super().__init__()
        check_positive_int("d_model", d_model, where=_WHERE)
        check_positive_int("kernel_size", kernel_size, where=_WHERE)
        self.d_model, self.kernel_size = d_model, kernel_size
        self.use_act, self.residual, self.bidirectional = bool(use_act), bool(residual), bool(bidirectional)
        options = dict(kernel_size=kernel_size, use_act=use_act, residual=residual)
        if self._init_directions((lambda: BaseConv(d_model, **options)) if self.bidirectional else None):
            return
        self.conv = ShortConv(d_model, kernel_size, bias=True, activation=None)
        self.projection = nn.Linear(d_model, d_model)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, kernel_size={self.kernel_size}, use_act={self.use_act}, "
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

    def _zero_state(self, batch_size: int, device, dtype) -> dict[str, Tensor]:
        return {"conv": self.conv.zero_state(batch_size, device, dtype)}

    def _step(self, x: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        conv, window = self.conv.step(x, state["conv"])
        return self._gate(x, conv), {"conv": window}
