"""Where and how a run ran: its device, its precision, the versions of the kernels' libraries, the
implementations its ops dispatched to, and the deterministic mode.

    describe_device(torch.device("cuda", 0), count=4)
        # {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "count": 4, "capability": "9.0"}
    describe_precision(torch.bfloat16, model)      # {"autocast": "bfloat16", "params": "float32"}
    library_versions()                              # {"numba": "0.61.2", "triton": "3.4.0"} (those present)

    kernels = KernelRecord()       # the trainer's: ops.used reset when training starts,
    kernels.start()                # read when it ends, merged with earlier (resumed) segments
    kernels.result()               # {"selective_scan": "numba", "causal_conv1d": "numba"}

    restore = set_deterministic(True)   # torch.use_deterministic_algorithms, cuDNN, cuBLAS workspace
    ...
    restore()                           # PyTorch's settings as they were

These are what a run records (``train/loop.py`` returns them with :meth:`Trainer.fit`'s result;
``experiment/record.py`` writes them into ``config.yaml``'s record and ``summary.json``), so that two
runs that ran on different devices, in another precision or with other kernels can be told apart
from their records rather than from a prediction.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from longrange.ops import used

__all__ = [
    "CUBLAS_WORKSPACE",
    "KernelRecord",
    "cpu_name",
    "describe_device",
    "describe_precision",
    "dtype_name",
    "library_versions",
    "merge_denormals",
    "merge_kernels",
    "prepare_deterministic",
    "set_deterministic",
]

#: The cuBLAS workspace setting that makes cuBLAS deterministic (NVIDIA's documentation; PyTorch
#: checks for it when deterministic algorithms are on).
CUBLAS_WORKSPACE = ":4096:8"


# ----------------------------------------------------------------------------- device and precision
def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what :mod:`platform` knows."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return name or "unknown"


def describe_device(device: torch.device | str, count: int = 1) -> dict[str, Any]:
    """``{type, name, count}`` of the device a run trains on (``count``: devices used, one per
    process), with the compute capability on CUDA, and on the CPU PyTorch's thread count and whether
    subnormal floats are flushed to zero (``"flushed"`` or ``"kept"``, train/denormals.py)."""
    device = torch.device(device)
    out: dict[str, Any] = {"type": device.type, "name": device.type, "count": int(count)}
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        out.update(name=props.name, capability=f"{props.major}.{props.minor}")
    elif device.type == "cpu":
        from longrange.train.denormals import mode

        out.update(name=cpu_name(), threads=torch.get_num_threads(), denormals=mode(device))
    return out


def dtype_name(dtype: torch.dtype | None) -> str | None:
    """``torch.bfloat16`` -> ``"bfloat16"``; None stays None."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


def describe_precision(autocast: torch.dtype | None, model: nn.Module) -> dict[str, Any]:
    """``{autocast, params}``: the autocast dtype (None: no autocast) and the parameters' dtype
    (several joined by ``+``, e.g. ``"float32+complex64"``)."""
    dtypes = sorted({dtype_name(p.dtype) for p in model.parameters()})
    return {"autocast": dtype_name(autocast), "params": "+".join(dtypes) if dtypes else None}


def library_versions() -> dict[str, str]:
    """The versions of the kernels' libraries that are present: triton and numba (installed), CUDA
    (PyTorch's build) and cuDNN (when PyTorch can use it)."""
    from longrange import _optional  # imported when asked: it looks for the optional GPU packages

    out = {name: v for name in ("triton", "numba") if (v := _optional.version(name)) is not None}
    if torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)
    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # a CUDA build on a machine whose cuDNN does not load
        cudnn = None
    if cudnn:
        out["cudnn"] = str(cudnn)
    return out


# ----------------------------------------------------------------------------- kernels
def merge_kernels(*records: Mapping[str, str] | None) -> dict[str, str]:
    """``{op: implementation}`` records merged: an op that ran several implementations (in one
    record, ``"numba+chunked"``, or across records) lists each once, sorted, joined by ``+``."""
    impls: dict[str, set[str]] = {}
    for record in records:
        for op, impl in (record or {}).items():
            impls.setdefault(str(op), set()).update(str(impl).split("+"))
    return {op: "+".join(sorted(names)) for op, names in sorted(impls.items())}


class KernelRecord:
    """The implementations a run's ops ran (from :mod:`longrange.ops.used`): this segment's, read
    from the dispatch record since :meth:`start`, and those of earlier segments of a resumed run
    (saved in its checkpoints)."""

    def __init__(self) -> None:
        self.earlier: dict[str, str] = {}

    def start(self) -> None:
        """Training starts: forget what ran before in this process."""
        used.reset()

    def result(self) -> dict[str, str]:
        return merge_kernels(self.earlier, used.kernels())

    def state_dict(self) -> dict[str, str]:
        return self.result()

    def load_state_dict(self, state: Mapping[str, str] | None) -> None:
        self.earlier = merge_kernels(state)


def merge_denormals(device: dict[str, Any], earlier: Mapping[str, Any] | None) -> dict[str, Any]:
    """This segment's device record (:func:`describe_device`) for a run resumed from a checkpoint whose
    segments trained on ``earlier`` (its saved record; None for checkpoints that saved none): the
    subnormal mode becomes ``"mixed"`` where a segment trained in the other one, so that the record
    never claims one mode for a run that trained in both. A checkpoint without a recorded mode was
    written before training flushed subnormals: its segments kept them (as the report reads a
    record without the mode)."""
    before = (earlier or {}).get("denormals", "kept")
    if device.get("denormals") in (None, before):
        return device
    return {**device, "denormals": "mixed"}


# ----------------------------------------------------------------------------- determinism
def prepare_deterministic(enabled: bool) -> None:
    """Set ``CUBLAS_WORKSPACE_CONFIG`` to cuBLAS's deterministic workspace when ``enabled`` and it is
    unset. cuBLAS reads it when it first runs, so this comes before any CUDA work of the run."""
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)


def set_deterministic(enabled: bool) -> Callable[[], None]:
    """Turn on PyTorch's deterministic algorithms, cuDNN's deterministic mode without benchmarking,
    and (when unset) cuBLAS's deterministic workspace ``CUBLAS_WORKSPACE_CONFIG`` (read when cuBLAS
    first runs: set it before CUDA work starts). Returns a function that restores PyTorch's
    settings as they were; the environment variable stays, as cuBLAS has read it. Nothing changes
    when ``enabled`` is False."""
    if not enabled:
        return lambda: None
    prepare_deterministic(True)
    cudnn = torch.backends.cudnn
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn.deterministic,
        cudnn.benchmark,
    )
    torch.use_deterministic_algorithms(True)
    cudnn.deterministic, cudnn.benchmark = True, False

    def restore() -> None:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        cudnn.deterministic, cudnn.benchmark = before[2], before[3]

    return restore
