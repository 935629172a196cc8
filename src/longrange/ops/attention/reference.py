"""The dense, written-out reference of softmax attention, which every implementation of
:mod:`longrange.ops.attention` is tested against: O(L²) memory, obviously correct."""

from __future__ import annotations

import torch
from torch import Tensor


def admissible_ref(length: int, key_mask: Tensor | None, causal: bool, block_size: int | None, device=None) -> Tensor:
    """Dense (N or 1, 1, L, L) bool matrix: may query i attend to key j. Reference only: O(L²).

    ``key_mask`` (N, L) marks real positions; a padded position neither attends nor is attended to.
    """
    pos = torch.arange(length, device=device)
    allowed = torch.ones(length, length, dtype=torch.bool, device=device)
    if causal:
        allowed &= pos[:, None] >= pos[None, :]
    if block_size is not None:
        allowed &= (pos[:, None] // block_size) == (pos[None, :] // block_size)
    allowed = allowed[None, None]
    if key_mask is None:
        return allowed
    return allowed & key_mask[:, None, None, :] & key_mask[:, None, :, None]


def attention_ref(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
    """softmax(q kᵀ / √d, restricted to ``allowed``) v, written out; rows with no admissible key give 0.

    The slow, obviously-correct reference for :func:`masked_attention` and :func:`blocked_attention`.
    q, k, v: (N, heads, L, head_dim); ``allowed`` broadcasts to (N, heads, L, L).
    """
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    allowed = allowed.expand_as(scores)
    has_key = allowed.any(-1, keepdim=True)
    # Empty rows are given every key (finite softmax, no NaN in the backward pass), then zeroed.
    probs = torch.softmax(scores.masked_fill(~(allowed | ~has_key), float("-inf")), dim=-1)
    return (probs * has_key) @ v
