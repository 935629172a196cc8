"""Timing and peak-memory mechanics shared by the benchmarks.

Timing: a callable is run ``warmup`` times untimed (allocator warm-up, lazy initialisation such as
optimiser state or cached kernels), then ``batches`` times, each timed with ``time.perf_counter``
between device synchronisations. The figures are wall-clock seconds per call.

Peak memory (:class:`PeakMemory`) is the increase over the memory in use just before the measured
calls, i.e. what running them needs on top of the model (and data) already in memory:

- CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus
  ``memory_allocated`` at the start (bytes held by live tensors; the caching allocator's reserve is
  not counted).
- CPU on Linux: the peak resident set size of the process during the calls minus its resident set
  size at the start. The kernel's high-water mark (``VmHWM``, which ``getrusage(...).ru_maxrss``
  also reads) is reset at the start by writing ``5`` to ``/proc/self/clear_refs``, so the peak
  belongs to the measured calls only, not to imports or earlier measurements.
- CPU elsewhere (no ``clear_refs``): ``ru_maxrss`` after the calls minus ``ru_maxrss`` before them;
  this is 0 when the calls never exceed an earlier high-water mark. :attr:`PeakMemory.method` says
  which method was used, and it is reported with the figures.

Resident memory also holds what the allocator keeps after earlier frees; before the baseline is
read, freed heap memory is returned to the OS (``gc.collect`` and glibc's ``malloc_trim(0)``,
when available), so that the baseline counts live memory. CPU figures remain coarser than CUDA
ones (page granularity, allocator caching during the calls); running each measurement in a fresh
process (:func:`run_isolated`) makes them comparable across models: every model starts from the
same empty process.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from longrange.errors import ConfigError

#: Precision names accepted by the benchmarks: the parameter/input dtype and an autocast dtype.
PRECISIONS: dict[str, tuple[torch.dtype, torch.dtype | None]] = {
    "float32": (torch.float32, None),
    "float64": (torch.float64, None),
    "bf16-mixed": (torch.float32, torch.bfloat16),
    "fp16-mixed": (torch.float32, torch.float16),
}

_MB = 1024.0 * 1024.0


def resolve_device(name: str | None) -> torch.device:
    """``None`` or "auto" -> CUDA when available, else CPU; otherwise the named device, checked."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise ConfigError(f"--device {name!r} is not a device name (expected e.g. cpu, cuda, cuda:1)") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name!r}: CUDA is not available on this machine")
    return device


def resolve_precision(name: str, device: torch.device) -> tuple[torch.dtype, torch.dtype | None]:
    """(parameter dtype, autocast dtype or None) for a precision name."""
    if name not in PRECISIONS:
        raise ConfigError(f"--precision {name!r} is unknown; expected one of {', '.join(PRECISIONS)}")
    if name == "fp16-mixed" and device.type != "cuda":
        raise ConfigError("--precision fp16-mixed needs a CUDA device; use bf16-mixed on CPU")
    return PRECISIONS[name]


@contextmanager
def autocast_for(device: torch.device, autocast_dtype: torch.dtype | None) -> Iterator[None]:
    if autocast_dtype is None:
        yield
    else:
        with torch.autocast(device_type=device.type, dtype=autocast_dtype):
            yield


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` torch threads (None: leave as is), restoring the previous number after."""
    if n is None:
        yield
        return
    if n < 1:
        raise ConfigError(f"--threads must be positive, got {n}")
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def check_scan_impl(impl: str) -> None:
    """``--scan-impl`` must name an implementation of :func:`longrange.ops.scan.selective_scan`."""
    from longrange.ops.scan import IMPLS

    if impl not in IMPLS:
        raise ConfigError(f"--scan-impl {impl!r} is unknown; expected one of {', '.join(IMPLS)}")


@contextmanager
def scan_impl(impl: str, device: str | None) -> Iterator[str]:
    """Run with ``impl`` as the selective scan's default implementation; yields the implementation
    that runs on ``device`` (``"auto"`` resolved), which the rows record."""
    from longrange.ops.scan import auto_impl, default_impl

    check_scan_impl(impl)
    resolved = auto_impl(resolve_device(device)) if impl == "auto" else impl
    if resolved == "numba":  # load the compiled kernels before any memory baseline
        from longrange.ops.scan.numba import warm_up

        warm_up()
    from longrange.ops import conv
    from longrange.ops.conv import numba as conv_numba

    if conv.auto_impl(resolve_device(device)) == "numba":  # the Mamba blocks' convolution
        conv_numba.warm_up()
    with default_impl(impl):
        yield resolved


#: Choices of ``--ssm-kernel-impl``: an implementation of the SSM-kernel products
#: (:mod:`longrange.ops.ssm_kernels`); ``pykeops`` exists for the Cauchy sum (S4) only, the
#: Vandermonde product (S4D, DLR) then runs ``auto``.
SSM_KERNEL_IMPLS = ("auto", "ref", "chunked", "numba", "triton", "pykeops")


def check_ssm_kernel_impl(impl: str) -> None:
    """``--ssm-kernel-impl`` must name an implementation of the SSM-kernel products."""
    if impl not in SSM_KERNEL_IMPLS:
        raise ConfigError(f"--ssm-kernel-impl {impl!r} is unknown; expected one of {', '.join(SSM_KERNEL_IMPLS)}")


@contextmanager
def ssm_kernel_impl(impl: str, device: str | None) -> Iterator[str]:
    """Run with ``impl`` as the default implementation of the Vandermonde and Cauchy products of
    the S4D, DLR and S4 kernels; yields what runs on ``device`` ("auto" resolved), e.g. ``"numba"``,
    or ``"vandermonde auto (numba), cauchy pykeops"`` when the two ops differ."""
    from longrange.ops import ssm_kernels

    check_ssm_kernel_impl(impl)
    dev = resolve_device(device)
    chosen = {op: impl if impl in ssm_kernels.IMPLS[op] or impl == "auto" else "auto" for op in ssm_kernels.OPS}
    resolved = {op: ssm_kernels.auto_impl(op, dev) if choice == "auto" else choice for op, choice in chosen.items()}
    if "numba" in resolved.values():  # load the compiled kernels before any memory baseline
        from longrange.ops.ssm_kernels.numba import warm_up

        warm_up()
    if len(set(resolved.values())) == 1:
        label = next(iter(resolved.values()))
    else:
        label = ", ".join(
            f"{op} {chosen[op]}" + (f" ({resolved[op]})" if chosen[op] == "auto" else "") for op in ssm_kernels.OPS
        )
    previous = {op: ssm_kernels.set_default_impl(op, choice) for op, choice in chosen.items()}
    try:
        yield label
    finally:
        for op, value in previous.items():
            ssm_kernels.set_default_impl(op, value)


@dataclass
class Measurement:
    """What every measurement of ``longrange bench`` shares: the batch, the untimed and timed calls,
    the device, the seed, the threads and the kernels. :class:`~longrange.bench.models.Workload`
    (the model table) and :class:`~longrange.bench.scaling.ScalingSettings` (scaling with length)
    add their own fields and checks."""

    batch_size: int = 1
    warmup: int = 1
    batches: int = 3
    device: str = "auto"
    seed: int = 0
    #: torch threads in the measurement process; None: torch's default (see docs/performance.md).
    threads: int | None = 1
    #: The selective scan's implementation for S6 (``longrange.ops.scan.IMPLS``; "auto": the device's best).
    scan_impl: str = "auto"
    #: The implementation of the SSM-kernel products for S4, S4D and DLR (:data:`SSM_KERNEL_IMPLS`;
    #: "auto": the device's best).
    ssm_kernel_impl: str = "auto"

    #: The integer fields that must be positive, in the order they are checked (subclasses add theirs).
    POSITIVE: ClassVar[tuple[str, ...]] = ("batch_size", "batches")

    def validate(self) -> torch.device:
        """Check every field (an error names its command-line option); returns the resolved device."""
        check_scan_impl(self.scan_impl)
        check_ssm_kernel_impl(self.ssm_kernel_impl)
        for name in self.POSITIVE:
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ConfigError(f"--warmup must be >= 0, got {self.warmup}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads must be positive, got {self.threads}")
        return resolve_device(self.device)


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels so that wall-clock time covers the work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], Any], *, warmup: int, batches: int, device: torch.device) -> list[float]:
    """Seconds taken by each of ``batches`` calls of ``fn``, after ``warmup`` untimed calls."""
    if warmup < 0 or batches < 1:
        raise ConfigError(f"need warmup >= 0 and batches >= 1, got warmup={warmup}, batches={batches}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(batches):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def environment(device: torch.device | None = None) -> dict[str, Any]:
    """What the figures were measured on, saved with them."""
    import platform

    from longrange import __version__
    from longrange.train.denormals import flushing
    from longrange.train.environment import cpu_name

    env: dict[str, Any] = {
        "longrange": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        # the CPU's subnormal mode here, as in the measurement processes (train/denormals.py)
        "denormals": "flushed" if flushing() else "kept",
    }
    if device is not None and device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def _proc_status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_rss_high_water_mark() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _proc_status_kb("VmHWM") is not None


def _release_free_heap() -> None:
    """Return freed heap pages to the OS (glibc), so the baseline RSS holds only live memory."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _ru_maxrss_bytes() -> int:
    # Linux reports kilobytes, macOS bytes.
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


class PeakMemory:
    """Context manager measuring the peak memory increase of the code it wraps (see module doc).

    After the block: ``peak_bytes`` (int, >= 0), ``peak_mb`` and ``method`` (a short description).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_bytes = 0
        self.method = ""
        self._baseline = 0

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / _MB

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._baseline = torch.cuda.memory_allocated(self.device)
            self.method = "cuda max_memory_allocated - memory_allocated before"
        else:
            _release_free_heap()
            if _reset_rss_high_water_mark():
                self._baseline = (_proc_status_kb("VmRSS") or 0) * 1024
                self.method = "peak RSS (VmHWM after clear_refs) - RSS before"
            else:
                self._baseline = _ru_maxrss_bytes()
                self.method = "ru_maxrss after - ru_maxrss before"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        elif self.method.startswith("peak RSS"):
            peak = (_proc_status_kb("VmHWM") or 0) * 1024
        else:
            peak = _ru_maxrss_bytes()
        self.peak_bytes = max(0, peak - self._baseline)


def summarize_times(times: list[float]) -> dict[str, float]:
    """Mean (the thesis' figure), minimum and standard deviation of per-call seconds."""
    n = len(times)
    mean = sum(times) / n
    std = (sum((t - mean) ** 2 for t in times) / (n - 1)) ** 0.5 if n > 1 else 0.0
    return {"mean": mean, "min": min(times), "std": std}


def measure_train_and_infer(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    loss_fn: Callable[[torch.Tensor], torch.Tensor],
    *,
    warmup: int,
    batches: int,
    device: torch.device,
    autocast_dtype: torch.dtype | None = None,
    lr: float = 1e-3,
) -> dict[str, Any]:
    """Time and peak memory of inference and of training steps on one fixed batch.

    Inference: ``model.eval()``, forward under ``torch.no_grad()``. Training step: ``model.train()``,
    forward, ``loss_fn(outputs)``, backward, AdamW step, gradients set to None. Inference is
    measured first so that even the ``ru_maxrss`` fallback gives the training peak correctly.
    Returns ``{"infer": {...}, "train": {...}, "memory_method": str}`` where each part holds the
    per-batch seconds summary (:func:`summarize_times`) and ``peak_bytes``.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def infer() -> None:
        with torch.no_grad(), autocast_for(device, autocast_dtype):
            model(inputs)

    def train_step() -> None:
        with autocast_for(device, autocast_dtype):
            loss = loss_fn(model(inputs))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    result: dict[str, Any] = {}
    model.eval()
    with PeakMemory(device) as mem:
        times = time_calls(infer, warmup=warmup, batches=batches, device=device)
    result["infer"] = {**summarize_times(times), "peak_bytes": mem.peak_bytes}
    model.train()
    with PeakMemory(device) as mem:
        times = time_calls(train_step, warmup=warmup, batches=batches, device=device)
    result["train"] = {**summarize_times(times), "peak_bytes": mem.peak_bytes}
    result["memory_method"] = mem.method
    return result


# Running a measurement in a fresh process ---------------------------------------------------

#: Measurement functions may only be looked up in these packages (the child imports by name).
_ALLOWED_PREFIX = "longrange.bench."


def _resolve(target: str) -> Callable[..., Any]:
    module_name, _, func_name = target.partition(":")
    if not module_name.startswith(_ALLOWED_PREFIX) or not func_name:
        raise ConfigError(f"measurement target {target!r} must be 'longrange.bench.<module>:<function>'")
    return getattr(importlib.import_module(module_name), func_name)


class IsolatedRunError(RuntimeError):
    """A measurement process failed; the message holds the end of its error output."""


def run_isolated(target: str, kwargs: dict[str, Any], *, isolate: bool = True, timeout: float | None = None) -> Any:
    """Call ``target`` ("module:function" under ``longrange.bench``) with JSON-able ``kwargs``.

    With ``isolate`` the call runs in a fresh Python process (same interpreter and environment)
    and its JSON-able result is sent back; a crash there (e.g. killed for lack of memory) raises
    :class:`IsolatedRunError` here instead of ending this process. Without ``isolate`` it is a
    plain call.
    """
    if not isolate:
        return _resolve(target)(**kwargs)
    _resolve(target)  # fail early, in this process, on a bad target
    request = json.dumps({"target": target, "kwargs": kwargs})
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "longrange.bench.measure"],
            input=request,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    except subprocess.TimeoutExpired as err:
        raise IsolatedRunError(f"{target} did not finish within {timeout:.0f} s") from err
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-6:]) or "(no error output)"
        how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        raise IsolatedRunError(f"{target} failed in its measurement process ({how}):\n{tail}")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise IsolatedRunError(f"{target} printed no result")
    reply = json.loads(lines[-1])
    if "user_error" in reply:  # a bad option found in the child: the same clear error as in-process
        raise ConfigError(reply["user_error"])
    return reply["result"]


def _child_main() -> int:
    from longrange.errors import LongrangeError
    from longrange.train.denormals import flush_denormals

    flush_denormals("cpu")  # as training runs on a CPU, before any thread pool starts (train/denormals.py)
    request = json.loads(sys.stdin.read())
    try:
        reply = {"result": _resolve(request["target"])(**request["kwargs"])}
    except LongrangeError as err:
        reply = {"user_error": str(err)}
    sys.stdout.write("\n" + json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
