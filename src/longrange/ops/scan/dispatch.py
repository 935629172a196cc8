"""Which implementation of the selective scan runs: :func:`selective_scan`, the entry point.

``impl`` names an implementation (:data:`IMPLS`); ``"auto"`` is resolved by :func:`auto_impl`,
``None`` takes the process-wide default (:func:`set_default_impl`, :func:`default_impl`).
:func:`available_impls` lists those that can run on a device here. Every call reports the
implementation it ran to :mod:`longrange.ops.used` (op ``"selective_scan"``).

Determinism (:data:`DETERMINISTIC_BACKWARD`): with ``torch.use_deterministic_algorithms(True)``,
``"auto"`` never picks an implementation whose backward is non-deterministic, and asking for one
by name raises a RuntimeError naming the deterministic ones (a warning instead in PyTorch's
``warn_only`` mode).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor

from longrange import _optional
from longrange.ops import used
from longrange.ops.dataless import holds_data
from longrange.ops.determinism import refuse_nondeterministic
import longrange.ops.scan.numba as numba_scan
import longrange.ops.scan.triton as triton_scan
from longrange.ops.scan.chunked import selective_scan_chunked
from longrange.ops.scan.common import check_shapes, compute_dtype
from longrange.ops.scan.reference import selective_scan_ref

IMPLS = ("auto", "chunked", "ref", "cuda", "numba", "triton")

#: Whether each implementation's backward gives the same bits for the same inputs (at equal
#: thread counts on CPUs): "ref" and "chunked" are PyTorch operations without atomic accumulation;
#: "numba" writes every partial sum from one task and sums them in a fixed order; "triton" and
#: "cuda" (mamba-ssm) add the gradients of a time-varying B and C from several programs (thread
#: blocks) with atomic additions, whose order, and so the last bits, can change from run to run on
#: a GPU. The forward passes of all five are deterministic.
DETERMINISTIC_BACKWARD = {"ref": True, "chunked": True, "numba": True, "triton": False, "cuda": False}

_default_impl = "auto"


def set_default_impl(impl: str) -> str:
    """Set the implementation used when ``impl=None``; returns the previous default."""
    global _default_impl
    _check_impl(impl)
    previous, _default_impl = _default_impl, impl
    return previous


@contextmanager
def default_impl(impl: str) -> Iterator[None]:
    """Context manager: use ``impl`` as the default implementation inside the block."""
    previous = set_default_impl(impl)
    try:
        yield
    finally:
        set_default_impl(previous)


def _check_impl(impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"selective_scan: unknown impl {impl!r}; expected one of {IMPLS}")


def _triton_scan(dataless: bool = False) -> tuple[object | None, str | None]:
    """(``selective_scan_triton``, None), or (None, why triton does not import); on tensors without
    data (meta, fake: :mod:`longrange.ops.dataless`) the operator's fake implementation runs and
    triton is not needed."""
    if dataless:
        return triton_scan.selective_scan_triton, None
    reason = triton_scan.unavailable_reason()
    return (None, reason) if reason else (triton_scan.selective_scan_triton, None)


def _cuda_usable(device: torch.device, has_initial_state: bool, dtype: torch.dtype) -> bool:
    return (
        _optional.selective_scan_cuda_fn is not None
        and device.type == "cuda"
        and not has_initial_state
        and dtype != torch.float64
    )


def available_impls(device: torch.device | str) -> tuple[str, ...]:
    """The implementations that can run on tensors of ``device`` in this process, slowest first
    (``"auto"`` excluded): ``"ref"`` and ``"chunked"`` everywhere, ``"numba"`` on CPU when numba
    imports, ``"triton"`` where :func:`longrange.ops.scan.triton.triton_available` (CUDA, or CPU
    under ``TRITON_INTERPRET=1``, and the meta device), ``"cuda"`` on CUDA when mamba-ssm's compiled
    kernel imports."""
    device = torch.device(device)
    impls = ["ref", "chunked"]
    if device.type == "cpu" and numba_scan.numba_available():
        impls.append("numba")
    if triton_scan.triton_available(device):
        impls.append("triton")
    if _cuda_usable(device, False, torch.float32):
        impls.append("cuda")
    return tuple(impls)


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
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    device = torch.device(device)
    if device.type == "meta":
        return "chunked" if deterministic else "triton"
    if device.type == "cuda":
        if deterministic:
            return "chunked"
        if _cuda_usable(device, has_initial_state, dtype):
            return "cuda"
        return "triton" if _triton_scan()[0] is not None else "chunked"
    if device.type == "cpu" and numba_scan.numba_available():
        return "numba"
    return "chunked"


def _check_deterministic(impl: str, device: torch.device) -> None:
    """Refuse an implementation with a non-deterministic backward while PyTorch's deterministic
    algorithms are on (warn in ``warn_only`` mode)."""
    if DETERMINISTIC_BACKWARD[impl] or not torch.are_deterministic_algorithms_enabled():
        return
    alternatives = [i for i in reversed(available_impls(device)) if DETERMINISTIC_BACKWARD[i]]
    refuse_nondeterministic("selective_scan", impl, "atomic additions of the gradients of B and C", alternatives,
                            stacklevel=3)


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
    impl = _default_impl if impl is None else impl
    _check_impl(impl)
    check_shapes(u, delta, A, B, C, D, z, delta_bias, initial_state)
    args = (u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
    dtype = compute_dtype(u, delta, A, B, C, D, z, delta_bias, initial_state)
    if impl == "auto":
        impl = auto_impl(u.device, initial_state is not None, dtype)
    else:
        _check_deterministic(impl, u.device)
    if impl == "cuda":
        if not _cuda_usable(u.device, initial_state is not None, dtype):
            reason = _optional.status()["mamba_ssm"].get("reason", "")
            raise RuntimeError(
                "selective_scan: impl='cuda' needs mamba_ssm with its compiled extension selective_scan_cuda"
                f"{f' ({reason})' if reason else ''}, CUDA tensors, float32/float16/bfloat16 inputs and no initial_state"
            )
        return _ran(impl, _optional.selective_scan_cuda_fn(*args))
    if impl == "triton":
        fn, error = _triton_scan(not holds_data(u))
        if fn is None:
            raise RuntimeError(
                f"selective_scan: impl='triton' needs the triton package, which does not import ({error})"
            )
        return _ran(impl, fn(*args, initial_state=initial_state))
    if impl == "numba":
        return _ran(impl, numba_scan.selective_scan_numba(*args, initial_state=initial_state))
    if impl == "ref":
        return _ran(impl, selective_scan_ref(*args, initial_state=initial_state))
    return _ran(impl, selective_scan_chunked(
        *args, initial_state=initial_state, chunk_size=chunk_size, chunk_method=chunk_method
    ))
