"""Which implementation of SwiGLU runs: :func:`swiglu`, the entry point.

``impl`` names an implementation (:data:`IMPLS`); ``"auto"`` runs ``"numba"`` on floating CPU
tensors when numba imports, else ``"torch"`` (the formula,
:func:`~longrange.ops.glu.reference.swiglu_ref`); ``None`` (the default) takes the process-wide
default (:func:`set_default_impl`, :func:`default_impl`; normally ``"auto"``). Every call reports
the implementation it ran to :mod:`longrange.ops.used` (op ``"swiglu"``). The choice follows the
convention of :mod:`longrange.ops.dispatch` (:data:`DISPATCHER`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops.dataless import holds_data
from longrange.ops.dispatch import Dispatcher, Impl, floating_inputs, floating_inputs_misfit, numba_impl
from longrange.ops.glu import numba as numba_glu
from longrange.ops.glu.reference import swiglu_ref

#: The implementations; both backwards are deterministic (elementwise, no sums).
DISPATCHER = Dispatcher(
    "swiglu",
    [
        numba_impl(numba_glu, fits=floating_inputs, misfit=floating_inputs_misfit, note="float32, float64"),
        Impl("torch"),
    ],
    reference="torch",
)

IMPLS = DISPATCHER.IMPLS
DETERMINISTIC_BACKWARD = DISPATCHER.deterministic_backward
set_default_impl = DISPATCHER.set_default_impl
default_impl = DISPATCHER.default_impl
available_impls = DISPATCHER.available_impls


def auto_impl(device: torch.device | str, dtype: torch.dtype = torch.float32) -> str:
    """The implementation ``impl="auto"`` runs: ``"numba"`` for floating CPU tensors when numba
    imports, else ``"torch"``."""
    return DISPATCHER.auto_impl(device, None, dtype=dtype)


def swiglu(h: Tensor, impl: str | None = None) -> Tensor:
    """``silu(gate) * up`` for ``h = [gate, up]`` (..., 2 H): the activation of the gated MLP on
    its fused projection, (..., H).

    ``impl``: None (the default, see :func:`set_default_impl`; normally ``"auto"``), ``"auto"``
    (see :func:`auto_impl`), ``"numba"`` (CPU; computed in float32, or float64 for float64 inputs),
    ``"torch"`` (the formula).
    """
    impl = DISPATCHER.default if impl is None else impl
    DISPATCHER.check_impl(impl)
    if not isinstance(h, Tensor) or h.dim() < 1 or not h.is_floating_point() or h.shape[-1] % 2:
        raise ValueError(
            "swiglu: h must be a floating tensor (..., 2 H) whose last dimension holds the gate and up halves, "
            f"got {getattr(h, 'dtype', type(h))} of shape {tuple(getattr(h, 'shape', ()))}"
        )
    impl = DISPATCHER.resolve(impl, h.device, dataless=not holds_data(h), dtype=h.dtype)
    y = numba_glu.swiglu_numba(h) if impl == "numba" else swiglu_ref(h)
    DISPATCHER.note(impl)
    return y
