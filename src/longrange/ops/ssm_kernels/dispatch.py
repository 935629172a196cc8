"""The one place that chooses how the Vandermonde and Cauchy products run.

Implementations (``impl=``):

==========  =====================================================  ==============  =====================
name        what                                                   devices         backward
==========  =====================================================  ==============  =====================
``ref``     :mod:`.reference`: explicit recurrence / whole matrix  any             autograd
``chunked`` :mod:`.chunked`: PyTorch over bounded pieces           any             autograd / recomputes
``numba``   :mod:`.numba`: fused compiled loops                    CPU             hand-written
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
why and lists those that can (:func:`available_impls`). Each op has its :class:`~longrange.ops.dispatch.Dispatcher`
(:data:`VANDERMONDE_DISPATCHER`, :data:`CAUCHY_DISPATCHER`; the convention of
:mod:`longrange.ops.dispatch`); the functions here that take an ``op`` first are thin wrappers of
their verbs.

Every implementation's backward is deterministic (:data:`DETERMINISTIC_BACKWARD`: no atomics,
sums in a fixed order), except pykeops', whose bits are KeOps' and not established here. The
table is checked whenever ``torch.are_deterministic_algorithms_enabled()``
is true: ``"auto"`` then skips an implementation marked non-deterministic, and forcing one raises
a RuntimeError naming the deterministic alternatives (a warning in ``warn_only`` mode; see
:func:`longrange.ops.determinism.refuse_nondeterministic`).

Each call reports the implementation it runs to :func:`longrange.ops.used.note` (ops
``"vandermonde"`` and ``"cauchy"``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
from torch import Tensor

from longrange.ops.chunking import TEMPORARY_BYTES
from longrange.ops.dataless import holds_data
from longrange.ops.dispatch import Dispatcher, Impl, numba_impl, triton_impl
from longrange.ops.ssm_kernels import keops
from longrange.ops.ssm_kernels import numba as numba_kernels
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


def _triton_import_error() -> str | None:
    return None if triton_kernels._kernel_module() is not None else triton_kernels._KERNELS.error


def _runs(impl: str, device: torch.device) -> bool:
    """Whether ``impl`` can run on ``device`` here: the ``runs`` predicate of both dispatchers' (one
    function, read at each call, so that a test can stand in for another machine)."""
    if impl == "numba":
        return numba_kernels.numba_available(device)
    if impl == "triton":
        return triton_kernels.triton_available(device)
    if impl == "pykeops":
        return keops.keops_available(device)
    return True


def _impls(op: str) -> list[Impl]:
    """The implementations of ``op`` in the order of preference of ``"auto"`` where they can run
    (``ref`` is never chosen automatically). Every backward is deterministic (the fused kernels
    write every output from one task or program and add partial sums in a fixed order, the PyTorch
    implementations use deterministic reductions) except pykeops': KeOps' reductions are its own,
    and no test here established their bits."""

    def runs(impl: str):
        return lambda device: _runs(impl, device)

    impls = [triton_impl(triton_kernels.triton_available, _triton_import_error, runs=runs("triton"))]
    if op == CAUCHY:
        impls.append(
            Impl(
                "pykeops",
                runs=runs("pykeops"),
                reason=lambda device: (
                    (f"cannot run on {device.type}: it " if device.type != "cuda" else "")
                    + f"needs CUDA tensors and a usable pykeops ({keops.unavailable_reason()})"
                ),
                deterministic=False,
                nondeterministic="KeOps' reductions, whose bits are not established here",
            )
        )
    return impls + [
        numba_impl(numba_kernels, runs=runs("numba")),
        Impl("chunked", runs=runs("chunked")),
        Impl("ref", runs=runs("ref"), auto=False),
    ]


VANDERMONDE_DISPATCHER = Dispatcher(VANDERMONDE, _impls(VANDERMONDE), function="vandermonde_kernel")
CAUCHY_DISPATCHER = Dispatcher(CAUCHY, _impls(CAUCHY), function="cauchy")
_DISPATCHERS = {VANDERMONDE: VANDERMONDE_DISPATCHER, CAUCHY: CAUCHY_DISPATCHER}

#: The implementations of each op, in the order of preference of ``"auto"`` where they can run
#: (``ref`` is never chosen automatically; ``"auto"`` not listed).
IMPLS: dict[str, tuple[str, ...]] = {op: d.impls for op, d in _DISPATCHERS.items()}
#: Whether each implementation's backward gives bitwise the same result from run to run (the
#: dispatchers' own tables: changing an entry changes what they do).
DETERMINISTIC_BACKWARD: dict[str, dict[str, bool]] = {op: d.deterministic_backward for op, d in _DISPATCHERS.items()}


def __getattr__(name: str):
    if name == "_defaults":  # the former table of defaults
        return {op: d.default for op, d in _DISPATCHERS.items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _dispatcher(op: str) -> Dispatcher:
    if op not in _DISPATCHERS:
        raise ValueError(f"unknown SSM kernel op {op!r}; expected one of {OPS}")
    return _DISPATCHERS[op]


def unavailable_reason(op: str, impl: str, device: torch.device | str) -> str | None:
    """Why implementation ``impl`` of ``op`` cannot run on ``device`` here, or None if it can."""
    return _dispatcher(op).unavailable_reason(impl, device)


def available_impls(op: str, device: torch.device | str) -> list[str]:
    """The implementations of ``op`` that can run on ``device`` here, in ``"auto"``'s order of
    preference (``ref`` last)."""
    return list(_dispatcher(op).available_impls(device))


def deterministic_impls(op: str, device: torch.device | str) -> list[str]:
    """Those of :func:`available_impls` whose backward is deterministic."""
    return list(_dispatcher(op).deterministic_impls(device))


def auto_impl(op: str, device: torch.device | str) -> str:
    """The implementation ``impl="auto"`` runs for ``op`` on ``device`` (see the module
    docstring); only deterministic ones when ``torch.are_deterministic_algorithms_enabled()``."""
    return _dispatcher(op).auto_impl(device)


def set_default_impl(op: str, impl: str) -> str:
    """Use ``impl`` for ``op`` when a call passes ``impl=None``; returns the previous default."""
    return _dispatcher(op).set_default_impl(impl)


@contextmanager
def default_impl(op: str | tuple[str, ...], impl: str) -> Iterator[None]:
    """Context manager: ``impl`` is the default of ``op`` (or of each op of a tuple, e.g. :data:`OPS`)
    inside the block."""
    ops = (op,) if isinstance(op, str) else tuple(op)
    for name in ops:
        _dispatcher(name).check_impl(impl)
    previous = {name: set_default_impl(name, impl) for name in ops}
    try:
        yield
    finally:
        for name, value in previous.items():
            set_default_impl(name, value)


def resolve_impl(op: str, impl: str | None, device: torch.device | str, dataless: bool = False) -> str:
    """The implementation a call of ``op`` with ``impl`` runs on ``device`` (see
    :meth:`longrange.ops.dispatch.Dispatcher.resolve`): None is the default, ``"auto"`` is
    :func:`auto_impl`; a named implementation is checked. On tensors without data (``dataless``:
    fake tensors, whose operators' fake implementations run) ``triton`` runs on any device: memory
    plans trace a GPU's kernels."""
    return _dispatcher(op).resolve(impl, device, dataless=dataless, stacklevel=4)


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
    impl = VANDERMONDE_DISPATCHER.resolve(impl, W.device, dataless=not holds_data(W))
    VANDERMONDE_DISPATCHER.note(impl)
    if impl == "numba":
        return numba_kernels.vandermonde_numba(log_dA, W, L)
    if impl == "triton":
        return triton_kernels.vandermonde_triton(log_dA, W, L)
    if impl == "ref":
        return vandermonde_kernel_ref(log_dA, W, L)
    return vandermonde_chunked(log_dA, W, L, chunk_bytes)


def cauchy(
    v: Tensor,
    z: Tensor,
    w: Tensor,
    chunk_elements: int | None = None,
    *,
    conj_pairs: bool = False,
    impl: str | None = None,
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
    impl = CAUCHY_DISPATCHER.resolve(impl, v.device, dataless=not holds_data(v))
    CAUCHY_DISPATCHER.note(impl)
    if impl == "numba":
        return numba_kernels.cauchy_numba(v, z, w, conj_pairs)
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
    _fn.dispatcher = _DISPATCHERS[_op]
    _fn.available_impls = partial(available_impls, _op)
    _fn.auto_impl = partial(auto_impl, _op)
    _fn.deterministic_backward = DETERMINISTIC_BACKWARD[_op]
