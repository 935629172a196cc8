"""``longrange check``: every implementation available on this machine against its float64
reference, and every primitive layer's recurrent mode against its parallel mode.

    longrange check [--device cpu|cuda|all] [--dtype float32|bfloat16|all] [--quick]

The tests hold every fast path to its reference on the machines the project is tested on; this
command does the same on the user's machine, with the user's GPU, Triton, numba and compiled
extensions. It runs the check cases (:class:`~longrange.ops.checking.Case`) of every family in
:data:`FAMILIES` (the ops' in :mod:`longrange.ops.check_cases`, the layers' in
:mod:`longrange.layers.check_cases`), each a comparison at one small shape, and prints one row per
(op, implementation, device, dtype): the largest relative error over its cases (see
:func:`~longrange.ops.checking.compare`), the tolerance, and pass or FAIL. ``--quick`` runs the
first case of each row only. Any failure, or an exception raised by an implementation, or a
dispatcher that reports (:mod:`longrange.ops.used`) another implementation than the one asked for,
makes the exit code 1 and prints a line saying which setting avoids the failing implementation.
The implementations come from the ops' dispatchers (the registry of :mod:`longrange.ops.dispatch`);
a registered implementation that can run here but has no check case is named after the table
(:func:`unchecked`).

On CUDA, float32 runs without TF32 (PyTorch's ``allow_tf32`` settings are turned off during the
check and restored), so that the float32 tolerance applies; TF32 is a precision choice, not a
kernel's error.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from longrange.layers.check_cases import layer_cases
from longrange.ops import used
from longrange.ops.check_cases import OP_FAMILIES
from longrange.ops.checking import REPORT, Case

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

#: The families of checks, each ``(device, dtype) -> cases``; a new op family is one more function.
FAMILIES: list[Callable[[str, torch.dtype], list[Case]]] = [*OP_FAMILIES, layer_cases]


@dataclass
class Row:
    """The table's row for one (op, implementation, device, dtype): the worst of its cases."""

    op: str
    impl: str
    label: str
    device: str
    dtype: torch.dtype
    tol: float
    error: float = 0.0
    failures: list[str] = field(default_factory=list)
    avoid: Callable[[list[str]], str] = lambda passed: REPORT

    @property
    def passed(self) -> bool:
        return not self.failures


def unchecked(devices: Sequence[str]) -> list[tuple[str, str, str]]:
    """``(op, implementation, device)`` for every implementation of a registered dispatcher
    (:data:`longrange.ops.dispatch.DISPATCHERS`) that runs on one of ``devices`` here, its
    reference aside, and that no case of :data:`FAMILIES` checks, in any dtype (a case checks the
    ``(op, implementation)`` of its ``record``)."""
    from longrange.ops.dispatch import DISPATCHERS

    out = []
    for device in devices:
        covered = {case.record for case in cases([device], list(DTYPES.values())) if case.record is not None}
        out += [
            (op, impl, device)
            for op, d in DISPATCHERS.items()
            for impl in d.available_impls(device)
            if impl != d.reference and (op, impl) not in covered
        ]
    return out


def cases(devices: Sequence[str], dtypes: Sequence[torch.dtype], quick: bool = False) -> list[Case]:
    """Every case of every family for the devices and dtypes; with ``quick``, the first case of
    each (op, implementation, device, dtype) only."""
    out = [case for device in devices for dtype in dtypes for family in FAMILIES for case in family(device, dtype)]
    if not quick:
        return out
    seen: set[tuple] = set()
    first = []
    for case in out:
        key = (case.op, case.label, case.device, case.dtype)
        if key not in seen:
            seen.add(key)
            first.append(case)
    return first


@contextmanager
def no_tf32() -> Iterator[None]:
    """float32 matrix products and convolutions in full float32 on CUDA (no TF32) inside the block."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@contextmanager
def environment(values: dict[str, str | None]) -> Iterator[None]:
    """Set (or, for None, unset) environment variables inside the block; restored afterwards."""

    def apply(settings: dict[str, str | None]) -> None:
        for k, v in settings.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    saved = {k: os.environ.get(k) for k in values}
    try:
        apply(values)
        yield
    finally:
        apply(saved)


def _new_calls(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, set[str]]:
    """The implementations each op ran between two readings of :func:`longrange.ops.used.calls`."""
    return {
        op: {impl for impl, n in impls.items() if n > before.get(op, {}).get(impl, 0)} for op, impls in after.items()
    }


def run_case(case: Case) -> tuple[float, str | None]:
    """(error, None) or (inf, why it failed to run); checks what the dispatcher reported."""
    before = used.calls()
    with environment(case.env):
        try:
            error = case.run()
        except Exception as err:  # a kernel that fails to compile, load or run is a failure of the check
            return math.inf, f"raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")
    if case.record is not None:
        op, impl = case.record
        ran = _new_calls(before, used.calls()).get(op, set())
        if ran != {impl}:
            return error, f"asked for impl={impl!r}, the dispatcher reports {sorted(ran) or 'nothing'}"
    return error, None


def run_cases(all_cases: Sequence[Case]) -> list[Row]:
    """Run every case; one :class:`Row` per (op, implementation, device, dtype), in order."""
    rows: dict[tuple, Row] = {}
    for case in all_cases:
        key = (case.op, case.label, case.device, case.dtype)
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row(case.op, case.impl, case.label, case.device, case.dtype, case.tol, avoid=case.avoid)
        error, problem = run_case(case)
        row.error = max(row.error, error) if not math.isnan(error) else math.inf
        row.tol = max(row.tol, case.tol)
        if problem is not None:
            row.failures.append(f"{case.shape}: {problem}")
        elif not error <= case.tol:
            row.failures.append(f"{case.shape}: error {error:.2e} > tolerance {case.tol:.0e}")
    return list(rows.values())


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def format_table(rows: Sequence[Row]) -> str:
    """The table: op, implementation, device, dtype, max relative error, tolerance, result."""
    header = ["op", "implementation", "device", "dtype", "max rel. error", "tolerance", "result"]
    body = [
        [
            r.op,
            r.label,
            r.device,
            _dtype_name(r.dtype),
            "-" if math.isinf(r.error) else f"{r.error:.1e}",
            f"{r.tol:.0e}",
            "pass" if r.passed else "FAIL",
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(b) for b in body)])


def format_failures(rows: Sequence[Row]) -> list[str]:
    """For each failing row: what failed, and the setting that avoids it."""
    lines = []
    for r in rows:
        if r.passed:
            continue
        passed = [o.impl for o in rows if o.passed and (o.op, o.device, o.dtype) == (r.op, r.device, r.dtype)]
        where = f"{r.op} {r.label} on {r.device} in {_dtype_name(r.dtype)}"
        lines.append(f"FAIL {where}:")
        lines += [f"  {failure}" for failure in r.failures]
        lines.append(f"  -> {r.avoid([p for p in passed if p != r.impl])}")
    return lines


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


def _devices(choice: str) -> list[str]:
    if choice == "cpu":
        return ["cpu"]
    if choice == "cuda" and not torch.cuda.is_available():
        build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ValueError(
            f"--device cuda: CUDA is not available here (torch {torch.__version__}, {build}); use --device cpu"
        )
    if choice == "cuda":
        return ["cuda"]
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def check(devices: Sequence[str], dtypes: Sequence[torch.dtype], quick: bool = False, out=None) -> int:
    """Run the checks, print the table (and the failures) to ``out``; 0 if all passed, else 1."""
    out = out or sys.stdout
    start = time.perf_counter()
    with no_tf32():
        rows = run_cases(cases(devices, dtypes, quick))
    print(format_table(rows), file=out)
    failures = format_failures(rows)
    missing = unchecked(devices)
    seconds = time.perf_counter() - start
    n_failed = sum(not r.passed for r in rows)
    print(file=out)
    if missing:
        print(
            "not checked (no check case in longrange.ops.check_cases): "
            + ", ".join(f"{op} {impl} on {device}" for op, impl, device in missing)
            + "\n",
            file=out,
        )
    if failures:
        print("\n".join(failures), file=out)
        print(f"\n{n_failed} of {len(rows)} checks FAILED ({seconds:.0f} s)", file=out)
        return 1
    print(f"all {len(rows)} checks passed ({seconds:.0f} s)", file=out)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "check",
        help="check every implementation available here against its float64 reference, and step == forward",
        description="Compare the outputs and gradients of every implementation that can run on this machine "
        "(numba, chunked and Triton scans, mamba-ssm and causal-conv1d kernels, pykeops, ...) with their float64 "
        "references at a few small shapes, and every primitive layer's step mode with its forward. Prints a table; "
        "exits with 1 if anything fails, saying which setting avoids the failing implementation.",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda", "all"),
        default="all",
        help="the devices to check (default all: the CPU and CUDA when available)",
    )
    p.add_argument("--dtype", choices=(*DTYPES, "all"), default="all", help="the dtypes to check (default all)")
    p.add_argument("--quick", action="store_true", help="one shape per op and implementation instead of several")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        devices = _devices(args.device)
    except ValueError as err:
        print(f"longrange check: error: {err}", file=sys.stderr)
        return 2
    dtypes = list(DTYPES.values()) if args.dtype == "all" else [DTYPES[args.dtype]]
    return check(devices, dtypes, quick=args.quick)
