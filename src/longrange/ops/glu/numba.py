"""SwiGLU fused into compiled loops for CPUs (numba; ``impl="numba"`` of
:func:`longrange.ops.glu.swiglu`).

PyTorch's formula splits the projection into two views, runs SiLU and the product forward (two
passes, a stored SiLU) and backward the product's two gradients, SiLU's backward and a
concatenation of the halves' gradients (four passes over tensors of a few megabytes at the
synthetic studies' sizes). The kernels (:mod:`longrange.ops.glu._numba_kernels`) read each row of
the projection once forward and once backward, recomputing the gate's sigmoid, and write the
projection's gradient whole; the forward stores nothing but its input.

The operator is ``torch.ops.longrange.swiglu_numba`` (its backward ``swiglu_numba_backward``;
see :mod:`longrange.ops.custom_ops`). It computes in float64 for float64 inputs and in float32 for
the others (bfloat16 and float16 are converted, and the output converted back). Without numba
(:func:`numba_available` False) ``impl="auto"`` runs the formula instead. Elementwise with no
sums, so its backward is deterministic.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops._lazy_kernels import LazyKernels, rows_per_task
from longrange.ops._lazy_kernels import use_threads as _use_threads
from longrange.ops.custom_ops import autograd_and_eager, eager, qualname, register_flops

#: The dtypes the kernels compute in (other floating inputs are computed in float32).
DTYPES = (torch.float32, torch.float64)
#: Output features per task at least (rows of a task times their width): small tasks cost more to
#: hand out than they compute.
TASK_ELEMENTS = 1 << 15

_KERNELS = LazyKernels("longrange.ops.glu._numba_kernels")


def numba_available() -> bool:
    """Whether numba imports, i.e. whether :func:`swiglu_numba` can run."""
    return _KERNELS.load() is not None


def unavailable_reason() -> str | None:
    """Why numba cannot be used (the import error), or None when it can."""
    return _KERNELS.reason()


def _kernels():
    return _KERNELS.require("swiglu")


def _rows_per_task(rows: int, width: int, threads: int) -> int:
    """Rows per task: about :data:`TASK_ELEMENTS` output features, and a task per thread at least."""
    return rows_per_task(rows, width, threads, TASK_ELEMENTS)


def glu_flops(rows: int, width: int, backward: bool = False) -> int:
    """FLOPs of the kernels (the convention of :mod:`longrange.ops.custom_ops`) per output feature:
    forward the gate's sigmoid ``1 / (1 + exp(-g))`` (3) and the two products (2); the backward
    recomputes the sigmoid (3), then up's gradient (2) and the gate's (6)."""
    return rows * width * (11 if backward else 5)


@torch.library.custom_op(qualname("swiglu_numba"), mutates_args=(), device_types="cpu")
def _glu_op(h: Tensor) -> Tensor:
    """h (R, 2H) contiguous -> y (R, H)."""
    k = _kernels()
    R, H = h.shape[0], h.shape[1] // 2
    y = h.new_empty(R, H)
    k.glu_forward(h.detach().numpy(), _rows_per_task(R, H, _use_threads(k)), y.numpy())
    return y


@_glu_op.register_fake
def _(h):
    return h.new_empty(h.shape[0], h.shape[1] // 2)


@torch.library.custom_op(qualname("swiglu_numba_backward"), mutates_args=(), device_types="cpu")
def _glu_backward_op(h: Tensor, gy: Tensor) -> Tensor:
    """The gradient of :func:`_glu_op` with respect to ``h`` (R, 2H) for the output gradient ``gy``."""
    k = _kernels()
    R, H = gy.shape
    gh = torch.empty_like(h)
    k.glu_backward(
        h.detach().numpy(), gy.contiguous().detach().numpy(), _rows_per_task(R, H, _use_threads(k)), gh.numpy()
    )
    return gh


@_glu_backward_op.register_fake
def _(h, gy):
    return torch.empty_like(h)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])


def _backward(ctx, gy: Tensor) -> Tensor:
    (h,) = ctx.saved_tensors
    return _glu_backward_op_eager(h, gy)


_glu_op_eager = autograd_and_eager(_glu_op, _backward, _setup_context)
_glu_backward_op_eager = eager(_glu_backward_op)
register_flops(_glu_op, lambda h: glu_flops(h[0], h[1] // 2))
register_flops(_glu_backward_op, lambda h, gy: glu_flops(*gy, backward=True))


def swiglu_numba(h: Tensor) -> Tensor:
    """:func:`longrange.ops.glu.swiglu` (arguments checked by the caller) by the numba kernels:
    floating CPU tensors, computed in float64 if h is float64, else in float32; the output in h's
    dtype, of shape (..., H)."""
    _kernels()
    if not h.is_floating_point() or h.device.type != "cpu":
        raise RuntimeError(f"swiglu: impl='numba' takes floating CPU tensors, got {h.dtype} on {h.device}")
    dtype = torch.float64 if h.dtype == torch.float64 else torch.float32
    two_h = h.shape[-1]
    y = _glu_op_eager(h.to(dtype).reshape(-1, two_h).contiguous())
    return y.reshape(*h.shape[:-1], two_h // 2).to(h.dtype)
