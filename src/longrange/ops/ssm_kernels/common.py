"""What every implementation of the two products shares: argument checks, dtypes and the canonical
layouts the fused kernels work in.

The two products (see :mod:`longrange.ops.ssm_kernels`):

* Vandermonde: ``K[..., h, l] = Re sum_m W[..., h, m] exp(l · log_dA[h, m])``, ``log_dA`` (H, M)
  or (1, M) (modes shared by the channels), ``W`` (..., H, M);
* Cauchy: ``out[..., k] = sum_n v[..., n] / (z[..., k] - w[..., n])`` (plus, with ``conj_pairs``,
  the same sum over the conjugate partners ``conj(v) / (z - conj(w))``), broadcasting over the
  leading dimensions.

Canonical layouts (what the numba and Triton kernels take): the Vandermonde product as modes
``a`` (R, M) and weights ``w`` (J, R, M) -> (J, R, L), where row r of the modes serves the J
weight rows of index r (R = H, J = the product of W's leading dimensions; or R = 1 and J every row
of W when the modes are shared); the Cauchy product as ``v`` (J, R, N), ``z`` (R, K), ``w`` (R, N)
-> (J, R, K), where r runs over the leading dimensions of z and w and j over those that only v has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

#: The two ops' names, as reported to :func:`longrange.ops.used.note`.
VANDERMONDE, CAUCHY = "vandermonde", "cauchy"


def real_dtype(*tensors: Tensor) -> torch.dtype:
    """The real compute dtype of complex or real tensors: float64 if any is double precision,
    else float32 (half precision is computed in float32)."""
    wide = any(t.dtype in (torch.float64, torch.complex128) for t in tensors)
    return torch.float64 if wide else torch.float32


def complex_dtype(real: torch.dtype) -> torch.dtype:
    return torch.complex128 if real == torch.float64 else torch.complex64


def check_length(L: object, op: str) -> None:
    if not isinstance(L, int) or isinstance(L, bool) or L < 1:
        raise ValueError(f"{op}: kernel length L must be a positive int, got {L!r}")


# --------------------------------------------------------------------------------------------
# Vandermonde
# --------------------------------------------------------------------------------------------


def check_vandermonde_args(log_dA: Tensor, W: Tensor, L: int) -> None:
    """ValueError naming the argument at fault unless the shapes fit (see the module docstring)."""
    if log_dA.dim() != 2 or W.dim() < 2 or log_dA.shape[-1] != W.shape[-1] or log_dA.shape[0] not in (1, W.shape[-2]):
        raise ValueError(
            f"vandermonde_kernel: log_dA {tuple(log_dA.shape)} must be (H, M) or (1, M) for W of shape (..., H, M), "
            f"got W {tuple(W.shape)}"
        )
    check_length(L, "vandermonde_kernel")
    if log_dA.device != W.device:
        raise ValueError(f"vandermonde_kernel: log_dA is on {log_dA.device}, W on {W.device}; both must share a device")


@dataclass(frozen=True)
class VandermondeLayout:
    """How (log_dA, W) map to the canonical (a (R, M), w (J, R, M)) and back."""

    out_shape: tuple[int, ...]  # W.shape[:-1] + (L,)
    R: int
    J: int
    real: torch.dtype

    def to_canonical(self, log_dA: Tensor, W: Tensor) -> tuple[Tensor, Tensor]:
        cdtype = complex_dtype(self.real)
        M = W.shape[-1]
        return log_dA.to(cdtype), W.to(cdtype).reshape(self.J, self.R, M)

    def from_canonical(self, out: Tensor) -> Tensor:
        return out.reshape(self.out_shape)


def vandermonde_layout(log_dA: Tensor, W: Tensor, L: int) -> VandermondeLayout:
    H = W.shape[-2]
    R = log_dA.shape[0]  # H, or 1 when the modes are shared
    J = math.prod(W.shape[:-2]) * (H // R)
    return VandermondeLayout(out_shape=(*W.shape[:-1], L), R=R, J=J, real=real_dtype(log_dA, W))


# --------------------------------------------------------------------------------------------
# Cauchy
# --------------------------------------------------------------------------------------------


def check_cauchy_args(v: Tensor, z: Tensor, w: Tensor) -> tuple[int, ...]:
    """ValueError unless v (..., N), z (..., K), w (..., N) fit and broadcast; returns the
    broadcast leading shape."""
    for name, t in (("v", v), ("z", z), ("w", w)):
        if not isinstance(t, Tensor) or t.dim() < 1:
            raise ValueError(
                f"cauchy: {name} must be a tensor with at least one dimension, got {getattr(t, 'shape', type(t))}"
            )
    if v.shape[-1] != w.shape[-1]:
        raise ValueError(f"cauchy: v {tuple(v.shape)} and w {tuple(w.shape)} differ in their last dimension")
    try:
        lead = torch.broadcast_shapes(v.shape[:-1], z.shape[:-1], w.shape[:-1])
    except RuntimeError as err:
        raise ValueError(
            f"cauchy: the leading dimensions of v {tuple(v.shape)}, z {tuple(z.shape)} and w {tuple(w.shape)} do not broadcast"
        ) from err
    if len({v.device, z.device, w.device}) > 1:
        raise ValueError(f"cauchy: v, z and w must share a device, got {v.device}, {z.device}, {w.device}")
    return tuple(lead)


@dataclass(frozen=True)
class CauchyLayout:
    """How (v, z, w) map to the canonical (v (J, R, N), z (R, K), w (R, N)) and back.

    The broadcast leading shape ``lead`` is split at ``split``: the dimensions in front (J) are
    v's alone, z and w vary over those behind (R). When z's and w's leading shape is not a suffix
    of ``lead``, everything is R (z and w are expanded, which costs their size times J, never
    the (K, N) matrix).
    """

    lead: tuple[int, ...]
    split: int
    zw_shape: tuple[int, ...]  # what z's and w's leading dimensions are expanded to (product R)
    N: int
    K: int
    real: torch.dtype
    complex_inputs: bool

    @property
    def J(self) -> int:
        return math.prod(self.lead[: self.split])

    @property
    def R(self) -> int:
        return math.prod(self.lead[self.split :])

    def to_canonical(self, v: Tensor, z: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        cdtype = complex_dtype(self.real)
        v = v.to(cdtype).expand(*self.lead, self.N).reshape(self.J, self.R, self.N)
        z = z.to(cdtype).expand(*self.zw_shape, self.K).reshape(self.R, self.K)
        w = w.to(cdtype).expand(*self.zw_shape, self.N).reshape(self.R, self.N)
        return v, z, w

    def from_canonical(self, out: Tensor) -> Tensor:
        out = out.reshape(*self.lead, self.K)
        return out if self.complex_inputs else out.real


def cauchy_layout(v: Tensor, z: Tensor, w: Tensor) -> CauchyLayout:
    lead = check_cauchy_args(v, z, w)
    zw_shape = tuple(torch.broadcast_shapes(z.shape[:-1], w.shape[:-1]))
    zw = zw_shape
    while zw and zw[0] == 1:  # size-1 dimensions in front of z's and w's own shape
        zw = zw[1:]
    split = len(lead) - len(zw)
    if lead[split:] != zw:  # z and w vary within v's dimensions: expand them
        split, zw_shape = 0, lead
    return CauchyLayout(
        lead=lead,
        split=split,
        zw_shape=zw_shape,
        N=v.shape[-1],
        K=z.shape[-1],
        real=real_dtype(v, z, w),
        complex_inputs=any(t.is_complex() for t in (v, z, w)),
    )


# --------------------------------------------------------------------------------------------
# FLOP counts of the fused kernels (see longrange.ops.custom_ops for the convention)
# --------------------------------------------------------------------------------------------


def vandermonde_flops(J: int, R: int, M: int, L: int, backward: bool = False) -> int:
    """Floating-point operations of the Vandermonde product in the canonical layout (weights
    (J, R, M), modes (R, M), length L), counted on the defining computation: the powers by one
    complex multiplication (6) per (r, l, m); per term (j, r, l, m) ``Re(w p)`` and its
    accumulation (4). Backward: the powers again (6 per (r, l, m)); per term ``g conj(p)`` and
    ``l g conj(p)`` with their accumulations (8); ``l g`` per (j, r, l) (1); ``conj(w) S`` and its
    sum over j per (j, r, m) (8)."""
    if backward:
        return 8 * J * R * L * M + 6 * R * L * M + J * R * L + 8 * J * R * M
    return 4 * J * R * L * M + 6 * R * L * M


def cauchy_flops(J: int, R: int, N: int, K: int, conj_pairs: bool, backward: bool = False, part: str = "all") -> int:
    """Floating-point operations of the Cauchy product in the canonical layout (v (J, R, N),
    z (R, K), w (R, N)). Per (r, k, n), the resolvent ρ = 1/(z - w): z - w 2, |z - w|² 3, the
    reciprocal 1, ρ 2; with ``conj_pairs`` also σ = 1/(z - conj(w)) (6) and the four sums that
    combine them (4): 8 or 18. Per term (j, r, k, n), one complex multiply-add: 8.

    Backward (``part="all"``: every gradient in one pass): per (r, k, n) the resolvents and their
    squares (5 each, 4 more to combine those of a pair): 13 or 32; per term the sums for the
    gradients of v and w (16) and of z (8); per (j, r, n) ``conj(v) yw`` summed over j (8); per
    (j, r, k) ``-g conj(t)`` summed over j (8). A pass computing only the gradients of v and w
    (``part="vw"``) or of z (``part="z"``) counts its own resolvents and terms."""
    if not backward:
        return R * K * N * (18 if conj_pairs else 8) + 8 * J * R * K * N
    resolvents = R * K * N * (32 if conj_pairs else 13)
    vw, z = 16 * J * R * K * N + 8 * J * R * N, 8 * J * R * K * N + 8 * J * R * K
    return {"all": resolvents + vw + z, "vw": resolvents + vw, "z": resolvents + z}[part]


# --------------------------------------------------------------------------------------------
# What the numba and Triton operators share (see longrange.ops.custom_ops)
# --------------------------------------------------------------------------------------------


def register_vandermonde_operators(op, backward_op):
    """Fake implementations, autograd and FLOP counts of a Vandermonde operator
    ``(a_re, a_im, w_re, w_im, L) -> (J, R, L)`` and of its backward
    ``(a_re, a_im, w_re, w_im, grad, L) -> (ga_re, ga_im, gw_re, gw_im)``; returns the operator as
    a callable that skips the dispatcher in plain eager calls (:func:`~longrange.ops.custom_ops.autograd_and_eager`)."""
    from longrange.ops.custom_ops import autograd_and_eager, eager, register_flops

    backward_call = eager(backward_op)

    op.register_fake(lambda a_re, a_im, w_re, w_im, L: w_re.new_empty(*w_re.shape[:2], L))
    backward_op.register_fake(
        lambda a_re, a_im, w_re, w_im, grad, L: (
            a_re.new_empty(a_re.shape),
            a_re.new_empty(a_re.shape),
            w_re.new_empty(w_re.shape),
            w_re.new_empty(w_re.shape),
        )
    )

    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs[:4])
        ctx.L = inputs[4]

    def backward(ctx, grad: Tensor):
        grads = backward_call(*ctx.saved_tensors, grad, ctx.L)
        return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad)), None)

    call = autograd_and_eager(op, backward, setup_context)
    register_flops(op, lambda a_re, a_im, w_re, w_im, L: vandermonde_flops(*w_re, L))
    register_flops(backward_op, lambda a_re, a_im, w_re, w_im, grad, L: vandermonde_flops(*w_re, L, backward=True))
    return call


def register_cauchy_operator(op, backward):
    """Fake implementation, autograd and FLOP count of a Cauchy operator
    ``(v_re, v_im, z_re, z_im, w_re, w_im, conj_pairs) -> (out_re, out_im)``; ``backward(ctx,
    saved tensors, g_re, g_im)`` returns the six gradients (``ctx.conj_pairs``,
    ``ctx.needs_input_grad`` as usual); the backward operator registers its own. Returns the
    operator as a callable that skips the dispatcher in plain eager calls."""
    from longrange.ops.custom_ops import autograd_and_eager, register_flops

    def fake(v_re, v_im, z_re, z_im, w_re, w_im, conj_pairs):
        shape = (*v_re.shape[:2], z_re.shape[1])
        return v_re.new_empty(shape), v_re.new_empty(shape)

    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs[:6])
        ctx.conj_pairs = inputs[6]

    def backward_(ctx, g_re: Tensor, g_im: Tensor):
        grads = backward(ctx, ctx.saved_tensors, g_re, g_im)
        return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad)), None)

    op.register_fake(fake)
    call = autograd_and_eager(op, backward_, setup_context)
    register_flops(op, lambda v_re, v_im, z_re, z_im, w_re, w_im, conj: cauchy_flops(*v_re, z_re[1], conj))
    return call
