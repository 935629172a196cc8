"""``longrange check``: every implementation available on this machine against its float64
reference, and every primitive layer's recurrent mode against its parallel mode.

    longrange check [--device cpu|cuda|all] [--dtype float32|bfloat16|all] [--quick]

The tests hold every fast path to its reference on the machines the project is tested on; this
command does the same on the user's machine, with the user's GPU, Triton, numba and compiled
extensions. It runs a list of check cases (:class:`Case`), each a comparison at one small shape
(odd lengths, an initial state where the op takes one), and prints one row per (op,
implementation, device, dtype): the largest relative error over its cases, the tolerance, and
pass or FAIL. Any failure, or an exception raised by an implementation, makes the exit code 1 and
prints a line saying which setting avoids the failing implementation.

**The error.** For each output and each input gradient (of a fixed random weighting of the
outputs), ``max |x - x_ref| / max |x_ref|``: the inputs are drawn in float64, rounded to the
checked dtype, and the reference runs in float64 (complex128) on the CPU on those rounded values,
so the error measures the implementation, not the rounding of its inputs.

**The cases** come from the families in :data:`FAMILIES`, one function per op family returning
its cases for a device and dtype. A family with several implementations asks the op for those
that can run here (``longrange.ops.scan.available_impls(device)``,
``longrange.ops.conv.available_impls(device)``); a new implementation appears in the table as
soon as the op lists it, and a new op family is one more function in the list.

Layers run in float32 only (their step modes keep float32 and complex64 states); the S4 kernels
(complex) in float32 only; the Triton scan also on the CPU, in Triton's interpreter, with
``TRITON_INTERPRET=1`` set only while its cases run. On CUDA, float32 runs without TF32 (PyTorch's
``allow_tf32`` settings are turned off during the check and restored), so that the float32
tolerance applies; TF32 itself is a precision choice, not a kernel's error.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor

#: Tolerances on the largest relative error, by dtype (a case may set its own).
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

#: What to do when an implementation without alternative fails.
REPORT = "no setting avoids it; please report it with the output of `longrange info`"


@dataclass(frozen=True)
class Case:
    """One comparison: ``run()`` returns the largest relative error (see the module docstring).

    ``op`` and ``impl`` name the row of the table (``note`` is shown beside the implementation,
    e.g. "interpreter"); ``shape`` describes the case in failure reports; ``avoid`` says how to
    avoid the implementation (called with the implementations of the same op that passed);
    ``env`` holds environment variables set only while the case runs (None: unset);
    ``record``, when set, is the (op, implementation) the op's dispatcher must report to
    :mod:`longrange.ops.used` while the case runs.
    """

    op: str
    impl: str
    device: str
    dtype: torch.dtype
    shape: str
    run: Callable[[], float]
    tol: float
    avoid: Callable[[list[str]], str] = lambda passed: REPORT
    note: str = ""
    env: dict[str, str | None] = field(default_factory=dict)
    record: tuple[str, str] | None = None

    @property
    def label(self) -> str:
        return f"{self.impl} ({self.note})" if self.note else self.impl


@dataclass
class Row:
    """The table's row for one (op, implementation, device, dtype): the worst of its cases."""

    op: str
    impl: str
    label: str
    device: str
    dtype: torch.dtype
    tol: float
    error: float = 0.0
    failures: list[str] = field(default_factory=list)
    avoid: Callable[[list[str]], str] = lambda passed: REPORT

    @property
    def passed(self) -> bool:
        return not self.failures


# --------------------------------------------------------------------------------------------
# Comparing an implementation with its reference
# --------------------------------------------------------------------------------------------


def _low(t: Tensor, dtype: torch.dtype, device: str) -> Tensor:
    """``t`` (float64 / complex128) in the checked dtype (complex64 for complex tensors) on ``device``."""
    if t.is_complex():
        return t.to(device, torch.complex64)
    if t.is_floating_point():
        return t.to(device, dtype)
    return t.to(device)


def _high(t: Tensor) -> Tensor:
    """The float64 / complex128 CPU copy of ``t`` (rounded values kept)."""
    t = t.detach().cpu()
    if t.is_complex():
        return t.to(torch.complex128)
    return t.to(torch.float64) if t.is_floating_point() else t


def _flat(out: Any) -> list[Tensor]:
    return [out] if isinstance(out, Tensor) else [t for t in out]


def relative_error(value: Tensor | None, reference: Tensor | None) -> float:
    """``max |value - reference| / max |reference|`` (0 for empty tensors; a missing gradient
    counts as zeros)."""
    if reference is None and value is None:
        return 0.0
    if reference is None or value is None:
        present = value if reference is None else reference
        return 0.0 if not present.abs().any() else math.inf
    value = value.detach().cpu().to(reference.dtype)
    if value.shape != reference.shape:
        return math.inf
    if reference.numel() == 0:
        return 0.0
    scale = reference.abs().max().item()
    diff = (value - reference).abs().max().item()
    if not math.isfinite(diff):
        return math.inf
    return diff / scale if scale > 0 else diff


def compare(
    fn: Callable[..., Any], ref: Callable[..., Any], inputs: dict[str, Tensor], dtype: torch.dtype, device: str,
) -> float:
    """The largest relative error of ``fn``'s outputs and input gradients, on copies of ``inputs``
    in ``dtype`` on ``device``, against ``ref``'s on their float64 CPU copies. ``inputs`` are
    float64 / complex128 CPU tensors (other tensors, e.g. masks, are passed as they are); both
    functions take them as keyword arguments and return a tensor or a sequence of tensors."""
    low = {k: _low(v, dtype, device) for k, v in inputs.items()}
    high = {k: _high(v) for k, v in low.items()}
    names = [k for k, v in low.items() if v.is_floating_point() or v.is_complex()]
    for k in names:
        low[k].requires_grad_()
        high[k].requires_grad_()
    outs, refs = _flat(fn(**low)), _flat(ref(**high))
    if len(outs) != len(refs):
        return math.inf
    # The outputs' weights, rounded to the outputs' dtypes so that both sides backpropagate the same values.
    g = torch.Generator().manual_seed(1)
    weights = []
    for o, r in zip(outs, refs):
        w = torch.randn(r.shape, generator=g, dtype=torch.float64)
        if r.is_complex():
            w = torch.complex(w, torch.randn(r.shape, generator=g, dtype=torch.float64))
        weights.append(w.to(o.dtype).to(r.dtype))
    errors = [relative_error(o, r) for o, r in zip(outs, refs)]

    def loss(tensors: list[Tensor], ws: list[Tensor]) -> Tensor:
        return sum((t * w.to(t.device, t.dtype).conj()).real.sum() for t, w in zip(tensors, ws))

    low_leaves, high_leaves = [low[k] for k in names], [high[k] for k in names]
    grads = torch.autograd.grad(loss(outs, weights), low_leaves, allow_unused=True)
    grads_ref = torch.autograd.grad(loss(refs, weights), high_leaves, allow_unused=True)
    errors += [relative_error(a, b) for a, b in zip(grads, grads_ref)]
    return max(errors)


def _inputs(seed: int, **shapes: tuple[int, ...]) -> dict[str, Tensor]:
    """Standard-normal float64 tensors of the given shapes, from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(*shape, generator=g, dtype=torch.float64) for name, shape in shapes.items()}


# --------------------------------------------------------------------------------------------
# The op families
# --------------------------------------------------------------------------------------------


def _preferred(passed: list[str], order: Sequence[str]) -> str | None:
    return next((impl for impl in order if impl in passed), None)


def _scan_avoid(device: str, interpreted: bool) -> Callable[[list[str]], str]:
    """How to avoid a failing scan implementation: name the best one that passed on the device."""
    order = ("numba", "chunked", "ref") if device == "cpu" else ("cuda", "triton", "chunked", "ref")

    def avoid(passed: list[str]) -> str:
        if interpreted:
            return ("impl='auto' never runs Triton's interpreter; only impl='triton' with TRITON_INTERPRET=1 on CPU "
                    "tensors does, so nothing needs avoiding on the CPU, but check the Triton install before using a GPU")
        alt = _preferred(passed, order)
        if alt is None:
            return REPORT
        return (
            f"avoid it with impl='{alt}': selective_scan(..., impl='{alt}'), "
            f"longrange.ops.scan.set_default_impl('{alt}'), or for S6 layers model.primitive_options.scan_impl={alt}"
        )

    return avoid


def _scan_inputs(b: int, d: int, n: int, l: int, layout: str, seed: int) -> dict[str, Tensor]:
    bc = {"time-invariant": (d, n), "shared": (b, n, l), "grouped": (b, 2, n, l)}[layout]
    t = _inputs(seed, u=(b, d, l), delta=(b, d, l), A=(d, n), B=bc, C=bc, D=(d,), z=(b, d, l), delta_bias=(d,),
                initial_state=(b, d, n))
    t["A"] = -(t["A"].abs() + 0.2)
    t["delta"] = 0.5 * t["delta"]
    return t


#: The scan's cases: (b, d, n, l, B/C layout, with an initial state, with the z gate).
SCAN_SHAPES = [
    (2, 4, 3, 7, "shared", True, True),
    (1, 8, 4, 37, "grouped", False, False),
    (2, 4, 5, 1, "time-invariant", True, True),
    (1, 6, 16, 21, "shared", True, False),  # S6's state size; channels not a multiple of Triton's blocks
]


def scan_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """The selective scan: every implementation that runs here, and Triton in its interpreter on
    the CPU when triton imports."""
    from longrange.ops import scan
    from longrange.ops.scan import triton as triton_scan

    impls: list[tuple[str, str, dict[str, str | None]]] = [
        (impl, "", {"TRITON_INTERPRET": None} if impl == "triton" else {})
        for impl in scan.available_impls(device) if impl != "ref"
    ]
    if device == "cpu" and "triton" not in scan.available_impls(device) and triton_scan.unavailable_reason() is None:
        impls.append(("triton", "interpreter", {"TRITON_INTERPRET": "1"}))
    cases = []
    for impl, note, env in impls:
        for b, d, n, l, layout, with_state, with_z in SCAN_SHAPES:
            if with_state and impl == "cuda":
                continue  # mamba-ssm's kernel takes no initial state
            inputs = _scan_inputs(b, d, n, l, layout, seed=l)
            if not with_state:
                del inputs["initial_state"]
            if not with_z:
                del inputs["z"]

            def run(inputs=inputs, impl=impl) -> float:
                def fn(**kw):
                    y, last = scan.selective_scan(**kw, delta_softplus=True, return_last_state=True, impl=impl)
                    return (y,) if impl == "cuda" else (y, last)  # mamba-ssm takes no gradient of the last state

                def ref(**kw):
                    y, last = scan.selective_scan_ref(**kw, delta_softplus=True, return_last_state=True)
                    return (y,) if impl == "cuda" else (y, last)

                return compare(fn, ref, inputs, dtype, device)

            shape = f"b={b} d={d} n={n} l={l}, B and C {layout}" + (", initial state" if with_state else "")
            cases.append(Case("selective_scan", impl, device, dtype, shape, run, TOLERANCE[dtype],
                              _scan_avoid(device, bool(note)), note, env, record=("selective_scan", impl)))
    return cases


def _conv_avoid(passed: list[str]) -> str:
    if "torch" not in passed:
        return REPORT
    return (
        "avoid it with causal_conv1d(..., impl='torch'); the Mamba block runs impl='auto', which takes causal-conv1d's "
        "kernel whenever its compiled extension imports: uninstall causal-conv1d (pip uninstall causal-conv1d) there"
    )


#: The causal convolution's cases: (b, d, l, width, with bias and SiLU).
CONV_SHAPES = [(2, 3, 9, 4, True), (1, 5, 6, 3, False)]


def conv_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """The causal depthwise convolution (every implementation that runs here) and its step."""
    from longrange.ops import conv

    cases = []
    for b, d, l, w, full in CONV_SHAPES:
        inputs = _inputs(l, x=(b, d, l), weight=(d, w), bias=(d,))
        if not full:
            del inputs["bias"]
        activation = "silu" if full else None
        shape = f"b={b} d={d} l={l} width={w}" + (", bias, SiLU" if full else "")
        for impl in conv.available_impls(device):
            if impl == "ref":
                continue

            def run(inputs=inputs, impl=impl, activation=activation) -> float:
                return compare(lambda **kw: conv.causal_conv1d(**kw, activation=activation, impl=impl),
                               lambda **kw: conv.causal_conv1d_ref(**kw, activation=activation), inputs, dtype, device)

            cases.append(Case("causal_conv1d", impl, device, dtype, shape, run, TOLERANCE[dtype], _conv_avoid,
                              record=("causal_conv1d", impl)))

        def step(inputs=inputs, activation=activation, w=w) -> float:
            def fn(x, weight, bias=None):
                state = x.new_zeros(x.shape[0], x.shape[1], w - 1)
                ys = []
                for t in range(x.shape[-1]):
                    y, state = conv.causal_conv1d_update(x[..., t], state, weight, bias, activation)
                    ys.append(y)
                return torch.stack(ys, dim=-1)

            return compare(fn, lambda **kw: conv.causal_conv1d_ref(**kw, activation=activation), inputs, dtype, device)

        cases.append(Case("causal_conv1d_update (steps)", "torch", device, dtype, shape, step, TOLERANCE[dtype]))
    return cases


def fft_conv_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """Long convolutions by FFT, causal and two-sided, with a skip term."""
    from longrange.ops.fftconv import fft_conv, fft_conv_ref

    cases = []
    for two_sided, (b, h, l, lk) in ((False, (2, 3, 9, 5)), (True, (1, 4, 11, 11))):
        inputs = _inputs(l, u=(b, h, l), k=(2, h, lk) if two_sided else (h, lk), D=(h,))
        shape = f"b={b} h={h} l={l} kernel={lk}, {'two-sided' if two_sided else 'causal'}"
        cases.append(Case("fft_conv", "torch.fft", device, dtype, shape,
                          lambda inputs=inputs: compare(fft_conv, fft_conv_ref, inputs, dtype, device), TOLERANCE[dtype]))
    return cases


def attention_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """Full, blocked and sliding-window attention (through PyTorch's fused kernels) against the
    written-out softmax, with padding at the end of one sequence."""
    from longrange.ops.attention import admissible_ref, attention_ref, blocked_attention, masked_attention
    from longrange.ops.sliding_window import sliding_window_attention, sliding_window_attention_ref

    n, heads, l, hd = 2, 2, 11, 4
    inputs = _inputs(l, q=(n, heads, l, hd), k=(n, heads, l, hd), v=(n, heads, l, hd))
    inputs["key_mask"] = torch.arange(l)[None, :] < torch.tensor([[l], [l - 3]])

    def dense(causal: bool, block: int | None):
        return lambda q, k, v, key_mask: attention_ref(q, k, v, admissible_ref(l, key_mask, causal, block))

    cases = []
    for causal in (True, False):
        kind = "causal" if causal else "bidirectional"
        variants = [
            ("masked_attention", lambda causal=causal, **kw: masked_attention(**kw, causal=causal), dense(causal, None), ""),
            ("blocked_attention", lambda causal=causal, **kw: blocked_attention(**kw, causal=causal, block_size=4),
             dense(causal, 4), ", blocks of 4"),
            ("sliding_window_attention", lambda causal=causal, **kw: sliding_window_attention(**kw, causal=causal, window=3),
             lambda causal=causal, **kw: sliding_window_attention_ref(**kw, causal=causal, window=3), ", windows of 3"),
        ]
        for op, fn, ref, extra in variants:
            shape = f"n={n} heads={heads} l={l} head_dim={hd}, {kind}, padded{extra}"
            cases.append(Case(op, "sdpa", device, dtype, shape,
                              lambda fn=fn, ref=ref: compare(fn, ref, inputs, dtype, device), TOLERANCE[dtype]))
    return cases


def ssm_kernel_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """The kernels of S4 and S4D through their public functions: the Cauchy kernel, the
    Vandermonde product and the diagonal and DPLR SSM kernels. Complex, so float32 only."""
    if dtype != torch.float32:
        return []
    from longrange.ops import ssm_kernels as K

    cauchy_impl = K.cauchy_impl(device) if hasattr(K, "cauchy_impl") else "auto"

    def keops_avoid(passed: list[str]) -> str:
        if cauchy_impl != "pykeops":
            return REPORT
        return "S4 runs pykeops' Cauchy kernel on CUDA whenever pykeops imports: uninstall it (pip uninstall pykeops) to run the PyTorch one"

    def cplx(seed: int, *shape: int) -> Tensor:
        t = _inputs(seed, re=shape, im=shape)
        return torch.complex(t["re"], t["im"])

    H, N, L = 3, 4, 9
    Lambda = torch.complex(-0.5 - torch.rand(H, N, generator=torch.Generator().manual_seed(3), dtype=torch.float64),
                           torch.arange(N, dtype=torch.float64).expand(H, N) * math.pi)
    dt = torch.full((H,), 0.1, dtype=torch.float64) * torch.arange(1, H + 1)
    z = torch.complex(torch.zeros(7, dtype=torch.float64), torch.linspace(-3, 3, 7, dtype=torch.float64))
    cases = [
        Case("cauchy", cauchy_impl, device, dtype, f"N={N}, K=7, 3 rows",
             lambda: compare(K.cauchy, K.cauchy_ref, {"v": cplx(1, 3, N), "z": z.expand(3, 7), "w": Lambda}, dtype, device),
             TOLERANCE[dtype], keops_avoid),
        Case("vandermonde_kernel", "torch", device, dtype, f"H={H} M={N} L={L}",
             lambda: compare(lambda **kw: K.vandermonde_kernel(**kw, L=L), lambda **kw: K.vandermonde_kernel_ref(**kw, L=L),
                             {"log_dA": Lambda * 0.1, "W": cplx(2, H, N)}, dtype, device),
             TOLERANCE[dtype]),
    ]
    for method in ("zoh", "bilinear"):
        inputs = {"dt": dt, "A": Lambda, "B": cplx(4, H, N), "C": cplx(5, 2, H, N)}
        cases.append(Case("diag_ssm_kernel", "torch", device, dtype, f"H={H} M={N} L={L}, {method}",
                          lambda inputs=inputs, method=method: compare(
                              lambda **kw: K.diag_ssm_kernel(**kw, L=L, method=method),
                              lambda **kw: K.diag_ssm_kernel_ref(**kw, L=L, method=method), inputs, dtype, device),
                          TOLERANCE[dtype]))
    for conj_pairs in (True, False):
        inputs = {"dt": dt, "Lambda": Lambda, "P": 0.3 * cplx(6, 2, H, N), "Q": 0.3 * cplx(7, 2, H, N), "B": cplx(8, H, N),
                  "C": cplx(9, 2, H, N)}
        cases.append(Case("dplr_ssm_kernel", cauchy_impl, device, dtype,
                          f"H={H} N={N} rank 2 L={L}" + (", conjugate pairs" if conj_pairs else ""),
                          lambda inputs=inputs, conj_pairs=conj_pairs: compare(
                              lambda **kw: K.dplr_ssm_kernel(**kw, L=L, conj_pairs=conj_pairs),
                              lambda **kw: K.dplr_ssm_kernel_ref(**kw, L=L, conj_pairs=conj_pairs), inputs, dtype, device),
                          10 * TOLERANCE[dtype], keops_avoid))  # dense solves and matrix powers inside
    return cases


# --------------------------------------------------------------------------------------------
# The primitive layers: recurrent (step) mode against the parallel forward
# --------------------------------------------------------------------------------------------


def _step_through(layer: torch.nn.Module, x: Tensor) -> Tensor:
    """The layer's outputs for x (batch, length, d) by its step mode from the default state."""
    state = layer.default_state(x.shape[0], device=x.device, dtype=x.dtype)
    ys = []
    for t in range(x.shape[1]):
        y, state = layer.step(x[:, t], state)
        ys.append(y)
    return torch.stack(ys, dim=1)


def _conv_ssm_directions(bi: torch.nn.Module, make: Callable[[], torch.nn.Module], c_name: str):
    """The two causal directions of a bidirectional convolutional SSM (S4, S4D, DLR): the same
    parameters with the forward or the backward output vector, and no skip term backward. The
    backward direction run on the reversed sequence, one step later, is the layer's backward part."""
    state = bi.state_dict()
    shared = {k: v for k, v in state.items() if k != c_name}
    fwd, bwd = make(), make()
    fwd.load_state_dict({**shared, c_name: state[c_name][:1]})
    bwd.load_state_dict({**shared, c_name: state[c_name][1:], **({"D": torch.zeros_like(state["D"])} if "D" in state else {})})
    return fwd, bwd, True


def _primitives(quick: bool) -> list[tuple[str, Callable[[bool], torch.nn.Module], Callable | None]]:
    """(name, build(bidirectional), split(bidirectional layer) -> (forward, backward, shifted) or
    None where there is no bidirectional step check)."""
    from longrange.layers.attention import Attention
    from longrange.layers.dlr import DLR
    from longrange.layers.s4 import S4
    from longrange.layers.s4d import S4D
    from longrange.layers.s6 import S6

    def s4(bi: bool) -> torch.nn.Module:
        return S4(3, d_state=6, rank=2, tie_pq=False, l_max=8, dt_min=0.01, dt_max=0.5, bidirectional=bi)

    def s4d(bi: bool) -> torch.nn.Module:
        return S4D(3, d_state=6, bidirectional=bi)

    def dlr(bi: bool) -> torch.nn.Module:
        return DLR(3, d_state=6, bidirectional=bi)

    def s6(bi: bool) -> torch.nn.Module:
        return S6(4, d_state=3, bidirectional=bi)

    layers = [
        ("S4", s4, lambda bi: _conv_ssm_directions(bi, lambda: s4(False), "C_tilde")),
        ("S4D", s4d, lambda bi: _conv_ssm_directions(bi, lambda: s4d(False), "C")),
        ("DLR", dlr, lambda bi: _conv_ssm_directions(bi, lambda: dlr(False), "C")),
        ("S6", s6, lambda bi: (bi.directions.fwd, bi.directions.bwd, False)),
        ("attention", lambda bi: Attention(8, n_heads=2, bidirectional=bi), None),
    ]
    if not quick:
        layers += [
            ("attention (blocks of 3)", lambda bi: Attention(8, n_heads=2, block_size=3, bidirectional=bi), None),
            ("attention (windows of 3)", lambda bi: Attention(8, n_heads=2, window=3, bidirectional=bi), None),
        ]
    return layers


def layer_cases(device: str, dtype: torch.dtype, quick: bool = False) -> list[Case]:
    """Every primitive layer: its step mode in ``dtype`` on ``device`` against its forward in
    float64 (the scan's reference loop for S6), causal, and for bidirectional layers their two
    directions stepped against the bidirectional forward. float32 only."""
    if dtype != torch.float32:
        return []
    from longrange.ops import scan

    cases = []
    L = 7 if quick else 11
    for name, build, split in _primitives(quick):
        for bidirectional in (False, True):
            if bidirectional and split is None:
                continue

            def run(build=build, split=split, bidirectional=bidirectional) -> float:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(0)
                    layer = build(bidirectional).double().eval()
                    d = layer.d_model
                x = _inputs(1, x=(2, L, d))

                def ref(x):
                    with scan.default_impl("ref"):
                        return layer(x)

                if not bidirectional:
                    stepped = copy.deepcopy(layer).to(device=device, dtype=dtype)
                    return compare(lambda x: _step_through(stepped, x), ref, x, dtype, device)
                fwd, bwd, shifted = (copy.deepcopy(m).to(device=device, dtype=dtype) if isinstance(m, torch.nn.Module) else m
                                     for m in split(layer))

                def both(x):
                    back = _step_through(bwd, x.flip(1)).flip(1)
                    if shifted:  # the backward kernel sees the inputs strictly after t
                        back = torch.cat([back[:, 1:], torch.zeros_like(back[:, :1])], dim=1)
                    return _step_through(fwd, x) + back

                return compare(both, ref, x, dtype, device)

            direction = "both directions" if bidirectional else "causal"
            cases.append(Case(f"{name} step == forward", direction, device, dtype, f"batch 2, length {L}", run,
                              TOLERANCE[dtype], lambda passed: "no setting avoids it: the layer's step mode disagrees with its forward; "
                              "please report it with the output of `longrange info`"))
    return cases


#: The families of checks, each ``(device, dtype) -> cases`` (``quick`` is passed to those that
#: take it). Another op family adds its function here.
FAMILIES: list[Callable[..., list[Case]]] = [
    scan_cases, conv_cases, fft_conv_cases, attention_cases, ssm_kernel_cases, layer_cases,
]


def cases(devices: Sequence[str], dtypes: Sequence[torch.dtype], quick: bool = False) -> list[Case]:
    """Every case of every family for the devices and dtypes; with ``quick``, the first case of
    each (op, implementation, device, dtype) only."""
    out: list[Case] = []
    for device in devices:
        for dtype in dtypes:
            for family in FAMILIES:
                out += family(device, dtype, quick=quick) if "quick" in family.__code__.co_varnames else family(device, dtype)
    if quick:
        seen, first = set(), []
        for case in out:
            key = (case.op, case.label, case.device, case.dtype)
            if key not in seen:
                seen.add(key)
                first.append(case)
        out = first
    return out


# --------------------------------------------------------------------------------------------
# Running the cases
# --------------------------------------------------------------------------------------------


@contextmanager
def no_tf32() -> Iterator[None]:
    """float32 matrix products and convolutions in full float32 on CUDA (no TF32) inside the block."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@contextmanager
def environment(values: dict[str, str | None]) -> Iterator[None]:
    """Set (or, for None, unset) environment variables inside the block; restored afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _new_calls(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, set[str]]:
    """The implementations each op ran between two readings of :func:`longrange.ops.used.calls`."""
    return {op: {impl for impl, n in impls.items() if n > before.get(op, {}).get(impl, 0)} for op, impls in after.items()}


def run_case(case: Case) -> tuple[float, str | None]:
    """(error, None) or (inf, why it failed to run); checks what the dispatcher reported."""
    from longrange.ops import used

    before = used.calls()
    with environment(case.env):
        try:
            error = case.run()
        except Exception as err:  # a kernel that fails to compile, load or run is a failure of the check
            return math.inf, f"raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")
    if case.record is not None:
        op, impl = case.record
        ran = _new_calls(before, used.calls()).get(op, set())
        if ran != {impl}:
            return error, f"asked for impl={impl!r}, the dispatcher reports {sorted(ran) or 'nothing'}"
    return error, None


def run_cases(all_cases: Sequence[Case], progress: Callable[[Case], None] | None = None) -> list[Row]:
    """Run every case; one :class:`Row` per (op, implementation, device, dtype), in order."""
    rows: dict[tuple, Row] = {}
    for case in all_cases:
        if progress is not None:
            progress(case)
        key = (case.op, case.label, case.device, case.dtype)
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row(case.op, case.impl, case.label, case.device, case.dtype, case.tol, avoid=case.avoid)
        error, problem = run_case(case)
        row.error = max(row.error, error) if not math.isnan(error) else math.inf
        row.tol = max(row.tol, case.tol)
        if problem is not None:
            row.failures.append(f"{case.shape}: {problem}")
        elif not error <= case.tol:
            row.failures.append(f"{case.shape}: error {error:.2e} > tolerance {case.tol:.0e}")
    return list(rows.values())


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def format_table(rows: Sequence[Row]) -> str:
    """The table: op, implementation, device, dtype, max relative error, tolerance, result."""
    header = ["op", "implementation", "device", "dtype", "max rel. error", "tolerance", "result"]
    body = [[r.op, r.label, r.device, _dtype_name(r.dtype), "-" if math.isinf(r.error) else f"{r.error:.1e}",
             f"{r.tol:.0e}", "pass" if r.passed else "FAIL"] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(b) for b in body)])


def format_failures(rows: Sequence[Row]) -> list[str]:
    """For each failing row: what failed, and the setting that avoids it."""
    lines = []
    for r in rows:
        if r.passed:
            continue
        passed = [o.impl for o in rows if o.passed and (o.op, o.device, o.dtype) == (r.op, r.device, r.dtype)]
        where = f"{r.op} {r.label} on {r.device} in {_dtype_name(r.dtype)}"
        lines.append(f"FAIL {where}:")
        lines += [f"  {failure}" for failure in r.failures]
        lines.append(f"  -> {r.avoid([p for p in passed if p != r.impl])}")
    return lines


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


def _devices(choice: str) -> list[str]:
    if choice == "cpu":
        return ["cpu"]
    if choice == "cuda" and not torch.cuda.is_available():
        build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ValueError(f"--device cuda: CUDA is not available here (torch {torch.__version__}, {build}); use --device cpu")
    if choice == "cuda":
        return ["cuda"]
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def check(devices: Sequence[str], dtypes: Sequence[torch.dtype], quick: bool = False, out=None) -> int:
    """Run the checks, print the table (and the failures) to ``out``; 0 if all passed, else 1."""
    out = out or sys.stdout
    start = time.perf_counter()
    with no_tf32():
        rows = run_cases(cases(devices, dtypes, quick))
    print(format_table(rows), file=out)
    failures = format_failures(rows)
    seconds = time.perf_counter() - start
    n_failed = sum(not r.passed for r in rows)
    print(file=out)
    if failures:
        print("\n".join(failures), file=out)
        print(f"\n{n_failed} of {len(rows)} checks FAILED ({seconds:.0f} s)", file=out)
        return 1
    print(f"all {len(rows)} checks passed ({seconds:.0f} s)", file=out)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "check",
        help="check every implementation available here against its float64 reference, and step == forward",
        description="Compare the outputs and gradients of every implementation that can run on this machine "
        "(numba, chunked and Triton scans, mamba-ssm and causal-conv1d kernels, pykeops, ...) with their float64 "
        "references at a few small shapes, and every primitive layer's step mode with its forward. Prints a table; "
        "exits with 1 if anything fails, saying which setting avoids the failing implementation.",
    )
    p.add_argument("--device", choices=("cpu", "cuda", "all"), default="all",
                   help="the devices to check (default all: the CPU and CUDA when available)")
    p.add_argument("--dtype", choices=(*DTYPES, "all"), default="all", help="the dtypes to check (default all)")
    p.add_argument("--quick", action="store_true", help="one shape per op and implementation instead of several")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        devices = _devices(args.device)
    except ValueError as err:
        print(f"longrange check: error: {err}", file=sys.stderr)
        return 2
    dtypes = list(DTYPES.values()) if args.dtype == "all" else [DTYPES[args.dtype]]
    return check(devices, dtypes, quick=args.quick)
