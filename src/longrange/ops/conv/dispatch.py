"""Which implementation of the causal convolution runs: :func:`causal_conv1d`, the entry point.

``impl`` names an implementation (:data:`IMPLS`); ``"auto"`` is resolved by :func:`auto_impl`,
``None`` (the default) takes the process-wide default (:func:`set_default_impl`,
:func:`default_impl`; normally ``"auto"``). :func:`available_impls` lists those that can run on a
device here. Every call reports the implementation it ran to :mod:`longrange.ops.used` (op
``"causal_conv1d"``). The choice follows the convention of :mod:`longrange.ops.dispatch`
(:data:`DISPATCHER`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from longrange import _optional
from longrange.ops.conv import numba as numba_conv
from longrange.ops.conv.common import activate, check_conv_inputs
from longrange.ops.conv.reference import causal_conv1d_ref
from longrange.ops.dataless import holds_data
from longrange.ops.dispatch import Dispatcher, Impl, floating_inputs, floating_inputs_misfit, numba_impl

#: Kernel widths the ``causal-conv1d`` CUDA kernel supports.
CUDA_WIDTHS = (2, 3, 4)
_CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _cuda_runs(device: torch.device) -> bool:
    return _optional.causal_conv1d_cuda_fn is not None and device.type == "cuda"


def _cuda_reason(device: torch.device) -> str:
    if _optional.causal_conv1d_cuda_fn is None:
        reason = _optional.status()["causal_conv1d"].get("reason", "")
        return (
            "needs the causal-conv1d package with its compiled extension causal_conv1d_cuda"
            f"{f' ({reason})' if reason else ''} and CUDA tensors"
        )
    return f"cannot run on {device.type}: it needs CUDA tensors"


def _cuda_fits(width: int = CUDA_WIDTHS[-1], dtype: torch.dtype = torch.float32, **_) -> bool:
    return width in CUDA_WIDTHS and dtype in _CUDA_DTYPES


def _cuda_misfit(width: int = CUDA_WIDTHS[-1], dtype: torch.dtype = torch.float32, **_) -> str:
    return f"takes a width in {CUDA_WIDTHS} and float32/float16/bfloat16 inputs, got width {width} and {dtype}"


#: The implementations, in "auto"'s order of preference where they run and take the inputs.
#: Determinism of the backward: "cuda" (the causal-conv1d kernel) adds the weight and bias
#: gradients of the batch elements' thread blocks with atomic additions, whose order can change
#: from run to run; the others are deterministic (numba sums the batch elements' partial
#: gradients in a fixed order).
DISPATCHER = Dispatcher(
    "causal_conv1d",
    [
        Impl(
            "cuda",
            runs=_cuda_runs,
            reason=_cuda_reason,
            fits=_cuda_fits,
            misfit=_cuda_misfit,
            deterministic=False,
            nondeterministic="atomic additions of the weight and bias gradients",
            note="causal-conv1d; widths 2-4, not float64",
        ),
        numba_impl(numba_conv, fits=floating_inputs, misfit=floating_inputs_misfit, note="float32, float64"),
        Impl("torch"),
        Impl("ref", auto=False),
    ],
)

IMPLS = DISPATCHER.IMPLS
#: Whether each implementation's backward gives the same bits for the same inputs (see above).
DETERMINISTIC_BACKWARD = DISPATCHER.deterministic_backward
set_default_impl = DISPATCHER.set_default_impl
default_impl = DISPATCHER.default_impl


def auto_impl(
    device: torch.device | str, width: int = 4, dtype: torch.dtype = torch.float32, deterministic: bool | None = None
) -> str:
    """The implementation ``impl="auto"`` runs: ``"cuda"`` (the ``causal-conv1d`` kernel) for
    CUDA inputs when its compiled extension ``causal_conv1d_cuda`` imports (see
    :mod:`longrange._optional`), the width is 2 to 4 and the dtype not float64; ``"numba"``
    (:mod:`longrange.ops.conv.numba`) for floating CPU inputs when numba imports; else ``"torch"``.
    ``deterministic`` (None: ``torch.are_deterministic_algorithms_enabled()``): not ``"cuda"``."""
    return DISPATCHER.auto_impl(device, deterministic, width=width, dtype=dtype)


def available_impls(device: torch.device | str) -> tuple[str, ...]:
    """The implementations that can run on tensors of ``device`` here, slowest first (the reverse
    of ``DISPATCHER.available_impls(device)``, which lists them in ``"auto"``'s order of preference;
    ``"auto"`` excluded): ``"ref"`` and ``"torch"`` everywhere, ``"numba"`` on CPUs when numba
    imports, ``"cuda"`` on CUDA when causal-conv1d's compiled extension imports (widths 2 to 4, not
    float64)."""
    return tuple(reversed(DISPATCHER.available_impls(device)))


def _causal_conv1d_torch(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None) -> Tensor:
    """``impl="torch"``: PyTorch's grouped convolution with left padding."""
    w = weight.shape[1]
    return activate(F.conv1d(F.pad(x, (w - 1, 0)), weight[:, None, :], bias, groups=x.shape[1]), activation)


def causal_conv1d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    impl: str | None = None,
) -> Tensor:
    """Causal depthwise convolution (see the package docstring).

    ``impl``: None (the default, see :func:`set_default_impl`; normally ``"auto"``), ``"auto"``
    (see :func:`auto_impl`), ``"torch"`` (grouped ``conv1d`` with left padding), ``"ref"``,
    ``"numba"`` (CPU; computed in float32, or float64 for float64 inputs), ``"cuda"``.
    """
    impl = DISPATCHER.default if impl is None else impl
    DISPATCHER.check_impl(impl)
    check_conv_inputs(x, weight, bias, activation)
    impl = DISPATCHER.resolve(impl, x.device, dataless=not holds_data(x), width=weight.shape[1], dtype=x.dtype)
    if impl == "cuda":
        y = _optional.causal_conv1d_cuda_fn(x, weight, bias, activation=activation)
    elif impl == "ref":
        y = causal_conv1d_ref(x, weight, bias, activation)
    elif impl == "numba":
        y = numba_conv.causal_conv1d_numba(x, weight, bias, silu=activation in ("silu", "swish"))
    else:
        y = _causal_conv1d_torch(x, weight, bias, activation)
    DISPATCHER.note(impl)
    return y
