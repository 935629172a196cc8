"""One convention for ops with several implementations: a :class:`Dispatcher` per op, and the
registry of them all (:data:`DISPATCHERS`, :func:`dispatcher`).

An op with several implementations (the selective scan: numba, Triton, mamba-ssm, chunked; the
causal convolution; the Vandermonde and Cauchy products of the S4 kernels; ...) describes each of
them as an :class:`Impl` (a name, a cheap ``runs(device)`` predicate, why it cannot run where it
cannot, whether its backward is deterministic) and hands them, in ``"auto"``'s order of
preference, to one :class:`Dispatcher`. The dispatcher offers the same verbs for every op:

=========================================  ================================================================
``IMPLS``                                  the names, ``"auto"`` first, then the order of preference
``available_impls(device)``                those that can run on tensors of ``device`` here (same order)
``deterministic_impls(device)``            those of them whose backward is deterministic
``auto_impl(device, **context)``           what ``impl="auto"`` runs (context: ``width=``, ``dtype=``, ...)
``set_default_impl(impl)``                 the implementation ``impl=None`` means; returns the previous one
``default_impl(impl)``                     the same as a context manager
``resolve(impl, device, dataless=False,    the implementation a call runs: None is the default, ``"auto"``
**context)``                               :meth:`~Dispatcher.auto_impl`, a named one is checked (below)
``unavailable_reason(impl, device)``       why ``impl`` cannot run there (None if it can)
``deterministic_backward``                 implementation -> whether its backward is deterministic
``note(impl)``                             report the implementation that runs to :mod:`longrange.ops.used`
=========================================  ================================================================

:meth:`Dispatcher.resolve` raises a ValueError naming the op's function and its implementations
for an unknown name, a RuntimeError saying why and listing those that can run for an
implementation that cannot run on the inputs' device (or on these inputs: e.g. the CUDA causal
convolution's widths), and, under ``torch.use_deterministic_algorithms(True)``, refuses one whose
backward is not deterministic (:func:`longrange.ops.determinism.refuse_nondeterministic`: a
RuntimeError naming the deterministic alternatives, a warning in ``warn_only`` mode). In that
mode ``"auto"`` picks only deterministic implementations. On tensors without data (``dataless``:
meta or fake tensors, see :mod:`longrange.ops.dataless`) an implementation marked ``dataless``
(the Triton kernels, whose operators' fake implementations run) is accepted on any device.

``"auto"`` runs, by default, the first implementation in the order of preference that runs on the
device, that ``"auto"`` may pick there (:attr:`Impl.auto`: never the reference, not Triton's CPU
interpreter), that takes the inputs (:attr:`Impl.fits`) and, in deterministic mode, whose backward
is deterministic; the last implementation (the reference, which runs anywhere) when none does. An
op whose rule differs passes its own ``auto`` function.

**A new op family** joins by building its dispatcher in its ``dispatch`` module, calling it in
its entry point, and adding that module to :data:`FAMILIES` (the registry imports those modules on
first use, so that ``longrange check`` and ``longrange info`` list the op)::

    from longrange.ops.dispatch import Dispatcher, Impl, numba_impl
    from longrange.ops.myop import numba as numba_myop

    DISPATCHER = Dispatcher("myop", [
        numba_impl(numba_myop),                  # "numba": CPU tensors, when numba imports
        Impl("chunked"),                         # runs anywhere
        Impl("ref", auto=False),                 # the reference: never picked by "auto"
    ])
    IMPLS, available_impls, auto_impl = DISPATCHER.IMPLS, DISPATCHER.available_impls, DISPATCHER.auto_impl
    set_default_impl, default_impl = DISPATCHER.set_default_impl, DISPATCHER.default_impl

    def myop(x, impl=None):
        impl = DISPATCHER.resolve(impl, x.device, dataless=not holds_data(x), dtype=x.dtype)
        DISPATCHER.note(impl)
        ...

Messages read alike: a reason (:attr:`Impl.reason`, :attr:`Impl.misfit`) completes the sentence
``"<function>: impl='<name>' ..."`` (``"needs the numba package, which does not import (...)"``,
``"cannot run on meta: it runs on CPU tensors only"``), to which :meth:`~Dispatcher.resolve` adds
``"; available here: ..."``. A dispatcher is registered when it is built (``register=False``: not);
one whose module is not in :data:`FAMILIES` is listed only once that module has been imported.

Numba implementations live in ``<family>/numba.py`` (with ``numba_available()`` and
``unavailable_reason()``) and their kernels in ``<family>/_numba_kernels.py`` (``cache=True``),
Triton's in ``<family>/triton.py`` and ``<family>/_triton_kernels.py``; :func:`numba_impl` and
:func:`triton_impl` describe them. Check cases for ``longrange check`` go to
:mod:`longrange.ops.check_cases` (their ``record`` is ``(op, impl)``); ``longrange check`` lists
any registered implementation left without one.

Importing this module imports neither numba nor triton, nor the ops: :data:`DISPATCHERS` imports
the modules of :data:`FAMILIES` when it is first read, and those import their kernels only when a
``runs`` predicate first asks (:class:`longrange.ops._lazy_kernels.LazyKernels`).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType

import torch

from longrange.ops.determinism import refuse_nondeterministic

#: The modules that define the registered dispatchers, imported when :data:`DISPATCHERS` is first
#: read. A new op family adds its dispatch module here.
FAMILIES: tuple[str, ...] = (
    "longrange.ops.scan.dispatch",
    "longrange.ops.conv.dispatch",
    "longrange.ops.norm.dispatch",
    "longrange.ops.glu.dispatch",
    "longrange.ops.ssm_kernels.dispatch",
    "longrange.ops.matrix_state.dispatch",
    "longrange.ops.complex_scan.dispatch",
    "longrange.ops.wkv.dispatch",
    "longrange.ops.fftconv",
    "longrange.ops.attention.dispatch",
)


def _everywhere(device: torch.device) -> bool:
    return True


@dataclass(frozen=True)
class Impl:
    """One implementation of an op, as its :class:`Dispatcher` sees it.

    ``runs(device)``: whether it can run on tensors of ``device`` in this process; cheap and
    traceable by ``torch.compile`` (no messages built: read module attributes at call time, so that
    monkeypatched availability is seen). ``reason(device)``: where ``runs`` is False, why, as the
    rest of a sentence that starts with ``"<function>: impl='<name>' "``: ``"needs the numba
    package, which does not import (...)"``, ``"cannot run on meta: it runs on CPU tensors only"``
    (None: ``"cannot run on <device>"``).

    ``fits(**context)``: whether it takes inputs described by the context the op passes (e.g.
    ``width=``, ``dtype=``, ``has_initial_state=``; every key optional); ``misfit(**context)``:
    why not, like ``reason``. None: it takes any.

    ``deterministic``: whether its backward gives the same bits for the same inputs (the initial
    value of :attr:`Dispatcher.deterministic_backward`); ``nondeterministic``: why not, for the
    refusal under deterministic algorithms.

    ``auto``: whether ``"auto"`` may pick it (a bool, or a predicate of the device: e.g. Triton
    runs on the CPU in its interpreter, which ``"auto"`` leaves to tests).

    ``dataless``: on tensors without data it is accepted on any device (its operator's fake
    implementation runs; nothing is launched). ``interpreter_env``: environment variables under
    which it also runs on CPU tensors, in an interpreter (Triton's), which ``longrange check``
    checks. ``note``: a few words for ``longrange info`` (e.g. which package's kernel it is).
    """

    name: str
    runs: Callable[[torch.device], bool] = _everywhere
    reason: Callable[[torch.device], str] | None = None
    fits: Callable[..., bool] | None = None
    misfit: Callable[..., str] | None = None
    deterministic: bool = True
    nondeterministic: str = ""
    auto: bool | Callable[[torch.device], bool] = True
    dataless: bool = False
    interpreter_env: Mapping[str, str] | None = None
    note: str = ""


#: ``rule(dispatcher, device, deterministic, **context) -> impl``: an op's own rule for ``"auto"``.
AutoRule = Callable[..., str]


class Dispatcher:
    """Chooses among the implementations of one op (see the module docstring).

    ``op``: the name reported to :func:`longrange.ops.used.note` and the key in the registry;
    ``impls``: its :class:`Impl` in ``"auto"``'s order of preference, the last one the reference
    that runs anywhere; ``function``: the public function's name, for messages (default ``op``);
    ``auto``: the op's own rule for ``"auto"`` (default: see the module docstring); ``reference``:
    the implementation the others are checked against by ``longrange check`` (not itself checked);
    ``register``: add it to :data:`DISPATCHERS`; ``describe_auto(device)``: what ``"auto"`` runs there,
    in words, for ``longrange info``, where the op's rule depends on more than the device (None:
    the implementation it picks on the device alone).
    """

    def __init__(
        self,
        op: str,
        impls: Sequence[Impl],
        *,
        function: str | None = None,
        auto: AutoRule | None = None,
        reference: str | None = "ref",
        register: bool = True,
        describe_auto: Callable[[torch.device], str] | None = None,
    ):
        names = tuple(impl.name for impl in impls)
        if not names or len(set(names)) != len(names) or "auto" in names:
            raise ValueError(f"{op}: implementations must be distinct, at least one, none named 'auto'; got {names}")
        if reference is not None and reference not in names:
            raise ValueError(f"{op}: the reference {reference!r} is not one of the implementations {names}")
        self.op = op
        self.function = function or op
        self.impls: tuple[str, ...] = names
        self.IMPLS: tuple[str, ...] = ("auto", *names)
        self.specs: dict[str, Impl] = {impl.name: impl for impl in impls}
        #: implementation -> whether its backward is deterministic (a dict the op may export).
        self.deterministic_backward: dict[str, bool] = {impl.name: impl.deterministic for impl in impls}
        self.reference = reference
        self.default = "auto"
        self._rule = auto
        self.describe_auto = describe_auto
        self._auto_ok = {
            impl.name: impl.auto if callable(impl.auto) else (_everywhere if impl.auto else _nowhere) for impl in impls
        }
        if register:
            _REGISTRY.add(self)

    def __repr__(self) -> str:
        return f"Dispatcher({self.op!r}, impls={self.impls}, default={self.default!r})"

    # ---------------------------------------------------------------------------- names and defaults

    def check_impl(self, impl: str) -> None:
        """A ValueError naming the op and its implementations unless ``impl`` is one of :attr:`IMPLS`."""
        if impl not in self.IMPLS:
            raise ValueError(f"{self.function}: unknown impl {impl!r}; expected one of {self.IMPLS}")

    def check_option(self, impl: str | None, where: str | None = None) -> None:
        """:meth:`check_impl` for a setting that may be None (the process default): with ``where``
        (a layer's option, e.g. ``"LRU"``) a ConfigError ``"<where>: impl: ..."``, else the ValueError."""
        if impl is None or impl in self.IMPLS:
            return
        try:
            self.check_impl(impl)
        except ValueError as err:
            if where is None:
                raise
            from longrange.errors import ConfigError

            raise ConfigError(f"{where}: impl: {err}") from None

    def set_default_impl(self, impl: str) -> str:
        """Use ``impl`` when a call passes ``impl=None``; returns the previous default."""
        self.check_impl(impl)
        previous, self.default = self.default, impl
        return previous

    @contextmanager
    def default_impl(self, impl: str) -> Iterator[None]:
        """Context manager: ``impl`` is the default inside the block."""
        previous = self.set_default_impl(impl)
        try:
            yield
        finally:
            self.set_default_impl(previous)

    # ---------------------------------------------------------------------------- where each runs

    def runs(self, impl: str, device: torch.device | str, **context) -> bool:
        """Whether ``impl`` can run on ``device`` here and takes inputs described by ``context``."""
        spec = self.specs[impl]
        return spec.runs(torch.device(device)) and (spec.fits is None or spec.fits(**context))

    def available_impls(self, device: torch.device | str) -> tuple[str, ...]:
        """The implementations that can run on tensors of ``device`` here, in ``"auto"``'s order of
        preference (``"auto"`` excluded)."""
        device = torch.device(device)
        return tuple(name for name in self.impls if self.specs[name].runs(device))

    def deterministic_impls(self, device: torch.device | str) -> tuple[str, ...]:
        """Those of :meth:`available_impls` whose backward is deterministic."""
        return tuple(name for name in self.available_impls(device) if self.deterministic_backward[name])

    def unavailable_reason(self, impl: str, device: torch.device | str, **context) -> str | None:
        """Why ``impl`` cannot run on ``device`` (on inputs described by ``context``), as the rest of
        a sentence after ``"impl='<name>' "``; None when it can."""
        self.check_impl(impl)
        if impl == "auto":
            return None
        device = torch.device(device)
        spec = self.specs[impl]
        if not spec.runs(device):
            return spec.reason(device) if spec.reason is not None else f"cannot run on {device.type}"
        if spec.fits is not None and not spec.fits(**context):
            return spec.misfit(**context) if spec.misfit is not None else "does not take these inputs"
        return None

    # ---------------------------------------------------------------------------- auto

    def candidates(self, device: torch.device | str, deterministic: bool = False, **context) -> tuple[str, ...]:
        """The implementations ``"auto"``'s default rule may pick on ``device`` for ``context``, in
        order of preference (only those with a deterministic backward if ``deterministic``)."""
        device = torch.device(device)
        return tuple(
            name
            for name in self.impls
            if self._auto_ok[name](device)
            and self.runs(name, device, **context)
            and (not deterministic or self.deterministic_backward[name])
        )

    def auto_impl(self, device: torch.device | str, deterministic: bool | None = None, **context) -> str:
        """The implementation ``impl="auto"`` runs on ``device`` for inputs described by ``context``.
        ``deterministic`` (None: ``torch.are_deterministic_algorithms_enabled()``): only among
        implementations whose backward is deterministic."""
        device = torch.device(device)
        if deterministic is None:
            deterministic = torch.are_deterministic_algorithms_enabled()
        if self._rule is not None:
            return self._rule(self, device, deterministic, **context)
        for name in self.impls:
            if (
                self._auto_ok[name](device)
                and self.runs(name, device, **context)
                and (not deterministic or self.deterministic_backward[name])
            ):
                return name
        return self.impls[-1]

    # ---------------------------------------------------------------------------- a call

    def resolve(
        self, impl: str | None, device: torch.device | str, dataless: bool = False, stacklevel: int = 3, **context
    ) -> str:
        """The implementation a call with ``impl`` runs on tensors of ``device`` (see the module
        docstring): None is the default, ``"auto"`` :meth:`auto_impl`; a named one must run there
        (RuntimeError: why, and what can) and, under deterministic algorithms, have a deterministic
        backward (checked first). ``stacklevel``: the frame a deterministic-mode warning points to, counted from
        this method (3: the caller of the op's function that calls it)."""
        impl = self.default if impl is None else impl
        self.check_impl(impl)
        device = torch.device(device)
        if impl == "auto":
            return self.auto_impl(device, **context)
        spec = self.specs[impl]
        if not self.deterministic_backward[impl] and torch.are_deterministic_algorithms_enabled():
            refuse_nondeterministic(
                self.function,
                impl,
                spec.nondeterministic or "not established as deterministic",
                self.deterministic_impls(device),
                stacklevel=stacklevel,
            )
        if not (dataless and spec.dataless):
            if not spec.runs(device):
                self._cannot_run(impl, device, self.available_impls(device), context)
            if spec.fits is not None and not spec.fits(**context):
                usable = [name for name in self.available_impls(device) if self.runs(name, device, **context)]
                self._cannot_run(impl, device, usable, context)
        return impl

    def _cannot_run(self, impl: str, device: torch.device, usable: Sequence[str], context: dict) -> None:
        raise RuntimeError(
            f"{self.function}: impl={impl!r} {self.unavailable_reason(impl, device, **context)}; "
            f"available here: {', '.join(usable) or 'none'}"
        )

    def note(self, impl: str) -> None:
        """Report that the op runs ``impl`` (:func:`longrange.ops.used.note`)."""
        from longrange.ops import used  # here: importing used imports torch's flop counter, and with it triton

        used.note(self.op, impl)


def _nowhere(device: torch.device) -> bool:
    return False


# --------------------------------------------------------------------------------------------
# Implementations every family describes alike
# --------------------------------------------------------------------------------------------


def numba_reason(device: torch.device, import_error: str | None) -> str:
    """Why numba kernels cannot run on ``device`` (see :attr:`Impl.reason`)."""
    if device.type != "cpu":
        return f"cannot run on {device.type}: it runs on CPU tensors only"
    return f"needs the numba package, which does not import ({import_error})"


def floating_inputs(dtype: torch.dtype = torch.float32, **_) -> bool:
    """An :attr:`Impl.fits` for kernels that take any floating dtype (and compute in float32 or
    float64): the numba kernels of the convolution, the norm and SwiGLU."""
    return dtype.is_floating_point


def floating_inputs_misfit(dtype: torch.dtype = torch.float32, **_) -> str:
    """The :attr:`Impl.misfit` of :func:`floating_inputs`."""
    return f"takes floating CPU tensors, got {dtype}"


def numba_impl(module: ModuleType, **fields) -> Impl:
    """``"numba"``: the kernels of a family's ``numba`` module (its ``numba_available()`` and
    ``unavailable_reason()``, read at each call), on CPU tensors; other :class:`Impl` fields (or
    these) as given."""
    defaults = dict(
        runs=lambda device: device.type == "cpu" and module.numba_available(),
        reason=lambda device: numba_reason(device, module.unavailable_reason()),
    )
    return Impl("numba", **{**defaults, **fields})


def triton_reason(device: torch.device, import_error: str | None) -> str:
    """Why Triton kernels cannot run on ``device`` (see :attr:`Impl.reason`)."""
    if import_error is not None:
        return f"needs the triton package, which does not import ({import_error})"
    if device.type == "cuda" and not torch.cuda.is_available():
        return "cannot run on cuda: CUDA is not available here"
    return (
        f"cannot run on {device.type}: it runs on CUDA tensors, or on CPU tensors in Triton's interpreter with "
        "TRITON_INTERPRET=1 (slow; for tests)"
    )


def triton_impl(available: Callable[[torch.device], bool], import_error: Callable[[], str | None], **fields) -> Impl:
    """``"triton"``: Triton kernels, where ``available(device)`` (CUDA; the CPU in the interpreter;
    the meta device by the operators' fake implementations); ``import_error()``: why triton does
    not import, or None. ``"auto"`` does not pick the interpreter; on tensors without data it is
    accepted anywhere. Other :class:`Impl` fields (or these) as given."""
    defaults = dict(
        runs=lambda device: available(device),
        reason=lambda device: triton_reason(device, import_error()),
        auto=_not_on_cpu,
        dataless=True,
        interpreter_env={"TRITON_INTERPRET": "1"},
    )
    return Impl("triton", **{**defaults, **fields})


def _not_on_cpu(device: torch.device) -> bool:
    return device.type != "cpu"


# --------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------


class _Registry(Mapping):
    """op -> :class:`Dispatcher`, in the order of the op names; reading it imports :data:`FAMILIES` first."""

    def __init__(self) -> None:
        self._known: dict[str, Dispatcher] = {}
        self._loaded = False

    def add(self, d: Dispatcher) -> None:
        old = self._known.get(d.op)
        if old is not None and (old.function, old.impls) != (d.function, d.impls):  # else: a module reloaded
            raise ValueError(f"two dispatchers for the op {d.op!r}: {old!r} and {d!r}")
        self._known[d.op] = d

    def load(self) -> None:
        if not self._loaded:
            for module in FAMILIES:
                importlib.import_module(module)
            self._loaded = True

    def __getitem__(self, op: str) -> Dispatcher:
        self.load()
        return self._known[op]

    def __iter__(self) -> Iterator[str]:
        self.load()
        return iter(sorted(self._known))

    def __len__(self) -> int:
        self.load()
        return len(self._known)

    def __repr__(self) -> str:
        return f"DISPATCHERS({', '.join(self)})"


#: Every registered dispatcher by op name (``"selective_scan"``, ``"causal_conv1d"``,
#: ``"vandermonde"``, ``"cauchy"``, ...): a read-only mapping that imports :data:`FAMILIES` when
#: first read.
DISPATCHERS: Mapping[str, Dispatcher] = _Registry()
_REGISTRY: _Registry = DISPATCHERS  # type: ignore[assignment]


def dispatcher(name: str) -> Dispatcher:
    """The registered dispatcher of op ``name`` (or of the public function ``name``, e.g.
    ``"vandermonde_kernel"``); a ValueError suggesting the closest names otherwise."""
    if name in DISPATCHERS:
        return DISPATCHERS[name]
    by_function = {d.function: d for d in DISPATCHERS.values()}
    if name in by_function:
        return by_function[name]
    known = sorted({*DISPATCHERS, *by_function})
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(f"no dispatcher for the op {name!r}{hint} (registered: {', '.join(DISPATCHERS)})")
