"""RWKV-4's WKV as compiled loops for CPUs (numba; ``impl="numba"`` of :func:`longrange.ops.wkv.wkv`).

The chunked form computes the running maximum, two exponentials per position and a scan over
(length, batch, channels, 2) with PyTorch's operations, forward and backward (about 130 ms for a
training step's WKV of 64 x 256 x 64 on one thread here). The kernels
(:mod:`longrange.ops.wkv._numba_kernels`) step through each sequence once forward and twice
backward, the sums at their running maximum as the v4 kernel keeps them, and store nothing
forward but the inputs.

The operator is ``torch.ops.longrange.wkv_numba`` (its backward ``wkv_numba_backward``; see
:mod:`longrange.ops.custom_ops`): the outputs alone, from an empty state (an initial state or the
final one is the chunked form's: the dispatcher sends such calls there). It computes in float64 for
float64 inputs and in float32 for the others. w's and u's gradients are summed over the batch from
per-sequence rows, so the backward is deterministic.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops._lazy_kernels import LazyKernels
from longrange.ops._lazy_kernels import use_threads as _use_threads
from longrange.ops.custom_ops import autograd_and_eager, eager, qualname, register_flops
from longrange.ops.scan.common import compute_dtype

_KERNELS = LazyKernels("longrange.ops.wkv._numba_kernels")


def numba_available() -> bool:
    """Whether numba imports, i.e. whether :func:`wkv_numba` can run."""
    return _KERNELS.load() is not None


def unavailable_reason() -> str | None:
    """Why numba cannot be used (the import error), or None when it can."""
    return _KERNELS.reason()


def _kernels():
    return _KERNELS.require("wkv")


def wkv_flops(batch: int, length: int, channels: int, backward: bool = False) -> int:
    """FLOPs of the kernels (the convention of :mod:`longrange.ops.custom_ops`: an exponential
    counts 1) per position and channel: forward the output (12: the bonus, the scales' maximum and
    two differences, two exponentials, the two weighted sums and their quotient) and the sums'
    update (11); the backward recomputes both (23), adds w's derivatives of the sums (4) and the
    direct gradients (11), then the reverse sweep: the gradients through the sums (8) and the
    adjoints' update (14)."""
    return batch * length * channels * (60 if backward else 23)


@torch.library.custom_op(qualname("wkv_numba"), mutates_args=(), device_types="cpu")
def _wkv_op(w: Tensor, u: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """w, u (D,); k, v (B, L, D) contiguous; mask (B, L) uint8 -> y (B, L, D)."""
    kern = _kernels()
    _use_threads(kern)
    B, _, D = k.shape
    y = torch.empty_like(k)
    state = [k.new_empty(B, D) for _ in range(3)]
    kern.wkv_forward(*(t.detach().numpy() for t in (w, u, k, v, mask)), y.numpy(), *(s.numpy() for s in state))
    return y


@_wkv_op.register_fake
def _(w, u, k, v, mask):
    return torch.empty_like(k)


@torch.library.custom_op(qualname("wkv_numba_backward"), mutates_args=(), device_types="cpu")
def _wkv_backward_op(
    w: Tensor, u: Tensor, k: Tensor, v: Tensor, mask: Tensor, gy: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of :func:`_wkv_op` with respect to w, u, k and v for the output gradient ``gy``."""
    kern = _kernels()
    _use_threads(kern)
    B, _, D = k.shape
    gk, gv = torch.empty_like(k), torch.empty_like(v)
    gw_rows, gu_rows = k.new_empty(B, D), k.new_empty(B, D)
    kern.wkv_backward(
        *(t.detach().numpy() for t in (w, u, k, v, mask)),
        gy.contiguous().detach().numpy(),
        gk.numpy(),
        gv.numpy(),
        gw_rows.numpy(),
        gu_rows.numpy(),
    )
    return gw_rows.sum(0), gu_rows.sum(0), gk, gv


@_wkv_backward_op.register_fake
def _(w, u, k, v, mask, gy):
    return torch.empty_like(w), torch.empty_like(u), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, gy: Tensor):
    w, u, k, v, mask = ctx.saved_tensors
    return (*_wkv_backward_op_eager(w, u, k, v, mask, gy), None)


_wkv_op_eager = autograd_and_eager(_wkv_op, _backward, _setup_context)
_wkv_backward_op_eager = eager(_wkv_backward_op)
register_flops(_wkv_op, lambda w, u, k, v, mask: wkv_flops(*k))
register_flops(_wkv_backward_op, lambda w, u, k, v, mask, gy: wkv_flops(*k, backward=True))


def wkv_numba(w: Tensor, u: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """:func:`longrange.ops.wkv.wkv` from an empty state (arguments checked by the caller) by the
    numba kernels: CPU tensors, computed in float64 if any input is float64, else in float32; the
    outputs in that dtype."""
    _kernels()
    if k.device.type != "cpu":
        raise RuntimeError(f"wkv: impl='numba' takes CPU tensors, got {k.device}")
    dtype = compute_dtype(w, u, k, v)
    w, u, k, v = (t.to(dtype).contiguous() for t in (w, u, k, v))
    if mask is None:
        mask = torch.ones(k.shape[:2], dtype=torch.uint8)
    return _wkv_op_eager(w, u, k, v, mask.to(torch.uint8).contiguous())


__all__ = ["numba_available", "unavailable_reason", "wkv_flops", "wkv_numba"]
