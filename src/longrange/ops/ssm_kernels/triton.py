"""The Vandermonde and Cauchy products as Triton kernels, for GPUs (``impl="triton"``).

:func:`vandermonde_triton` and :func:`cauchy_triton` take the arguments of
:func:`longrange.ops.ssm_kernels.vandermonde_kernel` and :func:`~longrange.ops.ssm_kernels.cauchy`
(checked by the caller), forward and backward, as the PyTorch operators
``torch.ops.longrange.vandermonde_triton``, ``cauchy_triton`` and their ``*_backward`` (see
:mod:`longrange.ops.custom_ops`); the kernels are in :mod:`longrange.ops.ssm_kernels._triton_kernels`.
They recompute the powers or resolvents in the backward pass instead of storing (…, N, L) or
(…, K, N) tensors, use no atomics (deterministic), and compute in float32 (float64 if an input is
double precision); the first power of each tile of positions is taken in float64, so the powers
keep their accuracy at long lengths. The Cauchy kernels carry their resolvents to about twice
float32's precision and compensate every sum, in float32 arithmetic, so that points where the sum
cancels keep their accuracy.

Devices: CUDA tensors run compiled kernels; CPU tensors run in Triton's interpreter when the
environment variable ``TRITON_INTERPRET=1`` is set (slow; for tests). :func:`triton_available`
says whether a device can run them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops._lazy_kernels import LazyKernels, interpreter_reason, triton_interpret_requested, triton_runs_on
from longrange.ops.custom_ops import qualname, register_flops
from longrange.ops.dataless import holds_data
from longrange.ops.ssm_kernels.common import (
    cauchy_flops,
    cauchy_layout,
    complex_dtype,
    register_cauchy_operator,
    register_vandermonde_operators,
    vandermonde_layout,
)

#: Tile sizes per mode. GPU: tiles of at most 4096 elements (blocks of rows/vectors times
#: positions/points times modes/poles; for the Cauchy kernels 4096 accumulators, see
#: :func:`_cauchy_constants`), a first choice that fits the registers, not tuned on hardware.
#: Interpreter: small tiles, so that the tests cross tile edges. ``float64``: compute in float64
#: also for float32 inputs (the results rounded once to float32; see docs/performance.md for the
#: accuracy of both; not timed on a GPU yet).
DEFAULT_CONFIG = {
    "gpu": dict(block_j=4, block_m=32, tile=4096, num_warps=4, float64=False),
    "interpret": dict(block_j=2, block_m=4, tile=64, num_warps=1, float64=False),
}

_KERNELS = LazyKernels("longrange.ops.ssm_kernels._triton_kernels")
_kernel_module = _KERNELS.load


def triton_available(device: torch.device | str) -> bool:
    """Whether the Triton kernels can run on tensors of ``device``: triton importable and either
    a CUDA device (with CUDA present) or a CPU device with ``TRITON_INTERPRET=1``; and the ``meta``
    device, where the operators' fake implementations run (nothing is launched, so triton is not
    needed)."""
    if torch.device(device).type == "meta":
        return True
    return _kernel_module() is not None and triton_runs_on(device)


def unavailable_reason(device: torch.device | str) -> str | None:
    """Why the Triton kernels cannot run on ``device``, or None when they can."""
    if torch.device(device).type == "meta":
        return None
    if _kernel_module() is None:
        return f"triton does not import ({_KERNELS.error})"
    if triton_available(device):
        return None
    if (why := interpreter_reason(device)) is not None:
        return why
    return "they run on CUDA tensors, or on CPU tensors in Triton's interpreter with TRITON_INTERPRET=1"


def _check_runnable(op: str, *tensors: Tensor) -> torch.device:
    device = tensors[0].device
    if not holds_data(tensors[0]):  # meta or fake tensors: the operators' fake implementations run
        return device
    reason = unavailable_reason(device)
    if reason is not None:
        raise RuntimeError(f"{op}: impl='triton' cannot run on {device}: {reason}")
    return device


def _config(device: torch.device) -> tuple[dict, bool]:
    interpreting = device.type not in ("cuda", "meta") or triton_interpret_requested()  # meta stands for a GPU
    return dict(DEFAULT_CONFIG["interpret" if interpreting else "gpu"]), interpreting


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _acc(dtype: torch.dtype, cfg: dict):
    """The kernels' compute dtype: float64 for float64 inputs or with ``cfg["float64"]``, else float32."""
    tl = _kernel_module().triton.language
    return tl.float64 if dtype == torch.float64 or cfg.get("float64") else tl.float32


def _contiguous(*tensors: Tensor) -> list[Tensor]:
    return [t.contiguous() for t in tensors]


def _blocks(J: int, M: int, cfg: dict) -> tuple[int, int, int]:
    """(block of rows j, block of modes, block of positions) of the Vandermonde kernels for a tile
    of at most ``cfg["tile"]`` elements (all powers of two)."""
    block_j = min(_pow2(J), cfg["block_j"])
    block_m = min(_pow2(M), cfg["block_m"])
    return block_j, block_m, min(128, max(8, cfg["tile"] // (block_j * block_m)))


#: Launch options of the Cauchy kernels: no contraction of products and sums into multiply-adds,
#: which would break the error-free transformations of their compensated arithmetic (they call
#: ``tl.fma`` where they want one; the interpreter never contracts).
CAUCHY_OPTIONS = dict(enable_fp_fusion=False)


def _cauchy_constants(J: int, N: int, cfg: dict) -> dict[str, dict]:
    """Block sizes (powers of two) of each Cauchy kernel, by kernel name. The compensated sums keep
    two accumulators per sum and tile element: the tiles (vectors, points) of the forward pass and
    of the gradient of z (one pole at a time) hold four per element, those (vectors, poles,
    points) of the gradients of v and w eight; about ``cfg["tile"]`` per program (with blocks of
    at most 4 vectors)."""
    block_j = min(_pow2(J), cfg["block_j"])
    block_n = min(_pow2(N), cfg["block_m"])
    block_k = max(8, cfg["tile"] // 16)
    block_kv = min(64, max(2, cfg["tile"] // (8 * block_j * block_n)))
    points = dict(BLOCK_J=block_j, BLOCK_K=block_k)
    return {
        "cauchy_fwd": points,
        "cauchy_bwd_z": points,
        "cauchy_bwd_vw": dict(
            BLOCK_J=block_j, BLOCK_N=block_n, BLOCK_K=block_kv, LOG2_BLOCK_K=block_kv.bit_length() - 1
        ),
    }


# --------------------------------------------------------------------------------------------
# Vandermonde
# --------------------------------------------------------------------------------------------


@torch.library.custom_op(qualname("vandermonde_triton"), mutates_args=())
def _vandermonde_op(a_re: Tensor, a_im: Tensor, w_re: Tensor, w_im: Tensor, L: int) -> Tensor:
    """Modes a (R, M) and weights w (J, R, M) as real and imaginary parts of one real dtype ->
    (J, R, L) in that dtype."""
    real = w_re.dtype
    J, R, M = w_re.shape
    cfg, interpreting = _config(w_re.device)
    bj, bm, bl = _blocks(J, M, cfg)
    a_re, a_im = (t.to(torch.float64).contiguous() for t in (a_re, a_im))
    w_re, w_im = w_re.contiguous(), w_im.contiguous()
    out = torch.empty(J, R, L, dtype=real, device=w_re.device)
    k = _kernel_module().kernels(interpreting)["vandermonde_fwd"]
    k[(R, -(-J // bj), -(-L // bl))](
        a_re,
        a_im,
        w_re,
        w_im,
        out,
        J,
        R,
        M,
        L,
        BLOCK_J=bj,
        BLOCK_L=bl,
        BLOCK_M=bm,
        BLOCK_S=min(16, bl),
        ACC=_acc(real, cfg),
        num_warps=cfg["num_warps"],
    )
    return out


@torch.library.custom_op(qualname("vandermonde_triton_backward"), mutates_args=())
def _vandermonde_backward_op(
    a_re: Tensor,
    a_im: Tensor,
    w_re: Tensor,
    w_im: Tensor,
    grad: Tensor,
    L: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients (a_re, a_im, w_re, w_im) of :func:`_vandermonde_op` for the output gradient ``grad``."""
    real = w_re.dtype
    J, R, M = w_re.shape
    cfg, interpreting = _config(w_re.device)
    bj, bm, bl = _blocks(J, M, cfg)
    j_blocks = -(-J // bj)
    a_re, a_im = (t.to(torch.float64).contiguous() for t in (a_re, a_im))
    w_re, w_im = w_re.contiguous(), w_im.contiguous()
    gw_re, gw_im = (torch.empty(J, R, M, dtype=real, device=w_re.device) for _ in range(2))
    ga_re, ga_im = (torch.empty(R, j_blocks, M, dtype=real, device=w_re.device) for _ in range(2))
    k = _kernel_module().kernels(interpreting)["vandermonde_bwd"]
    k[(R, j_blocks, -(-M // bm))](
        a_re,
        a_im,
        w_re,
        w_im,
        grad.to(real).contiguous(),
        gw_re,
        gw_im,
        ga_re,
        ga_im,
        J,
        R,
        M,
        L,
        j_blocks,
        BLOCK_J=bj,
        BLOCK_L=bl,
        BLOCK_M=bm,
        BLOCK_S=min(16, bl),
        ACC=_acc(real, cfg),
        num_warps=cfg["num_warps"],
    )
    return ga_re.sum(1), ga_im.sum(1), gw_re, gw_im


register_vandermonde_operators(_vandermonde_op, _vandermonde_backward_op)


def vandermonde_triton(log_dA: Tensor, W: Tensor, L: int) -> Tensor:
    """``K[..., h, l] = Re sum_m W[..., h, m] exp(l · log_dA[h, m])`` by the Triton kernels
    (arguments checked by the caller)."""
    _check_runnable("vandermonde_kernel", log_dA, W)
    layout = vandermonde_layout(log_dA, W, L)
    a, w = layout.to_canonical(log_dA, W)
    if a.numel() == 0 or w.numel() == 0:  # nothing to launch over
        return layout.from_canonical(torch.zeros(layout.J, layout.R, L, dtype=layout.real, device=W.device))
    return layout.from_canonical(_vandermonde_op(a.real, a.imag, w.real, w.imag, L))


# --------------------------------------------------------------------------------------------
# Cauchy
# --------------------------------------------------------------------------------------------


@torch.library.custom_op(qualname("cauchy_triton"), mutates_args=())
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
    real = v_re.dtype
    J, R, N = v_re.shape
    K = z_re.shape[1]
    cfg, interpreting = _config(v_re.device)
    blocks = _cauchy_constants(J, N, cfg)["cauchy_fwd"]
    out_re, out_im = (torch.empty(J, R, K, dtype=real, device=v_re.device) for _ in range(2))
    k = _kernel_module().kernels(interpreting)["cauchy_fwd"]
    k[(R, -(-K // blocks["BLOCK_K"]), -(-J // blocks["BLOCK_J"]))](
        *_contiguous(v_re, v_im, z_re, z_im, w_re, w_im),
        out_re,
        out_im,
        J,
        R,
        N,
        K,
        CONJ=bool(conj_pairs),
        ACC=_acc(real, cfg),
        num_warps=cfg["num_warps"],
        **blocks,
        **CAUCHY_OPTIONS,
    )
    return out_re, out_im


@torch.library.custom_op(qualname("cauchy_triton_backward"), mutates_args=())
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
    need_vw: bool,
    need_z: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients (v_re, v_im, z_re, z_im, w_re, w_im) of :func:`_cauchy_op` for the output
    gradients ``g_re``, ``g_im``: those of v and w only with ``need_vw``, of z only with ``need_z``
    (empty tensors otherwise; each takes its own kernel)."""
    real = v_re.dtype
    J, R, N = v_re.shape
    K = z_re.shape[1]
    dev = v_re.device
    cfg, interpreting = _config(dev)
    blocks = _cauchy_constants(J, N, cfg)
    ks = _kernel_module().kernels(interpreting)
    args = _contiguous(v_re, v_im, z_re, z_im, w_re, w_im, g_re, g_im)
    meta = dict(CONJ=bool(conj_pairs), ACC=_acc(real, cfg), num_warps=cfg["num_warps"], **CAUCHY_OPTIONS)
    gv_re, gv_im, gz_re, gz_im, gw_re, gw_im = _cauchy_grads(v_re, z_re, w_re, need_vw, need_z)
    if need_z:
        z_blocks = blocks["cauchy_bwd_z"]
        ks["cauchy_bwd_z"][(R, -(-K // z_blocks["BLOCK_K"]))](*args, gz_re, gz_im, J, R, N, K, **z_blocks, **meta)
    if need_vw:
        vw_blocks = blocks["cauchy_bwd_vw"]
        ks["cauchy_bwd_vw"][(R, -(-N // vw_blocks["BLOCK_N"]))](
            *args,
            gv_re,
            gv_im,
            gw_re,
            gw_im,
            J,
            R,
            N,
            K,
            **vw_blocks,
            **meta,
        )
    return gv_re, gv_im, gz_re, gz_im, gw_re, gw_im


def _cauchy_grads(v: Tensor, z: Tensor, w: Tensor, need_vw: bool, need_z: bool) -> tuple[Tensor, ...]:
    """Empty gradients (v_re, v_im, z_re, z_im, w_re, w_im) for :func:`_cauchy_backward_op`: of
    the inputs' shapes where asked for, of none otherwise."""

    def empty(t: Tensor, needed: bool) -> Tensor:
        return t.new_empty(t.shape if needed else (0,))

    return (
        empty(v, need_vw),
        empty(v, need_vw),
        empty(z, need_z),
        empty(z, need_z),
        empty(w, need_vw),
        empty(w, need_vw),
    )


@_cauchy_backward_op.register_fake
def _(v_re, v_im, z_re, z_im, w_re, w_im, g_re, g_im, conj_pairs, need_vw, need_z):
    return _cauchy_grads(v_re, z_re, w_re, need_vw, need_z)


def _cauchy_backward(ctx, saved: tuple[Tensor, ...], g_re: Tensor, g_im: Tensor):
    need = ctx.needs_input_grad
    return _cauchy_backward_op(*saved, g_re, g_im, ctx.conj_pairs, any(need[:2] + need[4:6]), any(need[2:4]))


register_cauchy_operator(_cauchy_op, _cauchy_backward)
register_flops(
    _cauchy_backward_op,
    lambda v_re, v_im, z_re, z_im, w_re, w_im, g_re, g_im, conj, need_vw, need_z: (
        need_vw * cauchy_flops(*v_re, z_re[1], conj, backward=True, part="vw")
        + need_z * cauchy_flops(*v_re, z_re[1], conj, backward=True, part="z")
    ),
)


def cauchy_triton(v: Tensor, z: Tensor, w: Tensor, conj_pairs: bool = False) -> Tensor:
    """The Cauchy sum of :func:`longrange.ops.ssm_kernels.cauchy` by the Triton kernels (arguments
    checked by the caller)."""
    _check_runnable("cauchy", v, z, w)
    layout = cauchy_layout(v, z, w)
    if layout.R * layout.J == 0 or layout.K == 0 or layout.N == 0:
        zero = torch.zeros(layout.J, layout.R, layout.K, dtype=complex_dtype(layout.real), device=v.device)
        return layout.from_canonical(zero)
    vc, zc, wc = layout.to_canonical(v, z, w)
    out_re, out_im = _cauchy_op(vc.real, vc.imag, zc.real, zc.imag, wc.real, wc.imag, bool(conj_pairs))
    return layout.from_canonical(torch.complex(out_re, out_im))
