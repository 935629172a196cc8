"""Kernel modules (numba, Triton) imported on first use: whether they can run, and why not.

The numba kernels run on PyTorch's number of threads (:func:`use_threads`); the Triton kernels run
on CUDA tensors, or on CPU tensors in Triton's interpreter when ``TRITON_INTERPRET=1``
(:func:`triton_runs_on`).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import torch


def mark_constant(fn):
    """``torch.compiler.assume_constant_result(fn)`` without importing Dynamo, which that function
    does first (1.6 s here, paid by every command that imports the layers, e.g. ``longrange params``):
    the mark Dynamo reads when it traces a call of ``fn``, the attribute that decorator sets
    (``tests/ops/test_custom_ops.py`` checks that it is the same)."""
    fn._dynamo_marked_constant = True
    return fn


class LazyKernels:
    """The kernel module ``name``, imported once on first use; where it cannot be imported (numba
    or triton not installed, or a version mismatch), :meth:`load` gives None and :attr:`error`
    says why."""

    def __init__(self, name: str):
        self.name = name
        self.module: ModuleType | None = None
        self.error: str | None = None

        # Under torch.compile: imported once while tracing, a constant. A function of no arguments
        # (PyTorch 2.11 could not take a bound method's ``self`` as a constant: seen, tests/ops/test_custom_ops.py).
        def load() -> ModuleType | None:
            return self._load()

        self.load = mark_constant(load)

    def _load(self) -> ModuleType | None:
        if self.module is None and self.error is None:
            try:
                self.module = importlib.import_module(self.name)
            except Exception as err:  # ImportError, or a numba/numpy version mismatch
                self.error = f"{type(err).__name__}: {err}"
        return self.module

    def reason(self) -> str | None:
        """Why the kernels cannot be used (the import error), or None when they can."""
        self.load()
        return self.error

    def require(self, op: str, package: str = "numba") -> ModuleType:
        """The module, for ``op``'s implementation ``package``; where it cannot be imported, a
        RuntimeError naming ``op`` and the import error."""
        module = self.load()
        if module is None:
            raise RuntimeError(
                f"{op}: impl={package!r} needs the {package} package, which does not import ({self.error})"
            )
        return module


def rows_per_task(rows: int, width: int, threads: int, elements: int) -> int:
    """Rows per task of a row-wise kernel: about ``elements`` features (fewer cost more to hand out
    than they compute), and a task per thread at least."""
    per = max(1, elements // max(width, 1))
    return max(1, min(per, -(-rows // max(threads, 1))))


def use_threads(kernels: ModuleType) -> int:
    """Run ``kernels`` on ``torch.get_num_threads()`` threads; returns the number used.

    numba's OpenMP layer can share the OpenMP runtime of PyTorch, and starting it sets that
    runtime's thread count to numba's maximum; PyTorch's setting is put back.
    """
    wanted = torch.get_num_threads()
    used = kernels.set_threads(wanted)
    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)
    return used


def divisors(n: int, largest: int, smallest: int = 1) -> list[int]:
    """The divisors of ``n`` from ``largest`` down to ``smallest``, widest first: the blocks of
    channels a kernel's tasks can take."""
    return [w for w in range(min(n, largest), smallest - 1, -1) if n % w == 0]


def block_width(b: int, d: int, widths: list[int], tasks: int) -> int:
    """Channels per task: the widest of ``widths`` (widest first) that splits ``b`` batch elements
    of ``d`` channels into ``tasks`` tasks at least; the narrowest where none does (1 where
    ``widths`` is empty)."""
    return next((w for w in widths if b * (d // w) >= tasks), widths[-1] if widths else 1)


def triton_interpret_requested() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's interpreter (read now, not at import)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def triton_runs_on(device: torch.device | str) -> bool:
    """Whether Triton kernels can run on tensors of ``device`` (given that triton imports): a CUDA
    device with CUDA present, or a CPU device with ``TRITON_INTERPRET=1`` where the interpreter
    runs the toolkit's kernels (:func:`interpreter_problem`)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available()
    return device.type == "cpu" and triton_interpret_requested() and interpreter_problem() is None


def interpreter_reason(device: torch.device | str) -> str | None:
    """:func:`interpreter_problem` where it is why Triton cannot run on ``device`` (a CPU device with
    ``TRITON_INTERPRET=1``), else None."""
    if torch.device(device).type == "cpu" and triton_interpret_requested():
        return interpreter_problem()
    return None


_interpreter: list[str | None] = []  # the probe's answer, once asked


def interpreter_problem() -> str | None:
    """Why Triton's interpreter cannot run the toolkit's kernels here, or None when it can; probed
    once per process with a kernel that loops over a scalar argument (``ops/_triton_probe.py``).
    Triton 3.6's interpreter with NumPy 2.4 or later fails there ("only 0-dimensional arrays can be
    converted to Python scalars"; seen on a GPU machine, where the compiled kernels ran), so that on
    such a machine the kernels run on CUDA tensors only."""
    if not _interpreter:
        try:
            from longrange.ops import _triton_probe

            count = _triton_probe.run(3)
            _interpreter.append(None if count == 3 else f"a loop of 3 counted {count}")
        except Exception as err:  # the interpreter's own errors, or triton not importing
            _interpreter.append(f"{type(err).__name__}: {str(err)[:200]}")
        if _interpreter[0] is not None:
            _interpreter[0] = f"Triton's interpreter cannot run these kernels here ({_versions()}): {_interpreter[0]}"
    return _interpreter[0]


def _versions() -> str:
    from longrange import _optional

    return f"triton {_optional.version('triton')}, numpy {_optional.version('numpy')}"
