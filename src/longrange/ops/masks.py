"""Padding masks of left-aligned sequences (real positions first, padding at the end)."""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(lengths: Tensor, max_len: int) -> Tensor:
    """Boolean (B, max_len) mask, True at real positions of left-aligned sequences of ``lengths`` (B,)."""
    positions = torch.arange(max_len, device=lengths.device)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)
