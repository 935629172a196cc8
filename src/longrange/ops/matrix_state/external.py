"""The maintained CUDA kernels of the matrix-state ops, detected truthfully.

- flash-linear-attention (PyPI ``flash-linear-attention`` / ``fla-core``, the extra ``.[fla]``):
  ``chunk_gla``, ``chunk_delta_rule``, ``chunk_gated_delta_rule``, Triton kernels in our layout
  (batch, length, heads, features) with states (batch, heads, dk, dv);
- mamba-ssm (``.[cuda]``): ``mamba_chunk_scan_combined`` for SSD, whose state is (batch, heads,
  headdim, d_state), the transpose of ours.

A kernel counts as usable on a device only after it imported and ran once there on a small input,
forward and backward, in float32 and in bfloat16 (Triton compiles on first use, so a package that
imports can still fail on a given GPU, or in one dtype, or in its backward only), and its float32
output matched our chunked form's on that input (:data:`AGREEMENT`: a kernel whose layout or
definition differs from ours is never used); the result is kept per op and device, and :func:`reason` says why one is not usable (``longrange info``).
``longrange check --device cuda`` compares every usable kernel with the float64 reference.
"""

from __future__ import annotations

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
}

_probed: dict[tuple[str, str], tuple[Callable | None, str | None]] = {}
#: The dtypes a kernel must run in, forward and backward, to count as usable: training runs in
#: float32 or under bf16 autocast, and a kernel can fail in one only (flash-linear-attention's
#: gated delta rule refuses its backward on Hopper GPUs with Triton 3.4 to 3.7.0; a forward-only
#: probe in float32 had let it through on an H100).
PROBE_DTYPES = (torch.float32, torch.bfloat16)


def _wrap(op: str, fn: Callable) -> Callable:
    """``fn`` with the signature of our entry points' positional arguments."""
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


def _probe_inputs(op: str, device: torch.device, dtype: torch.dtype = torch.float32) -> tuple:
    """A small input of ``op`` (batch 1, length 16) at ``dtype`` (SSD's A stays float32, as Mamba-2
    keeps it), every tensor a leaf that requires grad."""
    inputs = _probe_values(op, device)
    return tuple(
        t if not isinstance(t, Tensor) else t.to(torch.float32 if op == "ssd" and i == 2 else dtype).requires_grad_()
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
    wrapped = _wrap(op, fn)
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
