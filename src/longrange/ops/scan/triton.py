"""The selective scan as Triton kernels, for GPUs: :func:`selective_scan_triton`.

Same call and semantics as :func:`longrange.ops.scan.selective_scan` (see the package for the
shapes and the recurrence): every B/C layout ((d, n), (b, n, l), (b, g, n, l)), ``D``, the SiLU
gate ``z``, ``delta_bias`` and softplus, ``initial_state`` and the last state; gradients with
respect to every tensor input, ``initial_state`` included.

How it runs (kernels in :mod:`longrange.ops.scan._triton_kernels`): one program per batch element
and block of channels keeps the state (channels x n) in registers and walks along the length in
chunks; the states inside a chunk are computed in registers by an associative scan. The forward
stores the state at chunk starts only (b, d, length / chunk, n); the backward walks the chunks in
reverse, recomputes each chunk's states from the stored one and runs the adjoint recurrence as a
reverse scan, so the per-position states never reach memory, as in ``mamba_ssm``'s CUDA kernel
(which this one also matches in supporting ``initial_state``, which that kernel does not).

Precision: inputs of any float dtype (float32 and bfloat16 are the intended ones) are read into a
float32 state with float32 accumulation, or float64 if any input is float64 (the rule of
:func:`~longrange.ops.scan.common.compute_dtype`); the output has u's dtype, the last state the computation's dtype.

Devices: CUDA tensors run compiled kernels. CPU tensors run in Triton's interpreter when the
environment variable ``TRITON_INTERPRET=1`` is set (slow; for tests). :func:`triton_available`
says whether a device can run the kernels; :func:`selective_scan_triton` raises otherwise.

Determinism: the forward is deterministic; the backward is not: the gradients of a time-varying B
and C (the S6 case) are summed over blocks of channels with atomic additions, whose order varies
from run to run on a GPU (see :data:`longrange.ops.scan.dispatch.DETERMINISTIC_BACKWARD`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops._lazy_kernels import LazyKernels, interpreter_reason, triton_interpret_requested, triton_runs_on
from longrange.ops.custom_ops import qualname, register_flops
from longrange.ops.dataless import holds_data
from longrange.ops.scan.common import check_shapes, compute_dtype, scan_flops
from longrange.ops.scan.reference import selective_scan_ref

#: Kernel settings per mode: channels per program (``block_d``), positions per chunk (``chunk``:
#: the states are stored every ``chunk`` positions) and ``num_warps``. The GPU values are the
#: fastest of ``benchmarks/gpu_scan.py --sweep`` on an H200 (batch 64, d 232, n 16) at both shapes
#: swept: forward + backward 1.28x faster than the first choice (4, 32, 4 warps) at length 4096 in
#: float32, 1.57x at 1024 in bfloat16 (docs/performance.md, the third and fourth GPU sessions); the
#: states stored every 16 positions take twice the memory of every 32.
DEFAULT_CONFIG = {
    "gpu": dict(block_d=4, chunk=16, num_warps=2),
    "interpret": dict(block_d=4, chunk=16, num_warps=1),
}

_KERNELS = LazyKernels("longrange.ops.scan._triton_kernels")
_kernel_module = _KERNELS.load


def unavailable_reason() -> str | None:
    """Why the Triton kernels cannot be used anywhere (triton's import error), or None when triton imports."""
    if _kernel_module() is None:
        return _KERNELS.error or "triton does not import"
    return None


def triton_available(device: torch.device | str) -> bool:
    """Whether :func:`selective_scan_triton` can run on tensors of ``device``: triton importable and
    either a CUDA device (with CUDA present) or a CPU device with ``TRITON_INTERPRET=1``; and the
    ``meta`` device, where the operator's fake implementation runs (nothing is launched, so
    triton is not needed)."""
    if torch.device(device).type == "meta":
        return True
    return _kernel_module() is not None and triton_runs_on(device)


def _check_runnable(u: Tensor, tensors: dict[str, Tensor | None]) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != u.device:
            raise ValueError(
                f"selective_scan_triton: {name} is on {t.device}, u on {u.device}; all must share a device"
            )
    if not holds_data(u):  # meta or fake tensors: the operator's fake implementation runs, nothing is launched
        return
    if _kernel_module() is None:
        raise RuntimeError("selective_scan_triton: triton is not installed (pip install triton)")
    if not triton_available(u.device):
        if (why := interpreter_reason(u.device)) is not None:
            raise RuntimeError(f"selective_scan_triton: {why}; use CUDA tensors")
        raise RuntimeError(
            f"selective_scan_triton: tensors on {u.device} cannot run the Triton kernels; "
            "use CUDA tensors, or CPU tensors with the environment variable TRITON_INTERPRET=1 (interpreter, slow)"
        )


def _interpreting(device: torch.device) -> bool:
    return device.type != "cuda" or triton_interpret_requested()


def _config(
    device: torch.device, block_d: int | None, chunk: int | None, num_warps: int | None, dataless: bool = False
) -> dict:
    """The kernel settings; tensors without data (dry runs, plans) stand for a GPU's and take its settings."""
    cfg = dict(DEFAULT_CONFIG["interpret" if _interpreting(device) and not dataless else "gpu"])
    for key, value in (("block_d", block_d), ("chunk", chunk), ("num_warps", num_warps)):
        if value is not None:
            value = int(value)
            if value < 1 or value & (value - 1):
                raise ValueError(f"selective_scan_triton: {key} must be a power of two, got {value}")
            cfg[key] = value
    return cfg


def _layout(M: Tensor, d: int) -> tuple[tuple[int, int, int, int], int, int, bool]:
    """B or C as strides (batch, group, n, length), channels per group, groups, time-varying."""
    if M.dim() == 2:  # (d, n): channel c reads row c
        return (0, M.stride(0), M.stride(1), 0), 1, d, False
    if M.dim() == 3:  # (b, n, l): one group of all d channels
        return (M.stride(0), 0, M.stride(1), M.stride(2)), d, 1, True
    g = M.shape[1]
    return (M.stride(0), M.stride(1), M.stride(2), M.stride(3)), d // g, g, True


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _acc_dtype(dtype: torch.dtype):
    tl = _kernel_module().triton.language
    return tl.float64 if dtype == torch.float64 else tl.float32


@torch.library.custom_op(qualname("selective_scan_triton"), mutates_args=())
def _scan_op(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    delta_bias: Tensor | None,
    initial_state: Tensor | None,
    softplus: bool,
    block_d: int,
    chunk: int,
    num_warps: int,
    store_states: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(out in u's dtype, last state and, with ``store_states``, the states at chunk starts
    (b, d, chunks, n) in the compute dtype, else an empty tensor); see the module docstring."""
    b, d, L = u.shape
    n = A.shape[1]
    dtype = compute_dtype(u, delta, A, B, C, D, z, delta_bias, initial_state)
    u, delta = u.contiguous(), delta.contiguous()
    z = None if z is None else z.contiguous()
    A = A.contiguous()
    D = None if D is None else D.contiguous()
    delta_bias = None if delta_bias is None else delta_bias.contiguous()
    h0 = None if initial_state is None else initial_state.contiguous()
    T = chunk
    n_chunks = -(-L // T)
    out = torch.empty_like(u, memory_format=torch.contiguous_format)
    last = torch.empty(b, d, n, dtype=dtype, device=u.device)
    states = torch.empty(b, d, n_chunks, n, dtype=dtype, device=u.device) if store_states else last
    (sBb, sBg, sBn, sBl), B_group, _, B_varies = _layout(B, d)
    (sCb, sCg, sCn, sCl), C_group, _, C_varies = _layout(C, d)
    fwd, _ = _kernel_module().kernels(_interpreting(u.device))
    BD = block_d
    grid = (b, -(-d // BD))
    fwd[grid](
        u,
        delta,
        A,
        B,
        C,
        u if D is None else D,
        u if z is None else z,
        u if delta_bias is None else delta_bias,
        last if h0 is None else h0,
        out,
        last,
        states,
        d,
        L,
        n,
        n_chunks,
        sBb,
        sBg,
        sBn,
        sBl,
        B_group,
        sCb,
        sCg,
        sCn,
        sCl,
        C_group,
        BLOCK_D=BD,
        BLOCK_N=_next_power_of_2(n),
        CHUNK=T,
        B_VARIES=B_varies,
        C_VARIES=C_varies,
        B_ONE_GROUP=B_group % BD == 0,
        C_ONE_GROUP=C_group % BD == 0,
        HAS_D=D is not None,
        HAS_Z=z is not None,
        HAS_BIAS=delta_bias is not None,
        HAS_H0=h0 is not None,
        SOFTPLUS=bool(softplus),
        STORE_STATES=store_states,
        ACC=_acc_dtype(dtype),
        num_warps=num_warps,
    )
    return out, last, states if store_states else u.new_empty(0, dtype=dtype)


@_scan_op.register_fake
def _(u, delta, A, B, C, D, z, delta_bias, initial_state, softplus, block_d, chunk, num_warps, store_states):
    b, d, L = u.shape
    n = A.shape[1]
    dtype = compute_dtype(u, delta, A, B, C, D, z, delta_bias, initial_state)
    states = u.new_empty(b, d, -(-L // chunk), n, dtype=dtype) if store_states else u.new_empty(0, dtype=dtype)
    return torch.empty_like(u, memory_format=torch.contiguous_format), u.new_empty(b, d, n, dtype=dtype), states


@torch.library.custom_op(qualname("selective_scan_triton_backward"), mutates_args=())
def _scan_backward_op(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    z: Tensor | None,
    delta_bias: Tensor | None,
    initial_state: Tensor | None,
    states: Tensor,
    dout: Tensor,
    dlast: Tensor,
    softplus: bool,
    block_d: int,
    chunk: int,
    num_warps: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients (u, delta, A, B, C, D, z, delta_bias, initial_state) of :func:`_scan_op`, each
    in its input's dtype (an empty tensor for an absent input), from the stored ``states``."""
    dtype = states.dtype
    b, d, L = u.shape
    n = A.shape[1]
    n_chunks = states.shape[2]
    dev = u.device
    u, delta = u.contiguous(), delta.contiguous()
    z = None if z is None else z.contiguous()
    A = A.contiguous()
    D = None if D is None else D.contiguous()
    delta_bias = None if delta_bias is None else delta_bias.contiguous()
    dout, dlast = dout.contiguous(), dlast.contiguous()
    (sBb, sBg, sBn, sBl), B_group, B_ng, B_varies = _layout(B, d)
    (sCb, sCg, sCn, sCl), C_group, C_ng, C_varies = _layout(C, d)
    du = torch.empty_like(u)
    ddelta = torch.empty_like(delta)
    dz = torch.empty_like(z) if z is not None else du
    dA = torch.empty(b, d, n, dtype=dtype, device=dev)
    dB = (
        torch.zeros(b, B_ng, n, L, dtype=dtype, device=dev)
        if B_varies
        else torch.empty(b, d, n, dtype=dtype, device=dev)
    )
    dC = (
        torch.zeros(b, C_ng, n, L, dtype=dtype, device=dev)
        if C_varies
        else torch.empty(b, d, n, dtype=dtype, device=dev)
    )
    dD = torch.empty(b, d, dtype=dtype, device=dev) if D is not None else dA
    dbias = torch.empty(b, d, dtype=dtype, device=dev) if delta_bias is not None else dA
    dh0 = torch.empty(b, d, n, dtype=dtype, device=dev)
    BD = block_d
    _, bwd = _kernel_module().kernels(_interpreting(dev))
    bwd[(b, -(-d // BD))](
        u,
        delta,
        A,
        B,
        C,
        u if D is None else D,
        u if z is None else z,
        u if delta_bias is None else delta_bias,
        states,
        dout,
        dlast,
        du,
        ddelta,
        dz,
        dA,
        dB,
        dC,
        dD,
        dbias,
        dh0,
        d,
        L,
        n,
        n_chunks,
        sBb,
        sBg,
        sBn,
        sBl,
        B_group,
        B_ng,
        sCb,
        sCg,
        sCn,
        sCl,
        C_group,
        C_ng,
        BLOCK_D=BD,
        BLOCK_N=_next_power_of_2(n),
        CHUNK=chunk,
        B_VARIES=B_varies,
        C_VARIES=C_varies,
        B_ONE_GROUP=B_group % BD == 0,
        C_ONE_GROUP=C_group % BD == 0,
        HAS_D=D is not None,
        HAS_Z=z is not None,
        HAS_BIAS=delta_bias is not None,
        SOFTPLUS=bool(softplus),
        ACC=_acc_dtype(dtype),
        num_warps=num_warps,
    )

    def bc_grad(grad: Tensor, M: Tensor, varies: bool) -> Tensor:
        grad = grad.reshape(M.shape) if varies else grad.sum(0)  # (b, 1, n, l) -> (b, n, l) when shared
        return grad.to(M.dtype)

    def none() -> Tensor:  # a fresh empty tensor for each absent input (outputs may not alias)
        return u.new_empty(0)

    return (
        du,
        ddelta,
        dA.sum(0).to(A.dtype),
        bc_grad(dB, B, B_varies),
        bc_grad(dC, C, C_varies),
        dD.sum(0).to(D.dtype) if D is not None else none(),
        dz if z is not None else none(),
        dbias.sum(0).to(delta_bias.dtype) if delta_bias is not None else none(),
        dh0.to(initial_state.dtype) if initial_state is not None else none(),
    )


@_scan_backward_op.register_fake
def _(u, delta, A, B, C, D, z, delta_bias, initial_state, states, dout, dlast, softplus, block_d, chunk, num_warps):
    def like(t: Tensor | None) -> Tensor:
        return u.new_empty(0) if t is None else t.new_empty(t.shape)

    return (
        torch.empty_like(u, memory_format=torch.contiguous_format),
        torch.empty_like(delta, memory_format=torch.contiguous_format),
        like(A),
        like(B),
        like(C),
        like(D),
        u.new_empty(0) if z is None else torch.empty_like(z, memory_format=torch.contiguous_format),
        like(delta_bias),
        like(initial_state),
    )


def _setup_context(ctx, inputs, output) -> None:
    u, delta, A, B, C, D, z, delta_bias, initial_state, softplus, block_d, chunk, num_warps, store_states = inputs
    if not store_states:
        return  # no gradient asked for
    ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, initial_state, output[2])
    ctx.meta = (softplus, block_d, chunk, num_warps)


def _backward(ctx, dout: Tensor, dlast: Tensor, dstates: Tensor):
    u, delta, A, B, C, D, z, delta_bias, initial_state, states = ctx.saved_tensors
    dout = torch.zeros_like(u) if dout is None else dout
    dlast = states.new_zeros(*u.shape[:2], A.shape[1]) if dlast is None else dlast
    grads = _scan_backward_op(u, delta, A, B, C, D, z, delta_bias, initial_state, states, dout, dlast, *ctx.meta)
    present = (
        True,
        True,
        True,
        True,
        True,
        D is not None,
        z is not None,
        delta_bias is not None,
        initial_state is not None,
    )
    grads = tuple(g if has and need else None for g, has, need in zip(grads, present, ctx.needs_input_grad))
    return (*grads, None, None, None, None, None)


_scan_op.register_autograd(_backward, setup_context=_setup_context)


def _flops(u, A, D, z, delta_bias, softplus: bool, backward: bool) -> int:
    b, d, L = u
    return scan_flops(
        b,
        d,
        L,
        A[1],
        D is not None,
        z is not None,
        backward=backward,
        has_bias=delta_bias is not None,
        softplus=bool(softplus),
    )


register_flops(
    _scan_op, lambda u, delta, A, B, C, D, z, bias, h0, softplus, *config: _flops(u, A, D, z, bias, softplus, False)
)
register_flops(
    _scan_backward_op,
    lambda u, delta, A, B, C, D, z, bias, h0, states, dout, dlast, softplus, *config: _flops(
        u, A, D, z, bias, softplus, True
    ),
)


def _selective_scan_triton(
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
    block_d: int | None = None,
    chunk: int | None = None,
    num_warps: int | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`selective_scan_triton` with the kernel settings exposed (see :data:`DEFAULT_CONFIG`)."""
    check_shapes(u, delta, A, B, C, D, z, delta_bias, initial_state)
    tensors = dict(delta=delta, A=A, B=B, C=C, D=D, z=z, delta_bias=delta_bias, initial_state=initial_state)
    _check_runnable(u, tensors)
    cfg = _config(u.device, block_d, chunk, num_warps, dataless=not holds_data(u))
    if u.numel() == 0 or A.shape[1] == 0:  # nothing to launch over
        return selective_scan_ref(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, initial_state)
    inputs = (u, delta, A, B, C, D, z, delta_bias, initial_state)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)
    out, last, _ = _scan_op(*inputs, bool(delta_softplus), cfg["block_d"], cfg["chunk"], cfg["num_warps"], needs_grad)
    return (out, last) if return_last_state else out


def selective_scan_triton(
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
    """The selective scan by Triton kernels; the semantics of :func:`longrange.ops.scan.selective_scan`
    (see the module docstrings). Needs :func:`triton_available` for u's device, else RuntimeError."""
    return _selective_scan_triton(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, initial_state)
