"""The maintained CUDA kernels of the matrix-state ops, detected truthfully.

- flash-linear-attention (PyPI ``flash-linear-attention`` / ``fla-core``, the extra ``.[fla]``):
  ``chunk_gla``, ``chunk_delta_rule``, ``chunk_gated_delta_rule``, Triton kernels in our layout
  (batch, length, heads, features) with states (batch, heads, dk, dv);
- mamba-ssm (``.[cuda]``): ``mamba_chunk_scan_combined`` for SSD, whose state is (batch, heads,
  headdim, d_state), the transpose of ours; ``mamba3_siso_combined`` for Mamba-3 SISO (its Triton
  kernels: the op is defined at the level of this function, see :mod:`.mamba3`), which computes in
  bfloat16 whatever its inputs' dtype, takes no padding mask, and wants power-of-two head widths
  (:func:`mamba3_fits`).

A kernel counts as usable on a device only after it imported and ran once there on a small input,
forward and backward, in float32 and in bfloat16 (Triton compiles on first use, so a package that
imports can still fail on a given GPU, or in one dtype, or in its backward only), and its float32
output matched our chunked form's on that input (:data:`AGREEMENT`: a kernel whose layout or
definition differs from ours is never used); the result is kept per op and device, and :func:`reason` says why one is not usable (``longrange info``).
``longrange check --device cuda`` compares every usable kernel with the float64 reference.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from longrange import _optional
from longrange.ops.matrix_state.families import family

#: op -> (package, module, function)
SOURCES: dict[str, tuple[str, str, str]] = {
    "gla": ("fla", "fla.ops.gla", "chunk_gla"),
    "delta_rule": ("fla", "fla.ops.delta_rule", "chunk_delta_rule"),
    "gated_delta_rule": ("fla", "fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    "ssd": ("mamba_ssm", "mamba_ssm.ops.triton.ssd_combined", "mamba_chunk_scan_combined"),
    "mamba3": ("mamba_ssm", "mamba_ssm.ops.triton.mamba3.mamba3_siso_combined", "mamba3_siso_combined"),
}

_probed: dict[tuple[str, str], tuple[Callable | None, str | None]] = {}
#: The dtypes a kernel must run in, forward and backward, to count as usable: training runs in
#: float32 or under bf16 autocast, and a kernel can fail in one only (flash-linear-attention's
#: gated delta rule refuses its backward on Hopper GPUs with Triton 3.4 to 3.7.0; a forward-only
#: probe in float32 had let it through on an H100).
PROBE_DTYPES = (torch.float32, torch.bfloat16)


def _wrap(op: str, fn: Callable) -> Callable:
    """``fn`` with the signature of our entry points' positional arguments."""
    if op == "mamba3":
        return _mamba3_adapter(fn)
    if op == "ssd":

        def ssd(x, dt, A, B, C, D=None, initial_state=None, output_final_state=False):
            init = None if initial_state is None else initial_state.transpose(-1, -2).contiguous()
            out = fn(x, dt, A, B, C, chunk_size=64, D=D, initial_states=init, return_final_states=output_final_state)
            if output_final_state:
                y, final = out
                return y, final.transpose(-1, -2)
            return out

        return ssd

    def run(*args: Any) -> Any:
        *tensors, scale, initial_state, output_final_state = args
        o, final = fn(
            *fla_dtypes(op, tensors), scale=scale, initial_state=initial_state, output_final_state=output_final_state
        )
        return (o, final) if output_final_state else o

    return run


def is_prefix_mask(mask: Tensor | None) -> bool:
    """Whether every row of ``mask`` (batch, length) is real positions then padding (or none): the
    sequences are left-aligned, as the toolkit's batches are."""
    if mask is None:
        return True
    lengths = mask.sum(1, keepdim=True)
    return bool((mask == (torch.arange(mask.shape[1], device=mask.device) < lengths)).all())


def mamba3_fits(
    p: int | None = None, n: int | None = None, prefix_mask: bool = True, m: int | None = None, **_: Any
) -> bool:
    """Whether mamba-ssm's Mamba-3 kernel takes inputs of head width ``p``, state width ``n`` (both
    powers of two, as its tensor descriptors need), ``m`` rotation angles (an even number: it
    asserts so; a layer with ``d_state=4`` and ``rope_fraction=0.5`` has one) and this padding mask
    (left-aligned sequences: :func:`is_prefix_mask`)."""
    pow2 = lambda v: v is None or (v > 0 and v & (v - 1) == 0)  # noqa: E731
    return pow2(p) and pow2(n) and (m is None or (m > 0 and m % 2 == 0)) and prefix_mask


def mamba3_misfit(
    p: int | None = None, n: int | None = None, prefix_mask: bool = True, m: int | None = None, **_: Any
) -> str:
    if not prefix_mask:
        return "takes left-aligned sequences only (a padding mask of real positions, then padding)"
    if m is not None and (m <= 0 or m % 2):
        return f"needs an even, positive number of rotation angles; got {m}"
    return f"needs power-of-two head and state widths; got p={p}, n={n}"


def _mamba3_adapter(fn: Callable) -> Callable:
    """mamba-ssm's ``mamba3_siso_combined`` with our arguments and state (:mod:`.mamba3`): Q = C,
    K = B, V = x, ADT = dt A, DT = dt and Trap as (batch, heads, length), the SSM state transposed,
    the states in the order (angle, ssm, k, v). A padding mask of left-aligned sequences zeroes dt
    at padded positions (no decay, no write, no rotation: the state is carried) and the outputs
    there; as the kernel's previous key and input are then those of the last padded position, the
    final state's ``k`` and ``v`` are rebuilt from the last real one (the rotation angles are
    carried unchanged, so ``k = R(theta)(B + b_B)`` there)."""
    from longrange.ops.matrix_state.common import keep
    from longrange.ops.matrix_state.mamba3 import Mamba3State, _biased, rotate_pairs

    def mamba3(
        x, dt, A, B, C, trap, angles, B_bias=None, C_bias=None, D=None, initial_state=None,
        output_final_state=False, mask=None,
    ):  # fmt: skip
        b, l, h, p = x.shape
        n = B.shape[-1]
        if mask is not None:
            dt = keep(mask, dt)
        f32 = torch.float64 if x.dtype == torch.float64 else torch.float32  # the kernel's float32 inputs
        dtf = dt.to(f32)
        zeros = torch.zeros(h, n, device=x.device, dtype=f32)
        states = None
        if initial_state is not None:
            S0, theta0, k0, v0 = initial_state
            states = (theta0.to(f32), S0.transpose(-1, -2).to(f32).contiguous(), k0.to(f32), v0.to(f32))
        out = fn(
            C,
            B,
            x,
            (dtf * A.to(f32)).transpose(1, 2).contiguous(),
            dtf.transpose(1, 2).contiguous(),
            trap.transpose(1, 2).contiguous(),
            zeros if C_bias is None else C_bias.to(f32),
            zeros if B_bias is None else B_bias.to(f32),
            angles.to(f32),
            D=None if D is None else D.to(f32),
            Z=None,
            Input_States=states,
            chunk_size=64,
            return_final_states=output_final_state,
        )
        y = out[0] if output_final_state else out
        y = y.to(x.dtype) if mask is None else keep(mask, y.to(x.dtype))
        if not output_final_state:
            return y
        theta, S, k, v = out[1], out[2].transpose(-1, -2), out[3], out[4]
        if mask is not None and not bool(mask.all()):
            last = mask.sum(1) - 1  # the last real position of each sequence (-1: none)
            rows = torch.arange(b, device=x.device)
            at = last.clamp_min(0)
            real = (last >= 0).view(b, 1, 1)
            Bh = _biased(B[rows, at].unsqueeze(1).to(k.dtype), B_bias, h, 2).squeeze(1)  # (b, h, n)
            k_last = rotate_pairs(Bh, theta.to(k.dtype))
            k0 = torch.zeros_like(k) if initial_state is None else initial_state[2].to(k.dtype)
            v0 = torch.zeros_like(v) if initial_state is None else initial_state[3].to(v.dtype)
            k = torch.where(real, k_last, k0)
            v = torch.where(real, x[rows, at].to(v.dtype), v0)
        return y, Mamba3State(ssm=S, angle=theta, k=k, v=v)

    return mamba3


def fla_dtypes(op: str, tensors: list[Tensor]) -> list[Tensor]:
    """The inputs in the dtypes flash-linear-attention's kernels take: q, k, v and the delta rules'
    beta in one dtype (the lowest precision among q, k and v: under bf16 autocast the normalised
    keys come out in float32 and the values in bf16, and its kernels' products refuse mixed
    operands, "Both operands must be same dtype", seen on an H100), the log-decays in float32."""
    q, k, v, *rest = tensors
    low = min((t.dtype for t in (q, k, v)), key=lambda dt: torch.finfo(dt).bits)
    out = [q.to(low), k.to(low), v.to(low)]
    if op == "delta_rule":  # beta
        return out + [rest[0].to(low)]
    if op == "gla":  # gk
        return out + [rest[0].float()]
    return out + [rest[0].float(), rest[1].to(low)]  # gated: g, beta


#: The positions of each op's probe inputs that stay float32 whatever the probe's dtype (parameters
#: and decays that the layers keep in float32, as Mamba-2 and Mamba-3 do): SSD's A; Mamba-3's dt, A,
#: biases and D.
PROBE_FLOAT32 = {"ssd": (2,), "mamba3": (1, 2, 7, 8, 9)}


def _probe_inputs(op: str, device: torch.device, dtype: torch.dtype = torch.float32) -> tuple:
    """A small input of ``op`` (batch 1, length 16) at ``dtype`` (but :data:`PROBE_FLOAT32`), every
    tensor a leaf that requires grad."""
    inputs = _probe_values(op, device)
    keep32 = PROBE_FLOAT32.get(op, ())
    return tuple(
        t if not isinstance(t, Tensor) else t.to(torch.float32 if i in keep32 else dtype).requires_grad_()
        for i, t in enumerate(inputs)
    )


def _probe_values(op: str, device: torch.device) -> tuple:
    b, l, h, d = 1, 16, 1, 16
    r = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    if op == "ssd":
        return (
            r(b, l, h, d),
            torch.rand(b, l, h, device=device) * 0.1,
            -torch.ones(h, device=device),
            r(b, l, 1, d),
            r(b, l, 1, d),
            None,
            None,
            False,
        )
    if op == "mamba3":  # x, dt, A, B, C, trap, angles, B_bias, C_bias, D, initial state, final state
        return (
            r(b, l, h, d),
            torch.rand(b, l, h, device=device) * 0.1 + 0.01,
            -torch.ones(h, device=device),
            r(b, l, 1, d),
            r(b, l, 1, d),
            r(b, l, h),
            r(b, l, h, d // 4),
            0.1 * r(h, d),
            0.1 * r(h, d),
            r(h),
            None,
            False,
        )
    q, k, v = r(b, l, h, d), torch.nn.functional.normalize(r(b, l, h, d), dim=-1), r(b, l, h, d)
    if op == "gla":
        return (q, k, v, -torch.rand(b, l, h, d, device=device), None, None, False)
    beta = torch.rand(b, l, h, device=device)
    if op == "delta_rule":
        return (q, k, v, beta, None, None, False)
    return (q, k, v, -torch.rand(b, l, h, device=device), beta, None, None, False)


def _probe(op: str, device: torch.device) -> tuple[Callable | None, str | None]:
    package, module, name = SOURCES[op]
    if not _optional.installed(package):
        return None, f"{package} is not installed"
    try:
        import importlib

        fn = getattr(importlib.import_module(module), name)
    except Exception as err:  # an ImportError, or a broken extension
        return None, f"{module}.{name} does not import ({type(err).__name__}: {err})"
    say(
        f"longrange: probing {module}.{name} on {device} (forward and backward in float32 and bfloat16: "
        "the first use of a Triton kernel compiles and autotunes it, which can take minutes)"
    )
    start = time.perf_counter()
    fn, why = _probe_runs(op, _wrap(op, fn), module, name, device)
    verdict = "usable" if why is None else "not usable"
    say(f"longrange: {module}.{name} on {device}: {verdict} ({time.perf_counter() - start:.0f} s)")
    return fn, why


def say(line: str) -> None:
    """A progress line on standard error (a probe can take minutes on its first use)."""
    print(line, file=sys.stderr, flush=True)


def _probe_runs(
    op: str, wrapped: Callable, module: str, name: str, device: torch.device
) -> tuple[Callable | None, str | None]:
    for dtype in PROBE_DTYPES:
        try:
            inputs = _probe_inputs(op, device, dtype)
            out = wrapped(*inputs)
            out.float().square().sum().backward()
            grads = [t.grad for t in inputs if isinstance(t, Tensor) and t.requires_grad]
            if not bool(torch.isfinite(out).all()) or not all(
                g is not None and bool(torch.isfinite(g).all()) for g in grads
            ):
                return None, f"{module}.{name} gave non-finite outputs or gradients on a small {dtype} input"
            if dtype == torch.float32:
                error = _error_against_chunk(op, out, inputs)
                if not error <= AGREEMENT:
                    return None, (
                        f"{module}.{name} differs from the chunked PyTorch form by {error:.1e} (relative) on a small "
                        f"float32 input (at most {AGREEMENT:g} expected): its layouts or its definition differ from "
                        "ours here"
                    )
        except Exception as err:  # Triton compilation errors, unsupported GPUs, refused Triton versions
            return None, (
                f"{module}.{name} failed on a small {str(dtype).replace('torch.', '')} input, forward and "
                f"backward ({type(err).__name__}: {str(err)[:200]})"
            )
    return wrapped, None


#: The largest relative difference (``|a - b| / |b|``, all entries) from the chunked PyTorch form on
#: the probe's float32 input for which a maintained kernel counts as computing the same function
#: (Triton's float32 products run in TF32: about 1e-3; a layout or definition mismatch: order 1).
AGREEMENT = 2e-2


def _error_against_chunk(op: str, out: Tensor, inputs: tuple) -> float:
    """The relative difference of a maintained kernel's output ``out`` from our chunked form's on
    the same ``inputs``."""
    plain = tuple(t.detach() if isinstance(t, Tensor) else t for t in inputs)
    with torch.no_grad():
        ref = getattr(family(op), f"{op}_chunk")(*plain)
    ref = ref[0] if isinstance(ref, tuple) else ref
    return float((out.detach().float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


def kernel(op: str, device: torch.device) -> Callable | None:
    """The maintained kernel of ``op`` if it ran on ``device``, else None (probed once per device)."""
    if op not in SOURCES or device.type != "cuda":
        return None
    key = (op, str(device))
    if key not in _probed:
        _probed[key] = _probe(op, device)
    return _probed[key][0]


def reason(op: str, device: torch.device) -> str:
    """Why the maintained kernel of ``op`` is not usable on ``device``."""
    if op not in SOURCES:
        return f"{op} has no maintained CUDA kernel here"
    if device.type != "cuda":
        return f"{SOURCES[op][0]}'s kernel runs on CUDA tensors only"
    kernel(op, device)
    return _probed[(op, str(device))][1] or "usable"
