"""The one place that chooses how the Vandermonde and Cauchy products run.

Implementations (``impl=``):

==========  =====================================================  ==============  =====================
name        what                                                   devices         backward
==========  =====================================================  ==============  =====================
``ref``     :mod:`.reference`: explicit recurrence / whole matrix  any             autograd
``chunked`` :mod:`.chunked`: PyTorch over bounded pieces           any             autograd / recomputes
``numba``   :mod:`.cpu`: fused compiled loops                      CPU             hand-written
``triton``  :mod:`.triton`: Triton kernels                         CUDA (or CPU    hand-written
                                                                   interpreter;
                                                                   meta: fake)
``pykeops`` :mod:`.keops` (Cauchy only): KeOps lazy reduction      CUDA            KeOps
==========  =====================================================  ==============  =====================

``impl="auto"`` (the default, see :func:`set_default_impl`) runs, per op and device (see
:func:`auto_impl`): on CPU ``numba`` when numba imports, else ``chunked``; on CUDA ``triton`` when
triton imports, else (Cauchy) ``pykeops`` when usable, else ``chunked``; on the ``meta`` device (dry
runs) ``triton``, the kernels a GPU runs, by their operators' fake implementations (nothing is
launched; triton need not be installed); elsewhere ``chunked``.
Forcing an implementation that cannot run on the inputs' device raises a RuntimeError that says
why and lists those that can (:func:`available_impls`).

Every implementation's backward is deterministic (:data:`DETERMINISTIC_BACKWARD`: no atomics,
sums in a fixed order), except pykeops', whose bits are KeOps' and not established here. The
table is checked whenever ``torch.are_deterministic_algorithms_enabled()``
is true: ``"auto"`` then skips an implementation marked non-deterministic, and forcing one raises
a RuntimeError naming the deterministic alternatives.

Each call reports the implementation it runs to :func:`longrange.ops.used.note` (ops
``"vandermonde"`` and ``"cauchy"``).
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Iterator

import torch
from torch import Tensor

from longrange.ops import used
from longrange.ops.chunking import TEMPORARY_BYTES
from longrange.ops.dataless import holds_data
from longrange.ops.ssm_kernels import cpu, keops
from longrange.ops.ssm_kernels import triton as triton_kernels
from longrange.ops.ssm_kernels.chunked import cauchy_chunked, vandermonde_chunked
from longrange.ops.ssm_kernels.common import (
    CAUCHY,
    VANDERMONDE,
    cauchy_layout,
    check_cauchy_args,
    check_vandermonde_args,
    complex_dtype,
)
from longrange.ops.ssm_kernels.reference import cauchy_ref, vandermonde_kernel_ref

OPS = (VANDERMONDE, CAUCHY)
#: The implementations of each op, in the order of preference of ``"auto"`` where they can run
#: (``ref`` is never chosen automatically).
IMPLS: dict[str, tuple[str, ...]] = {
    VANDERMONDE: ("triton", "numba", "chunked", "ref"),
    CAUCHY: ("triton", "pykeops", "numba", "chunked", "ref"),
}
#: Whether each implementation's backward gives bitwise the same result from run to run: the fused
#: kernels write every output from one task or program and add partial sums in a fixed order, the
#: PyTorch implementations use deterministic reductions. KeOps' reductions are its own, and no test
#: here established their bits: pykeops counts as non-deterministic.
DETERMINISTIC_BACKWARD: dict[str, dict[str, bool]] = {
    VANDERMONDE: {"ref": True, "chunked": True, "numba": True, "triton": True},
    CAUCHY: {"ref": True, "chunked": True, "numba": True, "triton": True, "pykeops": False},
}
#: The public function of each op, for messages.
_FUNCTION = {VANDERMONDE: "vandermonde_kernel", CAUCHY: "cauchy"}

_defaults = {VANDERMONDE: "auto", CAUCHY: "auto"}


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"unknown SSM kernel op {op!r}; expected one of {OPS}")


def _check_impl(op: str, impl: str) -> None:
    _check_op(op)
    if impl != "auto" and impl not in IMPLS[op]:
        raise ValueError(f"{_FUNCTION[op]}: unknown impl {impl!r}; expected one of {('auto', *IMPLS[op])}")


def _runs(impl: str, device: torch.device) -> bool:
    """Whether ``impl`` can run on ``device`` here (cheap, and traceable by torch.compile: no messages)."""
    if impl == "numba":
        return cpu.numba_available(device)
    if impl == "triton":
        return triton_kernels.triton_available(device)
    if impl == "pykeops":
        return keops.keops_available(device)
    return True


def unavailable_reason(op: str, impl: str, device: torch.device | str) -> str | None:
    """Why implementation ``impl`` of ``op`` cannot run on ``device`` here, or None if it can."""
    _check_impl(op, impl)
    device = torch.device(device)
    if _runs(impl, device):
        return None
    if impl == "numba":
        return "it runs on CPU tensors only" if device.type != "cpu" else f"numba does not import ({cpu.unavailable_reason()})"
    if impl == "triton":
        return triton_kernels.unavailable_reason(device)
    return f"it needs CUDA tensors and a usable pykeops ({keops.unavailable_reason()})"


def available_impls(op: str, device: torch.device | str) -> list[str]:
    """The implementations of ``op`` that can run on ``device`` here, in ``"auto"``'s order of
    preference (``ref`` last)."""
    _check_op(op)
    device = torch.device(device)
    return [impl for impl in IMPLS[op] if _runs(impl, device)]


def deterministic_impls(op: str, device: torch.device | str) -> list[str]:
    """Those of :func:`available_impls` whose backward is deterministic."""
    return [impl for impl in available_impls(op, device) if DETERMINISTIC_BACKWARD[op][impl]]


def auto_impl(op: str, device: torch.device | str) -> str:
    """The implementation ``impl="auto"`` runs for ``op`` on ``device`` (see the module
    docstring); only deterministic ones when ``torch.are_deterministic_algorithms_enabled()``."""
    _check_op(op)
    device = torch.device(device)
    candidates = deterministic_impls(op, device) if torch.are_deterministic_algorithms_enabled() else available_impls(op, device)
    for impl in candidates:
        if impl != "ref" and not (impl == "triton" and device.type == "cpu"):  # the interpreter is for tests
            return impl
    return "ref"


def set_default_impl(op: str, impl: str) -> str:
    """Use ``impl`` for ``op`` when a call passes ``impl=None``; returns the previous default."""
    _check_impl(op, impl)
    previous, _defaults[op] = _defaults[op], impl
    return previous


@contextmanager
def default_impl(op: str | tuple[str, ...], impl: str) -> Iterator[None]:
    """Context manager: ``impl`` is the default of ``op`` (or of each op of a tuple, e.g. :data:`OPS`)
    inside the block."""
    ops = (op,) if isinstance(op, str) else tuple(op)
    for name in ops:
        _check_impl(name, impl)
    previous = {name: set_default_impl(name, impl) for name in ops}
    try:
        yield
    finally:
        for name, value in previous.items():
            set_default_impl(name, value)


def resolve_impl(op: str, impl: str | None, device: torch.device | str, dataless: bool = False) -> str:
    """The implementation a call of ``op`` with ``impl`` runs on ``device``: None is the default
    (:func:`set_default_impl`), ``"auto"`` is :func:`auto_impl`; a named implementation is checked
    (RuntimeError if it cannot run there, or if it is non-deterministic while PyTorch's
    deterministic mode is on). On tensors without data (``dataless``: fake tensors, whose operators'
    fake implementations run) ``triton`` runs on any device: memory plans trace a GPU's kernels."""
    impl = _defaults[op] if impl is None else impl
    _check_impl(op, impl)
    device = torch.device(device)
    if impl == "auto":
        return auto_impl(op, device)
    if not _runs(impl, device) and not (dataless and impl == "triton"):
        raise RuntimeError(
            f"{_FUNCTION[op]}: impl={impl!r} cannot run on {device.type}: {unavailable_reason(op, impl, device)}; "
            f"available here: {', '.join(available_impls(op, device))}"
        )
    if torch.are_deterministic_algorithms_enabled() and not DETERMINISTIC_BACKWARD[op][impl]:
        raise RuntimeError(
            f"{_FUNCTION[op]}: impl={impl!r} has a non-deterministic backward and "
            "torch.use_deterministic_algorithms(True) is in effect; deterministic implementations here: "
            f"{', '.join(deterministic_impls(op, device))}"
        )
    return impl


# --------------------------------------------------------------------------------------------
# The ops
# --------------------------------------------------------------------------------------------


def vandermonde_kernel(
    log_dA: Tensor, W: Tensor, L: int, *, chunk_bytes: int = TEMPORARY_BYTES, impl: str | None = None
) -> Tensor:
    """``K[..., h, l] = Re sum_m W[..., h, m] exp(l · log_dA[h, m])`` for l < L.

    ``log_dA`` (H, M) or (1, M) (modes shared by all channels), ``W`` (..., H, M) complex; returns
    (..., H, L) real (float64 if an input is double precision, else float32). ``impl``: see the
    module docstring (None: the default, normally ``"auto"``); ``chunk_bytes`` bounds the
    temporaries of ``impl="chunked"`` (see :mod:`longrange.ops.chunking`).
    """
    check_vandermonde_args(log_dA, W, L)
    impl = resolve_impl(VANDERMONDE, impl, W.device, dataless=not holds_data(W))
    used.note(VANDERMONDE, impl)
    if impl == "numba":
        return cpu.vandermonde_numba(log_dA, W, L)
    if impl == "triton":
        return triton_kernels.vandermonde_triton(log_dA, W, L)
    if impl == "ref":
        return vandermonde_kernel_ref(log_dA, W, L)
    return vandermonde_chunked(log_dA, W, L, chunk_bytes)


def cauchy(
    v: Tensor, z: Tensor, w: Tensor, chunk_elements: int | None = None, *, conj_pairs: bool = False, impl: str | None = None
) -> Tensor:
    """Cauchy kernel ``out[..., k] = sum_n v[..., n] / (z[..., k] - w[..., n])``.

    ``v`` (..., N), ``z`` (..., K) and ``w`` (..., N), complex, broadcasting over their leading
    dimensions; with ``conj_pairs`` the sum also runs over the conjugate partners
    ``conj(v[n]) / (z - conj(w[n]))`` (a system stored as one member of each conjugate pair).
    ``impl``: see the module docstring (None: the default, normally ``"auto"``);
    ``chunk_elements`` bounds the (..., K, N) pieces of ``impl="chunked"`` (default
    :data:`longrange.ops.ssm_kernels.chunked.CAUCHY_CHUNK_ELEMENTS`). :func:`cauchy_ref` is the fully
    materialised reference.
    """
    check_cauchy_args(v, z, w)
    impl = resolve_impl(CAUCHY, impl, v.device, dataless=not holds_data(v))
    used.note(CAUCHY, impl)
    if impl == "numba":
        return cpu.cauchy_numba(v, z, w, conj_pairs)
    if impl == "triton":
        return triton_kernels.cauchy_triton(v, z, w, conj_pairs)
    if impl == "ref":
        return cauchy_ref(v, z, w, conj_pairs)
    if impl == "pykeops":  # pragma: no cover - needs CUDA and pykeops
        cdtype = complex_dtype(cauchy_layout(v, z, w).real)
        return keops.cauchy_keops(v.to(cdtype), z.to(cdtype), w.to(cdtype), conj_pairs)
    return cauchy_chunked(v, z, w, conj_pairs, chunk_elements)


def cauchy_impl(device: torch.device | str) -> str:
    """How :func:`cauchy` evaluates on ``device`` with ``impl="auto"`` (see :func:`auto_impl`)."""
    return auto_impl(CAUCHY, device)


for _op, _fn in ((VANDERMONDE, vandermonde_kernel), (CAUCHY, cauchy)):
    _fn.op = _op
    _fn.available_impls = partial(available_impls, _op)
    _fn.auto_impl = partial(auto_impl, _op)
    _fn.deterministic_backward = DETERMINISTIC_BACKWARD[_op]
