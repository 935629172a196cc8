"""``impl="chunk"`` and ``impl="loop"``: the chunked complex diagonal scan (see the package
docstring), with its hand-written backward (:class:`_ComplexDiagScan`).

Both cut the length into chunks of T positions and differ only in how they compute the states
inside the chunks: ``"chunk"`` by one product with the (T x T) matrix of powers, ``"loop"`` by T
sequential steps over all chunks at once.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops.complex_scan.common import check_chunk_size, check_inputs

#: Default chunk length per implementation: "loop" steps T times and then recurses on L / T chunk
#: ends, so T near sqrt(L) keeps both short; "chunk" does T times the sequential work in large products.
DEFAULT_CHUNK_SIZE = {"loop": 32, "chunk": 64}


def _powers(log_decay: Tensor, T: int) -> Tensor:
    """(T, N): λ^1 .. λ^T."""
    k = torch.arange(1, T + 1, device=log_decay.device, dtype=log_decay.real.dtype)
    return torch.exp(k[:, None] * log_decay)


def _local_matmul(log_decay: Tensor, v: Tensor) -> Tensor:
    """States from a zero start inside each chunk: v (..., T, N) -> (..., T, N), by the (T x T) power matrix."""
    T = v.shape[-2]
    idx = torch.arange(T, device=v.device)
    lag = idx[:, None] - idx[None, :]  # t - s
    causal = lag >= 0
    # exp(max(t - s, 0) · log λ), zeroed above the diagonal: the exponent is never positive for a
    # stable λ, so no entry overflows (and no inf meets the zeroing mask).
    W = torch.exp(lag.clamp(min=0).to(log_decay.real.dtype)[:, :, None] * log_decay) * causal[:, :, None]
    return torch.einsum("tsn,...sn->...tn", W, v)


def _local_loop(log_decay: Tensor, v: Tensor) -> Tensor:
    """As :func:`_local_matmul`, stepping through the T positions of all chunks at once (position
    first in memory, so that every step reads and writes contiguous slices; without autograd)."""
    lam = torch.exp(log_decay)
    vt = v.movedim(-2, 0).contiguous()
    out = torch.empty_like(vt)
    out[0] = vt[0]
    for t in range(1, vt.shape[0]):
        torch.addcmul(vt[t], lam, out[t - 1], out=out[t])
    return out.movedim(0, -2)


#: How each implementation computes the states inside the chunks.
_LOCAL = {"chunk": _local_matmul, "loop": _local_loop}


def _scan(log_decay: Tensor, v: Tensor, h0: Tensor | None, T: int, impl: str) -> Tensor:
    L = v.shape[-2]
    if L <= T:
        x = _LOCAL[impl](log_decay, v)
        return x if h0 is None else x + _powers(log_decay, L) * h0.unsqueeze(-2)
    pad = (-L) % T
    if pad:  # zero inputs after the end: the padded states are discarded and the real ones unaffected
        v = torch.cat([v, v.new_zeros(*v.shape[:-2], pad, v.shape[-1])], dim=-2)
    nc = (L + pad) // T
    if impl == "loop":
        # position first in memory, (T, ..., nc, N), until one copy at the end: the steps and the sum
        # with the starting states below then read and write contiguous tensors (the same sum over a
        # permuted view mixed with contiguous operands ran several times slower on a CPU)
        local = v.unflatten(-2, (nc, T)).movedim(-2, 0).contiguous()
        lam = torch.exp(log_decay)
        for t in range(1, T):
            local[t].addcmul_(lam, local[t - 1])
        last = local[-1]
    else:
        local = _local_matmul(log_decay, v.unflatten(-2, (nc, T)))  # (..., nc, T, N)
        last = local[..., -1, :]
    # The state at the end of each chunk: E_c = λ^T E_{c-1} + local_c[T-1], E_{-1} = h0.
    ends = _scan(T * log_decay, last, h0, T, impl)  # (..., nc, N)
    first = torch.zeros_like(ends[..., :1, :]) if h0 is None else h0.unsqueeze(-2)
    starts = torch.cat([first, ends[..., :-1, :]], dim=-2)  # the state before each chunk
    if impl == "loop":
        local.addcmul_(_powers(log_decay, T).view(T, *([1] * (starts.dim() - 1)), -1), starts)
        x = local.movedim(0, -2)
    else:
        x = local + _powers(log_decay, T) * starts.unsqueeze(-2)
    return x.flatten(-3, -2)[..., :L, :]


class _ComplexDiagScan(torch.autograd.Function):
    """x = scan(log λ, v, h0) with a backward that is the same scan run in reverse (package docstring)."""

    @staticmethod
    def forward(ctx, log_decay: Tensor, inputs: Tensor, h0: Tensor | None, chunk_size: int, impl: str) -> Tensor:
        with torch.no_grad():
            x = _scan(log_decay, inputs, h0, chunk_size, impl)
        ctx.chunk_size, ctx.impl, ctx.has_h0 = chunk_size, impl, h0 is not None
        ctx.save_for_backward(log_decay, x, h0 if h0 is not None else x)
        return x

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_x: Tensor):
        log_decay, x, h0 = ctx.saved_tensors
        grad_x = grad_x.to(x.dtype)  # a real-valued upstream gradient (e.g. of x.real) arrives as real
        # g_t = grad_t + conj(λ) g_{t+1}: the forward scan with the conjugate decay on reversed time.
        g = _scan(log_decay.conj(), grad_x.flip(-2), None, ctx.chunk_size, ctx.impl).flip(-2)
        lam_conj = torch.exp(log_decay).conj()
        grad_log = grad_h0 = None
        if ctx.needs_input_grad[0]:
            # x_{t-1}: the initial state before position 0, then the states.
            first = h0.unsqueeze(-2) if ctx.has_h0 else torch.zeros_like(x[..., :1, :])
            prev = torch.cat([first, x[..., :-1, :]], dim=-2)
            grad_log = lam_conj * (prev.conj() * g).reshape(-1, x.shape[-1]).sum(0)
        if ctx.has_h0 and ctx.needs_input_grad[2]:
            grad_h0 = lam_conj * g[..., 0, :]
        return grad_log, g, grad_h0, None, None


def chunked_scan(
    impl: str,
    log_decay: Tensor,
    inputs: Tensor,
    h0: Tensor | None = None,
    reverse: bool = False,
    chunk_size: int | None = None,
    where: str | None = None,
) -> Tensor:
    """The chunked scan with the states inside the chunks computed as ``impl`` (``"chunk"`` or
    ``"loop"``) does; ``where``: the function named in errors."""
    where = where or f"complex_diag_scan_{impl}"
    check_inputs(log_decay, inputs, h0, where)
    check_chunk_size(chunk_size, where)
    T = DEFAULT_CHUNK_SIZE[impl] if chunk_size is None else chunk_size
    if inputs.shape[-2] == 0:
        return inputs.clone()
    log_decay = log_decay.to(inputs.dtype)
    if reverse:
        return _ComplexDiagScan.apply(log_decay, inputs.flip(-2), h0, T, impl).flip(-2)
    return _ComplexDiagScan.apply(log_decay, inputs, h0, T, impl)


def complex_diag_scan_chunk(
    log_decay: Tensor, inputs: Tensor, h0: Tensor | None = None, reverse: bool = False, chunk_size: int | None = None
) -> Tensor:
    """``impl="chunk"``: the states inside each chunk by one product with the chunk's (T x T) matrix
    of powers. ``chunk_size`` T (>= 2; None: :data:`DEFAULT_CHUNK_SIZE`)."""
    return chunked_scan("chunk", log_decay, inputs, h0, reverse, chunk_size)


def complex_diag_scan_loop(
    log_decay: Tensor, inputs: Tensor, h0: Tensor | None = None, reverse: bool = False, chunk_size: int | None = None
) -> Tensor:
    """``impl="loop"``: the states inside each chunk by T steps over all chunks at once.
    ``chunk_size`` T (>= 2; None: :data:`DEFAULT_CHUNK_SIZE`)."""
    return chunked_scan("loop", log_decay, inputs, h0, reverse, chunk_size)
