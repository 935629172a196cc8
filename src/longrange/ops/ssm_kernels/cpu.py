"""The Vandermonde and Cauchy products fused into compiled loops for CPUs (numba; ``impl="numba"``).

:func:`vandermonde_numba` and :func:`cauchy_numba` take the arguments of
:func:`longrange.ops.ssm_kernels.vandermonde_kernel` and :func:`~longrange.ops.ssm_kernels.cauchy`
(checked by the caller) and run the kernels of :mod:`longrange.ops.ssm_kernels._cpu_kernels` in
the canonical layouts of :mod:`longrange.ops.ssm_kernels.common`, in parallel over
``torch.get_num_threads()`` threads.

* Vandermonde: per mode row, a table of the powers d^s (s below a block of 64 positions) is built
  once in float64; each block of positions is then one matrix-vector product of that table with
  the weights times d^l0, the block's first power, carried from block to block in float64. No
  complex exponential per term, and the powers are as accurate as float64 rounded once to the
  compute dtype.
* Cauchy: per row r and block of evaluation points, the resolvents 1/(z - w) (and
  1/(z - conj(w)) for conjugate pairs) are computed once per pole w and applied to every vector
  v[j]; the conjugate partners are summed in the same pass.

The backward passes are hand-written (:class:`_NumbaVandermonde`, :class:`_NumbaCauchy`): they
recompute the powers or resolvents instead of storing any (…, N, L) or (…, K, N) tensor, and are
deterministic: every output is written by one task, partial sums are added by the caller in a
fixed order, and the division into tasks does not depend on the number of threads, so neither do
the results, to the bit. Temporaries are per task: a table of 64 x M powers, or a few vectors of
a block of evaluation points per vector v[j], whatever the length.

Dtypes: float64 if any input is double precision, else float32; complex inputs in, the output
of the reference's dtype (real for the Vandermonde kernel). Without numba (:func:`numba_available`
False) ``impl="auto"`` runs the chunked PyTorch code, and calling these functions raises an error
saying why.
"""
from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor

from longrange.ops._lazy_kernels import LazyKernels, use_threads as _use_threads
from longrange.ops.ssm_kernels.common import VANDERMONDE, cauchy_layout, complex_dtype, vandermonde_layout

#: Positions per block of the Vandermonde kernels (the size of the table of powers).
VANDERMONDE_BLOCK = 64
#: Weight rows per task of the Vandermonde kernels.
VANDERMONDE_ROWS_PER_TASK = 8
#: Evaluation points per task of the Cauchy kernels (at most).
CAUCHY_POINTS_PER_TASK = 256

_KERNELS = LazyKernels("longrange.ops.ssm_kernels._cpu_kernels")
_load = _KERNELS.load


def numba_available(device: torch.device | str = "cpu") -> bool:
    """Whether the numba kernels can run on ``device``: a CPU device and numba importable."""
    return torch.device(device).type == "cpu" and _load() is not None


def unavailable_reason() -> str | None:
    """Why numba cannot be used (the import error), or None when it can."""
    return _KERNELS.reason()


def warm_up(dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64)) -> None:
    """Load the kernels for ``dtypes`` now (from numba's cache, or compiling them): one tiny
    forward and backward of each product. Benchmarks call this before their memory baseline."""
    if _load() is None:
        return
    for dtype in dtypes:
        cdtype = torch.complex128 if dtype == torch.float64 else torch.complex64
        a = torch.full((1, 1), -0.5, dtype=cdtype, requires_grad=True)
        w = torch.ones(1, 1, dtype=cdtype, requires_grad=True)
        vandermonde_numba(a, w, 2).sum().backward()
        z = torch.full((1, 2), 2.0, dtype=cdtype, requires_grad=True)
        for conj_pairs in (False, True):
            cauchy_numba(w, z, a, conj_pairs).abs().sum().backward()


def _np(t: Tensor):
    """A NumPy view of a contiguous CPU tensor (no copy)."""
    return t.detach().numpy()


def _split(t: Tensor, dtype: torch.dtype) -> tuple:
    """Contiguous real and imaginary parts of a complex tensor, as NumPy arrays of ``dtype``."""
    return _np(t.real.to(dtype).contiguous()), _np(t.imag.to(dtype).contiguous())


def _kernels_or_raise(op: str, *tensors: Tensor) -> ModuleType:
    k = _load()
    if k is None:
        raise RuntimeError(f"{op}: impl='numba' needs the numba package, which does not import ({_KERNELS.error})")
    devices = sorted({t.device.type for t in tensors})
    if devices != ["cpu"]:
        raise RuntimeError(f"{op}: impl='numba' runs on CPU tensors only, got tensors on {devices}")
    return k


# --------------------------------------------------------------------------------------------
# Vandermonde
# --------------------------------------------------------------------------------------------


class _NumbaVandermonde(torch.autograd.Function):
    """(a (R, M), w (J, R, M), L) complex -> (J, R, L) real, in the compute dtype of the inputs."""

    @staticmethod
    def forward(ctx, a: Tensor, w: Tensor, L: int) -> Tensor:
        k = _load()
        real = a.real.dtype
        J, R, M = w.shape
        d, D = _steps(a, min(VANDERMONDE_BLOCK, L))
        out = torch.empty(J, R, L, dtype=real)
        _use_threads(k)
        k.vandermonde_forward(*d, *D, *_split(w, real), VANDERMONDE_BLOCK, VANDERMONDE_ROWS_PER_TASK, _np(out))
        ctx.save_for_backward(a, w)
        ctx.L = L
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        k = _load()
        a, w = ctx.saved_tensors
        L = ctx.L
        real = a.real.dtype
        J, R, M = w.shape
        groups = -(-J // VANDERMONDE_ROWS_PER_TASK)
        d, D = _steps(a, min(VANDERMONDE_BLOCK, L))
        gw_re, gw_im = (torch.empty(J, R, M, dtype=real) for _ in range(2))
        ga_re, ga_im = (torch.empty(R, groups, M, dtype=torch.float64) for _ in range(2))
        _use_threads(k)
        k.vandermonde_backward(
            *d, *D, *_split(w, real), _np(grad.to(real).contiguous()), VANDERMONDE_BLOCK, VANDERMONDE_ROWS_PER_TASK,
            _np(gw_re), _np(gw_im), _np(ga_re), _np(ga_im),
        )
        grad_a = torch.complex(ga_re.sum(1), ga_im.sum(1)).to(a.dtype) if ctx.needs_input_grad[0] else None
        grad_w = torch.complex(gw_re, gw_im) if ctx.needs_input_grad[1] else None
        return grad_a, grad_w, None


def _steps(a: Tensor, block: int) -> tuple[tuple, tuple]:
    """(d, D) as NumPy (real, imaginary) pairs in float64: d = exp(a), D = exp(block · a)."""
    a64 = a.detach().to(torch.complex128)
    return _split(torch.exp(a64), torch.float64), _split(torch.exp(block * a64), torch.float64)


def vandermonde_numba(log_dA: Tensor, W: Tensor, L: int) -> Tensor:
    """``K[..., h, l] = Re sum_m W[..., h, m] exp(l · log_dA[h, m])`` by the numba kernels
    (arguments checked by the caller; see the module docstring)."""
    _kernels_or_raise(VANDERMONDE + "_kernel", log_dA, W)
    layout = vandermonde_layout(log_dA, W, L)
    a, w = layout.to_canonical(log_dA, W)
    return layout.from_canonical(_NumbaVandermonde.apply(a, w, L))


# --------------------------------------------------------------------------------------------
# Cauchy
# --------------------------------------------------------------------------------------------


#: Tasks the Cauchy kernels aim for when there are few rows (the points of a row are then split).
CAUCHY_MIN_TASKS = 64


def _points_per_task(R: int, K: int) -> int:
    """Evaluation points per task: at most :data:`CAUCHY_POINTS_PER_TASK`, fewer (down to 16)
    while there are fewer than :data:`CAUCHY_MIN_TASKS` tasks; blocks of equal size. It does not
    depend on the number of threads, so neither do the results (the order of the sums)."""
    blocks = max(-(-K // CAUCHY_POINTS_PER_TASK), min(-(-CAUCHY_MIN_TASKS // max(R, 1)), -(-K // 16)))
    return max(1, -(-K // blocks))


class _NumbaCauchy(torch.autograd.Function):
    """(v (J, R, N), z (R, K), w (R, N), conj_pairs) complex -> (J, R, K) complex."""

    @staticmethod
    def forward(ctx, v: Tensor, z: Tensor, w: Tensor, conj_pairs: bool) -> Tensor:
        k = _load()
        real = v.real.dtype
        J, R, N = v.shape
        K = z.shape[1]
        _use_threads(k)
        block = _points_per_task(R, K)
        out_re, out_im = (torch.empty(J, R, K, dtype=real) for _ in range(2))
        k.cauchy_forward(*_split(v, real), *_split(z, real), *_split(w, real), bool(conj_pairs), block, _np(out_re), _np(out_im))
        ctx.save_for_backward(v, z, w)
        ctx.conj_pairs = bool(conj_pairs)
        return torch.complex(out_re, out_im)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        k = _load()
        v, z, w = ctx.saved_tensors
        real = v.real.dtype
        J, R, N = v.shape
        K = z.shape[1]
        _use_threads(k)
        block = _points_per_task(R, K)
        blocks = -(-K // block)
        gv_re, gv_im = (torch.empty(blocks, J, R, N, dtype=real) for _ in range(2))
        gw_re, gw_im = (torch.empty(blocks, R, N, dtype=real) for _ in range(2))
        gz_re, gz_im = (torch.empty(R, K, dtype=real) for _ in range(2))
        k.cauchy_backward(
            *_split(v, real), *_split(z, real), *_split(w, real), *_split(grad, real), ctx.conj_pairs, block,
            _np(gv_re), _np(gv_im), _np(gw_re), _np(gw_im), _np(gz_re), _np(gz_im),
        )
        need = ctx.needs_input_grad
        return (
            torch.complex(gv_re.sum(0), gv_im.sum(0)) if need[0] else None,
            torch.complex(gz_re, gz_im) if need[1] else None,
            torch.complex(gw_re.sum(0), gw_im.sum(0)) if need[2] else None,
            None,
        )


def cauchy_numba(v: Tensor, z: Tensor, w: Tensor, conj_pairs: bool = False) -> Tensor:
    """The Cauchy sum of :func:`longrange.ops.ssm_kernels.cauchy` by the numba kernels (arguments
    checked by the caller; see the module docstring)."""
    _kernels_or_raise("cauchy", v, z, w)
    layout = cauchy_layout(v, z, w)
    if layout.R * layout.J == 0 or layout.K == 0:
        return layout.from_canonical(torch.zeros(layout.J, layout.R, layout.K, dtype=complex_dtype(layout.real)))
    vc, zc, wc = layout.to_canonical(v, z, w)
    return layout.from_canonical(_NumbaCauchy.apply(vc, zc, wc, conj_pairs))


__all__ = ["cauchy_numba", "numba_available", "unavailable_reason", "vandermonde_numba", "warm_up"]
