"""The causal depthwise convolution fused into compiled loops for CPUs (numba; ``impl="numba"`` of
:func:`longrange.ops.conv.causal_conv1d`).

The kernels (:mod:`longrange.ops.conv._numba_kernels`) work channels last: x and the output in
(b, l, d) memory, so that the (b, d, l) view of a (b, l, d) tensor that a Mamba block passes costs
no copy, and the output comes back as such a view. The bias and the SiLU run in the same loop as
the taps; the backward recomputes the pre-activation output instead of storing it. Each task is a
block of up to 256 channels of one batch element; the weight and bias gradients are summed over
the batch elements by the caller in a fixed order, so the backward is deterministic.

The operator is ``torch.ops.longrange.causal_conv1d_numba`` (its backward
``causal_conv1d_numba_backward``; see :mod:`longrange.ops.custom_ops`). It computes in float64
for float64 inputs and in float32 for the others (bfloat16 and float16 are converted, and the
output converted back). Without numba (:func:`numba_available` False)
``impl="auto"`` runs PyTorch's convolution instead.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops._lazy_kernels import LazyKernels, block_width, divisors
from longrange.ops._lazy_kernels import use_threads as _use_threads
from longrange.ops.custom_ops import autograd_and_eager, eager, qualname, register_flops

#: The widest block of channels per task.
MAX_WIDTH = 256
#: The dtypes the kernels compute in (other floating inputs are computed in float32).
DTYPES = (torch.float32, torch.float64)

_KERNELS = LazyKernels("longrange.ops.conv._numba_kernels")


def numba_available() -> bool:
    """Whether numba imports, i.e. whether :func:`causal_conv1d_numba` can run."""
    return _KERNELS.load() is not None


def unavailable_reason() -> str | None:
    """Why numba cannot be used (the import error), or None when it can."""
    return _KERNELS.reason()


def warm_up(dtypes: tuple[torch.dtype, ...] = DTYPES) -> None:
    """Load the kernels for ``dtypes`` now (from numba's cache, or compiling them): one tiny forward
    and backward each. Benchmarks call this before their memory baseline."""
    if _KERNELS.load() is None:
        return
    for dtype in dtypes:
        x = torch.ones(1, 1, 2, dtype=dtype, requires_grad=True)
        causal_conv1d_numba(x, torch.ones(1, 2, dtype=dtype), torch.ones(1, dtype=dtype), silu=True).sum().backward()


def _kernels():
    return _KERNELS.require("causal_conv1d")


def _width(b: int, d: int, threads: int) -> int:
    """Channels per task: the widest divisor of d up to :data:`MAX_WIDTH` that leaves a task per
    thread at least (the narrowest, one channel, where none does)."""
    return block_width(b, d, divisors(d, MAX_WIDTH), threads)


def conv_flops(b: int, l: int, d: int, w: int, has_bias: bool, silu: bool, backward: bool = False) -> int:
    """FLOPs of the kernels (the convention of :mod:`longrange.ops.custom_ops`): forward, per output
    element, a multiply-add per tap (2w), the bias (1) and the SiLU a / (1 + exp(-a)) (3); the
    backward recomputes that, then the SiLU's derivative (8), the bias gradient (1) and per tap
    the input and weight gradients (4w)."""
    forward = 2 * w + int(has_bias) + 3 * int(silu)
    per = forward + 8 * int(silu) + int(has_bias) + 4 * w if backward else forward
    return b * l * d * per


@torch.library.custom_op(qualname("causal_conv1d_numba"), mutates_args=(), device_types="cpu")
def _conv_op(x: Tensor, weight: Tensor, bias: Tensor | None, silu: bool) -> Tensor:
    """x (b, l, d) contiguous, weight (w, d) contiguous (tap k multiplies the input w - 1 - k steps
    back), bias (d,) or None, one dtype -> the output (b, l, d)."""
    k = _kernels()
    b, l, d = x.shape
    width = _width(b, d, _use_threads(k))
    y = torch.empty_like(x)
    bias_ = bias if bias is not None else x.new_zeros(d)
    k.conv_forward(x.detach().numpy(), weight.detach().numpy(), bias_.detach().numpy(), silu, width, y.numpy())
    return y


@_conv_op.register_fake
def _(x, weight, bias, silu):
    return torch.empty_like(x)


@torch.library.custom_op(qualname("causal_conv1d_numba_backward"), mutates_args=(), device_types="cpu")
def _conv_backward_op(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    silu: bool,
    gy: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (x, weight, bias) of :func:`_conv_op` for the output gradient ``gy``."""
    k = _kernels()
    b, l, d = x.shape
    width = _width(b, d, _use_threads(k))
    gy = gy.contiguous()
    gx = torch.empty_like(x)
    gw, gb = x.new_empty(b, weight.shape[0], d), x.new_empty(b, d)
    bias_ = bias if bias is not None else x.new_zeros(d)
    k.conv_backward(
        x.detach().numpy(),
        weight.detach().numpy(),
        bias_.detach().numpy(),
        silu,
        gy.detach().numpy(),
        width,
        gx.numpy(),
        gw.numpy(),
        gb.numpy(),
    )
    return gx, gw.sum(0), gb.sum(0)


@_conv_backward_op.register_fake
def _(x, weight, bias, silu, gy):
    return torch.empty_like(x), weight.new_empty(weight.shape), x.new_empty(x.shape[2])


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, silu = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.silu = silu


def _backward(ctx, gy: Tensor):
    x, weight, bias = ctx.saved_tensors
    gx, gw, gb = _conv_backward_op_eager(x, weight, bias, ctx.silu, gy)
    needs = ctx.needs_input_grad
    return (gx if needs[0] else None, gw if needs[1] else None, gb if bias is not None and needs[2] else None, None)


_conv_op_eager = autograd_and_eager(_conv_op, _backward, _setup_context)
_conv_backward_op_eager = eager(_conv_backward_op)
register_flops(_conv_op, lambda x, w, bias, silu: conv_flops(*x, w[0], bias is not None, silu))
register_flops(
    _conv_backward_op, lambda x, w, bias, silu, gy: conv_flops(*x, w[0], bias is not None, silu, backward=True)
)


def causal_conv1d_numba(x: Tensor, weight: Tensor, bias: Tensor | None = None, silu: bool = False) -> Tensor:
    """:func:`longrange.ops.conv.causal_conv1d` (arguments checked by the caller; ``silu`` for the
    activation) by the numba kernels: x (b, d, l), a floating CPU tensor, computed in float64 if x
    is float64, else in float32; the output (b, d, l) in x's dtype, a view of (b, l, d) memory."""
    _kernels()
    if not x.is_floating_point() or x.device.type != "cpu":
        raise RuntimeError(f"causal_conv1d: impl='numba' takes floating CPU tensors, got {x.dtype} on {x.device}")
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = _conv_op_eager(
        x.to(dtype).transpose(1, 2).contiguous(),
        weight.to(dtype).t().contiguous(),
        None if bias is None else bias.to(dtype).contiguous(),
        bool(silu),
    )
    return y.transpose(1, 2).to(x.dtype)
