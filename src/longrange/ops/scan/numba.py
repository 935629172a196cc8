"""The selective scan fused into one compiled loop per direction, for CPUs (numba).

:func:`selective_scan_numba` has the signature and semantics of
:func:`longrange.ops.scan.selective_scan` (see the package for the shapes and equations), minus
``impl`` and the chunking arguments. Two pairs of kernels, chosen by the shapes:

* **Channels last** (B and C time-varying, as in S6 and Mamba, with 16 channels or more per group;
  the operator ``torch.ops.longrange.selective_scan_numba_cl``): u, delta, z and the output in
  (b, l, d) memory, so that a (b, d, l) view of a (b, l, d) tensor, which is what a Mamba block
  passes, costs no copy, and the output is returned as such a view. Each task is a block of up to
  256 channels of one batch element (as many tasks as threads at least) and every inner loop runs
  over the block's channels, contiguous in memory: it vectorises whatever the state size (16 in
  Mamba, one short vector when the loop runs over the states instead). The forward pass also
  stores the state at the start of every chunk of T positions ((b, l / T, n, d) values, T from 4
  to 64); the backward pass recomputes one chunk's states (and their decays) at a time into a
  scratch buffer of (2T + 1) n W values, sized to stay in a core's L2 cache, and runs the adjoint
  recurrence back over them.
* **States inner** (every other case: time-invariant B or C, narrow groups; the operator
  ``torch.ops.longrange.selective_scan_numba``): each (batch element, channel) is one task of a
  parallel loop that walks along the length once, keeping the state (n values) in local
  variables, and writes only the output and the last state. The backward pass recomputes the
  states of one channel at a time into a scratch buffer of (length + 1, n) values, then runs the
  adjoint recurrence in reverse; the forward pass stores nothing per position.

Either way the backward is hand-written (see :mod:`longrange.ops.custom_ops`) and memory is a few
tensors of (b, d, l), never (b, d, n, l) as in the chunked scan. Tasks run in parallel
(``numba.prange``) on ``torch.get_num_threads()`` threads.

Dtypes follow :mod:`longrange.ops.scan`: the computation runs in float64 if any floating input is
float64, else in float32; the output has u's dtype, the last state the compute dtype.
``delta_bias`` and the softplus are applied inside the channels-last kernels (their gradients
too) and before the others (differentiably, by PyTorch).

The kernels are compiled on first use (seconds per dtype) and cached on disk by numba, so later
processes load them; numba's threading layer is its default (``NUMBA_THREADING_LAYER`` chooses
another). Without numba (:func:`numba_available` is False) ``impl="auto"`` runs the
chunked scan instead, and calling this function raises an error saying so.

Deterministic: every (task, element) of the backward's partial sums is written by one task and
the partial sums are added in a fixed order, so two runs give the same bits at the same number of
threads (the division of the channels into tasks follows the thread count).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from longrange.ops._lazy_kernels import LazyKernels, block_width, divisors
from longrange.ops._lazy_kernels import use_threads as _use_threads
from longrange.ops.custom_ops import autograd_and_eager, eager, qualname, register_flops
from longrange.ops.scan.common import check_shapes, compute_dtype, prepare_delta, scan_flops

_KERNELS = LazyKernels("longrange.ops.scan._numba_kernels")
_load = _KERNELS.load


def numba_available() -> bool:
    """Whether numba imports, i.e. whether :func:`selective_scan_numba` can run."""
    return _load() is not None


def unavailable_reason() -> str | None:
    """Why numba cannot be used (the import error), or None when it can."""
    return _KERNELS.reason()


def warm_up(dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64)) -> None:
    """Load the kernels for ``dtypes`` now (from numba's cache, or compiling them): one tiny
    forward and backward each. Benchmarks call this before their memory baseline, so that the
    one-time cost of loading numba is not counted as the scan's memory."""
    if _load() is None:
        return
    for dtype in dtypes:
        for d in (1, CL_MIN_WIDTH):  # the state-vectorised kernels, then the channels-last ones
            u = torch.ones(1, d, 2, dtype=dtype, requires_grad=True)
            B = torch.ones(1, 1, 2, dtype=dtype)
            selective_scan_numba(u, u, -torch.ones(d, 1, dtype=dtype), B, B).sum().backward()


def _as_4d(M: Tensor, d: int) -> Tensor:
    """B or C in the kernel layout (bM, groups, LM, n) with the state index innermost, contiguous."""
    if M.dim() == 2:  # (d, n): every channel its own group, one position
        return M[None, :, None, :].contiguous()
    if M.dim() == 3:  # (b, n, l): one group
        return M.transpose(1, 2)[:, None].contiguous()
    return M.transpose(2, 3).contiguous()  # (b, g, n, l) -> (b, g, l, n)


def _channels_per_task(b: int, d: int, B4: Tensor, C4: Tensor, threads: int) -> int:
    """Channels per backward task: divides the channels of every group of a time-varying B or C
    (so each task's partial sums belong to one group), as many as keep >= 4 tasks per thread."""
    base = d
    for M in (B4, C4):
        if M.shape[2] > 1:
            base = math.gcd(base, d // M.shape[1])
    return block_width(b, d, divisors(base, base), 4 * threads)


def _np(t: Tensor):
    """A NumPy view of a CPU tensor (no copy)."""
    return t.detach().numpy()


def _reduce_partial(part: Tensor, M4: Tensor) -> Tensor:
    """Sum the kernel's partial gradient (b, S, LM, n) to the shape of ``M4`` (bM, G, LM, n)."""
    b, S, LM, n = part.shape
    G = M4.shape[1]
    grad = part.view(b, G, S // G, LM, n)
    grad = grad[:, :, 0] if S == G else grad.sum(2)
    return grad.sum(0, keepdim=True) if M4.shape[0] == 1 else grad


def _or_zeros(t: Tensor | None, like: Tensor, *shape: int) -> Tensor:
    """``t``, or zeros of ``shape`` (an absent D, z or initial state as the kernels take it)."""
    return t if t is not None else like.new_zeros(*shape)


def _kernels():
    return _KERNELS.require("selective_scan")


# --------------------------------------------------------------------------------------------
# The kernels as PyTorch operators (see longrange.ops.custom_ops)
# --------------------------------------------------------------------------------------------


@torch.library.custom_op(qualname("selective_scan_numba"), mutates_args=(), device_types="cpu")
def _scan_op(
    u: Tensor,
    dt: Tensor,
    A: Tensor,
    B4: Tensor,
    C4: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    h0: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """(u, dt, A, B4, C4, D, z, h0) -> (out, last), contiguous, in one floating dtype (the compute
    dtype); B4, C4 in the kernel layout (:func:`_as_4d`). See the module docstring."""
    k = _kernels()
    b, d, l = u.shape
    n = A.shape[1]
    _use_threads(k)
    D_, z_ = _or_zeros(D, u, d), _or_zeros(z, u, 1, 1, 1)
    h0_ = _or_zeros(h0, u, b, d, n)
    out = torch.empty_like(u)
    last = u.new_empty(b, d, n)
    k.scan_forward(
        _np(u),
        _np(dt),
        _np(A),
        _np(B4),
        _np(C4),
        _np(D_),
        _np(z_),
        _np(h0_),
        z is not None,
        _np(out),
        _np(last),
    )
    return out, last


@_scan_op.register_fake
def _(u, dt, A, B4, C4, D, z, h0):
    return torch.empty_like(u), u.new_empty(*u.shape[:2], A.shape[1])


@torch.library.custom_op(qualname("selective_scan_numba_backward"), mutates_args=(), device_types="cpu")
def _scan_backward_op(
    u: Tensor,
    dt: Tensor,
    A: Tensor,
    B4: Tensor,
    C4: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    h0: Tensor | None,
    gout: Tensor,
    glast: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients (u, dt, A, B4, C4, D, z, h0) of :func:`_scan_op` for the output gradients
    ``gout``, ``glast``; those of an absent D or z are computed as for zeros (D) or empty (z)."""
    k = _kernels()
    b, d, l = u.shape
    n = A.shape[1]
    threads = _use_threads(k)
    D_, z_ = _or_zeros(D, u, d), _or_zeros(z, u, 1, 1, 1)
    h0_ = _or_zeros(h0, u, b, d, n)
    gout, glast = gout.contiguous(), glast.contiguous()
    per_task = _channels_per_task(b, d, B4, C4, threads)
    tasks = d // per_task

    def partial(M4: Tensor) -> Tensor:
        return u.new_zeros(b, d if M4.shape[2] == 1 else tasks, M4.shape[2], n)

    gu, gdt = torch.empty_like(u), torch.empty_like(u)
    gz = torch.empty_like(u) if z is not None else u.new_empty(1, 1, 1)
    gA, gD, gh0 = u.new_empty(b, d, n), u.new_empty(b, d), u.new_empty(b, d, n)
    gB, gC = partial(B4), partial(C4)
    k.scan_backward(
        _np(u),
        _np(dt),
        _np(A),
        _np(B4),
        _np(C4),
        _np(D_),
        _np(z_),
        _np(h0_),
        z is not None,
        _np(gout),
        _np(glast),
        per_task,
        _np(gu),
        _np(gdt),
        _np(gA),
        _np(gB),
        _np(gC),
        _np(gD),
        _np(gz),
        _np(gh0),
    )
    return (
        gu,
        gdt,
        gA.sum(0),
        _reduce_partial(gB, B4).contiguous(),
        _reduce_partial(gC, C4).contiguous(),
        gD.sum(0),
        gz if z is not None else u.new_empty(0),
        gh0,
    )


@_scan_backward_op.register_fake
def _(u, dt, A, B4, C4, D, z, h0, gout, glast):
    b, d, l = u.shape
    return (
        torch.empty_like(u),
        torch.empty_like(u),
        A.new_empty(A.shape),
        B4.new_empty(B4.shape),
        C4.new_empty(C4.shape),
        u.new_empty(d),
        torch.empty_like(u) if z is not None else u.new_empty(0),
        u.new_empty(b, d, A.shape[1]),
    )


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, gout: Tensor, glast: Tensor):
    u, dt, A, B4, C4, D, z, h0 = ctx.saved_tensors
    gout = torch.zeros_like(u) if gout is None else gout
    glast = u.new_zeros(*u.shape[:2], A.shape[1]) if glast is None else glast
    grads = _scan_backward_op_eager(u, dt, A, B4, C4, D, z, h0, gout, glast)
    present = (True, True, True, True, True, D is not None, z is not None, h0 is not None)
    return tuple(g if has and need else None for g, has, need in zip(grads, present, ctx.needs_input_grad))


_scan_op_eager = autograd_and_eager(_scan_op, _backward, _setup_context)
_scan_backward_op_eager = eager(_scan_backward_op)


# --------------------------------------------------------------------------------------------
# The channels-last kernels (time-varying B and C) as operators: u, dt, z and out in (b, l, d)
# --------------------------------------------------------------------------------------------

#: The narrowest block of channels the channels-last kernels run on; below it, or where B or C is
#: time-invariant, the state-vectorised kernels run. A module variable so that tests can lower it.
CL_MIN_WIDTH = 16
#: The widest block of channels per task.
CL_MAX_WIDTH = 256
#: Bytes of one task's backward scratch buffers (the states and decays of one chunk) at most:
#: well inside a core's L2 cache (1 MiB on the CPU the kernels were tuned on).
CL_SCRATCH_BYTES = 640 << 10


def _cl_widths(d: int, B4: Tensor, C4: Tensor) -> list[int]:
    """The blocks of channels the channels-last kernels can run on, widest first: from
    :data:`CL_MAX_WIDTH` down to :data:`CL_MIN_WIDTH` channels of one group of B and of C; none
    where B or C is time-invariant."""
    if B4.shape[2] == 1 or C4.shape[2] == 1:
        return []
    return divisors(math.gcd(d // B4.shape[1], d // C4.shape[1]), CL_MAX_WIDTH, CL_MIN_WIDTH)


def _cl_chunk(d: int, n: int, B4: Tensor, C4: Tensor, itemsize: int) -> int | None:
    """Positions per chunk of the channels-last kernels, or None where they do not apply
    (:func:`_cl_widths`): a power of two from 4 to 64 whose states and decays, on the widest
    block, fit in :data:`CL_SCRATCH_BYTES`."""
    widths = _cl_widths(d, B4, C4)
    if not widths:
        return None
    chunk = 64
    while chunk > 4 and (2 * chunk + 1) * n * widths[0] * itemsize > CL_SCRATCH_BYTES:
        chunk //= 2
    return chunk


def _cl_width(b: int, d: int, B4: Tensor, C4: Tensor, threads: int) -> int:
    """Channels per task: the widest block that leaves a task per thread at least (the narrowest
    block where none does)."""
    return block_width(b, d, _cl_widths(d, B4, C4), threads)


@torch.library.custom_op(qualname("selective_scan_numba_cl"), mutates_args=(), device_types="cpu")
def _scan_cl_op(
    u: Tensor,
    raw: Tensor,
    A: Tensor,
    B4: Tensor,
    C4: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    h0: Tensor | None,
    bias: Tensor | None,
    softplus: bool,
    chunk: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """(u, raw, A, B4, C4, D, z, h0, bias) with u, raw, z (b, l, d) -> (out (b, l, d), last
    (b, d, n), the states at the chunk starts (b, chunks, n, d)), contiguous, in one floating
    dtype; the step is ``softplus(raw + bias)`` (without ``softplus``: ``raw + bias``), computed in
    the kernel; B4 and C4 time-varying, in the kernel layout (:func:`_as_4d`); ``chunk`` positions
    per chunk (:func:`_cl_chunk`). Each task is a block of :func:`_cl_width` channels."""
    k = _kernels()
    b, l, d = u.shape
    n = A.shape[1]
    width = _cl_width(b, d, B4, C4, _use_threads(k))
    D_, z_, bias_ = _or_zeros(D, u, d), _or_zeros(z, u, 1, 1, 1), _or_zeros(bias, u, d)
    h0_ = _or_zeros(h0, u, b, d, n)
    out = torch.empty_like(u)
    last = u.new_empty(b, d, n)
    states = u.new_empty(b, -(-l // chunk), n, d)
    k.scan_forward_cl(
        _np(u),
        _np(raw),
        _np(bias_),
        softplus,
        _np(A.t().contiguous()),
        _np(B4),
        _np(C4),
        _np(D_),
        _np(z_),
        _np(h0_),
        z is not None,
        width,
        chunk,
        _np(out),
        _np(last),
        _np(states),
    )
    return out, last, states


@_scan_cl_op.register_fake
def _(u, raw, A, B4, C4, D, z, h0, bias, softplus, chunk):
    b, l, d = u.shape
    n = A.shape[1]
    return torch.empty_like(u), u.new_empty(b, d, n), u.new_empty(b, -(-l // chunk), n, d)


@torch.library.custom_op(qualname("selective_scan_numba_cl_backward"), mutates_args=(), device_types="cpu")
def _scan_cl_backward_op(
    u: Tensor,
    raw: Tensor,
    A: Tensor,
    B4: Tensor,
    C4: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    bias: Tensor | None,
    softplus: bool,
    states: Tensor,
    gout: Tensor,
    glast: Tensor,
    chunk: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients (u, raw, A, B4, C4, D, z, h0, bias) of :func:`_scan_cl_op` from its stored
    ``states``."""
    k = _kernels()
    b, l, d = u.shape
    n = A.shape[1]
    width = _cl_width(b, d, B4, C4, _use_threads(k))
    D_, z_, bias_ = _or_zeros(D, u, d), _or_zeros(z, u, 1, 1, 1), _or_zeros(bias, u, d)
    gout, glast = gout.contiguous(), glast.contiguous()
    gu, graw = torch.empty_like(u), torch.empty_like(u)
    gz = torch.empty_like(u) if z is not None else u.new_empty(1, 1, 1)
    gA, gD, gh0 = u.new_empty(b, d, n), u.new_empty(b, d), u.new_empty(b, d, n)
    gbias = u.new_empty(b, d)
    gB, gC = u.new_zeros(b, d // width, l, n), u.new_zeros(b, d // width, l, n)
    k.scan_backward_cl(
        _np(u),
        _np(raw),
        _np(bias_),
        softplus,
        _np(A.t().contiguous()),
        _np(B4),
        _np(C4),
        _np(D_),
        _np(z_),
        _np(states),
        z is not None,
        _np(gout),
        _np(glast),
        width,
        chunk,
        _np(gu),
        _np(graw),
        _np(gA),
        _np(gB),
        _np(gC),
        _np(gD),
        _np(gbias),
        _np(gz),
        _np(gh0),
    )
    return (
        gu,
        graw,
        gA.sum(0),
        _reduce_partial(gB, B4).contiguous(),
        _reduce_partial(gC, C4).contiguous(),
        gD.sum(0),
        gz if z is not None else u.new_empty(0),
        gh0,
        gbias.sum(0),
    )


@_scan_cl_backward_op.register_fake
def _(u, raw, A, B4, C4, D, z, bias, softplus, states, gout, glast, chunk):
    b, l, d = u.shape
    return (
        torch.empty_like(u),
        torch.empty_like(u),
        A.new_empty(A.shape),
        B4.new_empty(B4.shape),
        C4.new_empty(C4.shape),
        u.new_empty(d),
        torch.empty_like(u) if z is not None else u.new_empty(0),
        u.new_empty(b, d, A.shape[1]),
        u.new_empty(d),
    )


def _setup_cl_context(ctx, inputs, output) -> None:
    u, raw, A, B4, C4, D, z, h0, bias, softplus, chunk = inputs
    ctx.save_for_backward(u, raw, A, B4, C4, D, z, h0, bias, output[2])
    ctx.softplus, ctx.chunk = softplus, chunk


def _cl_backward(ctx, gout: Tensor, glast: Tensor, gstates: Tensor):
    u, raw, A, B4, C4, D, z, h0, bias, states = ctx.saved_tensors
    gout = torch.zeros_like(u) if gout is None else gout
    glast = u.new_zeros(u.shape[0], u.shape[2], A.shape[1]) if glast is None else glast
    grads = _scan_cl_backward_op_eager(u, raw, A, B4, C4, D, z, bias, ctx.softplus, states, gout, glast, ctx.chunk)
    present = (True, True, True, True, True, D is not None, z is not None, h0 is not None, bias is not None)
    grads = tuple(g if has and need else None for g, has, need in zip(grads, present, ctx.needs_input_grad))
    return (*grads, None, None)


_scan_cl_op_eager = autograd_and_eager(_scan_cl_op, _cl_backward, _setup_cl_context)
_scan_cl_backward_op_eager = eager(_scan_cl_backward_op)


def _flops(u, dt, A, B4, C4, D, z, h0, *rest, backward: bool = False) -> int:
    b, d, l = u
    return scan_flops(b, d, l, A[1], D is not None, z is not None, backward=backward)


register_flops(_scan_op, _flops)
register_flops(_scan_backward_op, lambda *args: _flops(*args, backward=True))


def _flops_cl(u, A, D, z, bias, softplus: bool, backward: bool) -> int:
    b, l, d = u
    return scan_flops(
        b, d, l, A[1], D is not None, z is not None, backward=backward, has_bias=bias is not None, softplus=softplus
    )


register_flops(
    _scan_cl_op, lambda u, raw, A, B4, C4, D, z, h0, bias, softplus, chunk: _flops_cl(u, A, D, z, bias, softplus, False)
)
register_flops(
    _scan_cl_backward_op,
    lambda u, raw, A, B4, C4, D, z, bias, softplus, *rest: _flops_cl(u, A, D, z, bias, softplus, True),
)


def selective_scan_numba(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    initial_state: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """The selective scan in one compiled pass per direction on CPU tensors (see the module docstring)."""
    check_shapes(u, delta, A, B, C, D, z, delta_bias, initial_state)
    _kernels()
    tensors = (u, delta, A, B, C, D, z, delta_bias, initial_state)
    devices = {t.device.type for t in tensors if t is not None}
    if devices != {"cpu"}:
        raise RuntimeError(f"selective_scan: impl='numba' runs on CPU tensors only, got tensors on {sorted(devices)}")
    dtype = compute_dtype(*tensors)
    d = u.shape[1]

    def prep(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.to(dtype).contiguous()

    B4, C4 = _as_4d(B.to(dtype), d), _as_4d(C.to(dtype), d)
    chunk = _cl_chunk(d, A.shape[1], B4, C4, dtype.itemsize)
    if chunk is not None:  # channels last: (b, d, l) views of (b, l, d) tensors cost no copy

        def prep_cl(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(dtype).transpose(1, 2).contiguous()

        # delta's bias and softplus in the kernel, delta's gradient in (b, l, d) as well (row-major
        # for the product that made delta)
        out, last, _ = _scan_cl_op_eager(
            prep_cl(u),
            prep_cl(delta),
            prep(A),
            B4,
            C4,
            prep(D),
            prep_cl(z),
            prep(initial_state),
            prep(delta_bias),
            delta_softplus,
            chunk,
        )
        out = out.transpose(1, 2)
    else:
        dt = prepare_delta(delta, delta_bias, delta_softplus, dtype)
        out, last = _scan_op_eager(prep(u), prep(dt), prep(A), B4, C4, prep(D), prep(z), prep(initial_state))
    out = out.to(u.dtype)
    return (out, last) if return_last_state else out
