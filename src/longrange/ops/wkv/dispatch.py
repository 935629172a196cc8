"""Which implementation of RWKV-4's WKV runs: :func:`wkv`, the entry point.

``impl`` names an implementation (:data:`IMPLS`): ``"numba"`` (compiled loops on CPU tensors, from
an empty state, the outputs alone), ``"chunked"`` (a chunked scan in PyTorch: any device, an
initial state and the final one), ``"ref"`` (the loop over time; never picked by ``"auto"``).
``"auto"`` runs ``"numba"`` on CPU tensors when numba imports and the call neither starts from a
state nor asks for the final one, else ``"chunked"``; ``None`` takes the process-wide default
(:func:`set_default_impl`, :func:`default_impl`; normally ``"auto"``). Every call reports the
implementation it ran to :mod:`longrange.ops.used` (op ``"wkv"``). The choice follows the
convention of :mod:`longrange.ops.dispatch` (:data:`DISPATCHER`). Every backward is deterministic.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops.dataless import holds_data
from longrange.ops.dispatch import Dispatcher, Impl, numba_impl
from longrange.ops.wkv import numba as numba_wkv
from longrange.ops.wkv.chunked import wkv_chunked
from longrange.ops.wkv.reference import check_inputs, wkv_ref


def _stateless(has_state: bool = False, **_) -> bool:
    return not has_state


def _stateless_misfit(has_state: bool = False, **_) -> str:
    return "starts from an empty state and gives the outputs alone: an initial or final state is the chunked form's"


#: The implementations, ``"auto"``'s order of preference.
DISPATCHER = Dispatcher(
    "wkv",
    [
        numba_impl(numba_wkv, fits=_stateless, misfit=_stateless_misfit, note="float32, float64; no states"),
        Impl("chunked", note="a chunked scan in PyTorch"),
        Impl("ref", auto=False, note="loop over time"),
    ],
    reference="ref",
)

IMPLS = DISPATCHER.IMPLS
DETERMINISTIC_BACKWARD = DISPATCHER.deterministic_backward
set_default_impl = DISPATCHER.set_default_impl
default_impl = DISPATCHER.default_impl
available_impls = DISPATCHER.available_impls


def auto_impl(device: torch.device | str, has_state: bool = False) -> str:
    """The implementation ``impl="auto"`` runs: ``"numba"`` on CPU tensors when numba imports and
    the call uses no state (``has_state``: an initial state given or the final one asked for),
    else ``"chunked"``."""
    return DISPATCHER.auto_impl(device, None, has_state=has_state)


def wkv(
    w: Tensor,
    u: Tensor,
    k: Tensor,
    v: Tensor,
    state: dict[str, Tensor] | None = None,
    mask: Tensor | None = None,
    chunk_size: int | None = None,
    return_state: bool = False,
    impl: str | None = None,
) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
    """RWKV-4's WKV (:mod:`longrange.ops.wkv`): ``k``, ``v`` (batch, length, channels), ``w`` (the
    decay rates, > 0) and ``u`` (channels,) -> the outputs (batch, length, channels), and with
    ``return_state`` the final state (a dict of num, den, scale). ``state``: the state to start from
    (None: empty). A position where ``mask`` (batch, length) is False adds nothing to the sums.
    ``chunk_size``: the chunked form's (None: the scan's default). ``impl``: see the module
    docstring. Differentiable in every input, the state included."""
    impl = DISPATCHER.default if impl is None else impl
    DISPATCHER.check_impl(impl)
    check_inputs(w, u, k, v, state, mask, "wkv")
    has_state = state is not None or bool(return_state)
    impl = DISPATCHER.resolve(impl, k.device, dataless=not holds_data(k), has_state=has_state)
    DISPATCHER.note(impl)
    if impl == "numba":
        return numba_wkv.wkv_numba(w, u, k, v, mask)
    y, final = wkv_ref(w, u, k, v, state, mask) if impl == "ref" else wkv_chunked(w, u, k, v, state, mask, chunk_size)
    return (y, final) if return_state else y


__all__ = [
    "DETERMINISTIC_BACKWARD",
    "DISPATCHER",
    "IMPLS",
    "auto_impl",
    "available_impls",
    "default_impl",
    "set_default_impl",
    "wkv",
]
