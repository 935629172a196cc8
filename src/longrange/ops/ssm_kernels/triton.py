"""The Vandermonde and Cauchy products as Triton kernels, for GPUs (``impl="triton"``).

:func:`vandermonde_triton` and :func:`cauchy_triton` take the arguments of
:func:`longrange.ops.ssm_kernels.vandermonde_kernel` and :func:`~longrange.ops.ssm_kernels.cauchy`
(checked by the caller), forward and backward (:class:`_TritonVandermonde`,
:class:`_TritonCauchy`); the kernels are in :mod:`longrange.ops.ssm_kernels._triton_kernels`.
They recompute the powers or resolvents in the backward pass instead of storing (…, N, L) or
(…, K, N) tensors, use no atomics (deterministic), and compute in float32 (float64 if an input is
double precision); the first power of each tile of positions is taken in float64, so the powers
keep their accuracy at long lengths.

Devices: CUDA tensors run compiled kernels; CPU tensors run in Triton's interpreter when the
environment variable ``TRITON_INTERPRET=1`` is set (slow; for tests). :func:`triton_available`
says whether a device can run them.
"""
from __future__ import annotations


import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from longrange.ops._lazy_kernels import LazyKernels, triton_interpret_requested, triton_runs_on
from longrange.ops.ssm_kernels.common import cauchy_layout, complex_dtype, vandermonde_layout

#: Tile sizes per mode. GPU: tiles of at most 4096 elements (blocks of rows/vectors times
#: positions/points times modes/poles), a first choice that fits the registers, not tuned on
#: hardware. Interpreter: small tiles, so that the tests cross tile edges.
DEFAULT_CONFIG = {
    "gpu": dict(block_j=4, block_m=32, tile=4096, num_warps=4),
    "interpret": dict(block_j=2, block_m=4, tile=64, num_warps=1),
}

_KERNELS = LazyKernels("longrange.ops.ssm_kernels._triton_kernels")
_kernel_module = _KERNELS.load


def triton_available(device: torch.device | str) -> bool:
    """Whether the Triton kernels can run on tensors of ``device``: triton importable and either
    a CUDA device (with CUDA present) or a CPU device with ``TRITON_INTERPRET=1``."""
    return _kernel_module() is not None and triton_runs_on(device)


def unavailable_reason(device: torch.device | str) -> str | None:
    """Why the Triton kernels cannot run on ``device``, or None when they can."""
    if _kernel_module() is None:
        return f"triton does not import ({_KERNELS.error})"
    if triton_available(device):
        return None
    return "they run on CUDA tensors, or on CPU tensors in Triton's interpreter with TRITON_INTERPRET=1"


def _check_runnable(op: str, *tensors: Tensor) -> torch.device:
    device = tensors[0].device
    reason = unavailable_reason(device)
    if reason is not None:
        raise RuntimeError(f"{op}: impl='triton' cannot run on {device}: {reason}")
    return device


def _config(device: torch.device) -> tuple[dict, bool]:
    interpreting = device.type != "cuda" or triton_interpret_requested()
    return dict(DEFAULT_CONFIG["interpret" if interpreting else "gpu"]), interpreting


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _acc(dtype: torch.dtype):
    tl = _kernel_module().triton.language
    return tl.float64 if dtype == torch.float64 else tl.float32


def _parts(t: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    return t.real.to(dtype).contiguous(), t.imag.to(dtype).contiguous()


def _blocks(J: int, M: int, cfg: dict) -> tuple[int, int, int]:
    """(block of rows j, block of modes or poles, block of positions or points) for a tile of at
    most ``cfg["tile"]`` elements (all powers of two)."""
    block_j = min(_pow2(J), cfg["block_j"])
    block_m = min(_pow2(M), cfg["block_m"])
    return block_j, block_m, min(128, max(8, cfg["tile"] // (block_j * block_m)))


# --------------------------------------------------------------------------------------------
# Vandermonde
# --------------------------------------------------------------------------------------------


class _TritonVandermonde(torch.autograd.Function):
    """(a (R, M), w (J, R, M), L) complex -> (J, R, L) real."""

    @staticmethod
    def forward(ctx, a: Tensor, w: Tensor, L: int) -> Tensor:
        real = a.real.dtype
        J, R, M = w.shape
        cfg, interpreting = _config(a.device)
        bj, bm, bl = _blocks(J, M, cfg)
        a_re, a_im = _parts(a, torch.float64)
        w_re, w_im = _parts(w, real)
        out = torch.empty(J, R, L, dtype=real, device=a.device)
        k = _kernel_module().kernels(interpreting)["vandermonde_fwd"]
        k[(R, -(-J // bj), -(-L // bl))](
            a_re, a_im, w_re, w_im, out, J, R, M, L,
            BLOCK_J=bj, BLOCK_L=bl, BLOCK_M=bm, ACC=_acc(real), num_warps=cfg["num_warps"],
        )
        ctx.save_for_backward(a, w)
        ctx.L = L
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        a, w = ctx.saved_tensors
        L = ctx.L
        real = a.real.dtype
        J, R, M = w.shape
        cfg, interpreting = _config(a.device)
        bj, bm, bl = _blocks(J, M, cfg)
        j_blocks = -(-J // bj)
        a_re, a_im = _parts(a, torch.float64)
        w_re, w_im = _parts(w, real)
        gw_re, gw_im = (torch.empty(J, R, M, dtype=real, device=a.device) for _ in range(2))
        ga_re, ga_im = (torch.empty(R, j_blocks, M, dtype=real, device=a.device) for _ in range(2))
        k = _kernel_module().kernels(interpreting)["vandermonde_bwd"]
        k[(R, j_blocks, -(-M // bm))](
            a_re, a_im, w_re, w_im, grad.to(real).contiguous(), gw_re, gw_im, ga_re, ga_im, J, R, M, L, j_blocks,
            BLOCK_J=bj, BLOCK_L=bl, BLOCK_M=bm, ACC=_acc(real), num_warps=cfg["num_warps"],
        )
        grad_a = torch.complex(ga_re.sum(1), ga_im.sum(1)) if ctx.needs_input_grad[0] else None
        grad_w = torch.complex(gw_re, gw_im) if ctx.needs_input_grad[1] else None
        return grad_a, grad_w, None


def vandermonde_triton(log_dA: Tensor, W: Tensor, L: int) -> Tensor:
    """``K[..., h, l] = Re sum_m W[..., h, m] exp(l · log_dA[h, m])`` by the Triton kernels
    (arguments checked by the caller)."""
    _check_runnable("vandermonde_kernel", log_dA, W)
    layout = vandermonde_layout(log_dA, W, L)
    a, w = layout.to_canonical(log_dA, W)
    if a.numel() == 0 or w.numel() == 0:  # nothing to launch over
        return layout.from_canonical(torch.zeros(layout.J, layout.R, L, dtype=layout.real, device=W.device))
    return layout.from_canonical(_TritonVandermonde.apply(a, w, L))


# --------------------------------------------------------------------------------------------
# Cauchy
# --------------------------------------------------------------------------------------------


class _TritonCauchy(torch.autograd.Function):
    """(v (J, R, N), z (R, K), w (R, N), conj_pairs) complex -> (J, R, K) complex."""

    @staticmethod
    def forward(ctx, v: Tensor, z: Tensor, w: Tensor, conj_pairs: bool) -> Tensor:
        real = v.real.dtype
        J, R, N = v.shape
        K = z.shape[1]
        cfg, interpreting = _config(v.device)
        bj, bn, bk = _blocks(J, N, cfg)
        out_re, out_im = (torch.empty(J, R, K, dtype=real, device=v.device) for _ in range(2))
        k = _kernel_module().kernels(interpreting)["cauchy_fwd"]
        k[(R, -(-K // bk), -(-J // bj))](
            *_parts(v, real), *_parts(z, real), *_parts(w, real), out_re, out_im, J, R, N, K,
            CONJ=bool(conj_pairs), BLOCK_J=bj, BLOCK_K=bk, BLOCK_N=bn, ACC=_acc(real), num_warps=cfg["num_warps"],
        )
        ctx.save_for_backward(v, z, w)
        ctx.conj_pairs = bool(conj_pairs)
        return torch.complex(out_re, out_im)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        v, z, w = ctx.saved_tensors
        real = v.real.dtype
        J, R, N = v.shape
        K = z.shape[1]
        cfg, interpreting = _config(v.device)
        bj, bn, bk = _blocks(J, N, cfg)
        ks = _kernel_module().kernels(interpreting)
        args = (*_parts(v, real), *_parts(z, real), *_parts(w, real), *_parts(grad, real))
        meta = dict(CONJ=ctx.conj_pairs, BLOCK_J=bj, BLOCK_K=bk, BLOCK_N=bn, ACC=_acc(real), num_warps=cfg["num_warps"])
        need = ctx.needs_input_grad
        grad_v = grad_z = grad_w = None
        if need[1]:
            gz_re, gz_im = (torch.empty(R, K, dtype=real, device=v.device) for _ in range(2))
            ks["cauchy_bwd_z"][(R, -(-K // bk))](*args, gz_re, gz_im, J, R, N, K, **meta)
            grad_z = torch.complex(gz_re, gz_im)
        if need[0] or need[2]:
            gv_re, gv_im = (torch.empty(J, R, N, dtype=real, device=v.device) for _ in range(2))
            gw_re, gw_im = (torch.empty(R, N, dtype=real, device=v.device) for _ in range(2))
            ks["cauchy_bwd_vw"][(R, -(-N // bn))](*args, gv_re, gv_im, gw_re, gw_im, J, R, N, K, **meta)
            grad_v = torch.complex(gv_re, gv_im) if need[0] else None
            grad_w = torch.complex(gw_re, gw_im) if need[2] else None
        return grad_v, grad_z, grad_w, None


def cauchy_triton(v: Tensor, z: Tensor, w: Tensor, conj_pairs: bool = False) -> Tensor:
    """The Cauchy sum of :func:`longrange.ops.ssm_kernels.cauchy` by the Triton kernels (arguments
    checked by the caller)."""
    _check_runnable("cauchy", v, z, w)
    layout = cauchy_layout(v, z, w)
    if layout.R * layout.J == 0 or layout.K == 0 or layout.N == 0:
        zero = torch.zeros(layout.J, layout.R, layout.K, dtype=complex_dtype(layout.real), device=v.device)
        return layout.from_canonical(zero)
    vc, zc, wc = layout.to_canonical(v, z, w)
    return layout.from_canonical(_TritonCauchy.apply(vc, zc, wc, conj_pairs))
