"""The RMS norm over the last dimension, optionally gated by SiLU before or after it: the output
norms of the matrix-state layers (Mamba-2's ``RMSNormGated``, FLA's ``FusedRMSNormGated``,
per head or shared).

- :mod:`.reference`: ``"torch"``, :func:`rms_norm_ref`, the formula in PyTorch's elementwise
  operations (also the reference of the checks);
- :mod:`.numba`: ``"numba"``, one pass over each row forward and backward for CPUs (kernels in
  :mod:`._numba_kernels`);
- :mod:`.dispatch`: :func:`rms_norm`, which runs the implementation named by ``impl``
  (:data:`IMPLS`; None: the default, :func:`set_default_impl`; ``"auto"``: see :func:`auto_impl`)
  and reports it to :mod:`longrange.ops.used` (op ``"rms_norm"``).
"""

from longrange.ops.norm.dispatch import (
    DETERMINISTIC_BACKWARD,
    DISPATCHER,
    IMPLS,
    auto_impl,
    available_impls,
    default_impl,
    rms_norm,
    set_default_impl,
)
from longrange.ops.norm.reference import rms_norm_ref

__all__ = [
    "DETERMINISTIC_BACKWARD",
    "DISPATCHER",
    "IMPLS",
    "auto_impl",
    "available_impls",
    "default_impl",
    "rms_norm",
    "rms_norm_ref",
    "set_default_impl",
]
