"""``"torch"``: SwiGLU as PyTorch's operations, the formula itself (:func:`swiglu_ref`)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def swiglu_ref(h: Tensor) -> Tensor:
    """``silu(gate) * up`` for ``h = [gate, up]`` (..., 2 H), split in halves on the last dimension."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up
