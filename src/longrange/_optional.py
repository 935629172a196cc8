"""Optional accelerated packages, imported in one place.

A kernel is reported only when its compiled part imports, not merely its Python wrapper:
``mamba-ssm`` can be installed without building its ``selective_scan_cuda`` extension (the
wrapper then imports, and the first call fails), and ``causal-conv1d`` likewise without
``causal_conv1d_cuda``. Each name below is ``None`` when the package or its compiled part is
missing or fails to import; callers then run the next-best implementation. ``pykeops`` is
reported when ``pykeops.torch`` imports and KeOps found a CUDA toolchain (its kernels are
compiled on first use, so a broken toolchain can still only show then). The CUDA kernels are
only used for CUDA tensors.

:func:`status` says, per package, what was found and why a kernel is not used (for
``longrange info``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from types import ModuleType
from typing import Any


def _try_import(name: str) -> tuple[ModuleType | None, str | None]:
    """(module, None) or (None, the reason it does not import)."""
    try:
        return importlib.import_module(name), None
    except Exception as err:  # ImportError, or a broken binary extension (OSError, RuntimeError)
        return None, f"{type(err).__name__}: {err}".strip()


def installed(name: str) -> bool:
    """Whether the top-level package ``name`` can be found (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # e.g. a module in sys.modules without a spec
        return sys.modules.get(name) is not None


def version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _kernel(package: str, extension: str, wrapper: str, attr: str) -> tuple[Any, dict[str, Any]]:
    """The function ``wrapper.attr`` if the compiled ``extension`` and the wrapper both import."""
    info: dict[str, Any] = {"installed": installed(package), "extension": extension}
    ext, ext_error = _try_import(extension)
    info["extension_imports"] = ext is not None
    fn = None
    if ext is None:
        info["reason"] = (
            f"compiled extension {extension} does not import ({ext_error})" if info["installed"] else "not installed"
        )
    else:
        mod, error = _try_import(wrapper)
        fn = getattr(mod, attr, None) if mod is not None else None
        if fn is None:
            info["reason"] = f"{wrapper}.{attr} does not import ({error})" if error else f"{wrapper} has no {attr}"
    info["usable"] = fn is not None
    return fn, info


def _keops() -> tuple[ModuleType | None, dict[str, Any]]:
    info: dict[str, Any] = {"installed": installed("pykeops"), "extension": "KeOps CUDA JIT"}
    mod, error = _try_import("pykeops.torch")
    usable = False
    if mod is None:
        info["reason"] = f"pykeops.torch does not import ({error})" if info["installed"] else "not installed"
    else:
        import pykeops

        config = getattr(pykeops, "config", None)
        gpu = getattr(config, "gpu_available", getattr(pykeops, "gpu_available", False))
        usable = bool(gpu)
        if not usable:
            info["reason"] = "KeOps found no CUDA toolchain (pykeops.config.gpu_available is False)"
    info["extension_imports"] = usable
    info["usable"] = usable
    return (mod if usable else None), info


selective_scan_cuda_fn, _mamba_info = _kernel(
    "mamba_ssm", "selective_scan_cuda", "mamba_ssm.ops.selective_scan_interface", "selective_scan_fn"
)
causal_conv1d_cuda_fn, _causal_conv_info = _kernel(
    "causal_conv1d", "causal_conv1d_cuda", "causal_conv1d", "causal_conv1d_fn"
)
pykeops, _keops_info = _keops()

_STATUS = {
    "mamba_ssm": {"distribution": "mamba-ssm", **_mamba_info},
    "causal_conv1d": {"distribution": "causal-conv1d", **_causal_conv_info},
    "pykeops": {"distribution": "pykeops", **_keops_info},
}


def available() -> dict[str, bool]:
    """Which optional accelerations are usable (their compiled parts import)."""
    return {
        "mamba_ssm": selective_scan_cuda_fn is not None,
        "causal_conv1d": causal_conv1d_cuda_fn is not None,
        "pykeops": pykeops is not None,
    }


def status() -> dict[str, dict[str, Any]]:
    """Per optional package: ``installed``, ``version``, ``extension`` (the compiled part),
    ``extension_imports``, ``usable``, and ``reason`` when not usable."""
    return {name: {**info, "version": version(info["distribution"])} for name, info in _STATUS.items()}
