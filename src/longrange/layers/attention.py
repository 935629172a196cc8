"""Multi-head softmax attention, optionally rotary, blocked (local) and with a KV-cache step mode.

Shapes: inputs and outputs are (batch, L, d_model); inside, queries/keys/values are
(batch, heads, L, head_dim) with ``head_dim = attn_dim / heads``, where ``attn_dim`` (the width of
the q/k/v projections, d_model -> attn_dim; the output projection maps attn_dim -> d_model) is
d_model unless set. Scores are scaled by ``1 / sqrt(head_dim)``.

The kernels (full, blocked, and their dense reference) are in :mod:`longrange.ops.attention`.

Padding: ``mask`` (batch, L) is True at real positions. Padded keys are never attended to and the
outputs at padded positions are zero. A query that has no key to attend to (possible only with
unusual masks or blocks made entirely of padding) outputs zero instead of NaN.

Blocked attention (``block_size=B``): the sequence is cut into consecutive, non-overlapping blocks
of B positions (the last one may be shorter) and each position attends only within its block
(and only to earlier positions of it in causal mode). Blocks are folded into the batch dimension,
so memory is O(L·B) rather than O(L²). Rotary positions remain global positions, so the same
token gets the same rotation whatever the block size.

Sliding-window attention (``window=W``): each position attends to its own window of W positions
and one window back and one forward (causally: its own window up to itself and one window back);
the kernel and its dense reference are in :mod:`longrange.ops.sliding_window`. Memory O(L·W).

Generation: ``default_state(batch)`` is an empty :class:`KVCache`; ``step(x_t, state)`` appends
this step's key and value and attends over the cache. With ``block_size`` the cache is emptied at
every block boundary, matching the blocked forward; with ``window`` it keeps only the previous
window's keys at every window boundary (at most 2·W cached steps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.layers.base import SequencePrimitive, apply_mask
from longrange.layers.registry import register_primitive
from longrange.layers.rope import RotaryEmbedding
from longrange.ops.attention import blocked_attention, masked_attention
from longrange.ops.sliding_window import sliding_window_attention


@dataclass(frozen=True)
class KVCache:
    """Keys and values of the steps seen so far (of the current block, when blocked).

    ``k`` and ``v`` have shape (batch, heads, n_cached, head_dim); ``position`` is the number of
    steps taken since the start of the sequence (the global position of the next step).
    """

    k: Tensor
    v: Tensor
    position: int = 0
    #: The most positions the cache holds (isolated blocks: the block; sliding windows: two
    #: windows); None: every position seen.
    limit: int | None = None

    def elements(self, seq_len: int) -> int:
        """Elements per sequence after ``seq_len`` steps (for :func:`~longrange.layers.base.state_elements`)."""
        held = seq_len if self.limit is None else min(seq_len, self.limit)
        return 2 * self.k.shape[1] * held * self.k.shape[3]


@register_primitive("attention")
class Attention(SequencePrimitive):
    """Multi-head self-attention as a sequence primitive (see the module docstring for conventions).

    Args:
        d_model: model width (inputs and outputs).
        n_heads: number of heads; must divide ``attn_dim``.
        attn_dim: width of the queries, keys and values (all heads together); None = ``d_model``.
        bidirectional: attend to all positions instead of only to earlier ones (no step mode).
        dropout: dropout on the attention probabilities (training only).
        rope: apply rotary embeddings (on the head dimension) to queries and keys.
        rope_base: base of the rotary frequencies (10000 standard, 10 in the thesis comparison).
        block_size: attend only within blocks of this many positions (local attention).
        bias: biases in the qkv and output projections.
        window: sliding-window attention with windows of this many positions (exclusive with block_size).
    """

    OPTION_NOTES: ClassVar[dict[str, str]] = {
        "block_size": "attention over the whole sequence, not within blocks",
        "window": "no sliding window",
        "attn_dim": "d_model",
    }

    def __init__(
        self,
        d_model: int,
        n_heads: int = 8,
        bidirectional: bool = False,
        dropout: float = 0.0,
        rope: bool = False,
        rope_base: float = 10000.0,
        block_size: int | None = None,
        bias: bool = True,
        window: int | None = None,
        attn_dim: int | None = None,
    ):
        super().__init__()
        for name, value in (("d_model", d_model), ("n_heads", n_heads)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"Attention {name} must be a positive int, got {value!r}")
        if attn_dim is not None and (not isinstance(attn_dim, int) or isinstance(attn_dim, bool) or attn_dim < 1):
            raise ConfigError(f"Attention attn_dim must be None (= d_model) or a positive int, got {attn_dim!r}")
        width = d_model if attn_dim is None else attn_dim
        if width % n_heads:
            name = "d_model" if attn_dim is None else "attn_dim"
            raise ConfigError(f"Attention {name}={width} is not divisible by n_heads={n_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"Attention dropout must be in [0, 1), got {dropout!r}")
        if block_size is not None and (
            not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1
        ):
            raise ConfigError(f"Attention block_size must be None or a positive int, got {block_size!r}")
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise ConfigError(f"Attention window must be None or a positive int, got {window!r}")
        if window is not None and block_size is not None:
            raise ConfigError(
                "Attention takes either block_size (isolated blocks) or window (sliding windows), not both"
            )
        self.d_model = d_model
        self.n_heads = n_heads
        self.attn_dim = width
        self.head_dim = width // n_heads
        self.bidirectional = bool(bidirectional)
        self.dropout = float(dropout)
        self.block_size = block_size
        self.window = window
        self.qkv = nn.Linear(d_model, 3 * width, bias=bias)
        self.out_proj = nn.Linear(width, d_model, bias=bias)
        self.rope = RotaryEmbedding(self.head_dim, base=rope_base) if rope else None

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, bidirectional={self.bidirectional}, "
            f"block_size={self.block_size}"
            + (f", attn_dim={self.attn_dim}" if self.attn_dim != self.d_model else "")
            + (f", window={self.window}" if self.window is not None else "")
            + (", bias=False" if self.qkv.bias is None else "")
        )

    def _dropout_p(self) -> float:
        return self.dropout if self.training else 0.0

    def _check_mask(self, x: Tensor, mask: Tensor | None) -> None:
        if mask is None:
            return
        if mask.shape != x.shape[:2]:
            raise ValueError(
                f"Attention mask of shape {tuple(mask.shape)} does not match input of shape {tuple(x.shape)}; "
                "expected (batch, length)"
            )
        if mask.dtype != torch.bool:
            raise ValueError(f"Attention mask must be a bool tensor (True = real position), got {mask.dtype}")

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """(batch, L, d_model) -> (batch, L, d_model); ``mask`` (batch, L) bool, True = real."""
        self._check_input(x)
        self._check_mask(x, mask)
        batch, length, _ = x.shape
        x = apply_mask(x, mask)
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.rope is not None:
            q, k = self.rope(q), self.rope(k)
        causal = not self.bidirectional
        if self.window is not None and 2 * self.window < length:  # up to two windows: plain attention
            out = sliding_window_attention(q, k, v, mask, causal, self.window, self._dropout_p())
        elif self.block_size is not None and self.block_size < length:
            out = blocked_attention(q, k, v, mask, causal, self.block_size, self._dropout_p())
        else:
            out = masked_attention(q, k, v, mask, causal, self._dropout_p())
        out = self.out_proj(out.transpose(1, 2).reshape(batch, length, self.attn_dim))
        return apply_mask(out, mask)

    def default_state(
        self, batch_size: int, device: torch.device | None = None, dtype: torch.dtype | None = None
    ) -> KVCache:
        """An empty cache: k, v of shape (batch_size, heads, 0, head_dim), position 0."""
        self._check_step()
        weight = self.qkv.weight
        empty = torch.zeros(
            batch_size, self.n_heads, 0, self.head_dim, device=device or weight.device, dtype=dtype or weight.dtype
        )
        limit = (
            self.block_size if self.block_size is not None else (2 * self.window if self.window is not None else None)
        )
        return KVCache(k=empty, v=empty.clone(), position=0, limit=limit)

    def step(self, x: Tensor, state: KVCache) -> tuple[Tensor, KVCache]:
        """One generation step: ``x`` (batch, d_model) -> (y (batch, d_model), updated cache)."""
        self._check_step()
        if x.dim() != 2 or x.shape[-1] != self.d_model:
            raise ValueError(f"Attention.step expects input of shape (batch, {self.d_model}), got {tuple(x.shape)}")
        if not isinstance(state, KVCache):
            raise TypeError(f"Attention.step expects a KVCache state (from default_state), got {type(state).__name__}")
        if state.k.shape[0] != x.shape[0] or state.k.shape[1:2] + state.k.shape[3:] != (self.n_heads, self.head_dim):
            raise ValueError(
                f"Attention.step cache of shape {tuple(state.k.shape)} does not fit input of shape {tuple(x.shape)}; "
                f"expected ({x.shape[0]}, {self.n_heads}, n, {self.head_dim})"
            )
        batch = x.shape[0]
        q, k, v = self.qkv(x).view(batch, 3, self.n_heads, self.head_dim).unbind(1)  # each (batch, heads, head_dim)
        if self.rope is not None:
            q, k = self.rope.rotate_at(q, state.position), self.rope.rotate_at(k, state.position)
        k_cache, v_cache = state.k, state.v
        if self.block_size is not None and state.position % self.block_size == 0:
            k_cache, v_cache = k_cache[:, :, :0], v_cache[:, :, :0]
        if self.window is not None and state.position % self.window == 0:
            k_cache, v_cache = k_cache[:, :, -self.window :], v_cache[:, :, -self.window :]
        k_cache = torch.cat((k_cache, k.unsqueeze(2)), dim=2)
        v_cache = torch.cat((v_cache, v.unsqueeze(2)), dim=2)
        # Every cached key is in the past: no mask needed.
        out = F.scaled_dot_product_attention(q.unsqueeze(2), k_cache, v_cache, dropout_p=self._dropout_p())
        y = self.out_proj(out.reshape(batch, self.attn_dim))
        return y, KVCache(k=k_cache, v=v_cache, position=state.position + 1, limit=state.limit)
