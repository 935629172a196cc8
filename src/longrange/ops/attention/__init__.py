"""Softmax self-attention over (batch, heads, L, head_dim): the kernels of the attention layers.

- :mod:`.masked`: :func:`masked_attention` (full, causal or not, padding-aware) and
  :func:`blocked_attention` (within consecutive blocks), the layers' entry points;
- :mod:`.dispatch`: :func:`attention`, attention without a mask by the implementation named by
  ``impl`` (:data:`IMPLS`: PyTorch's ``scaled_dot_product_attention``, ``"sdpa"``, or the numba
  kernels for narrow heads on CPUs, ``"numba"``; None: the default, :func:`set_default_impl`;
  ``"auto"``: see :func:`auto_impl`), reported to :mod:`longrange.ops.used` (op ``"attention"``);
- :mod:`.numba`: the numba kernels (in :mod:`._numba_kernels`), forward and backward;
- :mod:`.reference`: :func:`attention_ref` with :func:`admissible_ref`, the dense written-out
  reference every implementation is tested against.
"""

from longrange.ops.attention.dispatch import (
    DETERMINISTIC_BACKWARD,
    DISPATCHER,
    IMPLS,
    NUMBA_MAX_LENGTH,
    NUMBA_MAX_WIDTH,
    NUMBA_MAX_WIDTH_BIDIRECTIONAL,
    attention,
    auto_impl,
    available_impls,
    default_impl,
    set_default_impl,
)
from longrange.ops.attention.masked import blocked_attention, masked_attention
from longrange.ops.attention.reference import admissible_ref, attention_ref

__all__ = [
    "DETERMINISTIC_BACKWARD",
    "DISPATCHER",
    "IMPLS",
    "NUMBA_MAX_LENGTH",
    "NUMBA_MAX_WIDTH",
    "NUMBA_MAX_WIDTH_BIDIRECTIONAL",
    "admissible_ref",
    "attention",
    "attention_ref",
    "auto_impl",
    "available_impls",
    "blocked_attention",
    "default_impl",
    "masked_attention",
    "set_default_impl",
]
