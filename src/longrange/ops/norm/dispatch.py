"""Which implementation of the (gated) RMS norm runs: :func:`rms_norm`, the entry point.

``impl`` names an implementation (:data:`IMPLS`); ``"auto"`` runs ``"numba"`` on CPU tensors whose
rows have at least :data:`NUMBA_MIN_WIDTH` features when numba imports, else ``"torch"`` (the eager formula, :func:`~longrange.ops.norm.reference.rms_norm_ref`);
``None`` (the default) takes the process-wide default (:func:`set_default_impl`,
:func:`default_impl`; normally ``"auto"``). Every call reports the implementation it ran to
:mod:`longrange.ops.used` (op ``"rms_norm"``). The choice follows the convention of
:mod:`longrange.ops.dispatch` (:data:`DISPATCHER`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops.dataless import holds_data
from longrange.ops.dispatch import Dispatcher, Impl, floating_inputs, floating_inputs_misfit, numba_impl
from longrange.ops.norm import numba as numba_norm
from longrange.ops.norm.reference import rms_norm_ref

#: The narrowest rows ``"auto"`` normalises with the numba kernels on a CPU. Measured (one thread,
#: forward + backward against the formula): rows of 128 features 1.6-3.0x faster, of 32 1.5-2.0x,
#: of 16 (Mamba-3's norms of B and C) 0.8-1.0x, where the per-row work is too short to pay for the
#: call and the copies (docs/small-models.md, "Seventh round").
NUMBA_MIN_WIDTH = 32

#: Rows of :data:`NUMBA_NARROW_WIDTH` to :data:`NUMBA_MIN_WIDTH` features run the numba kernels in
#: tensors of at least :data:`NUMBA_NARROW_ELEMENTS` elements: at 16 features (the delta rules'
#: heads at MAD's width, 32 x 127 x 8 heads; the recall presets' at 64 x 256) 1.3-1.9x faster
#: forward + backward, gated or not, where smaller tensors of such rows (Mamba-3's norms of B and C,
#: the demo's 32 x 24) ran 0.8-1.0x and rows of 8 or 4 features 0.5-1.06x (docs/small-models.md,
#: "Tenth round").
NUMBA_NARROW_WIDTH = 16
NUMBA_NARROW_ELEMENTS = 1 << 18


def _auto(
    d: Dispatcher,
    device: torch.device,
    deterministic: bool,
    width: int | None = None,
    elements: int | None = None,
    **context,
) -> str:
    """``"numba"`` for floating CPU tensors whose rows have at least :data:`NUMBA_MIN_WIDTH`
    features, or :data:`NUMBA_NARROW_WIDTH` in a tensor of :data:`NUMBA_NARROW_ELEMENTS`, when
    numba imports; else ``"torch"``."""
    wide = width is None or width >= NUMBA_MIN_WIDTH
    large = width is not None and width >= NUMBA_NARROW_WIDTH and (elements or 0) >= NUMBA_NARROW_ELEMENTS
    return "numba" if (wide or large) and d.runs("numba", device, **context) else "torch"


def _describe_auto(device: torch.device) -> str:
    if device.type == "cpu" and numba_norm.numba_available():
        return (
            f"numba for rows of at least {NUMBA_MIN_WIDTH} features, or {NUMBA_NARROW_WIDTH} in tensors of "
            f"at least {NUMBA_NARROW_ELEMENTS:,} elements, else torch"
        )
    return "torch"


#: The implementations; both backwards are deterministic (numba sums its tasks' weight gradients
#: in a fixed order).
DISPATCHER = Dispatcher(
    "rms_norm",
    [
        numba_impl(numba_norm, fits=floating_inputs, misfit=floating_inputs_misfit, note="float32, float64"),
        Impl("torch"),
    ],
    auto=_auto,
    reference="torch",
    describe_auto=_describe_auto,
)

IMPLS = DISPATCHER.IMPLS
DETERMINISTIC_BACKWARD = DISPATCHER.deterministic_backward
set_default_impl = DISPATCHER.set_default_impl
default_impl = DISPATCHER.default_impl
available_impls = DISPATCHER.available_impls


def auto_impl(
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
    width: int | None = None,
    elements: int | None = None,
) -> str:
    """The implementation ``impl="auto"`` runs: ``"numba"`` for floating CPU tensors whose rows have
    ``width`` >= :data:`NUMBA_MIN_WIDTH` features (None: any), or >= :data:`NUMBA_NARROW_WIDTH` in a
    tensor of ``elements`` >= :data:`NUMBA_NARROW_ELEMENTS`, when numba imports, else ``"torch"``."""
    return DISPATCHER.auto_impl(device, None, dtype=dtype, width=width, elements=elements)


def _check(x: Tensor, weight: Tensor, gate: Tensor | None, eps: float) -> None:
    if not isinstance(x, Tensor) or x.dim() < 1 or not x.is_floating_point():
        raise ValueError(f"rms_norm: x must be a floating tensor (..., D), got {getattr(x, 'shape', type(x))}")
    D = x.shape[-1]
    heads = x.shape[-2] if x.dim() >= 2 else None
    if not isinstance(weight, Tensor) or not (
        weight.shape == (D,) or (weight.dim() == 2 and weight.shape == (heads, D))
    ):
        raise ValueError(
            f"rms_norm: weight must have shape (D,)=({D},) or (heads, D)=({heads}, {D}) for x of shape "
            f"{tuple(x.shape)}, got {tuple(getattr(weight, 'shape', ()))}"
        )
    if gate is not None and (not isinstance(gate, Tensor) or gate.shape != x.shape):
        raise ValueError(
            f"rms_norm: gate must have x's shape {tuple(x.shape)}, got {tuple(getattr(gate, 'shape', ()))}"
        )
    if not eps > 0:
        raise ValueError(f"rms_norm: eps must be positive, got {eps}")


def rms_norm(
    x: Tensor,
    weight: Tensor,
    gate: Tensor | None = None,
    gate_first: bool = False,
    eps: float = 1e-5,
    impl: str | None = None,
) -> Tensor:
    """RMS norm over the last dimension of ``x`` (..., D), scaled by ``weight`` (D,) or, one scale
    per head, (H, D) with H = ``x.shape[-2]``; with a ``gate`` of x's shape, ``norm(x) silu(gate)``
    (``gate_first=False``, FLA's gated norm) or ``norm(x silu(gate))`` (``gate_first=True``,
    Mamba-2's). ``eps`` is added to the mean square.

    ``impl``: None (the default, see :func:`set_default_impl`; normally ``"auto"``), ``"auto"``
    (see :func:`auto_impl`), ``"numba"`` (CPU; computed in float32, or float64 for float64 inputs),
    ``"torch"`` (the formula in PyTorch's elementwise operations).
    """
    impl = DISPATCHER.default if impl is None else impl
    DISPATCHER.check_impl(impl)
    _check(x, weight, gate, eps)
    impl = DISPATCHER.resolve(
        impl, x.device, dataless=not holds_data(x), dtype=x.dtype, width=x.shape[-1], elements=x.numel()
    )
    if impl == "numba":
        y = numba_norm.rms_norm_numba(x, weight, gate, gate_first, eps)
    else:
        y = rms_norm_ref(x, weight, gate, gate_first, eps)
    DISPATCHER.note(impl)
    return y
