"""The selective scan of S6 (Mamba), with the call signature of ``mamba_ssm``'s ``selective_scan_fn``.

Shapes (b: batch, d: channels, n: state size, l: length, g: groups of B/C)::

    u, delta, z       (b, d, l)
    A                 (d, n), real (normally negative)
    B, C              (d, n) time-invariant, (b, n, l) shared by all channels, or
                      (b, g, n, l) grouped: channel c reads group c // (d // g)
    D, delta_bias     (d,)
    initial_state     (b, d, n)
    output            (b, d, l) in u's dtype; with ``return_last_state`` also (b, d, n)

Semantics, per channel and state index::

    delta <- delta + delta_bias;  delta <- softplus(delta) if delta_softplus
    h_t = exp(delta_t * A) * h_{t-1} + delta_t * B_t * u_t      (ZOH for A, Euler for B)
    y_t = <C_t, h_t> + D * u_t;   y_t <- y_t * silu(z_t) if z is given

Implementations (``impl``):

- ``"ref"``: :func:`selective_scan_ref`, a plain loop over time; slow and obviously correct.
- ``"chunked"``: a chunked parallel scan in PyTorch (see :func:`linear_scan`), with a hand-written
  backward that runs the same scan in reverse, so autograd never stores per-chunk temporaries.
  Memory: a few tensors of (l, b, d, n) (the states, the log-decays, the gradients), plus for the
  "segsum" method one bounded block of (chunk x chunk) matrices at a time; never (l x l).
- ``"numba"``: :func:`longrange.ops.scan_numba.selective_scan_numba`, the scan fused into one
  compiled loop per direction on CPU tensors (numba), with a hand-written backward; memory of a
  few (b, d, l) tensors.
- ``"triton"``: ``selective_scan_triton`` from ``longrange.ops.scan_triton`` (needs triton).
- ``"cuda"``: the ``mamba_ssm`` kernel (CUDA tensors, no ``initial_state``, not float64; only
  when its compiled extension ``selective_scan_cuda`` imports, see :mod:`longrange._optional`).
- ``"auto"`` (default): see :func:`auto_impl`: on CUDA tensors ``"cuda"`` when usable, else
  ``"triton"`` when it imports, else ``"chunked"``; on CPU tensors ``"numba"`` when numba
  imports, else ``"chunked"``.

Computation runs in float64 if any floating input is float64, else in float32.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from longrange.ops.chunking import TEMPORARY_BYTES, group_size

from longrange import _optional

IMPLS = ("auto", "chunked", "ref", "cuda", "numba", "triton")

#: How the chunked scan computes the states inside a chunk:
#: ``"segsum"``: in parallel, from (chunk x chunk) matrices of masked segment sums of log-decays;
#: ``"loop"``: stepping through the chunk's positions, all chunks at once.
#: Both are exact; they differ in speed only. On CPU the (chunk x chunk) work dominates: forward +
#: backward of "segsum" took 2.4x (chunk 4) to 14x (chunk 32) the time of "loop" (batch 8, width 232,
#: state 16, length 1024, one thread), so CPU tensors use "loop" and other devices "segsum".
CHUNK_METHODS = ("segsum", "loop")

#: Default chunk length per method. "loop": timed on CPU, flat within 10% for chunks of 8 to 64 at
#: lengths 1024 and 4096; "segsum": its work grows linearly with the chunk length; 32 is a middle
#: value for parallel hardware (not timed there). Any value >= 2 is correct.
DEFAULT_CHUNK_SIZE = {"loop": 16, "segsum": 32}

#: Upper bound on the number of elements of the (chunk x chunk) decay matrices materialised at once
#: by the "segsum" method; chunks are processed in blocks below this size.
_MAX_BLOCK_ELEMENTS = 1 << 24

_default_impl = "auto"


def set_default_impl(impl: str) -> str:
    """Set the implementation used when ``impl=None``; returns the previous default."""
    global _default_impl
    _check_impl(impl)
    previous, _default_impl = _default_impl, impl
    return previous


@contextmanager
def default_impl(impl: str) -> Iterator[None]:
    """Context manager: use ``impl`` as the default implementation inside the block."""
    previous = set_default_impl(impl)
    try:
        yield
    finally:
        set_default_impl(previous)


def _check_impl(impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"selective_scan: unknown impl {impl!r}; expected one of {IMPLS}")


# --------------------------------------------------------------------------------------------
# Input validation and preparation shared by all implementations
# --------------------------------------------------------------------------------------------


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_shapes(u, delta, A, B, C, D, z, delta_bias, initial_state) -> None:
    if not isinstance(u, Tensor) or u.dim() != 3:
        raise ValueError(f"selective_scan: u must have shape (batch, d, length), got {_shape(u) if isinstance(u, Tensor) else type(u)}")
    b, d, l = u.shape
    if delta.shape != u.shape:
        raise ValueError(f"selective_scan: delta must have the shape of u (batch, d, length)={_shape(u)}, got {_shape(delta)}")
    if A.is_complex():
        raise ValueError("selective_scan: complex A is not supported; pass a real A of shape (d, n)")
    if A.dim() != 2 or A.shape[0] != d:
        raise ValueError(f"selective_scan: A must have shape (d, n) with d={d}, got {_shape(A)}")
    n = A.shape[1]
    for name, M in (("B", B), ("C", C)):
        if M.is_complex():
            raise ValueError(f"selective_scan: complex {name} is not supported")
        ok = (
            (M.dim() == 2 and M.shape == (d, n))
            or (M.dim() == 3 and M.shape == (b, n, l))
            or (M.dim() == 4 and M.shape[0] == b and M.shape[2:] == (n, l) and M.shape[1] >= 1 and d % M.shape[1] == 0)
        )
        if not ok:
            raise ValueError(
                f"selective_scan: {name} must have shape (d, n)={(d, n)}, (batch, n, length)={(b, n, l)} or "
                f"(batch, groups, n, length)=({b}, g, {n}, {l}) with g dividing d={d}; got {_shape(M)}"
            )
    for name, v in (("D", D), ("delta_bias", delta_bias)):
        if v is not None and v.shape != (d,):
            raise ValueError(f"selective_scan: {name} must have shape (d,)={(d,)}, got {_shape(v)}")
    if z is not None and z.shape != u.shape:
        raise ValueError(f"selective_scan: z must have the shape of u (batch, d, length)={_shape(u)}, got {_shape(z)}")
    if initial_state is not None and initial_state.shape != (b, d, n):
        raise ValueError(f"selective_scan: initial_state must have shape (batch, d, n)={(b, d, n)}, got {_shape(initial_state)}")


def _compute_dtype(*tensors: Tensor | None) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _prepare_delta(delta: Tensor, delta_bias: Tensor | None, delta_softplus: bool, dtype: torch.dtype) -> Tensor:
    delta = delta.to(dtype)
    if delta_bias is not None:
        delta = delta + delta_bias.to(dtype)[:, None]
    if delta_softplus:
        delta = F.softplus(delta)
    return delta


def _per_channel(M: Tensor, d: int) -> Tensor:
    """B or C as a tensor broadcastable to (b, d, n, l)."""
    if M.dim() == 2:  # (d, n)
        return M[None, :, :, None]
    if M.dim() == 3:  # (b, n, l)
        return M[:, None]
    b, g, n, l = M.shape  # grouped: expand groups to channels (channel c -> group c // (d // g))
    return M[:, :, None].expand(b, g, d // g, n, l).reshape(b, d, n, l)


def _finish(y: Tensor, u: Tensor, D: Tensor | None, z: Tensor | None, out_dtype: torch.dtype) -> Tensor:
    if D is not None:
        y = y + u * D.to(y.dtype)[:, None]
    if z is not None:
        y = y * F.silu(z.to(y.dtype))
    return y.to(out_dtype)


# --------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------


def selective_scan_ref(
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
    """The selective scan as a sequential loop over time (the reference). See the module docstring."""
    _check_shapes(u, delta, A, B, C, D, z, delta_bias, initial_state)
    dtype = _compute_dtype(u, delta, A, B, C, D, z, delta_bias, initial_state)
    b, d, l = u.shape
    n = A.shape[1]
    uc = u.to(dtype)
    dt = _prepare_delta(delta, delta_bias, delta_softplus, dtype)
    Ac = A.to(dtype)
    Bc = _per_channel(B.to(dtype), d).expand(b, d, n, l)
    Cc = _per_channel(C.to(dtype), d).expand(b, d, n, l)
    h = torch.zeros(b, d, n, dtype=dtype, device=u.device) if initial_state is None else initial_state.to(dtype)
    ys = []
    for t in range(l):
        decay = torch.exp(dt[:, :, t, None] * Ac)
        h = decay * h + (dt[:, :, t] * uc[:, :, t])[:, :, None] * Bc[..., t]
        ys.append((h * Cc[..., t]).sum(-1))
    y = torch.stack(ys, dim=-1) if ys else uc.new_zeros(b, d, 0)
    out = _finish(y, uc, D, z, u.dtype)
    return (out, h) if return_last_state else out


# --------------------------------------------------------------------------------------------
# Chunked parallel scan
# --------------------------------------------------------------------------------------------


def _chunk_states_segsum(a: Tensor, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """States inside each chunk from a zero start, by masked segment sums. See :func:`_chunk_states_loop`.

    ``state_t = sum_{s<=t} exp(cum_t - cum_s) * x_s``; the differences above the diagonal are set
    to -inf before the exponential, so every exponent is a true partial sum of log-decays
    (non-positive for a decaying recurrence) and nothing overflows however negative they are.
    """
    cum = a.cumsum(1)  # log-decay from the chunk start to t, inclusive
    nc, T = x.shape[:2]
    rest = x.shape[2:]
    upper = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1).reshape(T, T, *([1] * len(rest)))
    local = torch.empty_like(x)
    # Blocks of chunks keep the (T, T) decay matrices within the memory budget.
    block = max(1, _MAX_BLOCK_ELEMENTS // max(1, x[0, 0].numel() * T * T))
    for c0 in range(0, nc, block):
        cb = cum[c0 : c0 + block]
        seg = (cb[:, :, None] - cb[:, None, :]).masked_fill_(upper, -math.inf)  # (k, t, s, ...)
        local[c0 : c0 + block] = (seg.exp_() * x[c0 : c0 + block, None]).sum(2)
    return local, cum[:, -1].clone(), cum.exp_()


def _chunk_states_loop(a: Tensor, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """States inside each chunk from a zero start, stepping through the T positions of all chunks
    at once. Multiplies decay factors only, so nothing overflows.

    ``a``, ``x``: (nc, T, ...) log-decays and inputs. Returns the states (nc, T, ...), each chunk's
    total log-decay (nc, ...) and the decay from the chunk start to t inclusive (nc, T, ...).
    """
    decay = a.exp()
    local = torch.empty_like(x)
    local[:, 0] = x[:, 0]
    from_start = torch.empty_like(decay)
    from_start[:, 0] = decay[:, 0]
    for t in range(1, x.shape[1]):
        torch.addcmul(x[:, t], decay[:, t], local[:, t - 1], out=local[:, t])
        torch.mul(from_start[:, t - 1], decay[:, t], out=from_start[:, t])
    return local, a.sum(1), from_start


def _scan_states(log_decay: Tensor, inputs: Tensor, h0: Tensor | None, chunk_size: int, method: str) -> Tensor:
    """All states of ``h_t = exp(log_decay_t) * h_{t-1} + inputs_t`` (h_{-1} = h0), without autograd.

    Time-major: ``log_decay`` and ``inputs`` (L, ...); ``h0`` (...) or None (zero). Returns (L, ...).

    The length is split into chunks of ``chunk_size``; the states inside every chunk from a zero
    start are computed for all chunks at once (``method``: ``"segsum"`` or ``"loop"``). The
    chunk-initial states follow the same recurrence one level up (log-decay = the chunk's total
    log-decay, input = the chunk's final state from a zero start), solved by recursion, and are
    added back decayed by the product of the chunk-local decays up to t (at most 1 for a decaying
    recurrence, so this cannot overflow either).
    """
    L = log_decay.shape[0]
    if L <= 1:
        out = inputs.clone()
        if h0 is not None and L == 1:
            out = out + torch.exp(log_decay) * h0
        return out
    T = min(chunk_size, L)
    pad = (-L) % T
    if pad:  # zero log-decay and zero input after the end: the padded states are discarded
        zeros = log_decay.new_zeros(pad, *log_decay.shape[1:])
        log_decay = torch.cat([log_decay, zeros])
        inputs = torch.cat([inputs, zeros.to(inputs.dtype)])
    nc = (L + pad) // T
    a = log_decay.unflatten(0, (nc, T))
    x = inputs.unflatten(0, (nc, T))
    chunk_states = _chunk_states_segsum if method == "segsum" else _chunk_states_loop
    local, total, from_start = chunk_states(a, x)
    if nc > 1:
        ends = _scan_states(total, local[:, -1], h0, chunk_size, method)  # state at each chunk end
        starts = torch.cat([(torch.zeros_like(ends[:1]) if h0 is None else h0[None]), ends[:-1]])
        local = local.addcmul_(from_start, starts[:, None])
    elif h0 is not None:
        local = local.addcmul_(from_start, h0)
    return local.flatten(0, 1)[:L]


class _LinearScan(torch.autograd.Function):
    """h = scan(log_decay, inputs, h0) with a backward that is the same scan run in reverse."""

    @staticmethod
    def forward(ctx, log_decay: Tensor, inputs: Tensor, h0: Tensor | None, chunk_size: int, method: str) -> Tensor:
        with torch.no_grad():
            h = _scan_states(log_decay, inputs, h0, chunk_size, method)
        ctx.chunk_size = chunk_size
        ctx.method = method
        ctx.has_h0 = h0 is not None
        ctx.save_for_backward(log_decay, h, h0 if h0 is not None else h)
        return h

    @staticmethod
    def backward(ctx, grad_h: Tensor):
        log_decay, h, h0 = ctx.saved_tensors
        if not ctx.has_h0:
            h0 = None
        # Adjoint: g_t = grad_h_t + exp(log_decay_{t+1}) g_{t+1}, a forward scan on reversed time.
        next_decay = torch.cat([log_decay[1:], torch.zeros_like(log_decay[:1])])
        g = linear_scan(next_decay.flip(0), grad_h.flip(0), None, ctx.chunk_size, ctx.method).flip(0)
        # d h_t / d log_decay_t = exp(log_decay_t) * h_{t-1}
        grad_log_decay = torch.exp(log_decay).mul_(g)
        grad_h0 = grad_log_decay[0].clone() if h0 is not None and ctx.needs_input_grad[2] else None
        grad_log_decay[1:].mul_(h[:-1])
        if h0 is None:
            grad_log_decay[0].zero_()
        else:
            grad_log_decay[0].mul_(h0)
        return grad_log_decay, g, grad_h0, None, None


def _chunk_settings(device: torch.device, chunk_size: int | None, method: str | None) -> tuple[int, str]:
    """The chunk size and method to use: the device's defaults unless given; validated."""
    if method is None:
        method = "loop" if device.type == "cpu" else "segsum"
    if method not in CHUNK_METHODS:
        raise ValueError(f"linear_scan: unknown method {method!r}; expected one of {CHUNK_METHODS}")
    T = DEFAULT_CHUNK_SIZE[method] if chunk_size is None else int(chunk_size)
    if T < 2:
        raise ValueError(f"linear_scan: chunk_size must be >= 2, got {chunk_size}")
    return T, method


def linear_scan(
    log_decay: Tensor,
    inputs: Tensor,
    h0: Tensor | None = None,
    chunk_size: int | None = None,
    method: str | None = None,
) -> Tensor:
    """All states of the diagonal linear recurrence ``h_t = exp(log_decay_t) * h_{t-1} + inputs_t``.

    Time-major (time is the FIRST axis, so that every step touches contiguous memory):
    ``log_decay``, ``inputs``: (L, ...) (same shape); ``h0``: (...) or None for a zero initial
    state. Returns the states (L, ...). Differentiable in all three tensors; memory is a few copies
    of (L, ...) (plus, for ``method="segsum"``, one block of (chunk x chunk) matrices at a time).
    ``method``: one of :data:`CHUNK_METHODS`, None for the device's default.
    """
    T, method = _chunk_settings(inputs.device, chunk_size, method)
    if log_decay.shape != inputs.shape or log_decay.dim() < 1:
        raise ValueError(f"linear_scan: log_decay {_shape(log_decay)} and inputs {_shape(inputs)} differ in shape")
    if h0 is not None and h0.shape != inputs.shape[1:]:
        raise ValueError(f"linear_scan: h0 must have shape {_shape(inputs)[1:]}, got {_shape(h0)}")
    return _LinearScan.apply(log_decay, inputs, h0, T, method)


def selective_scan_chunked(
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
    chunk_size: int | None = None,
    chunk_method: str | None = None,
    segment_bytes: int = TEMPORARY_BYTES,
) -> Tensor | tuple[Tensor, Tensor]:
    """The selective scan as a chunked parallel scan in PyTorch (see the module docstring and
    :func:`linear_scan` for ``chunk_size`` and ``chunk_method``).

    Long inputs are scanned in segments along the length, each starting from the previous
    segment's last state, so that no (length, batch, channels, state) temporary exceeds
    ``segment_bytes`` (see :mod:`longrange.ops.chunking`); the result is the same.
    """
    _check_shapes(u, delta, A, B, C, D, z, delta_bias, initial_state)
    b, d, l = u.shape
    n = A.shape[1]
    itemsize = torch.empty((), dtype=_compute_dtype(u, delta, A, B, C, D, z, delta_bias, initial_state)).element_size()
    step, _ = _chunk_settings(u.device, chunk_size, chunk_method)
    seg = max(step, group_size(b * d * n * itemsize, segment_bytes) // step * step)
    if l > seg:
        outs, state = [], initial_state
        for s in range(0, l, seg):
            part = slice(s, s + seg)
            time_varying = lambda M: M[..., part] if M.dim() > 2 else M  # noqa: E731
            y_part, state = _selective_scan_segment(
                u[..., part], delta[..., part], A, time_varying(B), time_varying(C), D,
                None if z is None else z[..., part], delta_bias, delta_softplus, state, chunk_size, chunk_method,
            )
            outs.append(y_part)
        out = torch.cat(outs, dim=-1)
        return (out, state) if return_last_state else out
    out, last = _selective_scan_segment(
        u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state, chunk_size, chunk_method
    )
    return (out, last) if return_last_state else out


def _selective_scan_segment(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state, chunk_size, chunk_method):
    """One segment of :func:`selective_scan_chunked`: (output, last state)."""
    dtype = _compute_dtype(u, delta, A, B, C, D, z, delta_bias, initial_state)
    b, d, l = u.shape
    n = A.shape[1]
    uc = u.to(dtype)
    dt = _prepare_delta(delta, delta_bias, delta_softplus, dtype)
    # The states are laid out (l, b, d, n): time-major for the scan, state index innermost.
    dt_t = dt.permute(2, 0, 1).contiguous()  # (l, b, d)
    log_decay = dt_t[..., None] * A.to(dtype)  # (l, b, d, n)
    xu = dt_t * uc.permute(2, 0, 1)  # (l, b, d)
    Bc = B.to(dtype)
    if Bc.dim() == 2:
        inputs = xu[..., None] * Bc
    elif Bc.dim() == 3:
        inputs = xu[..., None] * Bc.permute(2, 0, 1).contiguous()[:, :, None, :]
    else:  # grouped: channels (g, d // g) times B (l, b, g, 1, n)
        g = Bc.shape[1]
        Bt = Bc.permute(3, 0, 1, 2).contiguous()[:, :, :, None, :]
        inputs = (xu.unflatten(2, (g, d // g))[..., None] * Bt).flatten(2, 3)
    h0 = None if initial_state is None else initial_state.to(dtype)
    h = linear_scan(log_decay, inputs.expand_as(log_decay), h0, chunk_size, chunk_method)
    Cc = C.to(dtype)
    if Cc.dim() == 2:
        y = (h * Cc).sum(-1)  # (l, b, d)
    elif Cc.dim() == 3:  # batched (d x n) @ (n x 1) over (l, b)
        y = (h @ Cc.permute(2, 0, 1)[..., None]).squeeze(-1)
    else:
        g = Cc.shape[1]
        Ct = Cc.permute(3, 0, 1, 2)[:, :, :, :, None]  # (l, b, g, n, 1)
        y = (h.unflatten(2, (g, d // g)) @ Ct).flatten(2)
    out = _finish(y.permute(1, 2, 0), uc, D, z, u.dtype)
    last = h[-1] if l > 0 else (h0 if h0 is not None else uc.new_zeros(b, d, n))
    return out, last


# --------------------------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------------------------


_triton: tuple[object | None, str | None] | None = None


def _triton_scan() -> tuple[object | None, str | None]:
    """(``selective_scan_triton``, None), or (None, why it does not import); imported once."""
    global _triton
    if _triton is None:
        try:
            from longrange.ops.scan_triton import selective_scan_triton
        except Exception as err:  # the module or triton missing, or triton broken
            _triton = (None, f"{type(err).__name__}: {err}")
        else:
            _triton = (selective_scan_triton, None)
    return _triton


def _cuda_usable(device: torch.device, has_initial_state: bool, dtype: torch.dtype) -> bool:
    return (
        _optional.selective_scan_cuda_fn is not None
        and device.type == "cuda"
        and not has_initial_state
        and dtype != torch.float64
    )


def auto_impl(device: torch.device | str, has_initial_state: bool = False, dtype: torch.dtype = torch.float32) -> str:
    """The implementation ``impl="auto"`` runs for inputs on ``device`` (with or without an
    initial state, computing in ``dtype``): on CUDA ``"cuda"`` (mamba_ssm's kernel, when its
    compiled extension imports; no initial state, not float64), else ``"triton"`` when
    ``longrange.ops.scan_triton`` imports, else ``"chunked"``; on CPU ``"numba"`` when numba
    imports, else ``"chunked"``; elsewhere ``"chunked"``."""
    from longrange.ops.scan_numba import numba_available

    device = torch.device(device)
    if device.type == "cuda":
        if _cuda_usable(device, has_initial_state, dtype):
            return "cuda"
        return "triton" if _triton_scan()[0] is not None else "chunked"
    if device.type == "cpu" and numba_available():
        return "numba"
    return "chunked"


def selective_scan(
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
    impl: str | None = None,
    chunk_size: int | None = None,
    chunk_method: str | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """The selective scan, a drop-in for ``mamba_ssm``'s ``selective_scan_fn`` (see the module docstring).

    Extra keyword arguments: ``initial_state`` (b, d, n) starts the recurrence from a given state
    (so a long sequence can be scanned piece by piece, passing the returned last state on);
    ``impl``, one of :data:`IMPLS` (None: the module default, see :func:`set_default_impl`;
    ``"auto"``: see :func:`auto_impl`); ``chunk_size`` and ``chunk_method`` for the chunked
    implementation (see :func:`linear_scan`; the others ignore them).
    """
    impl = _default_impl if impl is None else impl
    _check_impl(impl)
    _check_shapes(u, delta, A, B, C, D, z, delta_bias, initial_state)
    args = (u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
    dtype = _compute_dtype(u, delta, A, B, C, D, z, delta_bias, initial_state)
    if impl == "auto":
        impl = auto_impl(u.device, initial_state is not None, dtype)
    if impl == "cuda":
        if not _cuda_usable(u.device, initial_state is not None, dtype):
            reason = _optional.status()["mamba_ssm"].get("reason", "")
            raise RuntimeError(
                "selective_scan: impl='cuda' needs mamba_ssm with its compiled extension selective_scan_cuda"
                f"{f' ({reason})' if reason else ''}, CUDA tensors, float32/float16/bfloat16 inputs and no initial_state"
            )
        return _optional.selective_scan_cuda_fn(*args)
    if impl == "triton":
        fn, error = _triton_scan()
        if fn is None:
            raise RuntimeError(
                f"selective_scan: impl='triton' needs the triton package and longrange.ops.scan_triton, which do not import ({error})"
            )
        return fn(*args, initial_state=initial_state)
    if impl == "numba":
        from longrange.ops.scan_numba import selective_scan_numba

        return selective_scan_numba(*args, initial_state=initial_state)
    if impl == "ref":
        return selective_scan_ref(*args, initial_state=initial_state)
    return selective_scan_chunked(*args, initial_state=initial_state, chunk_size=chunk_size, chunk_method=chunk_method)
