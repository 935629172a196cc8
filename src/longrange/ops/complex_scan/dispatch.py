"""Which implementation of the complex diagonal scan runs: :func:`complex_diag_scan`, the entry point.

``impl`` names an implementation (:data:`IMPLS`): ``"chunk"`` (the states inside chunks by
matrix products with the chunk's matrix of powers), ``"loop"`` (by stepping through the chunks'
positions together), ``"ref"`` (the loop over time; never picked by ``"auto"``). ``"auto"`` is
resolved by :func:`auto_impl`: ``"loop"`` on CPU tensors, ``"chunk"`` elsewhere. ``None`` takes the
process-wide default (:func:`set_default_impl`, :func:`default_impl`; normally ``"auto"``).
:func:`available_impls` lists those that can run on a device here (all three, everywhere). Every
call reports the implementation it ran to :mod:`longrange.ops.used` (op ``"complex_diag_scan"``).
The choice follows the convention of :mod:`longrange.ops.dispatch` (:data:`DISPATCHER`), with the
scan's own rule for ``"auto"``.

Determinism (:data:`DETERMINISTIC_BACKWARD`): every implementation is PyTorch operations without
atomic accumulation, so deterministic wherever PyTorch's own operations are; ``"auto"`` picks the
same under ``torch.use_deterministic_algorithms(True)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops.complex_scan.chunked import chunked_scan
from longrange.ops.complex_scan.common import check_chunk_size, check_inputs
from longrange.ops.complex_scan.reference import complex_diag_scan_ref
from longrange.ops.dispatch import Dispatcher, Impl


def _auto(d: Dispatcher, device: torch.device, deterministic: bool, **context) -> str:
    """The scan's rule for ``"auto"`` (see :func:`auto_impl`); every implementation is deterministic."""
    return "loop" if device.type == "cpu" else "chunk"


#: The implementations, ``"auto"``'s choice on accelerators first.
DISPATCHER = Dispatcher(
    "complex_diag_scan",
    [
        Impl("chunk", note="matrix products within chunks"),
        Impl("loop", note="steps within chunks"),
        Impl("ref", auto=False, note="loop over time"),
    ],
    auto=_auto,
)

IMPLS = DISPATCHER.IMPLS
#: Whether each implementation's backward gives the same bits for the same inputs: all do.
DETERMINISTIC_BACKWARD = DISPATCHER.deterministic_backward
set_default_impl = DISPATCHER.set_default_impl
default_impl = DISPATCHER.default_impl
available_impls = DISPATCHER.available_impls


def auto_impl(device: torch.device | str, deterministic: bool | None = None) -> str:
    """The implementation ``impl="auto"`` runs on tensors of ``device``: ``"loop"`` on the CPU
    (L·N multiply-adds in T sequential steps of small operations), ``"chunk"`` elsewhere (T times
    the work, in large batched products that keep an accelerator busy). ``deterministic``: the
    same choice (every implementation's backward is deterministic)."""
    return DISPATCHER.auto_impl(device, deterministic)


def check_impl(impl: str | None, where: str | None = None) -> None:
    """A ConfigError (``where`` given: a layer's option, e.g. ``"LRU"``) or ValueError naming the
    scan and its implementations unless ``impl`` is None or one of :data:`IMPLS`."""
    DISPATCHER.check_option(impl, where)


def complex_diag_scan(
    log_decay: Tensor,
    inputs: Tensor,
    h0: Tensor | None = None,
    reverse: bool = False,
    chunk_size: int | None = None,
    impl: str | None = None,
) -> Tensor:
    """All states of ``x_t = exp(log_decay) * x_{t-1} + inputs_t`` (see the package docstring).

    ``log_decay``: (N,) complex, log λ (time-invariant); ``inputs``: (..., L, N) complex; ``h0``:
    (..., N) or None for a zero initial state; ``reverse``: run from the last position back.
    Returns the states (..., L, N). ``impl``: None (the default, see :func:`set_default_impl`;
    normally ``"auto"``), ``"auto"`` (see :func:`auto_impl`), ``"chunk"``, ``"loop"`` or
    ``"ref"``; ``chunk_size`` (>= 2) for ``"chunk"`` and ``"loop"``: None for the
    implementation's default (:data:`~longrange.ops.complex_scan.chunked.DEFAULT_CHUNK_SIZE`;
    ``"ref"`` ignores it). Every setting gives the same result up to rounding. Differentiable in
    all three tensors.
    """
    impl = DISPATCHER.default if impl is None else impl
    DISPATCHER.check_impl(impl)
    check_inputs(log_decay, inputs, h0, "complex_diag_scan")
    check_chunk_size(chunk_size, "complex_diag_scan")
    impl = DISPATCHER.resolve(impl, inputs.device, dtype=inputs.dtype)
    DISPATCHER.note(impl)
    if impl == "ref":
        return complex_diag_scan_ref(log_decay.to(inputs.dtype), inputs, h0, reverse)
    return chunked_scan(impl, log_decay, inputs, h0, reverse, chunk_size, where="complex_diag_scan")
