"""Matrix products on CPUs through oneDNN, as a registered operator.

PyTorch's float32 matrix products on the CPU call MKL, which takes a generic code path on CPUs
that are not Intel's: on this project's AMD EPYC machine, one thread, a (8192 x 128) @ (128 x 512)
product ran at 99 GFLOP/s there and at 236 GFLOP/s through oneDNN (PyTorch's ``mkldnn``
library, which chooses its kernels by the instructions a CPU has, not by its maker;
``benchmarks/results/compile.mamba_py.*``).

:func:`mm_onednn` is ``a @ b (+ bias)`` through oneDNN's matrix product (PyTorch's operator
``mkldnn::_linear_pointwise``), registered as ``torch.ops.longrange.mm_onednn`` with a fake
implementation and its gradient, so that compiled graphs can call it (the training step compiled
with ``train.compile`` routes its float32 CPU products to it: ``longrange/train/compile.py``).
Operands whose layout is neither row- nor column-major (a slice of a wider matrix) are copied to
row-major first: oneDNN's fast kernels take strided operands only in those two layouts. The
operator copies a first operand that is not row-major; for a column-major one (the transposed
operand of a weight's gradient) the product is computed as (b.T @ a.T).T where that copies fewer
values. Results
equal ``torch.mm``'s to float32 rounding (another order of the sums), not bitwise.

:func:`onednn_available` says whether this PyTorch has the operator (x86 and ARM builds with
oneDNN); elsewhere nothing routes to it.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from longrange.ops.custom_ops import qualname


@functools.cache
def onednn_available() -> bool:
    """Whether PyTorch was built with oneDNN and has its matrix-product operator."""
    try:
        return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


def _row_major(t: Tensor) -> bool:
    rows, cols = t.shape
    return rows <= 1 or cols <= 1 or t.stride() == (cols, 1)


def _dense(t: Tensor) -> bool:
    """Whether a matrix is row-major or column-major (oneDNN's fast layouts)."""
    return _row_major(t) or _row_major(t.t())


def _check(a: Tensor, b: Tensor, bias: Tensor | None) -> None:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(
            f"mm_onednn: a (m, k) and b (k, n) must be matrices with equal k, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if bias is not None and bias.shape != (b.shape[1],):
        raise ValueError(f"mm_onednn: bias must have shape (n,)=({b.shape[1]},), got {tuple(bias.shape)}")


@torch.library.custom_op(qualname("mm_onednn"), mutates_args=(), device_types="cpu")
def _mm_op(a: Tensor, b: Tensor, bias: Tensor | None) -> Tensor:
    """(a (m, k), b (k, n), bias (n,) or None) -> a @ b + bias, contiguous (m, n)."""
    a = a if _dense(a) else a.contiguous()
    b = b if _dense(b) else b.contiguous()
    # The operator computes input @ weight.T (+ bias) for a weight of shape (n, k), copying an
    # input that is not row-major. Where a is column-major (the transposed operand of a weight's
    # gradient), (b.T @ a.T).T may copy less: b.T (k x n) and the result (m x n) instead of a.
    m, n = a.shape[0], b.shape[1]
    if bias is None and not _row_major(a) and (_row_major(b.t()) or b.numel() + m * n < a.numel()):
        return torch.ops.mkldnn._linear_pointwise(b.t(), a, None, "none", [], "").t().contiguous()
    return torch.ops.mkldnn._linear_pointwise(a, b.t(), bias, "none", [], "")


@_mm_op.register_fake
def _(a, b, bias):
    return a.new_empty(a.shape[0], b.shape[1])


def _setup_context(ctx, inputs, output) -> None:
    a, b, bias = inputs
    ctx.save_for_backward(a, b)
    ctx.has_bias = bias is not None


def _backward(ctx, grad: Tensor):
    a, b = ctx.saved_tensors
    ga = _mm_op(grad, b.t(), None) if ctx.needs_input_grad[0] else None
    gb = _mm_op(a.t(), grad, None) if ctx.needs_input_grad[1] else None
    gbias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return ga, gb, gbias


_mm_op.register_autograd(_backward, setup_context=_setup_context)


def mm_onednn(a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
    """``a @ b`` (plus ``bias`` on every row) through oneDNN: float32 CPU matrices (see the module docstring)."""
    _check(a, b, bias)
    if not onednn_available():
        raise RuntimeError(
            "mm_onednn: this PyTorch has no oneDNN matrix product (torch.backends.mkldnn is not "
            "available); use torch.mm"
        )
    tensors = (a, b) if bias is None else (a, b, bias)
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in tensors):
        raise ValueError(
            "mm_onednn: takes float32 CPU tensors, got " + ", ".join(f"{t.dtype} on {t.device}" for t in tensors)
        )
    return _mm_op(a, b, bias)
