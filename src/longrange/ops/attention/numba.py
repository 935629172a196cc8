"""Softmax attention without a mask, in compiled loops for CPUs (numba; ``impl="numba"`` of
:func:`longrange.ops.attention.attention`).

PyTorch's fused CPU kernel multiplies blocks of queries by blocks of keys as small matrix
products whose inner dimension is the head width; at MAD's head widths (4 and 8) those products
and the bookkeeping around them take most of its time. The kernels
(:mod:`longrange.ops.attention._numba_kernels`) run, for each (batch, head) pair and query, loops
over the keys with the head width outermost: a few vector passes and one exponential per score,
forward and backward. Like flash attention they store no (L, L) matrix: the forward keeps each
query's log-sum-exp, from which the backward recomputes the probabilities.

The operator is ``torch.ops.longrange.attention_numba`` (its backward ``attention_numba_backward``;
see :mod:`longrange.ops.custom_ops`). It computes in float64 for float64 inputs and in float32 for
the others (bfloat16 and float16 are converted, and the output converted back). Its FLOPs are
counted as PyTorch counts its own attention (every (query, key) pair, causal or not), so that a
step's FLOP bound does not depend on which kernel ran. Each (batch, head) pair sums its own
gradients in order: the backward is deterministic.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops._lazy_kernels import LazyKernels
from longrange.ops._lazy_kernels import use_threads as _use_threads
from longrange.ops.custom_ops import autograd_and_eager, eager, qualname, register_flops

#: The dtypes the kernels compute in (other floating inputs are computed in float32).
DTYPES = (torch.float32, torch.float64)

_KERNELS = LazyKernels("longrange.ops.attention._numba_kernels")


def numba_available() -> bool:
    """Whether numba imports, i.e. whether :func:`attention_numba` can run."""
    return _KERNELS.load() is not None


def unavailable_reason() -> str | None:
    """Why numba cannot be used (the import error), or None when it can."""
    return _KERNELS.reason()


def _kernels():
    return _KERNELS.require("attention")


def attention_flops(n: int, length: int, width: int, backward: bool = False) -> int:
    """FLOPs as PyTorch's counter counts ``scaled_dot_product_attention`` (two products of
    (L, D) by (D, L) forward, five backward; every pair of positions, causal or not) for ``n``
    (batch x heads) sequences of ``length`` positions and head width ``width``."""
    return (10 if backward else 4) * n * length * length * width


@torch.library.custom_op(qualname("attention_numba"), mutates_args=(), device_types="cpu")
def _attention_op(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool) -> tuple[Tensor, Tensor]:
    """q, k, v (N, L, D) contiguous, one dtype -> (out (N, L, D), lse (N, L))."""
    kern = _kernels()
    _use_threads(kern)
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:2])
    kern.attention_forward(
        q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), float(scale), bool(causal), out.numpy(), lse.numpy()
    )
    return out, lse


@_attention_op.register_fake
def _(q, k, v, scale, causal):
    return torch.empty_like(q), q.new_empty(q.shape[:2])


@torch.library.custom_op(qualname("attention_numba_backward"), mutates_args=(), device_types="cpu")
def _attention_backward_op(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, gout: Tensor, scale: float, causal: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (q, k, v) of :func:`_attention_op` for the output gradient ``gout``."""
    kern = _kernels()
    _use_threads(kern)
    gout = gout.contiguous()
    gq, gk, gv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    kern.attention_backward(
        q.detach().numpy(),
        k.detach().numpy(),
        v.detach().numpy(),
        out.detach().numpy(),
        lse.detach().numpy(),
        gout.detach().numpy(),
        float(scale),
        bool(causal),
        gq.numpy(),
        gk.numpy(),
        gv.numpy(),
    )
    return gq, gk, gv


@_attention_backward_op.register_fake
def _(q, k, v, out, lse, gout, scale, causal):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, scale, causal = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.mark_non_differentiable(lse)  # saved for the backward, not an output to train through
    ctx.scale, ctx.causal = scale, causal


def _backward(ctx, gout: Tensor, glse: Tensor | None):
    q, k, v, out, lse = ctx.saved_tensors
    gq, gk, gv = _attention_backward_op_eager(q, k, v, out, lse, gout, ctx.scale, ctx.causal)
    needs = ctx.needs_input_grad
    return (gq if needs[0] else None, gk if needs[1] else None, gv if needs[2] else None, None, None)


_attention_op_eager = autograd_and_eager(_attention_op, _backward, _setup_context)
_attention_backward_op_eager = eager(_attention_backward_op)
register_flops(_attention_op, lambda q, k, v, scale, causal: attention_flops(*q))
register_flops(
    _attention_backward_op, lambda q, k, v, out, lse, gout, scale, causal: attention_flops(*q, backward=True)
)


def attention_numba(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
    """:func:`longrange.ops.attention.attention` (arguments checked by the caller) by the numba
    kernels: floating CPU tensors (N, heads, L, D), computed in float64 if q is float64, else in
    float32; the output in q's dtype and shape."""
    _kernels()
    if not q.is_floating_point() or q.device.type != "cpu":
        raise RuntimeError(f"attention: impl='numba' takes floating CPU tensors, got {q.dtype} on {q.device}")
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    n, heads, length, width = q.shape

    def flat(t: Tensor) -> Tensor:
        return t.to(dtype).reshape(n * heads, length, width).contiguous()

    out, _ = _attention_op_eager(flat(q), flat(k), flat(v), width**-0.5, bool(causal))
    return out.reshape(q.shape).to(q.dtype)
