"""The selective scan as a chunked parallel scan in PyTorch: :func:`selective_scan_chunked`, and the
diagonal linear recurrence it is built on, :func:`linear_scan`.

The length is split into chunks; the states inside every chunk are computed for all chunks at
once, the chunk-initial states by the same recurrence one level up. The backward
(:class:`_LinearScan`) is the same scan run in reverse, so autograd never stores per-chunk
temporaries. Memory: a few tensors of (l, b, d, n) (the states, the log-decays, the gradients),
plus for the "segsum" method one bounded block of (chunk x chunk) matrices at a time; never
(l x l). Long inputs are scanned in segments of bounded size (see :mod:`longrange.ops.chunking`).

Deterministic: forward and backward are PyTorch operations without atomic accumulation, so two
runs give the same bits wherever PyTorch's own operations do (on CPUs at equal thread counts; on
GPUs under ``torch.use_deterministic_algorithms``, which PyTorch enforces op by op).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from longrange.ops.chunking import TEMPORARY_BYTES, group_size
from longrange.ops.scan.common import check_shapes, compute_dtype, finish, prepare_delta, shape_of

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
        raise ValueError(f"linear_scan: log_decay {shape_of(log_decay)} and inputs {shape_of(inputs)} differ in shape")
    if h0 is not None and h0.shape != inputs.shape[1:]:
        raise ValueError(f"linear_scan: h0 must have shape {shape_of(inputs)[1:]}, got {shape_of(h0)}")
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
    check_shapes(u, delta, A, B, C, D, z, delta_bias, initial_state)
    b, d, l = u.shape
    n = A.shape[1]
    itemsize = torch.empty((), dtype=compute_dtype(u, delta, A, B, C, D, z, delta_bias, initial_state)).element_size()
    step, _ = _chunk_settings(u.device, chunk_size, chunk_method)
    seg = l if u.device.type == "meta" else max(step, group_size(b * d * n * itemsize, segment_bytes) // step * step)
    if l > seg:
        outs, state = [], initial_state
        for s in range(0, l, seg):
            part = slice(s, s + seg)
            time_varying = lambda M: M[..., part] if M.dim() > 2 else M  # noqa: E731
            y_part, state = _selective_scan_segment(
                u[..., part],
                delta[..., part],
                A,
                time_varying(B),
                time_varying(C),
                D,
                None if z is None else z[..., part],
                delta_bias,
                delta_softplus,
                state,
                chunk_size,
                chunk_method,
            )
            outs.append(y_part)
        out = torch.cat(outs, dim=-1)
        return (out, state) if return_last_state else out
    out, last = _selective_scan_segment(
        u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state, chunk_size, chunk_method
    )
    return (out, last) if return_last_state else out


def _selective_scan_segment(
    u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state, chunk_size, chunk_method
):
    """One segment of :func:`selective_scan_chunked`: (output, last state)."""
    dtype = compute_dtype(u, delta, A, B, C, D, z, delta_bias, initial_state)
    b, d, l = u.shape
    n = A.shape[1]
    uc = u.to(dtype)
    dt = prepare_delta(delta, delta_bias, delta_softplus, dtype)
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
    out = finish(y.permute(1, 2, 0), uc, D, z, u.dtype)
    last = h[-1] if l > 0 else (h0 if h0 is not None else uc.new_zeros(b, d, n))
    return out, last
