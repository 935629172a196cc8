"""The SwiGLU activation ``silu(gate) * up`` of the gated MLP, on the concatenated projection
``h = [gate, up]`` (the output of one ``Linear(d, 2 hidden)``).

- :mod:`.reference`: ``"torch"``, :func:`swiglu_ref`, the formula in PyTorch's operations (also
  the reference of the checks);
- :mod:`.numba`: ``"numba"``, one pass over ``h`` forward and one backward for CPUs, the backward
  writing the gradient of ``h`` whole (kernels in :mod:`._numba_kernels`);
- :mod:`.dispatch`: :func:`swiglu`, which runs the implementation named by ``impl``
  (:data:`IMPLS`; None: the default, :func:`set_default_impl`; ``"auto"``: see :func:`auto_impl`)
  and reports it to :mod:`longrange.ops.used` (op ``"swiglu"``).
"""

from longrange.ops.glu.dispatch import (
    DETERMINISTIC_BACKWARD,
    DISPATCHER,
    IMPLS,
    auto_impl,
    available_impls,
    default_impl,
    set_default_impl,
    swiglu,
)
from longrange.ops.glu.reference import swiglu_ref

__all__ = [
    "DETERMINISTIC_BACKWARD",
    "DISPATCHER",
    "IMPLS",
    "auto_impl",
    "available_impls",
    "default_impl",
    "set_default_impl",
    "swiglu",
    "swiglu_ref",
]
