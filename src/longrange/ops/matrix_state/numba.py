"""The delta rule, the gated delta rule, gated linear attention and Mamba-2's SSD as compiled loops
for CPUs (numba; ``impl="numba"`` of :func:`~longrange.ops.matrix_state.dispatch.delta_rule`,
:func:`~longrange.ops.matrix_state.dispatch.gated_delta_rule`,
:func:`~longrange.ops.matrix_state.dispatch.gla` and :func:`~longrange.ops.matrix_state.dispatch.ssd`,
which runs GLA's kernels with one decay per head: :func:`ssd_numba`).

The chunked forms (e.g. :func:`~longrange.ops.matrix_state.delta_rule.gated_delta_rule_chunk`) turn
the recurrence into batched matrix products, which pays where the state is large (64 x 64 per
head). At the synthetic studies' widths a head's state is small (8 x 16 in MAD's Gated DeltaNet at
width 64, 8 x 8 in its GLA) and the chunked forms' many small products (and, for the delta rules,
triangular solves) and elementwise passes, forward and through autograd, cost more than the
recurrence itself: the kernels
(:mod:`longrange.ops.matrix_state._numba_kernels`) run the recurrence position by position instead,
one task per sequence and head with its state in a local array, and the backward pass written out.
The forward keeps the state entering every span of positions (:func:`span_for`); the backward
recomputes one span's states at a time from it, so memory is the checkpoints, not a state per
position.

The operators are ``torch.ops.longrange.delta_rule_numba`` and ``delta_rule_numba_backward``, one
pair for both rules (``gated``: whether ``g`` is read), and ``gla_numba`` and ``gla_numba_backward``
(see :mod:`longrange.ops.custom_ops`). They compute in float64 when an input is float64, else in
float32; each task is one sequential loop, so the backward is deterministic. ``"auto"`` runs them on
CPUs for states of up to :data:`AUTO_STATE_ELEMENTS` elements per head (``dk * dv``), or up to
:data:`AUTO_NARROW_KEY_STATE_ELEMENTS` for keys of at most :data:`AUTO_KEY_WIDTH` features
(:func:`runs_by_default`), where they were measured faster than the chunked forms
(docs/small-models.md, "Ninth round" and "Sixteenth round"); larger states run ``chunk``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from longrange.ops._lazy_kernels import LazyKernels
from longrange.ops._lazy_kernels import use_threads as _use_threads
from longrange.ops.custom_ops import autograd_and_eager, eager, qualname, register_flops
from longrange.ops.matrix_state import gla as _gla
from longrange.ops.matrix_state import mamba3 as _mamba3
from longrange.ops.matrix_state import ssd as _ssd
from longrange.ops.matrix_state.common import check_chunk_size, compute_dtype, default_scale, initial
from longrange.ops.matrix_state.delta_rule import _prepare

#: ``"auto"`` runs the kernels for heads whose state has at most this many elements (dk * dv), and
#: for heads of keys of at most :data:`AUTO_KEY_WIDTH` features whose state has at most
#: :data:`AUTO_NARROW_KEY_STATE_ELEMENTS` (:func:`runs_by_default`).
AUTO_STATE_ELEMENTS = 1024
#: At 32 x 64 (2,048 elements) the kernels were 1.05-1.15x the chunked forms (the delta rule 0.99x),
#: forward and backward, and the recall preset's Gated DeltaNet (2 heads of 32 x 64) trained 1.31x
#: faster at batch 64 x 256 (their q and k normalised inside); at 64 x 32 SSD's (0.63x) and the delta
#: rule's (0.80x) were slower, and at 64 x 64 all four (0.40-0.50x): docs/small-models.md, "Sixteenth round".
AUTO_KEY_WIDTH = 32
AUTO_NARROW_KEY_STATE_ELEMENTS = 2048


def runs_by_default(state_elements: int, key_width: int | None = None) -> bool:
    """Whether ``"auto"`` runs the kernels on a CPU for heads of ``key_width`` (dk; SSD's state
    size n; None: not known, the first rule alone) by ``state_elements`` (dk * dv) elements."""
    if state_elements <= AUTO_STATE_ELEMENTS:
        return True
    narrow = key_width is not None and key_width <= AUTO_KEY_WIDTH
    return narrow and state_elements <= AUTO_NARROW_KEY_STATE_ELEMENTS


#: Bytes of one span's states that the backward pass keeps at a time (they stay in the cache).
SPAN_BYTES = 64 << 10
#: The longest span: checkpoints every so many positions at least.
MAX_SPAN = 64

_KERNELS = LazyKernels("longrange.ops.matrix_state._numba_kernels")


def numba_available() -> bool:
    """Whether numba imports, i.e. whether the kernels can run."""
    return _KERNELS.load() is not None


def unavailable_reason() -> str | None:
    """Why numba cannot be used (the import error), or None when it can."""
    return _KERNELS.reason()


def _kernels(op: str = "matrix_state"):
    return _KERNELS.require(op)


def _check_device(op: str, q: Tensor) -> None:
    _kernels(op)
    if q.device.type != "cpu":
        raise RuntimeError(f"{op}: impl='numba' takes CPU tensors, got tensors on {q.device}")


def _checkpoints(q: Tensor, v: Tensor, S0: Tensor, span: int) -> Tensor:
    """An empty tensor for the states entering each span: (B, H, spans, dk, dv)."""
    B, L, H, dk = q.shape
    return S0.new_empty(B, H, _spans(L, span), dk, v.shape[3])


def _output_grads(q: Tensor, v: Tensor, do: Tensor | None, dS: Tensor | None) -> tuple[Tensor, Tensor]:
    """The gradients of the output and of the final state as the backward kernels take them
    (contiguous; zeros for an output that did not reach the loss)."""
    B, L, H, dk = q.shape
    do = torch.zeros_like(v) if do is None else do.contiguous()
    dS = q.new_zeros(B, H, dk, v.shape[3]) if dS is None else dS.contiguous()
    return do, dS


def span_for(dk: int, dv: int, itemsize: int = 4) -> int:
    """Positions between checkpoints: as many states as fit in :data:`SPAN_BYTES`, from 4 to
    :data:`MAX_SPAN`."""
    return max(4, min(MAX_SPAN, SPAN_BYTES // max(1, dk * dv * itemsize) - 1))


def delta_rule_flops(b: int, l: int, h: int, dk: int, dv: int, backward: bool = False) -> int:
    """FLOPs of the kernels (the convention of :mod:`longrange.ops.custom_ops`) per state element and
    position: forward ``k S`` (2), the update (3) and ``q S`` (2); the backward recomputes the
    forward's first two (5), then ``dq``, ``dS``, ``du``, ``dk`` (8) and the pass through the
    transition (7)."""
    return b * l * h * dk * dv * (20 if backward else 7)


def _spans(length: int, span: int) -> int:
    return -(-length // span)


def _span(op: str, chunk_size: int | None, dk: int, dv: int, itemsize: int) -> int:
    """The positions between checkpoints: ``chunk_size`` checked, or :func:`span_for`."""
    return span_for(dk, dv, itemsize) if chunk_size is None else check_chunk_size(op, chunk_size)


@torch.library.custom_op(qualname("delta_rule_numba"), mutates_args=(), device_types="cpu")
def _forward_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor,
    gated: bool,
    normalize: bool,
    scale: float,
    S0: Tensor,
    span: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """q, k (B, L, H, dk), v (B, L, H, dv), beta and g (B, L, H), S0 (B, H, dk, dv), contiguous, one
    dtype -> (o (B, L, H, dv), the final state, the checkpoints (B, H, spans, dk, dv)); ``normalize``:
    q and k L2-normalised first."""
    kern = _kernels()
    o, S, ckpt = torch.empty_like(v), torch.empty_like(S0), _checkpoints(q, v, S0, span)
    _use_threads(kern)
    kern.delta_forward(
        q.numpy(), k.numpy(), v.numpy(), beta.numpy(), g.numpy(), gated, normalize, scale, S0.numpy(), span,
        o.numpy(), S.numpy(), ckpt.numpy(),
    )  # fmt: skip
    return o, S, ckpt


@_forward_op.register_fake
def _(q, k, v, beta, g, gated, normalize, scale, S0, span):
    return torch.empty_like(v), torch.empty_like(S0), _checkpoints(q, v, S0, span)


@torch.library.custom_op(qualname("delta_rule_numba_backward"), mutates_args=(), device_types="cpu")
def _backward_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor,
    gated: bool,
    normalize: bool,
    scale: float,
    ckpt: Tensor,
    span: int,
    do: Tensor,
    dS: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients (dq, dk, dv, dbeta, dg, dS0) of :func:`_forward_op` for the output's and the
    final state's gradients ``do`` and ``dS`` (dg is zero when not ``gated``)."""
    kern = _kernels()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dbeta, dg, dS0 = torch.empty_like(beta), torch.zeros_like(g), torch.empty_like(dS)
    _use_threads(kern)
    kern.delta_backward(
        q.numpy(), k.numpy(), v.numpy(), beta.numpy(), g.numpy(), gated, normalize, scale, ckpt.numpy(), span,
        do.numpy(), dS.numpy(), dq.numpy(), dk.numpy(), dv.numpy(), dbeta.numpy(), dg.numpy(), dS0.numpy(),
    )  # fmt: skip
    return dq, dk, dv, dbeta, dg, dS0


@_backward_op.register_fake
def _(q, k, v, beta, g, gated, normalize, scale, ckpt, span, do, dS):
    return (
        torch.empty_like(q),
        torch.empty_like(k),
        torch.empty_like(v),
        torch.empty_like(beta),
        torch.empty_like(g),
        torch.empty_like(dS),
    )


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, beta, g, gated, normalize, scale, S0, span = inputs
    ctx.save_for_backward(q, k, v, beta, g, output[2])
    ctx.gated, ctx.normalize, ctx.scale, ctx.span = gated, normalize, scale, span


def _backward(ctx, do: Tensor | None, dS: Tensor | None, dckpt: Tensor | None):
    q, k, v, beta, g, ckpt = ctx.saved_tensors
    do, dS = _output_grads(q, v, do, dS)
    dq, dk_, dv, dbeta, dg, dS0 = _backward_op_eager(
        q, k, v, beta, g, ctx.gated, ctx.normalize, ctx.scale, ckpt, ctx.span, do, dS
    )
    return dq, dk_, dv, dbeta, dg if ctx.gated else None, None, None, None, dS0, None


_forward_op_eager = autograd_and_eager(_forward_op, _backward, _setup_context)
_backward_op_eager = eager(_backward_op)
register_flops(_forward_op, lambda q, k, v, *rest: delta_rule_flops(*q, v[3]))
register_flops(_backward_op, lambda q, k, v, *rest: delta_rule_flops(*q, v[3], backward=True))


def _run(
    op: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None,
    scale: float | None,
    initial_state: Tensor | None,
    output_final_state: bool,
    chunk_size: int | None,
    normalize_qk: bool,
) -> Tensor | tuple[Tensor, Tensor]:
    _check_device(op, q)
    out_dtype = v.dtype
    q, k, v, beta, g, state, scale, _ = _prepare(op, q, k, v, beta, g, g is not None, scale, initial_state, None)
    dk, dv = q.shape[3], v.shape[3]
    span = _span(op, chunk_size, dk, dv, q.element_size())
    gated = g is not None
    if not gated:
        g = torch.zeros_like(beta)  # not read
    o, S, _ = _forward_op_eager(
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        beta.contiguous(),
        g.contiguous(),
        gated,
        bool(normalize_qk),
        scale,
        state.contiguous(),
        span,
    )
    o = o.to(out_dtype)
    return (o, S) if output_final_state else o


def delta_rule_numba(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int | None = None,
    normalize_qk: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`~longrange.ops.matrix_state.delta_rule.delta_rule_naive` (without a mask: the entry
    point applies it) by the numba kernels; ``chunk_size``: positions between the checkpoints the
    backward recomputes from (default :func:`span_for`); ``normalize_qk``: q and k are
    L2-normalised per head first, inside the kernels (``F.normalize(x, dim=-1, eps=1e-6)``)."""
    return _run(
        "delta_rule_numba", q, k, v, beta, None, scale, initial_state, output_final_state, chunk_size, normalize_qk
    )


def gated_delta_rule_numba(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int | None = None,
    normalize_qk: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`~longrange.ops.matrix_state.delta_rule.gated_delta_rule_naive` (without a mask) by the
    numba kernels; ``chunk_size`` and ``normalize_qk`` as in :func:`delta_rule_numba`."""
    return _run(
        "gated_delta_rule_numba", q, k, v, beta, g, scale, initial_state, output_final_state, chunk_size, normalize_qk
    )


# ----------------------------------------------------------------------------------------------
# gated linear attention


def gla_flops(b: int, l: int, h: int, dk: int, dv: int, backward: bool = False) -> int:
    """FLOPs of the GLA kernels per state element and position: forward the decayed write (3) and
    ``q S`` (2); the backward recomputes the write (3), then ``dq``, ``dS``, ``dk``, ``dv``, ``dg`` and
    the decayed ``dS`` (11)."""
    return b * l * h * dk * dv * (14 if backward else 5)


@torch.library.custom_op(qualname("gla_numba"), mutates_args=(), device_types="cpu")
def _gla_op(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float, S0: Tensor, span: int
) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, g (B, L, H, dk), v (B, L, H, dv), S0 (B, H, dk, dv), contiguous, one dtype -> (o, the
    final state, the checkpoints (B, H, spans, dk, dv)); g may also be (B, L, H, 1), one decay for
    every row of a head's state (SSD's)."""
    kern = _kernels()
    o, S, ckpt = torch.empty_like(v), torch.empty_like(S0), _checkpoints(q, v, S0, span)
    _use_threads(kern)
    kern.gla_forward(
        q.numpy(), k.numpy(), v.numpy(), g.numpy(), scale, S0.numpy(), span, o.numpy(), S.numpy(), ckpt.numpy()
    )
    return o, S, ckpt


@_gla_op.register_fake
def _(q, k, v, g, scale, S0, span):
    return torch.empty_like(v), torch.empty_like(S0), _checkpoints(q, v, S0, span)


@torch.library.custom_op(qualname("gla_numba_backward"), mutates_args=(), device_types="cpu")
def _gla_backward_op(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float, ckpt: Tensor, span: int, do: Tensor, dS: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients (dq, dk, dv, dg, dS0) of :func:`_gla_op` for the output's and the final state's
    gradients ``do`` and ``dS``."""
    kern = _kernels()
    dq, dk, dv, dg, dS0 = (torch.empty_like(t) for t in (q, k, v, g, dS))
    _use_threads(kern)
    kern.gla_backward(
        q.numpy(), k.numpy(), v.numpy(), g.numpy(), scale, ckpt.numpy(), span, do.numpy(), dS.numpy(),
        dq.numpy(), dk.numpy(), dv.numpy(), dg.numpy(), dS0.numpy(),
    )  # fmt: skip
    return dq, dk, dv, dg, dS0


@_gla_backward_op.register_fake
def _(q, k, v, g, scale, ckpt, span, do, dS):
    return tuple(torch.empty_like(t) for t in (q, k, v, g, dS))


def _gla_setup_context(ctx, inputs, output) -> None:
    q, k, v, g, scale, S0, span = inputs
    ctx.save_for_backward(q, k, v, g, output[2])
    ctx.scale, ctx.span = scale, span


def _gla_backward(ctx, do: Tensor | None, dS: Tensor | None, dckpt: Tensor | None):
    q, k, v, g, ckpt = ctx.saved_tensors
    do, dS = _output_grads(q, v, do, dS)
    dq, dk_, dv, dg, dS0 = _gla_backward_op_eager(q, k, v, g, ctx.scale, ckpt, ctx.span, do, dS)
    return dq, dk_, dv, dg, None, dS0, None


_gla_op_eager = autograd_and_eager(_gla_op, _gla_backward, _gla_setup_context)
_gla_backward_op_eager = eager(_gla_backward_op)
register_flops(_gla_op, lambda q, k, v, *rest: gla_flops(*q, v[3]))
register_flops(_gla_backward_op, lambda q, k, v, *rest: gla_flops(*q, v[3], backward=True))


def gla_numba(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`~longrange.ops.matrix_state.gla.gla_naive` (without a mask: the entry point applies
    it) by the numba kernels; ``chunk_size``: positions between the checkpoints the backward
    recomputes from (default :func:`span_for`)."""
    op = "gla_numba"
    _check_device(op, q)
    b, l, h, dk, dv, dtype, _ = _gla._prepare(op, q, k, v, g, initial_state, None)
    S0 = initial(op, initial_state, b, h, dk, dv, dtype, q.device)
    span = _span(op, chunk_size, dk, dv, dtype.itemsize)
    o, S, _ = _gla_op_eager(
        *(t.to(dtype).contiguous() for t in (q, k, v, g)), default_scale(scale, dk), S0.contiguous(), span
    )
    o = o.to(v.dtype)
    return (o, S) if output_final_state else o


# ----------------------------------------------------------------------------------------------
# Mamba-2's SSD: GLA's kernels with one decay per head


def ssd_numba(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`~longrange.ops.matrix_state.ssd.ssd_naive` (without a mask: the entry point applies it)
    by GLA's kernels: ``S_t = exp(dt_t A) S_{t-1} + (dt_t B_t)^T x_t``, ``y_t = C_t S_t + D x_t`` is
    GLA with ``q = C`` and ``k = dt B`` (each head its group's), ``v = x``, one log-decay ``dt A`` per
    head and position for every row of the state, and the scale 1; ``D x`` is added after.
    ``chunk_size`` as in :func:`gla_numba`."""
    op = "ssd_numba"
    _check_device(op, x)
    b, l, h, g, n, p, _ = _ssd._check(op, x, dt, A, B, C, D, initial_state, None)
    dtype = compute_dtype(x, dt, A, B, C, D, initial_state)
    S0 = initial(op, initial_state, b, h, n, p, dtype, x.device)
    xs, dts = x.to(dtype), dt.to(dtype)
    # (b, l, g, n) -> (b, l, h, n), head i reading group i // (h // g); k scaled by dt on the way
    per_group = (b, l, g, h // g)
    k = (B.to(dtype).unsqueeze(3) * dts.view(*per_group, 1)).reshape(b, l, h, n)
    q = C.to(dtype).unsqueeze(3).expand(*per_group, n).reshape(b, l, h, n)
    log_decay = (dts * A.to(dtype)).unsqueeze(-1)  # (b, l, h, 1): one decay for every row
    span = _span(op, chunk_size, n, p, dtype.itemsize)
    y, S, _ = _gla_op_eager(
        q.contiguous(), k.contiguous(), xs.contiguous(), log_decay.contiguous(), 1.0, S0.contiguous(), span
    )
    if D is not None:
        y = y + _ssd.skip(D, xs)
    y = y.to(x.dtype)
    return (y, S) if output_final_state else y


# ----------------------------------------------------------------------------------------------
# Mamba-3 SISO: its scalar-decay core by GLA's kernels


def mamba3_numba(*args: Any, chunk_size: int | None = None, **kwargs: Any) -> Any:
    """:func:`~longrange.ops.matrix_state.mamba3.mamba3_chunk` with its scalar-decay core run by
    GLA's kernels (one log-decay ``dt A`` per head and position for every row of the state, values
    ``write_t x_t``, the scale 1): the rotation, the trapezoidal write and the diagonal correction
    around it are :func:`~longrange.ops.matrix_state.mamba3.siso_by_core`'s, shared with the chunked
    form; the arguments and results of ``mamba3_chunk`` (``x, dt, A, B, C, trap, angles, B_bias,
    C_bias, D, initial_state, output_final_state, mask``), ``chunk_size`` as in :func:`gla_numba`."""
    op = "mamba3_numba"
    if chunk_size is not None:
        check_chunk_size(op, chunk_size)

    def core(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, S0: Tensor | None, write: Tensor):
        _check_device(op, q)
        b, _, h, n = q.shape
        p = v.shape[-1]
        if S0 is None:
            S0 = q.new_zeros(b, h, n, p)
        span = _span(op, chunk_size, n, p, q.dtype.itemsize)
        values = v * write.unsqueeze(-1)
        y, S, _ = _gla_op_eager(
            q.contiguous(), k.contiguous(), values.contiguous(), log_decay.unsqueeze(-1).contiguous(), 1.0,
            S0.contiguous(), span,
        )  # fmt: skip
        return y, S

    return _mamba3.siso_by_core(op, core, *args, **kwargs)
