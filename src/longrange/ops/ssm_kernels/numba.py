"""The Vandermonde and Cauchy products fused into compiled loops for CPUs (numba; ``impl="numba"``).

:func:`vandermonde_numba` and :func:`cauchy_numba` take the arguments of
:func:`longrange.ops.ssm_kernels.vandermonde_kernel` and :func:`~longrange.ops.ssm_kernels.cauchy`
(checked by the caller) and run the kernels of :mod:`longrange.ops.ssm_kernels._numba_kernels` in
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

Both products are PyTorch operators (``torch.ops.longrange.vandermonde_numba``, ``cauchy_numba``;
see :mod:`longrange.ops.custom_ops`) taking complex tensors as real and imaginary parts. The
backward passes are hand-written (the operators ``*_backward``): they
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

from longrange.ops._lazy_kernels import LazyKernels
from longrange.ops._lazy_kernels import use_threads as _use_threads
from longrange.ops.custom_ops import eager, qualname, register_flops
from longrange.ops.ssm_kernels.common import (
    VANDERMONDE,
    cauchy_flops,
    cauchy_layout,
    complex_dtype,
    register_cauchy_operator,
    register_vandermonde_operators,
    vandermonde_layout,
)

#: Positions per block of the Vandermonde kernels (the size of the table of powers).
VANDERMONDE_BLOCK = 64
#: Weight rows per task of the Vandermonde kernels.
VANDERMONDE_ROWS_PER_TASK = 8
#: Evaluation points per task of the Cauchy kernels (at most).
CAUCHY_POINTS_PER_TASK = 256

_KERNELS = LazyKernels("longrange.ops.ssm_kernels._numba_kernels")
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


def _contiguous(*tensors: Tensor) -> list:
    """NumPy views of contiguous copies (where needed) of CPU tensors."""
    return [_np(t.contiguous()) for t in tensors]


def _kernels(op: str = "vandermonde_kernel and cauchy") -> ModuleType:
    return _KERNELS.require(op)


def _kernels_or_raise(op: str, *tensors: Tensor) -> ModuleType:
    k = _kernels(op)
    devices = sorted({t.device.type for t in tensors})
    if devices != ["cpu"]:
        raise RuntimeError(f"{op}: impl='numba' runs on CPU tensors only, got tensors on {devices}")
    return k


# --------------------------------------------------------------------------------------------
# Vandermonde
# --------------------------------------------------------------------------------------------


@torch.library.custom_op(qualname("vandermonde_numba"), mutates_args=(), device_types="cpu")
def _vandermonde_op(a_re: Tensor, a_im: Tensor, w_re: Tensor, w_im: Tensor, L: int) -> Tensor:
    """Modes a (R, M) and weights w (J, R, M) as real and imaginary parts of one real dtype ->
    (J, R, L) in that dtype."""
    k = _kernels()
    J, R, M = w_re.shape
    d, D = _steps(a_re, a_im, min(VANDERMONDE_BLOCK, L))
    out = w_re.new_empty(J, R, L)
    _use_threads(k)
    k.vandermonde_forward(
        *d, *D, _np(w_re.contiguous()), _np(w_im.contiguous()), VANDERMONDE_BLOCK, VANDERMONDE_ROWS_PER_TASK, _np(out)
    )
    return out


@torch.library.custom_op(qualname("vandermonde_numba_backward"), mutates_args=(), device_types="cpu")
def _vandermonde_backward_op(
    a_re: Tensor,
    a_im: Tensor,
    w_re: Tensor,
    w_im: Tensor,
    grad: Tensor,
    L: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients (a_re, a_im, w_re, w_im) of :func:`_vandermonde_op` for the output gradient ``grad``."""
    k = _kernels()
    real = w_re.dtype
    J, R, M = w_re.shape
    groups = -(-J // VANDERMONDE_ROWS_PER_TASK)
    d, D = _steps(a_re, a_im, min(VANDERMONDE_BLOCK, L))
    gw_re, gw_im = (w_re.new_empty(J, R, M) for _ in range(2))
    ga_re, ga_im = (torch.empty(R, groups, M, dtype=torch.float64) for _ in range(2))
    _use_threads(k)
    k.vandermonde_backward(
        *d,
        *D,
        _np(w_re.contiguous()),
        _np(w_im.contiguous()),
        _np(grad.to(real).contiguous()),
        VANDERMONDE_BLOCK,
        VANDERMONDE_ROWS_PER_TASK,
        _np(gw_re),
        _np(gw_im),
        _np(ga_re),
        _np(ga_im),
    )
    return ga_re.sum(1).to(real), ga_im.sum(1).to(real), gw_re, gw_im


_vandermonde_op_eager = register_vandermonde_operators(_vandermonde_op, _vandermonde_backward_op)


def _steps(a_re: Tensor, a_im: Tensor, block: int) -> tuple[tuple, tuple]:
    """(d, D) as NumPy (real, imaginary) pairs in float64: d = exp(a), D = exp(block · a)."""
    a64 = torch.complex(a_re.detach().to(torch.float64), a_im.detach().to(torch.float64))
    return _split(torch.exp(a64), torch.float64), _split(torch.exp(block * a64), torch.float64)


def vandermonde_numba(log_dA: Tensor, W: Tensor, L: int) -> Tensor:
    """``K[..., h, l] = Re sum_m W[..., h, m] exp(l · log_dA[h, m])`` by the numba kernels
    (arguments checked by the caller; see the module docstring)."""
    _kernels_or_raise(VANDERMONDE + "_kernel", log_dA, W)
    layout = vandermonde_layout(log_dA, W, L)
    a, w = layout.to_canonical(log_dA, W)
    return layout.from_canonical(_vandermonde_op_eager(a.real, a.imag, w.real, w.imag, L))


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


@torch.library.custom_op(qualname("cauchy_numba"), mutates_args=(), device_types="cpu")
def _cauchy_op(
    v_re: Tensor,
    v_im: Tensor,
    z_re: Tensor,
    z_im: Tensor,
    w_re: Tensor,
    w_im: Tensor,
    conj_pairs: bool,
) -> tuple[Tensor, Tensor]:
    """v (J, R, N), z (R, K), w (R, N) as real and imaginary parts of one real dtype -> the real
    and imaginary parts of the (J, R, K) sum."""
    k = _kernels()
    J, R, N = v_re.shape
    K = z_re.shape[1]
    _use_threads(k)
    block = _points_per_task(R, K)
    out_re, out_im = (v_re.new_empty(J, R, K) for _ in range(2))
    k.cauchy_forward(
        *_contiguous(v_re, v_im, z_re, z_im, w_re, w_im), bool(conj_pairs), block, _np(out_re), _np(out_im)
    )
    return out_re, out_im


@torch.library.custom_op(qualname("cauchy_numba_backward"), mutates_args=(), device_types="cpu")
def _cauchy_backward_op(
    v_re: Tensor,
    v_im: Tensor,
    z_re: Tensor,
    z_im: Tensor,
    w_re: Tensor,
    w_im: Tensor,
    g_re: Tensor,
    g_im: Tensor,
    conj_pairs: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of :func:`_cauchy_op` for the output gradients ``g_re``, ``g_im``: those of
    ``z_re``, ``z_im``, and those of ``v`` and ``w`` as the kernels leave them, float64 partial sums
    over the blocks of points (blocks, J, R, N) and (blocks, R, N), which :func:`_cauchy_backward`
    adds. The partial sums are outputs so that a plan made on fake tensors (``longrange plan``)
    counts them: at small sizes they are the training step's peak."""
    k = _kernels()
    J, R, N = v_re.shape
    K = z_re.shape[1]
    _use_threads(k)
    block = _points_per_task(R, K)
    gv_re, gv_im, gw_re, gw_im = _cauchy_partials(v_re, R, K)
    gz_re, gz_im = (v_re.new_empty(R, K) for _ in range(2))
    k.cauchy_backward(
        *_contiguous(v_re, v_im, z_re, z_im, w_re, w_im, g_re, g_im),
        bool(conj_pairs),
        block,
        _np(gv_re),
        _np(gv_im),
        _np(gw_re),
        _np(gw_im),
        _np(gz_re),
        _np(gz_im),
    )
    return gv_re, gv_im, gz_re, gz_im, gw_re, gw_im


def _cauchy_partials(v_re: Tensor, R: int, K: int) -> list[Tensor]:
    """The backward kernels' partial sums of the gradients of v (re, im) and w (re, im), float64
    (PARTIAL_SUM_DTYPE), one per block of points."""
    J, _, N = v_re.shape
    blocks = -(-K // _points_per_task(R, K))
    return [v_re.new_empty(blocks, *shape, dtype=torch.float64) for shape in ((J, R, N),) * 2 + ((R, N),) * 2]


@_cauchy_backward_op.register_fake
def _(v_re, v_im, z_re, z_im, w_re, w_im, g_re, g_im, conj_pairs):
    R, K = z_re.shape
    gv_re, gv_im, gw_re, gw_im = _cauchy_partials(v_re, R, K)
    return gv_re, gv_im, z_re.new_empty(R, K), z_im.new_empty(R, K), gw_re, gw_im


def _cauchy_backward(ctx, saved: tuple[Tensor, ...], g_re: Tensor, g_im: Tensor) -> tuple[Tensor, ...]:
    """The gradients (v_re, v_im, z_re, z_im, w_re, w_im) of :func:`_cauchy_op`: the kernels'
    partial sums added in float64 and rounded to the inputs' dtype."""
    gv_re, gv_im, gz_re, gz_im, gw_re, gw_im = _cauchy_backward_op_eager(*saved, g_re, g_im, ctx.conj_pairs)
    real = saved[0].dtype
    return gv_re.sum(0).to(real), gv_im.sum(0).to(real), gz_re, gz_im, gw_re.sum(0).to(real), gw_im.sum(0).to(real)


_cauchy_op_eager = register_cauchy_operator(_cauchy_op, _cauchy_backward)
_cauchy_backward_op_eager = eager(_cauchy_backward_op)
register_flops(
    _cauchy_backward_op,
    lambda v_re, v_im, z_re, z_im, w_re, w_im, g_re, g_im, conj: cauchy_flops(*v_re, z_re[1], conj, backward=True),
)


def cauchy_numba(v: Tensor, z: Tensor, w: Tensor, conj_pairs: bool = False) -> Tensor:
    """The Cauchy sum of :func:`longrange.ops.ssm_kernels.cauchy` by the numba kernels (arguments
    checked by the caller; see the module docstring)."""
    _kernels_or_raise("cauchy", v, z, w)
    layout = cauchy_layout(v, z, w)
    if layout.R * layout.J == 0 or layout.K == 0:
        return layout.from_canonical(torch.zeros(layout.J, layout.R, layout.K, dtype=complex_dtype(layout.real)))
    vc, zc, wc = layout.to_canonical(v, z, w)
    out_re, out_im = _cauchy_op_eager(vc.real, vc.imag, zc.real, zc.imag, wc.real, wc.imag, bool(conj_pairs))
    return layout.from_canonical(torch.complex(out_re, out_im))


__all__ = ["cauchy_numba", "numba_available", "unavailable_reason", "vandermonde_numba", "warm_up"]
