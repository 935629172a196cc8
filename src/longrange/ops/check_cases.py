"""The ops' cases for ``longrange check`` (:mod:`longrange.check`): one function per op family,
``(device, dtype) -> [Case]``, listed in :data:`OP_FAMILIES`.

A family with several implementations asks the op's dispatcher, from the registry of
:mod:`longrange.ops.dispatch`, for those that can run here (:func:`implementations`), so a new
implementation is checked as soon as its op lists it; each case records ``(op, impl)``, which the
dispatcher must report having run. The shapes are small, with odd lengths and an initial state
where the op takes one. An implementation that also runs on the CPU in an interpreter
(:attr:`~longrange.ops.dispatch.Impl.interpreter_env`: the Triton kernels, ``TRITON_INTERPRET=1``)
is checked there too, its environment set only while its cases run; the S4 kernels (complex) in
float32 only.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from longrange.ops import conv, scan
from longrange.ops import ssm_kernels as K
from longrange.ops.attention import admissible_ref, attention_ref, blocked_attention, masked_attention
from longrange.ops.checking import REPORT, TF32_TOLERANCE, TOLERANCE, Case, compare, preferred, random_inputs
from longrange.ops.dispatch import dispatcher
from longrange.ops.fftconv import fft_conv, fft_conv_ref
from longrange.ops.sliding_window import sliding_window_attention, sliding_window_attention_ref


def implementations(op: str, device: str) -> list[tuple[str, str, dict[str, str | None]]]:
    """``(impl, note, env)`` for every implementation of ``op`` (a registered dispatcher) to check
    on ``device``: those that run there (:meth:`~longrange.ops.dispatch.Dispatcher.available_impls`)
    except the reference, with the variables of an interpreter unset; on the CPU, also those that
    run there only in their interpreter (note ``"interpreter"``, its variables set)."""
    d = dispatcher(op)
    available = d.available_impls(device)
    out = []
    for impl in available:
        if impl != d.reference:
            out.append((impl, "", dict.fromkeys(d.specs[impl].interpreter_env or {})))
    for impl in d.impls:
        interpreter = dict(d.specs[impl].interpreter_env or {})
        if device != "cpu" or not interpreter or impl in available or impl == d.reference:
            continue
        saved = {k: os.environ.get(k) for k in interpreter}
        os.environ.update(interpreter)
        try:
            runs = d.specs[impl].runs(torch.device(device))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        if runs:
            out.append((impl, "interpreter", interpreter))
    return out


#: How to avoid an implementation that fails only in its interpreter.
_INTERPRETER = (
    "impl='auto' never runs Triton's interpreter; only impl='triton' with TRITON_INTERPRET=1 on CPU "
    "tensors does, so nothing needs avoiding on the CPU, but check the Triton install before using a GPU"
)


def _preferred_alternative(op: str, device: str, passed: list[str]) -> str | None:
    """The implementation ``"auto"`` would prefer among those that run on ``device`` and passed."""
    return preferred(passed, dispatcher(op).available_impls(device))


def _use_instead(
    op: str, device: str, module: str, layer_setting: str, interpreted: bool = False
) -> Callable[[list[str]], str]:
    """How to avoid a failing implementation of ``op`` (a function of ``longrange.ops.<module>``):
    the best one that passed, for one call, as the process's default, or as the layers' setting
    (``layer_setting``, e.g. ``"LRU layers model.primitive_options.impl"``). One that failed only
    in its interpreter (``interpreted``) needs no avoiding on the CPU."""

    def avoid(passed: list[str]) -> str:
        if interpreted:
            return _INTERPRETER
        alt = _preferred_alternative(op, device, passed)
        if alt is None:
            return REPORT
        return (
            f"avoid it with impl='{alt}': {op}(..., impl='{alt}'), "
            f"longrange.ops.{module}.set_default_impl('{alt}'), or for {layer_setting}={alt}"
        )

    return avoid


def _scan_inputs(b: int, d: int, n: int, l: int, layout: str, seed: int) -> dict[str, Tensor]:
    bc = {"time-invariant": (d, n), "shared": (b, n, l), "grouped": (b, 2, n, l)}[layout]
    t = random_inputs(
        seed,
        u=(b, d, l),
        delta=(b, d, l),
        A=(d, n),
        B=bc,
        C=bc,
        D=(d,),
        z=(b, d, l),
        delta_bias=(d,),
        initial_state=(b, d, n),
    )
    t["A"] = -(t["A"].abs() + 0.2)
    t["delta"] = 0.5 * t["delta"]
    return t


#: The scan's cases: (b, d, n, l, B/C layout, with an initial state, with the z gate).
SCAN_SHAPES = [
    (2, 4, 3, 7, "shared", True, True),
    (1, 8, 4, 37, "grouped", False, False),
    (2, 4, 5, 1, "time-invariant", True, True),
    (1, 6, 16, 21, "shared", True, False),  # S6's state size; channels not a multiple of Triton's blocks
    (1, 16, 16, 70, "shared", True, True),  # blocks of 16+ channels: numba's channels-last kernels, 2 chunks
]


def scan_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """The selective scan: every implementation that runs here, and Triton in its interpreter on
    the CPU when triton imports."""
    cases = []
    for impl, note, env in implementations("selective_scan", device):
        for b, d, n, l, layout, with_state, with_z in SCAN_SHAPES:
            if with_state and impl == "cuda":
                continue  # mamba-ssm's kernel takes no initial state
            inputs = _scan_inputs(b, d, n, l, layout, seed=l)
            if not with_state:
                del inputs["initial_state"]
            if not with_z:
                del inputs["z"]

            # As in an S6 layer under autocast: the parameters (and a time-invariant B, C) stay float32.
            weights = ("A", "D", "delta_bias", "initial_state") + (("B", "C") if layout == "time-invariant" else ())

            def run(inputs=inputs, impl=impl, weights=weights) -> float:
                def fn(**kw):
                    y, last = scan.selective_scan(**kw, delta_softplus=True, return_last_state=True, impl=impl)
                    return (y,) if impl == "cuda" else (y, last)  # mamba-ssm takes no gradient of the last state

                def ref(**kw):
                    y, last = scan.selective_scan_ref(**kw, delta_softplus=True, return_last_state=True)
                    return (y,) if impl == "cuda" else (y, last)

                return compare(fn, ref, inputs, dtype, device, keep_float32=weights)

            shape = f"b={b} d={d} n={n} l={l}, B and C {layout}" + (", initial state" if with_state else "")
            cases.append(
                Case(
                    "selective_scan",
                    impl,
                    device,
                    dtype,
                    shape,
                    run,
                    TOLERANCE[dtype],
                    _use_instead(
                        "selective_scan", device, "scan", "S6 layers model.primitive_options.scan_impl", bool(note)
                    ),
                    note,
                    env,
                    record=("selective_scan", impl),
                )
            )
    return cases


def signed_scan_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """The selective scan with decays ``2 exp(delta A) - 1`` (S6's ``allow_neg_eigval``,
    :mod:`longrange.ops.scan.signed`) against the reference loop with ``negative_eigenvalues``;
    its one implementation runs on every device."""
    from longrange.ops.scan.signed import selective_scan_signed

    cases = []
    for b, d, n, l, layout, with_state, with_z in SCAN_SHAPES:
        inputs = _scan_inputs(b, d, n, l, layout, seed=l)
        inputs["A"] = 3 * inputs["A"]  # decays of both signs
        if not with_state:
            del inputs["initial_state"]
        if not with_z:
            del inputs["z"]
        weights = ("A", "D", "delta_bias", "initial_state") + (("B", "C") if layout == "time-invariant" else ())

        def run(inputs=inputs, weights=weights) -> float:
            def fn(**kw):
                return selective_scan_signed(**kw, delta_softplus=True, return_last_state=True)

            def ref(**kw):
                return scan.selective_scan_ref(
                    **kw, delta_softplus=True, return_last_state=True, negative_eigenvalues=True
                )

            return compare(fn, ref, inputs, dtype, device, keep_float32=weights)

        shape = f"b={b} d={d} n={n} l={l}, B and C {layout}" + (", initial state" if with_state else "")
        cases.append(
            Case(
                "selective_scan_signed",
                "loop",
                device,
                dtype,
                shape,
                run,
                TOLERANCE[dtype],
                lambda passed: (
                    "no other implementation computes decays of both signs; "
                    "set the S6 layer's model.primitive_options.allow_neg_eigval=false (decays in [0, 1]) to avoid it"
                ),
            )
        )
    return cases


def _conv_avoid(impl: str) -> Callable[[list[str]], str]:
    """How to avoid a failing implementation of the causal convolution."""

    def avoid(passed: list[str]) -> str:
        if "torch" not in passed:
            return REPORT
        return (
            "avoid it with causal_conv1d(..., impl='torch'), or for the Mamba blocks (which run the default) "
            "longrange.ops.conv.set_default_impl('torch')"
        )

    return avoid


#: The causal convolution's cases: (b, d, l, width, with bias and SiLU).
CONV_SHAPES = [(2, 3, 9, 4, True), (1, 5, 6, 3, False)]


def conv_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """The causal depthwise convolution (every implementation that runs here) and its step."""
    cases = []
    for b, d, l, w, full in CONV_SHAPES:
        inputs = random_inputs(l, x=(b, d, l), weight=(d, w), bias=(d,))
        if not full:
            del inputs["bias"]
        activation = "silu" if full else None
        shape = f"b={b} d={d} l={l} width={w}" + (", bias, SiLU" if full else "")
        for impl, note, env in implementations("causal_conv1d", device):

            def run(inputs=inputs, impl=impl, activation=activation) -> float:
                return compare(
                    lambda **kw: conv.causal_conv1d(**kw, activation=activation, impl=impl),
                    lambda **kw: conv.causal_conv1d_ref(**kw, activation=activation),
                    inputs,
                    dtype,
                    device,
                )

            cases.append(
                Case(
                    "causal_conv1d",
                    impl,
                    device,
                    dtype,
                    shape,
                    run,
                    TOLERANCE[dtype],
                    _conv_avoid(impl),
                    note,
                    env,
                    record=("causal_conv1d", impl),
                )
            )

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


#: The RMS norm's cases: (x's shape, weight per head, gate, gate first).
NORM_SHAPES = [
    ((2, 5, 7), False, None, False),
    ((2, 3, 2, 6), True, "gate", False),
    ((3, 4, 1, 8), False, "gate", True),
]


def norm_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """The (gated) RMS norm: every implementation that runs here but the formula, against it."""
    from longrange.ops import norm

    cases = []
    for shape, per_head, gate, gate_first in NORM_SHAPES:
        weight = shape[-2:] if per_head else shape[-1:]
        inputs = random_inputs(len(shape), x=shape, weight=weight, **({"gate": shape} if gate else {}))
        what = f"x {tuple(shape)}, weight {tuple(weight)}" + (
            f", gate {'first' if gate_first else 'after'}" if gate else ""
        )
        for impl, note, env in implementations("rms_norm", device):

            def run(inputs=inputs, impl=impl, gate_first=gate_first) -> float:
                return compare(
                    lambda **kw: norm.rms_norm(**kw, gate_first=gate_first, impl=impl),
                    lambda **kw: norm.rms_norm_ref(**kw, gate_first=gate_first),
                    inputs,
                    dtype,
                    device,
                )

            cases.append(
                Case(
                    "rms_norm",
                    impl,
                    device,
                    dtype,
                    what,
                    run,
                    TOLERANCE[dtype],
                    lambda passed: "avoid it for every layer with longrange.ops.norm.set_default_impl('torch')",
                    note,
                    env,
                    record=("rms_norm", impl),
                )
            )
    return cases


def glu_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """SwiGLU: every implementation that runs here but the formula, against it."""
    from longrange.ops import glu

    cases = []
    for shape in ((2, 5, 14), (3, 1, 2)):
        inputs = random_inputs(len(shape), h=shape)
        for impl, note, env in implementations("swiglu", device):

            def run(inputs=inputs, impl=impl) -> float:
                return compare(lambda **kw: glu.swiglu(**kw, impl=impl), glu.swiglu_ref, inputs, dtype, device)

            cases.append(
                Case(
                    "swiglu",
                    impl,
                    device,
                    dtype,
                    f"h {tuple(shape)}",
                    run,
                    TOLERANCE[dtype],
                    lambda passed: "avoid it for every layer with longrange.ops.glu.set_default_impl('torch')",
                    note,
                    env,
                    record=("swiglu", impl),
                )
            )
    return cases


def fft_conv_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """Long convolutions, causal and two-sided, with a skip term: every implementation that runs
    here against the explicit matrix."""
    cases = []
    for two_sided, (b, h, l, lk) in ((False, (2, 3, 9, 5)), (True, (1, 4, 11, 11))):
        inputs = random_inputs(l, u=(b, h, l), k=(2, h, lk) if two_sided else (h, lk), D=(h,))
        shape = f"b={b} h={h} l={l} kernel={lk}, {'two-sided' if two_sided else 'causal'}"
        for impl, note, env in implementations("fft_conv", device):
            cases.append(
                Case(
                    "fft_conv",
                    impl,
                    device,
                    dtype,
                    shape,
                    lambda inputs=inputs, impl=impl: compare(
                        lambda *a, **kw: fft_conv(*a, **kw, impl=impl), fft_conv_ref, inputs, dtype, device
                    ),
                    TOLERANCE[dtype],
                    _use_instead("fft_conv", device, "fftconv", "Hyena layers model.primitive_options.conv_impl"),
                    note,
                    env,
                    record=("fft_conv", impl),
                )
            )
    return cases


def attention_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """Attention without a mask by every implementation that runs here (op ``attention``), causal
    padded attention through it, and full, blocked and sliding-window attention with any mask
    (through PyTorch's fused kernels), against the written-out softmax, with padding at the end of
    one sequence."""
    from longrange.ops import attention as attn

    n, heads, l, hd = 2, 2, 11, 4
    inputs = random_inputs(l, q=(n, heads, l, hd), k=(n, heads, l, hd), v=(n, heads, l, hd))
    inputs["key_mask"] = torch.arange(l)[None, :] < torch.tensor([[l], [l - 3]])
    unmasked = {name: t for name, t in inputs.items() if name != "key_mask"}

    def dense(causal: bool, block: int | None):
        return lambda q, k, v, key_mask: attention_ref(q, k, v, admissible_ref(l, key_mask, causal, block))

    cases = []
    for impl, note, env in implementations("attention", device):

        def case(what: str, run: Callable[[], float], impl=impl, note=note, env=env) -> Case:
            return Case(
                "attention",
                impl,
                device,
                dtype,
                f"n={n} heads={heads} l={l} head_dim={hd}, {what}",
                run,
                TOLERANCE[dtype],
                lambda passed: "avoid it with longrange.ops.attention.set_default_impl('sdpa')",
                note,
                env,
                record=("attention", impl),
            )

        for causal in (True, False):

            def run(causal=causal, impl=impl) -> float:
                return compare(
                    lambda **kw: attn.attention(**kw, causal=causal, impl=impl),
                    lambda **kw: dense(causal, None)(**kw, key_mask=None),
                    unmasked,
                    dtype,
                    device,
                )

            cases.append(case(f"{'causal' if causal else 'bidirectional'}, no mask", run))

        def padded(impl=impl) -> float:  # causal with padding at the end: attention without a mask, rows zeroed
            with attn.default_impl(impl):
                return compare(
                    lambda **kw: masked_attention(**kw, causal=True), dense(True, None), inputs, dtype, device
                )

        cases.append(case("causal, padded (masked_attention)", padded))
    for causal in (True, False):
        kind = "causal" if causal else "bidirectional"
        variants = [
            (
                "masked_attention",
                lambda causal=causal, **kw: masked_attention(**kw, causal=causal),
                dense(causal, None),
                "",
            ),
            (
                "blocked_attention",
                lambda causal=causal, **kw: blocked_attention(**kw, causal=causal, block_size=4),
                dense(causal, 4),
                ", blocks of 4",
            ),
            (
                "sliding_window_attention",
                lambda causal=causal, **kw: sliding_window_attention(**kw, causal=causal, window=3),
                lambda causal=causal, **kw: sliding_window_attention_ref(**kw, causal=causal, window=3),
                ", windows of 3",
            ),
        ]
        for op, fn, ref, extra in variants:
            shape = f"n={n} heads={heads} l={l} head_dim={hd}, {kind}, padded{extra}"

            def run_sdpa(fn=fn, ref=ref) -> float:
                with attn.default_impl("sdpa"):
                    return compare(fn, ref, inputs, dtype, device)

            cases.append(Case(op, "sdpa", device, dtype, shape, run_sdpa, TOLERANCE[dtype]))
    return cases


def _ssm_kernel_avoid(op: str, device: str, interpreted: bool) -> Callable[[list[str]], str]:
    """How to avoid a failing implementation of an SSM-kernel product: the best one that passed."""
    function = dispatcher(op).function

    def avoid(passed: list[str]) -> str:
        if interpreted:
            return _INTERPRETER
        alt = _preferred_alternative(op, device, passed)
        if alt is None:
            return REPORT
        return (
            f"avoid it with impl='{alt}': {function}(..., impl='{alt}'), or for the S4, S4D and DLR layers "
            f"longrange.ops.ssm_kernels.set_default_impl('{op}', '{alt}')"
        )

    return avoid


def ssm_kernel_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """The kernels of S4, S4D and DLR: every implementation of the Vandermonde and Cauchy products
    that runs here (Triton also in its interpreter on the CPU), and the diagonal and DPLR SSM kernels
    through ``impl="auto"``. Complex, so float32 only."""
    if dtype != torch.float32:
        return []

    def cplx(seed: int, *shape: int) -> Tensor:
        t = random_inputs(seed, re=shape, im=shape)
        return torch.complex(t["re"], t["im"])

    H, N, L = 3, 5, 9  # N odd: not a multiple of any vector width
    Lambda = torch.complex(
        -0.5 - torch.rand(H, N, generator=torch.Generator().manual_seed(3), dtype=torch.float64),
        torch.arange(N, dtype=torch.float64).expand(H, N) * math.pi,
    )
    dt = torch.full((H,), 0.1, dtype=torch.float64) * torch.arange(1, H + 1)
    z = torch.complex(torch.zeros(7, dtype=torch.float64), torch.linspace(-3, 3, 7, dtype=torch.float64))
    products = {
        "vandermonde": (
            f"H={H} M={N} L={L}",
            {"log_dA": Lambda * 0.1, "W": cplx(2, H, N)},
            lambda impl: lambda **kw: K.vandermonde_kernel(**kw, L=L, impl=impl),
            lambda **kw: K.vandermonde_kernel_ref(**kw, L=L),
        ),
        "cauchy": (
            f"N={N}, K=7, 3 rows",
            {"v": cplx(1, 3, N), "z": z.expand(3, 7), "w": Lambda},
            lambda impl: lambda **kw: K.cauchy(**kw, impl=impl),
            K.cauchy_ref,
        ),
    }
    cases = []
    for op, (shape, inputs, fn, ref) in products.items():
        for impl, note, env in implementations(op, device):
            name = dispatcher(op).function  # the public function's name
            cases.append(
                Case(
                    name,
                    impl,
                    device,
                    dtype,
                    shape,
                    lambda inputs=inputs, f=fn(impl), ref=ref: compare(f, ref, inputs, dtype, device),
                    TOLERANCE[dtype],
                    _ssm_kernel_avoid(op, device, bool(note)),
                    note,
                    env,
                    record=(op, impl),
                )
            )
    for method in ("zoh", "bilinear"):
        inputs = {"dt": dt, "A": Lambda, "B": cplx(4, H, N), "C": cplx(5, 2, H, N)}
        cases.append(
            Case(
                "diag_ssm_kernel",
                dispatcher("vandermonde").auto_impl(device),
                device,
                dtype,
                f"H={H} M={N} L={L}, {method}",
                lambda inputs=inputs, method=method: compare(
                    lambda **kw: K.diag_ssm_kernel(**kw, L=L, method=method),
                    lambda **kw: K.diag_ssm_kernel_ref(**kw, L=L, method=method),
                    inputs,
                    dtype,
                    device,
                ),
                TOLERANCE[dtype],
                _ssm_kernel_avoid("vandermonde", device, False),
            )
        )
    for conj_pairs in (True, False):
        inputs = {
            "dt": dt,
            "Lambda": Lambda,
            "P": 0.3 * cplx(6, 2, H, N),
            "Q": 0.3 * cplx(7, 2, H, N),
            "B": cplx(8, H, N),
            "C": cplx(9, 2, H, N),
        }
        cases.append(
            Case(
                "dplr_ssm_kernel",
                dispatcher("cauchy").auto_impl(device),
                device,
                dtype,
                f"H={H} N={N} rank 2 L={L}" + (", conjugate pairs" if conj_pairs else ""),
                lambda inputs=inputs, conj_pairs=conj_pairs: compare(
                    lambda **kw: K.dplr_ssm_kernel(**kw, L=L, conj_pairs=conj_pairs),
                    lambda **kw: K.dplr_ssm_kernel_ref(**kw, L=L, conj_pairs=conj_pairs),
                    inputs,
                    dtype,
                    device,
                ),
                10 * TOLERANCE[dtype],
                _ssm_kernel_avoid("cauchy", device, False),
            )
        )  # dense solves inside
    return cases


def _matrix_state_avoid(op: str, device: str) -> Callable[[list[str]], str]:
    """How to avoid a failing implementation of a matrix-state op: the best one that passed."""

    def avoid(passed: list[str]) -> str:
        alt = _preferred_alternative(op, device, passed)
        if alt is None:
            return REPORT
        return f"avoid it with impl='{alt}': {op}(..., impl='{alt}'), or for a layer model.primitive_options.impl={alt}"

    return avoid


def _matrix_state_inputs(
    op: str, dk: int = 4, dv: int = 3
) -> tuple[str, dict[str, Tensor], Callable[..., Any], Callable[..., Any]]:
    """(shape text, float64 inputs, fn(impl, **inputs), ref(**inputs)) of one op, each returning the
    output and the final state's tensors: odd length (not a multiple of the chunk of 4 the cases use),
    an initial state, one sequence padded at its end. ``fn`` runs the entry point (which applies the
    mask itself), ``ref`` the loop over time directly (which takes the mask)."""
    from longrange.ops.matrix_state import dispatch as ms
    from longrange.ops.matrix_state.families import family
    from longrange.ops.matrix_state.mamba3 import Mamba3State

    b, l, h = 2, 11, 2
    g = torch.Generator().manual_seed(11)
    rand = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    unit = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64)  # noqa: E731
    mask = torch.arange(l)[None, :] < torch.tensor([[l], [l - 3]])
    shape = f"b={b} l={l} h={h} dk={dk} dv={dv}, initial state, padded, chunks of 4"
    naive = getattr(family(op), f"{op}_naive")

    def flat(out: Any) -> tuple[Tensor, ...]:
        y, state = out
        return (y, *state) if isinstance(state, tuple) else (y, state)

    def wrap(call: Callable[..., Any], state: Callable[..., Any] = lambda **kw: kw) -> tuple[Callable, Callable]:
        def fn(impl: str, **kw: Any) -> tuple[Tensor, ...]:
            device = kw["x" if "x" in kw else "q"].device
            return flat(call(**state(**kw), output_final_state=True, mask=mask.to(device), chunk_size=4, impl=impl))

        ref = lambda **kw: flat(naive(**state(**kw), output_final_state=True, mask=mask))  # noqa: E731
        return fn, ref

    if op == "ssd":
        inputs = {
            "x": rand(b, l, h, dv),
            "dt": 0.05 + 0.2 * unit(b, l, h),
            "A": -0.5 - unit(h),
            "B": rand(b, l, 1, dk),
            "C": rand(b, l, 1, dk),
            "D": rand(h),
            "initial_state": rand(b, h, dk, dv),
        }
        return (shape, inputs, *wrap(ms.ssd))
    if op == "mamba3":
        # Angles rotate pairs of key entries, leaving some unrotated: one of two pairs at dk=4; two of
        # eight at the kernel's dk=16, as mamba-ssm's kernel takes an even number of angles only.
        m = 1 if dk < 8 else 2
        inputs = {
            "x": rand(b, l, h, dv),
            "dt": 0.05 + 0.2 * unit(b, l, h),
            "A": -0.5 - unit(b, l, h),
            "B": rand(b, l, 1, dk),
            "C": rand(b, l, 1, dk),
            "trap": rand(b, l, h),
            "angles": rand(b, l, h, m),
            "B_bias": rand(h, dk),
            "C_bias": rand(h, dk),
            "D": rand(h),
            "S0": rand(b, h, dk, dv),
            "theta0": unit(b, h, m),
            "k0": rand(b, h, dk),
            "v0": rand(b, h, dv),
        }

        def state(S0, theta0, k0, v0, **kw):
            return {**kw, "initial_state": Mamba3State(ssm=S0, angle=theta0, k=k0, v=v0)}

        return (shape, inputs, *wrap(ms.mamba3, state))
    if op == "mamba3_mimo":
        m, r = 1, 2
        inputs = {
            "x": rand(b, l, r, h, dv),
            "dt": 0.05 + 0.2 * unit(b, l, h),
            "A": -0.5 - unit(b, l, h),
            "B": rand(b, l, r, 1, dk),
            "C": rand(b, l, r, 1, dk),
            "trap": rand(b, l, h),
            "angles": rand(b, l, h, m),
            "B_bias": rand(h, r, dk),
            "C_bias": rand(h, r, dk),
            "D": rand(h),
            "S0": rand(b, h, dk, dv),
            "theta0": unit(b, h, m),
            "k0": rand(b, h, r, dk),
            "v0": rand(b, h, r, dv),
        }

        def state(S0, theta0, k0, v0, **kw):
            return {**kw, "initial_state": Mamba3State(ssm=S0, angle=theta0, k=k0, v=v0)}

        return (shape + f", rank {r}", inputs, *wrap(ms.mamba3_mimo, state))
    q, k, v = rand(b, l, h, dk), torch.nn.functional.normalize(rand(b, l, h, dk), dim=-1), rand(b, l, h, dv)
    inputs = {"q": q, "k": k, "v": v, "initial_state": rand(b, h, dk, dv)}
    if op == "gla":
        inputs["g"] = -0.5 * unit(b, l, h, dk)
    if op in ("delta_rule", "gated_delta_rule"):
        inputs["beta"] = unit(b, l, h)
    if op == "gated_delta_rule":
        inputs["g"] = -0.5 * unit(b, l, h)
    return (shape, inputs, *wrap(getattr(ms, op)))


#: The inputs of Mamba-3 that its layer keeps in float32 whatever the precision (its kernel takes
#: them so): the step, the decay, the biases, the skip and the initial state.
MAMBA3_FLOAT32 = ("dt", "A", "B_bias", "C_bias", "D", "S0", "theta0", "k0", "v0")


def _matrix_state_tolerance(op: str, impl: str, dtype: torch.dtype) -> float:
    """Mamba-3's kernel computes in bfloat16 whatever its inputs; the other maintained kernels
    (mamba-ssm's SSD, flash-linear-attention's) take float32 but multiply in TF32."""
    from longrange.ops.matrix_state.dispatch import EXTERNAL

    if op == "mamba3" and impl == "mamba":
        return TOLERANCE[torch.bfloat16]
    if op in EXTERNAL and impl == EXTERNAL[op][0] and dtype == torch.float32:
        return TF32_TOLERANCE
    return TOLERANCE[dtype]


def matrix_state_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """SSD, GLA, the delta rules and Mamba-3: every implementation that runs here (the chunked
    PyTorch forms; on CUDA the maintained kernels where they run) against the loop over time in
    float64, outputs, final states and gradients."""
    from longrange.ops.matrix_state.dispatch import OPS

    cases = []
    for op in OPS:
        common = _matrix_state_inputs(op)
        for impl, note, env in implementations(op, device):
            kernel3 = op == "mamba3" and impl == "mamba"  # power-of-two widths; computes in bfloat16
            shape, inputs, fn, ref = _matrix_state_inputs(op, 16, 16) if kernel3 else common
            keep32 = MAMBA3_FLOAT32 if kernel3 else ()
            cases.append(
                Case(
                    op,
                    impl,
                    device,
                    dtype,
                    shape,
                    lambda inputs=inputs, fn=fn, ref=ref, impl=impl, keep32=keep32: compare(
                        lambda **kw: fn(impl, **kw), ref, inputs, dtype, device, keep_float32=keep32
                    ),
                    _matrix_state_tolerance(op, impl, dtype),
                    _matrix_state_avoid(op, device),
                    note,
                    env,
                    record=(op, impl),
                )
            )
    return cases


#: The complex scan's cases: (b, l, n, chunk_size, with an initial state, reverse). 37 positions in
#: chunks of 4: three levels of chunks, the last one partial; 5 positions: one chunk of the default size.
COMPLEX_SCAN_SHAPES = [(2, 37, 5, 4, True, False), (1, 23, 3, 4, False, True), (2, 5, 4, None, True, True)]


def complex_scan_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """The LRU's complex diagonal scan: every implementation that runs here against the loop over
    time in complex128, states and the gradients of log λ, the inputs and the initial state.
    Complex, so float32 (complex64) only."""
    from longrange.ops import complex_scan

    if dtype != torch.float32:
        return []
    cases = []
    for b, l, n, chunk, with_h0, reverse in COMPLEX_SCAN_SHAPES:
        t = random_inputs(l, re=(n,), im=(n,), v_re=(b, l, n), v_im=(b, l, n), h_re=(b, n), h_im=(b, n))
        # |λ| in [exp(-1.05), exp(-0.05)], any phase: a stable recurrence with long and short memories.
        inputs = {
            "log_decay": torch.complex(-0.05 - t["re"].abs().clamp(max=1), t["im"]),
            "inputs": torch.complex(t["v_re"], t["v_im"]),
        }
        if with_h0:
            inputs["h0"] = torch.complex(t["h_re"], t["h_im"])
        shape = (
            f"b={b} l={l} n={n}, chunks of {chunk or 'the default size'}"
            + (", initial state" if with_h0 else "")
            + (", reverse" if reverse else "")
        )
        for impl, note, env in implementations("complex_diag_scan", device):

            def run(inputs=inputs, impl=impl, chunk=chunk, reverse=reverse) -> float:
                return compare(
                    lambda **kw: complex_scan.complex_diag_scan(**kw, reverse=reverse, chunk_size=chunk, impl=impl),
                    lambda **kw: complex_scan.complex_diag_scan_ref(**kw, reverse=reverse),
                    inputs,
                    dtype,
                    device,
                )

            cases.append(
                Case(
                    "complex_diag_scan",
                    impl,
                    device,
                    dtype,
                    shape,
                    run,
                    TOLERANCE[dtype],
                    _use_instead(
                        "complex_diag_scan", device, "complex_scan", "LRU layers model.primitive_options.impl"
                    ),
                    note,
                    env,
                    record=("complex_diag_scan", impl),
                )
            )
    return cases


def wkv_cases(device: str, dtype: torch.dtype) -> list[Case]:
    """RWKV-4's WKV (:mod:`longrange.ops.wkv`): every implementation that runs here against the loop
    over time, outputs and gradients; with an initial state and the final one (the chunked form's)
    and with a reversed sequence's leading padding."""
    from longrange.ops import wkv

    cases = []
    for b, l, d, chunk, with_state, padded in (
        (2, 9, 5, 4, False, False),
        (1, 17, 3, 8, False, True),
        (2, 11, 4, 4, True, True),
    ):
        t = random_inputs(l + d, log_w=(d,), u=(d,), k=(b, l, d), v=(b, l, d), num=(b, d), den=(b, d))
        inputs = {"log_w": t["log_w"], "u": t["u"], "k": 3 * t["k"], "v": t["v"]}
        if with_state:  # a state with mass: a positive denominator at some scale
            inputs.update(num=t["num"], den=t["den"].abs() + 0.5)
        mask = None
        if padded:
            mask = torch.ones(b, l, dtype=torch.bool)
            mask[:, :3] = False

        def call(impl, log_w, u, k, v, num=None, den=None, mask=mask, chunk=chunk):
            """The outputs (and the final sums) by ``impl``; "ref": the loop, called directly (the
            dispatcher records the implementation under check alone)."""
            state = None if num is None else {"num": num, "den": den, "scale": torch.full_like(num, 2.0)}
            if impl == "ref":
                y, out = wkv.wkv_ref(torch.exp(log_w), u, k, v, state, mask)
            elif state is None:
                return wkv.wkv(torch.exp(log_w), u, k, v, mask=mask, chunk_size=chunk, impl=impl)
            else:
                y, out = wkv.wkv(torch.exp(log_w), u, k, v, state, mask, chunk, return_state=True, impl=impl)
            if state is None:
                return y
            return y, out["num"] * torch.exp(out["scale"]), out["den"] * torch.exp(out["scale"])

        shape = f"b={b} l={l} d={d}, chunks of {chunk}" + (", initial and final state" if with_state else "")
        shape += ", leading padding" if padded else ""
        for impl, note, env in implementations("wkv", device):
            if with_state and impl == "numba":
                continue  # no states: the chunked form's
            cases.append(
                Case(
                    "wkv",
                    impl,
                    device,
                    dtype,
                    shape,
                    lambda inputs=inputs, impl=impl, call=call: compare(
                        lambda **kw: call(impl, **kw), lambda **kw: call("ref", **kw), inputs, dtype, device
                    ),
                    TOLERANCE[dtype],
                    _use_instead("wkv", device, "wkv", "RWKV layers model.primitive_options.impl"),
                    note,
                    env,
                    record=("wkv", impl),
                )
            )
    return cases


#: The op families, each ``(device, dtype) -> cases``.
OP_FAMILIES: list[Callable[[str, torch.dtype], list[Case]]] = [
    scan_cases,
    signed_scan_cases,
    conv_cases,
    norm_cases,
    glu_cases,
    fft_conv_cases,
    attention_cases,
    ssm_kernel_cases,
    matrix_state_cases,
    complex_scan_cases,
    wkv_cases,
]
