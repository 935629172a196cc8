"""Output heads and the pooling that respects padding.

Heads are registered by kind (:data:`longrange.models.registry.HEADS`) and built as
``cls(d_model, n_out, **options)``, the model's ``pooling`` going to the heads that take it. A
head reads the backbone's features of one sequence, ``head(h, mask, cls_index)``, or, with
``two_sequences = True``, of two: ``head(h1, mask1, h2, mask2, cls1, cls2)``. A head with
``per_position = True`` gives an output per position (it can generate step by step, and needs no
CLS vector).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.models.registry import register_head


def pool(h: Tensor, mask: Tensor | None, pooling: str, cls_index: Tensor | None = None) -> Tensor:
    """Pool features h (batch, length, d) over real positions -> (batch, d).

    "mean": the mean over real positions; "last": the last real position; "cls": the position
    ``cls_index`` (batch,) where the model placed its CLS vector.
    """
    if pooling == "mean":
        if mask is None:
            return h.mean(1)
        w = mask.to(h.dtype).unsqueeze(-1)
        return (h * w).sum(1) / w.sum(1).clamp_min(1.0)
    if pooling == "last":
        if mask is None:
            return h[:, -1]
        index = mask.long().sum(1).clamp_min(1) - 1
        return h[torch.arange(h.shape[0], device=h.device), index]
    if pooling == "cls":
        if cls_index is None:
            raise ValueError("cls pooling needs the CLS position")
        return h[torch.arange(h.shape[0], device=h.device), cls_index]
    raise ConfigError(f"unknown pooling {pooling!r}; expected mean, last or cls")


@register_head("classify")
@register_head("regress")
class PooledHead(nn.Module):
    """Pool, then a linear map to ``n_out`` (class logits, or regression targets)."""

    def __init__(self, d_model: int, n_out: int, pooling: str = "mean"):
        super().__init__()
        self.pooling = pooling
        self.linear = nn.Linear(d_model, n_out)

    def forward(self, h: Tensor, mask: Tensor | None, cls_index: Tensor | None = None) -> Tensor:
        return self.linear(pool(h, mask, self.pooling, cls_index))


@register_head("retrieval")
class RetrievalHead(nn.Module):
    """Two-sequence classification on pooled features a, b: MLP([a, b, a·b, a−b]) (the LRA two-tower head)."""

    two_sequences = True

    def __init__(self, d_model: int, n_classes: int, pooling: str = "mean", hidden: int | None = None):
        super().__init__()
        self.pooling = pooling
        hidden = hidden or d_model
        self.mlp = nn.Sequential(nn.Linear(4 * d_model, hidden), nn.GELU(), nn.Linear(hidden, n_classes))

    def forward(
        self,
        h1: Tensor,
        mask1: Tensor | None,
        h2: Tensor,
        mask2: Tensor | None,
        cls1: Tensor | None = None,
        cls2: Tensor | None = None,
    ) -> Tensor:
        a = pool(h1, mask1, self.pooling, cls1)
        b = pool(h2, mask2, self.pooling, cls2)
        return self.mlp(torch.cat([a, b, a * b, a - b], dim=-1))


@register_head("tokens")
class TokenHead(nn.Module):
    """A per-position linear map: next-token/masked-token logits, intensity classes or values."""

    per_position = True

    def __init__(self, d_model: int, n_out: int):
        super().__init__()
        self.linear = nn.Linear(d_model, n_out)

    def forward(self, h: Tensor, mask: Tensor | None = None, cls_index: Tensor | None = None) -> Tensor:
        return self.linear(h)
