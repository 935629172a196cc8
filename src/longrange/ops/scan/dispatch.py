"""Which implementation of the selective scan runs: :func:`selective_scan`, the entry point.

``impl`` names an implementation (:data:`IMPLS`); ``"auto"`` is resolved by :func:`auto_impl`,
``None`` takes the process-wide default (:func:`set_default_impl`, :func:`default_impl`).
:func:`available_impls` lists those that can run on a device here. Every call reports the
implementation it ran to :mod:`longrange.ops.used` (op ``"selective_scan"``). The choice follows
the convention of :mod:`longrange.ops.dispatch` (:data:`DISPATCHER`), with the scan's own rule
for ``"auto"``.

Determinism (:data:`DETERMINISTIC_BACKWARD`): with ``torch.use_deterministic_algorithms(True)``,
``"auto"`` never picks an implementation whose backward is non-deterministic, and asking for one
by name raises a RuntimeError naming the deterministic ones (a warning instead in PyTorch's
``warn_only`` mode).
"""

from __future__ import annotations

import torch
from torch import Tensor

import longrange.ops.scan.numba as numba_scan
import longrange.ops.scan.triton as triton_scan
from longrange import _optional
from longrange.ops import used
from longrange.ops.dataless import holds_data
from longrange.ops.dispatch import Dispatcher, Impl, numba_impl, triton_impl
from longrange.ops.scan.chunked import selective_scan_chunked
from longrange.ops.scan.common import check_shapes, compute_dtype
from longrange.ops.scan.reference import selective_scan_ref


def _triton_scan(dataless: bool = False) -> tuple[object | None, str | None]:
    """(``selective_scan_triton``, None), or (None, why triton does not import); on tensors without
    data (meta, fake: :mod:`longrange.ops.dataless`) the operator's fake implementation runs and
    triton is not needed."""
    if dataless:
        return triton_scan.selective_scan_triton, None
    reason = triton_scan.unavailable_reason()
    return (None, reason) if reason else (triton_scan.selective_scan_triton, None)


def _cuda_runs(device: torch.device) -> bool:
    return _optional.selective_scan_cuda_fn is not None and device.type == "cuda"


def _cuda_reason(device: torch.device) -> str:
    if _optional.selective_scan_cuda_fn is None:
        reason = _optional.status()["mamba_ssm"].get("reason", "")
        return (
            "needs mamba_ssm with its compiled extension selective_scan_cuda"
            f"{f' ({reason})' if reason else ''} and CUDA tensors"
        )
    return f"cannot run on {device.type}: it needs CUDA tensors"


def _cuda_fits(has_initial_state: bool = False, dtype: torch.dtype = torch.float32, **_) -> bool:
    return not has_initial_state and dtype != torch.float64


def _cuda_misfit(has_initial_state: bool = False, dtype: torch.dtype = torch.float32, **_) -> str:
    got = "an initial_state" if has_initial_state else f"{dtype} inputs"
    return f"needs float32/float16/bfloat16 inputs and no initial_state, got {got}"


def _auto(
    d: Dispatcher,
    device: torch.device,
    deterministic: bool,
    has_initial_state: bool = False,
    dtype: torch.dtype = torch.float32,
) -> str:
    """The selective scan's rule for ``"auto"`` (see :func:`auto_impl`)."""
    if device.type == "meta":
        return "chunked" if deterministic else "triton"
    if device.type == "cuda":
        if deterministic:
            return "chunked"
        if d.runs("cuda", device, has_initial_state=has_initial_state, dtype=dtype):
            return "cuda"
        return "triton" if _triton_scan()[0] is not None else "chunked"
    if device.type == "cpu" and numba_scan.numba_available():
        return "numba"
    return "chunked"


#: The selective scan's implementations, in "auto"'s order of preference where they run.
#: Determinism of the backward (same bits for the same inputs, at equal thread counts on CPUs):
#: "ref" and "chunked" are PyTorch operations without atomic accumulation; "numba" writes every
#: partial sum from one task and sums them in a fixed order; "triton" and "cuda" (mamba-ssm) add
#: the gradients of a time-varying B and C from several programs (thread blocks) with atomic
#: additions, whose order, and so the last bits, can change from run to run on a GPU. The forward
#: passes of all five are deterministic.
_ATOMIC = "atomic additions of the gradients of B and C"
DISPATCHER = Dispatcher(
    "selective_scan",
    [
        Impl(
            "cuda",
            runs=_cuda_runs,
            reason=_cuda_reason,
            fits=_cuda_fits,
            misfit=_cuda_misfit,
            deterministic=False,
            nondeterministic=_ATOMIC,
            note="mamba_ssm; no initial state, not float64",
        ),
        triton_impl(
            lambda device: triton_scan.triton_available(device),
            lambda: triton_scan.unavailable_reason(),
            deterministic=False,
            nondeterministic=_ATOMIC,
        ),
        numba_impl(numba_scan),
        Impl("chunked"),
        Impl("ref", auto=False),
    ],
    auto=_auto,
)

IMPLS = DISPATCHER.IMPLS
#: Whether each implementation's backward gives the same bits for the same inputs (see above).
DETERMINISTIC_BACKWARD = DISPATCHER.deterministic_backward
set_default_impl = DISPATCHER.set_default_impl
default_impl = DISPATCHER.default_impl


def __getattr__(name: str):
    if name == "_default_impl":  # the former module-level default
        return DISPATCHER.default
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def available_impls(device: torch.device | str) -> tuple[str, ...]:
    """The implementations that can run on tensors of ``device`` in this process, slowest first
    (the reverse of ``DISPATCHER.available_impls(device)``, which lists them in ``"auto"``'s order
    of preference; ``"auto"`` excluded): ``"ref"`` and ``"chunked"`` everywhere, ``"numba"`` on CPU when numba
    imports, ``"triton"`` where :func:`longrange.ops.scan.triton.triton_available` (CUDA, or CPU
    under ``TRITON_INTERPRET=1``, and the meta device), ``"cuda"`` on CUDA when mamba-ssm's compiled
    kernel imports."""
    return tuple(reversed(DISPATCHER.available_impls(device)))


def auto_impl(
    device: torch.device | str,
    has_initial_state: bool = False,
    dtype: torch.dtype = torch.float32,
    deterministic: bool | None = None,
) -> str:
    """The implementation ``impl="auto"`` runs for inputs on ``device`` (with or without an
    initial state, computing in ``dtype``): on CUDA ``"cuda"`` (mamba_ssm's kernel, when its
    compiled extension imports; no initial state, not float64), else ``"triton"`` when triton
    imports, else ``"chunked"``; on CPU ``"numba"`` when numba imports, else ``"chunked"``; on
    the ``meta`` device (dry runs) ``"triton"``, the fused kernel a GPU runs, by its operator's
    fake implementation; elsewhere ``"chunked"``.

    ``deterministic`` (None: ``torch.are_deterministic_algorithms_enabled()``): pick only among
    implementations with a deterministic backward (:data:`DETERMINISTIC_BACKWARD`), so on CUDA
    ``"chunked"``.
    """
    return DISPATCHER.auto_impl(device, deterministic, has_initial_state=has_initial_state, dtype=dtype)


def _ran(impl: str, out):
    used.note("selective_scan", impl)
    return out


def selective_scan(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    initial_state: Tensor | None = None,
    impl: str | None = None,
    chunk_size: int | None = None,
    chunk_method: str | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """The selective scan, a drop-in for ``mamba_ssm``'s ``selective_scan_fn`` (see the package docstring).

    Extra keyword arguments: ``initial_state`` (b, d, n) starts the recurrence from a given state
    (so a long sequence can be scanned piece by piece, passing the returned last state on);
    ``impl``, one of :data:`IMPLS` (None: the module default, see :func:`set_default_impl`;
    ``"auto"``: see :func:`auto_impl`); ``chunk_size`` and ``chunk_method`` for the chunked
    implementation (see :func:`~longrange.ops.scan.chunked.linear_scan`; the others ignore them).
    """
    impl = DISPATCHER.default if impl is None else impl
    DISPATCHER.check_impl(impl)
    check_shapes(u, delta, A, B, C, D, z, delta_bias, initial_state)
    args = (u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
    dtype = compute_dtype(u, delta, A, B, C, D, z, delta_bias, initial_state)
    impl = DISPATCHER.resolve(
        impl, u.device, dataless=not holds_data(u), has_initial_state=initial_state is not None, dtype=dtype
    )
    if impl == "cuda":
        return _ran(impl, _optional.selective_scan_cuda_fn(*args))
    if impl == "triton":
        return _ran(impl, triton_scan.selective_scan_triton(*args, initial_state=initial_state))
    if impl == "numba":
        return _ran(impl, numba_scan.selective_scan_numba(*args, initial_state=initial_state))
    if impl == "ref":
        return _ran(impl, selective_scan_ref(*args, initial_state=initial_state))
    return _ran(
        impl,
        selective_scan_chunked(*args, initial_state=initial_state, chunk_size=chunk_size, chunk_method=chunk_method),
    )
