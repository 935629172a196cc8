"""The Transformer block: attention and an MLP, each in a residual branch.

Pre-norm (default):   x = x + drop(attn(norm1(x)));   x = x + drop(mlp(norm2(x)))
Post-norm:            x = norm1(x + drop(attn(x)));   x = norm2(x + drop(mlp(x)))

with ``mlp(x) = Linear(hidden, d)(act(Linear(d, hidden)(x)))``, ``hidden = round(mlp_ratio · d)``.
Inputs and outputs are (batch, length, d_model); ``mask`` (batch, length) is True at real positions.
"""

from __future__ import annotations

from torch import Tensor, nn

from longrange.blocks.common import norm_step
from longrange.blocks.norms import SequenceBatchNorm, make_norm
from longrange.errors import ConfigError
from longrange.layers.attention import Attention, KVCache
from longrange.layers.base import SequencePrimitive

ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU}


class TransformerBlock(SequencePrimitive):
    """A Transformer layer with the sequence-primitive interface.

    Args:
        d_model, n_heads, bidirectional, rope, rope_base, block_size, window, attn_dim: passed to
            :class:`Attention` (``attn_dim``: width of queries, keys and values; None = ``d_model``).
        attn_bias: biases in the attention's qkv and output projections (the MLP always has them).
        mlp_ratio: hidden width of the MLP as a multiple of ``d_model``.
        dropout: dropout on the outputs of both residual branches.
        norm: "layer", "batch", "rms" or "none" (see :func:`make_norm`).
        prenorm: normalise the branch inputs (True) or the residual sums (False).
        activation: "gelu", "relu" or "silu".
        attn_dropout: dropout on the attention probabilities.

    ``mixer`` is the attention layer (the block's sequence primitive). The causal block generates
    step by step with the attention's KV cache as state. With ``norm="batch"`` stepping needs eval
    mode (running statistics): a single step has no batch statistics over the sequence.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int = 8,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        norm: str = "layer",
        prenorm: bool = True,
        bidirectional: bool = False,
        rope: bool = False,
        rope_base: float = 10000.0,
        block_size: int | None = None,
        activation: str = "gelu",
        attn_dropout: float = 0.0,
        window: int | None = None,
        attn_dim: int | None = None,
        attn_bias: bool = True,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ConfigError(
                f"TransformerBlock activation {activation!r} is unknown; expected one of {', '.join(ACTIVATIONS)}"
            )
        if not (isinstance(mlp_ratio, (int, float)) and mlp_ratio > 0):
            raise ConfigError(f"TransformerBlock mlp_ratio must be a positive number, got {mlp_ratio!r}")
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"TransformerBlock dropout must be in [0, 1), got {dropout!r}")
        self.mixer = Attention(
            d_model,
            n_heads=n_heads,
            bidirectional=bidirectional,
            dropout=attn_dropout,
            rope=rope,
            rope_base=rope_base,
            block_size=block_size,
            window=window,
            attn_dim=attn_dim,
            bias=attn_bias,
        )
        self.d_model = d_model
        self.bidirectional = self.mixer.bidirectional
        self.prenorm = bool(prenorm)
        hidden = max(1, round(mlp_ratio * d_model))
        self.norm1 = make_norm(norm, d_model)
        self.norm2 = make_norm(norm, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, hidden), ACTIVATIONS[activation](), nn.Linear(hidden, d_model))
        self.drop = nn.Dropout(dropout)

    @property
    def mixers(self) -> list[SequencePrimitive]:
        return [self.mixer]

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """(batch, L, d_model) -> (batch, L, d_model)."""
        self._check_input(x)
        if self.prenorm:
            x = x + self.drop(self.mixer(self.norm1(x, mask), mask))
            return x + self.drop(self.mlp(self.norm2(x, mask)))
        x = self.norm1(x + self.drop(self.mixer(x, mask)), mask)
        return self.norm2(x + self.drop(self.mlp(x)), mask)

    def default_state(self, batch_size: int, device=None, dtype=None) -> KVCache:
        """The attention's empty KV cache."""
        self._check_step()
        return self.mixer.default_state(batch_size, device=device, dtype=dtype)

    def step(self, x: Tensor, state: KVCache) -> tuple[Tensor, KVCache]:
        """One position ``x`` (batch, d_model) -> (output (batch, d_model), updated cache)."""
        self._check_step()
        if x.dim() != 2 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"TransformerBlock.step expects input of shape (batch, {self.d_model}), got {tuple(x.shape)}"
            )
        if self.training and isinstance(self.norm1, SequenceBatchNorm):
            raise RuntimeError(
                "TransformerBlock with norm='batch' steps with running statistics: call .eval() before step()"
            )
        if self.prenorm:
            y, state = self.mixer.step(norm_step(self.norm1, x), state)
            x = x + self.drop(y)
            return x + self.drop(self.mlp(norm_step(self.norm2, x))), state
        y, state = self.mixer.step(x, state)
        x = norm_step(self.norm1, x + self.drop(y))
        return norm_step(self.norm2, x + self.drop(self.mlp(x))), state
