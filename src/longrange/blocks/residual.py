"""The residual block of today's recurrent models: a whole mixer layer and an optional MLP.

Pre-norm (default):   x = x + drop(mixer(norm1(x)));   x = x + drop(mlp(norm2(x)))
Post-norm:            x = norm1(x + drop(mixer(x)));   x = norm2(x + drop(mlp(x)))

The mixer is a complete layer with its own projections, gates and output norm (Mamba-2, Mamba-3,
GLA, DeltaNet, Gated DeltaNet), so the block adds only the residual branches. The MLP:

- ``"swiglu"``: ``down(silu(gate(x)) * up(x))`` with hidden width 2/3 · mlp_ratio · d rounded up
  to a multiple of 8: the gated MLP of flash-linear-attention's models (which round to a multiple
  of 256, a GPU-efficiency choice that at width 64 would make the MLP 1.5x wider than its ratio
  says; the small models compared here keep the ratio);
- ``"gelu"``: ``Linear(hidden, d)(gelu(Linear(d, hidden)(x)))``, hidden = mlp_ratio · d (the
  Transformer's MLP);
- ``"none"``: no MLP, the block is norm -> mixer -> residual (Mamba-2's and Mamba-3's own block).
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor, nn

from longrange.blocks.common import FeatureDropout, norm_step
from longrange.blocks.norms import make_norm
from longrange.errors import ConfigError
from longrange.layers.base import SequencePrimitive
from longrange.ops.glu import swiglu

MLPS = ("swiglu", "gelu", "none")


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``, without biases; the activation by
    :func:`longrange.ops.glu.swiglu` on the fused projection (one pass each way on a CPU)."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(swiglu(self.gate_up(x)))


def make_mlp(kind: str, d: int, ratio: float) -> nn.Module | None:
    """The block's MLP (see the module docstring), or None for ``"none"``."""
    if kind not in MLPS:
        raise ConfigError(f"unknown mlp {kind!r}; expected one of {', '.join(MLPS)}")
    if kind == "none":
        return None
    if not (isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio > 0):
        raise ConfigError(f"model.mlp_ratio must be a positive number for mlp {kind!r}, got {ratio!r}")
    if kind == "swiglu":
        return SwiGLU(d, 8 * math.ceil(2 * ratio * d / 3 / 8))
    hidden = max(1, round(ratio * d))
    return nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))


class ResidualBlock(SequencePrimitive):
    """A mixer layer and an optional MLP in residual branches (see the module docstring)."""

    def __init__(
        self,
        mixer: SequencePrimitive,
        mlp: str = "swiglu",
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        norm: str = "rms",
        prenorm: bool = True,
    ):
        super().__init__()
        d = mixer.d_model
        self.d_model, self.bidirectional, self.prenorm = d, mixer.bidirectional, bool(prenorm)
        self.mixer = mixer
        self.norm1 = make_norm(norm, d)
        self.mlp = make_mlp(mlp, d, mlp_ratio)
        self.norm2 = make_norm(norm, d) if self.mlp is not None else None
        self.drop = FeatureDropout(dropout)

    @property
    def mixers(self) -> list[SequencePrimitive]:
        return [self.mixer]

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        self._check_input(x)
        if self.prenorm:
            x = x + self.drop(self.mixer(self.norm1(x, mask), mask))
            return x if self.mlp is None else x + self.drop(self.mlp(self.norm2(x, mask)))
        x = self.norm1(x + self.drop(self.mixer(x, mask)), mask)
        return x if self.mlp is None else self.norm2(x + self.drop(self.mlp(x)), mask)

    def default_state(self, batch_size: int, device=None, dtype=None) -> Any:
        self._check_step()
        return self.mixer.default_state(batch_size, device=device, dtype=dtype)

    def step(self, x: Tensor, state: Any) -> tuple[Tensor, Any]:
        self._check_step()
        if self.prenorm:
            y, state = self.mixer.step(norm_step(self.norm1, x), state)
            x = x + self.drop(y)
            return (x if self.mlp is None else x + self.drop(self.mlp(norm_step(self.norm2, x)))), state
        y, state = self.mixer.step(x, state)
        x = norm_step(self.norm1, x + self.drop(y))
        return (x if self.mlp is None else norm_step(self.norm2, x + self.drop(self.mlp(x)))), state


class ChannelMixerBlock(SequencePrimitive):
    """A channel mixer as a layer of its own (``"swiglu"`` or ``"mlp"`` in ``model.layers``): the
    MLP ``mlp`` in a residual branch, position by position, with no state::

        pre-norm:  x = x + drop(mlp(norm(x)))        post-norm:  x = norm(x + drop(mlp(x)))

    MAD's ``hyena swiglu hyena swiglu`` is two mixer blocks without MLPs and two of these."""

    def __init__(
        self,
        d_model: int,
        mlp: str = "swiglu",
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        norm: str = "rms",
        prenorm: bool = True,
        bidirectional: bool = False,
    ):
        super().__init__()
        if mlp == "none":
            raise ConfigError("a channel-mixer layer needs an MLP: 'swiglu' or 'gelu'")
        self.d_model, self.bidirectional, self.prenorm = d_model, bool(bidirectional), bool(prenorm)
        self.mlp = make_mlp(mlp, d_model, mlp_ratio)
        self.norm = make_norm(norm, d_model)
        self.drop = FeatureDropout(dropout)

    @property
    def mixers(self) -> list[SequencePrimitive]:
        return []  # no sequence mixing

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        self._check_input(x)
        if self.prenorm:
            return x + self.drop(self.mlp(self.norm(x, mask)))
        return self.norm(x + self.drop(self.mlp(x)), mask)

    def default_state(self, batch_size: int, device=None, dtype=None) -> Any:
        self._check_step()
        return None

    def step(self, x: Tensor, state: Any) -> tuple[Tensor, Any]:
        self._check_step()
        if self.prenorm:
            return x + self.drop(self.mlp(norm_step(self.norm, x))), state
        return norm_step(self.norm, x + self.drop(self.mlp(x))), state
