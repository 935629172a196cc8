"""The Simple block of S4/S4D (thesis section 12.1, figure 9).

    y = primitive(x) -> GELU -> dropout -> Linear(d, 2d) -> GLU -> dropout;   out = x + y
with the norm before the primitive (pre-norm) or after the residual sum (post-norm, the thesis'
and S4's LRA default). ``output_glu=False`` gives the original S4 layer's output (the S4 code at
tag v1, ``postact: null``): ``Linear(d, d)`` without the GLU, d² + d parameters instead of 2d² + 2d.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from longrange.blocks.common import FeatureDropout, norm_step
from longrange.blocks.norms import make_norm
from longrange.layers.base import SequencePrimitive, apply_mask


class SimpleBlock(SequencePrimitive):
    def __init__(
        self,
        mixer: SequencePrimitive,
        dropout: float = 0.0,
        norm: str = "layer",
        prenorm: bool = False,
        output_glu: bool = True,
    ):
        super().__init__()
        d = mixer.d_model
        self.d_model = d
        self.bidirectional = mixer.bidirectional
        self.prenorm = prenorm
        self.mixer = mixer
        self.norm = make_norm(norm, d)
        self.activation = nn.GELU()
        self.dropout = FeatureDropout(dropout)
        self.output_linear = nn.Linear(d, 2 * d if output_glu else d)
        self.glu = nn.GLU(dim=-1) if output_glu else nn.Identity()

    @property
    def mixers(self) -> list[SequencePrimitive]:
        return [self.mixer]

    def _pointwise(self, y: Tensor) -> Tensor:
        y = self.dropout(self.activation(y))
        return self.dropout(self.glu(self.output_linear(y)))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        self._check_input(x)
        z = self.norm(x, mask) if self.prenorm else x
        y = self._pointwise(self.mixer(apply_mask(z, mask), mask))
        out = x + y
        return out if self.prenorm else self.norm(out, mask)

    def default_state(self, batch_size: int, device=None, dtype=None) -> Any:
        self._check_step()
        return self.mixer.default_state(batch_size, device=device, dtype=dtype)

    def step(self, x: Tensor, state: Any) -> tuple[Tensor, Any]:
        self._check_step()
        z = norm_step(self.norm, x) if self.prenorm else x
        y, state = self.mixer.step(z, state)
        out = x + self._pointwise(y)
        return (out if self.prenorm else norm_step(self.norm, out)), state
