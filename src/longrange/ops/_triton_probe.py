"""A kernel that loops over a scalar argument, as the toolkit's Triton kernels do (the scan over its
chunks, the SSM kernels over their tiles), run once in Triton's interpreter by
:func:`longrange.ops._lazy_kernels.interpreter_problem`. Imported only when triton is."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


def _count(out_ptr, n):
    acc = tl.full((1,), 0.0, tl.float32)  # builtins only, as the kernels (see scan/_triton_kernels.py)
    for _ in range(n):
        acc += 1.0
    tl.store(out_ptr + tl.arange(0, 1), acc)


def run(n: int = 3) -> float:
    """The loop's count of ``n`` computed by the interpreter (``n`` when it works)."""
    out = torch.zeros(1)
    InterpretedFunction(_count)[(1,)](out, n)
    return float(out[0])


__all__ = ["run", "triton"]
