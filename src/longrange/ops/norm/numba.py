"""The (gated) RMS norm fused into compiled loops for CPUs (numba; ``impl="numba"`` of
:func:`longrange.ops.norm.rms_norm`).

The eager formula runs five to eight elementwise passes forward and twice as many backward over
tensors of a few megabytes (the matrix-state layers' output norms: Mamba-2's gated norm, GLA's,
DeltaNet's); the kernels (:mod:`longrange.ops.norm._numba_kernels`) read each row once forward and
once backward, recomputing the gate's SiLU and the normalised row from the stored ``1 / rms`` of
each row. Each task is a block of rows; the weight's gradient is summed over the tasks by the
caller in a fixed order, so the backward is deterministic.

The operator is ``torch.ops.longrange.rms_norm_numba`` (its backward ``rms_norm_numba_backward``;
see :mod:`longrange.ops.custom_ops`). It computes in float64 for float64 inputs and in float32 for
the others (bfloat16 and float16 are converted, and the output converted back). Without numba
(:func:`numba_available` False) ``impl="auto"`` runs the eager formula instead.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops._lazy_kernels import LazyKernels, rows_per_task
from longrange.ops._lazy_kernels import use_threads as _use_threads
from longrange.ops.custom_ops import autograd_and_eager, eager, qualname, register_flops

#: The dtypes the kernels compute in (other floating inputs are computed in float32).
DTYPES = (torch.float32, torch.float64)
#: Features per task at least (rows of a task times their width): small tasks cost more to hand out
#: than they compute.
TASK_ELEMENTS = 1 << 15
#: ``mode`` of the kernels: no gate, the gate after the norm, the gate first.
MODES = {(False, False): 0, (True, False): 1, (True, True): 2}

_KERNELS = LazyKernels("longrange.ops.norm._numba_kernels")


def numba_available() -> bool:
    """Whether numba imports, i.e. whether :func:`rms_norm_numba` can run."""
    return _KERNELS.load() is not None


def unavailable_reason() -> str | None:
    """Why numba cannot be used (the import error), or None when it can."""
    return _KERNELS.reason()


def _kernels():
    return _KERNELS.require("rms_norm")


def _rows_per_task(rows: int, width: int, threads: int) -> int:
    """Rows per task: about :data:`TASK_ELEMENTS` features, and a task per thread at least."""
    return rows_per_task(rows, width, threads, TASK_ELEMENTS)


def norm_flops(rows: int, width: int, mode: int, backward: bool = False) -> int:
    """FLOPs of the kernels (the convention of :mod:`longrange.ops.custom_ops`), per feature:
    forward the square and sum (2), the scale by ``r`` and the weight (2), and a gate's SiLU
    ``g / (1 + exp(-g))`` (3) with its product (1); the backward recomputes that, then the weight's
    gradient (2), the norm's (4) and a gate's (6)."""
    gate = mode != 0
    forward = 4 + 4 * int(gate)
    per = forward + 6 + 6 * int(gate) if backward else forward
    return rows * width * per


@torch.library.custom_op(qualname("rms_norm_numba"), mutates_args=(), device_types="cpu")
def _norm_op(x: Tensor, gate: Tensor | None, weight: Tensor, eps: float, mode: int) -> tuple[Tensor, Tensor]:
    """x, gate (R, D) contiguous, weight (H, D) contiguous, one dtype -> (y (R, D), rstd (R,))."""
    k = _kernels()
    R, D = x.shape
    y, rstd = torch.empty_like(x), x.new_empty(R)
    gate_ = gate if gate is not None else x.new_empty(1, D)
    k.norm_forward(
        x.detach().numpy(),
        gate_.detach().numpy(),
        weight.detach().numpy(),
        float(eps),
        int(mode),
        _rows_per_task(R, D, _use_threads(k)),
        y.numpy(),
        rstd.numpy(),
    )
    return y, rstd


@_norm_op.register_fake
def _(x, gate, weight, eps, mode):
    return torch.empty_like(x), x.new_empty(x.shape[0])


@torch.library.custom_op(qualname("rms_norm_numba_backward"), mutates_args=(), device_types="cpu")
def _norm_backward_op(
    x: Tensor, gate: Tensor | None, weight: Tensor, rstd: Tensor, gy: Tensor, mode: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (x, gate, weight) of :func:`_norm_op` for the output gradient ``gy`` (the gate's:
    an empty tensor without a gate)."""
    k = _kernels()
    R, D = x.shape
    rows = _rows_per_task(R, D, _use_threads(k))
    gy = gy.contiguous()
    gx = torch.empty_like(x)
    ggate = torch.empty_like(x) if gate is not None else x.new_zeros(1, D)  # zeros: a defined output
    gw = x.new_empty(-(-R // rows), *weight.shape)
    gate_ = gate if gate is not None else x.new_empty(1, D)
    k.norm_backward(
        x.detach().numpy(),
        gate_.detach().numpy(),
        weight.detach().numpy(),
        rstd.detach().numpy(),
        gy.detach().numpy(),
        int(mode),
        rows,
        gx.numpy(),
        ggate.numpy(),
        gw.numpy(),
    )
    return gx, ggate, gw.sum(0)


@_norm_backward_op.register_fake
def _(x, gate, weight, rstd, gy, mode):
    ggate = torch.empty_like(x) if gate is not None else x.new_empty(1, x.shape[1])
    return torch.empty_like(x), ggate, weight.new_empty(weight.shape)


def _setup_context(ctx, inputs, output) -> None:
    x, gate, weight, eps, mode = inputs
    ctx.save_for_backward(x, gate, weight, output[1])
    ctx.mark_non_differentiable(output[1])  # 1 / rms: saved for the backward, not an output to train through
    ctx.mode = mode


def _backward(ctx, gy: Tensor, grstd: Tensor | None):
    x, gate, weight, rstd = ctx.saved_tensors
    gx, ggate, gw = _norm_backward_op_eager(x, gate, weight, rstd, gy, ctx.mode)
    needs = ctx.needs_input_grad
    return (
        gx if needs[0] else None,
        ggate if gate is not None and needs[1] else None,
        gw if needs[2] else None,
        None,
        None,
    )


_norm_op_eager = autograd_and_eager(_norm_op, _backward, _setup_context)
_norm_backward_op_eager = eager(_norm_backward_op)
register_flops(_norm_op, lambda x, gate, w, eps, mode: norm_flops(*x, mode))
register_flops(_norm_backward_op, lambda x, gate, w, rstd, gy, mode: norm_flops(*x, mode, backward=True))


def rms_norm_numba(
    x: Tensor, weight: Tensor, gate: Tensor | None = None, gate_first: bool = False, eps: float = 1e-5
) -> Tensor:
    """:func:`longrange.ops.norm.rms_norm` (arguments checked by the caller) by the numba kernels:
    floating CPU tensors, computed in float64 if x is float64, else in float32; the output in x's
    dtype and shape."""
    _kernels()
    if not x.is_floating_point() or x.device.type != "cpu":
        raise RuntimeError(f"rms_norm: impl='numba' takes floating CPU tensors, got {x.dtype} on {x.device}")
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    D = x.shape[-1]
    y, _ = _norm_op_eager(
        x.to(dtype).reshape(-1, D).contiguous(),
        None if gate is None else gate.to(dtype).reshape(-1, D).contiguous(),
        weight.to(dtype).reshape(-1, D).contiguous(),
        float(eps),
        MODES[(gate is not None, bool(gate_first) and gate is not None)],
    )
    return y.reshape(x.shape).to(x.dtype)
