"""Which implementation of softmax attention without a mask runs: :func:`attention`, the entry point
(:func:`~longrange.ops.attention.masked.masked_attention` calls it wherever no mask is needed).

``impl`` names an implementation (:data:`IMPLS`): ``"sdpa"``, PyTorch's
``scaled_dot_product_attention`` (its fused kernels), ``"numba"`` (CPU, no dropout:
:mod:`longrange.ops.attention.numba`) or ``"ref"``, the written-out softmax (the reference,
O(L²) memory; never picked by ``"auto"``). ``"auto"`` runs ``"numba"`` on floating CPU tensors of at
most :data:`NUMBA_MAX_LENGTH` positions whose heads are at most :data:`NUMBA_MAX_WIDTH` features
wide (causal attention) or :data:`NUMBA_MAX_WIDTH_BIDIRECTIONAL` (not causal), without dropout,
when numba imports, else ``"sdpa"``; ``None`` (the default) takes the process-wide default
(:func:`set_default_impl`, :func:`default_impl`; normally ``"auto"``). Every call reports the
implementation it ran to :mod:`longrange.ops.used` (op ``"attention"``). The choice follows the
convention of :mod:`longrange.ops.dispatch` (:data:`DISPATCHER`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from longrange.ops.attention import numba as numba_attention
from longrange.ops.attention.reference import admissible_ref, attention_ref
from longrange.ops.dataless import holds_data
from longrange.ops.dispatch import Dispatcher, Impl, numba_impl

#: Where ``"auto"`` attends with the numba kernels on a CPU: sequences of at most
#: :data:`NUMBA_MAX_LENGTH` positions, heads of at most :data:`NUMBA_MAX_WIDTH` features (causal) or
#: :data:`NUMBA_MAX_WIDTH_BIDIRECTIONAL` (not causal). Measured (one thread, forward + backward
#: against PyTorch's fused kernel, `benchmarks/attention_cpu.py`): heads of 4 1.3-2.0x faster at
#: 24-255 positions; heads of 8 1.2-1.5x causal at 127-256 positions, 1.1x bidirectional at 127 and
#: 0.75x at 256; at 1,024 positions, and for heads of 16 or more, slower (0.3-0.85x)
#: (docs/small-models.md, "Fourteenth round").
NUMBA_MAX_LENGTH = 256
NUMBA_MAX_WIDTH = 8
NUMBA_MAX_WIDTH_BIDIRECTIONAL = 4


def _fits_numba(dtype: torch.dtype = torch.float32, dropout_p: float = 0.0, one_shape: bool = True, **_) -> bool:
    return dtype.is_floating_point and not dropout_p and one_shape


def _misfit_numba(dtype: torch.dtype = torch.float32, dropout_p: float = 0.0, one_shape: bool = True, **_) -> str:
    if not dtype.is_floating_point:
        return f"takes floating CPU tensors, got {dtype}"
    if not one_shape:
        return "takes q, k and v of one shape (values as wide as keys)"
    return f"has no dropout, got dropout_p={dropout_p}"


def _fits_ref(dropout_p: float = 0.0, **_) -> bool:
    return not dropout_p


def _misfit_ref(dropout_p: float = 0.0, **_) -> str:
    return f"has no dropout, got dropout_p={dropout_p}"


def _auto(
    d: Dispatcher,
    device: torch.device,
    deterministic: bool,
    width: int | None = None,
    length: int | None = None,
    causal: bool = True,
    **context,
) -> str:
    """``"numba"`` where the measured rule above says so and it runs and fits, else ``"sdpa"``."""
    widest = NUMBA_MAX_WIDTH if causal else NUMBA_MAX_WIDTH_BIDIRECTIONAL
    short = length is not None and length <= NUMBA_MAX_LENGTH
    narrow = width is not None and width <= widest
    return "numba" if short and narrow and d.runs("numba", device, **context) else "sdpa"


def _describe_auto(device: torch.device) -> str:
    if device.type == "cpu" and numba_attention.numba_available():
        return (
            f"numba up to {NUMBA_MAX_LENGTH} positions for heads of at most {NUMBA_MAX_WIDTH} features (causal) "
            f"or {NUMBA_MAX_WIDTH_BIDIRECTIONAL} (bidirectional), without dropout; else sdpa"
        )
    return "sdpa"


#: The implementations; both backwards are deterministic on a CPU (the numba kernels sum each
#: (batch, head) pair's gradients in order; under deterministic algorithms PyTorch's attention picks
#: its own deterministic kernels or says it has none).
DISPATCHER = Dispatcher(
    "attention",
    [
        numba_impl(numba_attention, fits=_fits_numba, misfit=_misfit_numba, note="float32, float64; no dropout"),
        Impl("sdpa", note="PyTorch's scaled_dot_product_attention"),
        Impl("ref", auto=False, fits=_fits_ref, misfit=_misfit_ref, note="the written-out softmax, O(L^2) memory"),
    ],
    auto=_auto,
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
    length: int | None = None,
    causal: bool = True,
    dropout_p: float = 0.0,
) -> str:
    """The implementation ``impl="auto"`` runs for ``length`` positions and heads of ``width``
    features (see the module docstring)."""
    return DISPATCHER.auto_impl(
        device, None, dtype=dtype, width=width, length=length, causal=causal, dropout_p=dropout_p
    )


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, dropout_p: float = 0.0, impl: str | None = None) -> Tensor:
    """``softmax(q kᵀ / √D) v`` of q, k, v (N, heads, L, D; values of another width for ``"sdpa"``
    and ``"ref"``), causal (a query sees itself and the keys before it) or not, with ``dropout_p`` on
    the probabilities (``"sdpa"`` only). No mask: :func:`~longrange.ops.attention.masked.masked_attention`
    takes padding.

    ``impl``: None (the default, see :func:`set_default_impl`; normally ``"auto"``), ``"auto"``
    (see the module docstring), ``"numba"`` (CPU, no dropout; computed in float32, or float64 for
    float64 inputs), ``"sdpa"``, ``"ref"`` (the written-out softmax, no dropout).
    """
    impl = DISPATCHER.default if impl is None else impl
    DISPATCHER.check_impl(impl)
    if not all(isinstance(t, Tensor) and t.dim() == 4 for t in (q, k, v)):
        shapes = [tuple(getattr(t, "shape", ())) for t in (q, k, v)]
        raise ValueError(f"attention: q, k and v must be tensors (N, heads, L, D), got shapes {shapes}")
    impl = DISPATCHER.resolve(
        impl,
        q.device,
        dataless=not holds_data(q),
        dtype=q.dtype,
        width=q.shape[-1],
        length=q.shape[-2],
        causal=causal,
        dropout_p=dropout_p,
        one_shape=q.shape == k.shape == v.shape,
    )
    if impl == "numba":
        out = numba_attention.attention_numba(q, k, v, causal)
    elif impl == "ref":
        out = attention_ref(q, k, v, admissible_ref(q.shape[-2], None, causal, None, device=q.device))
    else:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
    DISPATCHER.note(impl)
    return out
