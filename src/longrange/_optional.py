"""Optional accelerated packages, imported in one place.

Each name is ``None`` when the package is missing or fails to import; callers fall back to the
plain-PyTorch implementation. The CUDA kernels are only used for CUDA tensors.
"""
from __future__ import annotations

import importlib
from types import ModuleType


def _try_import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except Exception:  # ImportError, or a broken binary extension (OSError, RuntimeError)
        return None


_mamba_scan = _try_import("mamba_ssm.ops.selective_scan_interface")
selective_scan_cuda_fn = getattr(_mamba_scan, "selective_scan_fn", None) if _mamba_scan else None

_causal_conv = _try_import("causal_conv1d")
causal_conv1d_cuda_fn = getattr(_causal_conv, "causal_conv1d_fn", None) if _causal_conv else None

pykeops = _try_import("pykeops.torch")


def available() -> dict[str, bool]:
    """Which optional accelerations were found (for reports and `longrange info`)."""
    return {
        "mamba_ssm": selective_scan_cuda_fn is not None,
        "causal_conv1d": causal_conv1d_cuda_fn is not None,
        "pykeops": pykeops is not None,
    }
