"""The entry points of the matrix-state recurrences: which implementation runs.

Implementations of each op (``impl=``):

==========  ==========================================================  ========================
name        what                                                        devices
==========  ==========================================================  ========================
``naive``   the loop over time (``*_naive``), the ground truth          any
``numba``   the recurrence as compiled loops, backward written out      CPU, when numba imports
            (SSD, GLA and the two delta rules; :mod:`.numba`)
``chunk``   chunkwise-parallel PyTorch (``*_chunk``)                    any
``fla``     flash-linear-attention's Triton chunk kernels (GLA, the     CUDA, when ``fla`` imports
            delta rules)                                                and its kernel ran once
``mamba``   mamba-ssm's ``mamba_chunk_scan_combined`` (SSD) and          CUDA, likewise
            ``mamba3_siso_combined`` (Mamba-3 SISO)
==========  ==========================================================  ========================

Mamba-3 MIMO (``mamba3_mimo``) has ``chunk`` and ``naive`` only: mamba-ssm's MIMO kernel is written
in TileLang, which is not wrapped here.

Each op has its :class:`~longrange.ops.dispatch.Dispatcher` (:data:`DISPATCHERS`, registered with
the others: ``longrange check`` and ``longrange info`` list them). ``"auto"`` runs the maintained
CUDA kernel where it is usable, else ``chunk``; under deterministic algorithms ``chunk``. A
maintained kernel counts as usable only after it ran once on a small input of the device (so a
package that imports but whose kernels do not compile on this GPU is not reported, and
``longrange list ops`` says why); that first run happens at the first call on the device, so under
``torch.compile`` on a GPU, run the model once eagerly first. Masks of SSD, GLA and the delta rules
are applied here, before any implementation runs, by zeroing the log-decays and the write
strengths at padded positions (the state is then carried unchanged) and the outputs there, so
their implementations need not know masks; Mamba-3's mask goes to its implementation (a padded
position also keeps the previous input that the trapezoidal write pairs with the next one).

Mamba-3's kernel computes in bfloat16 whatever its inputs' dtype, so ``"auto"`` runs it only on
half-precision inputs (under bf16 or fp16 autocast) and float32 inputs run ``chunk``; it takes
power-of-two head and state widths and left-aligned sequences only (``"auto"`` falls back to
``chunk`` otherwise; ``impl="mamba"`` is then an error saying why). Whether a mask is left-aligned
is read from its values, which compiled code cannot do without a graph break: under
``torch.compile`` a masked call runs ``chunk``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from longrange.ops.dispatch import Dispatcher, Impl, numba_impl
from longrange.ops.matrix_state import common
from longrange.ops.matrix_state import numba as numba_ms
from longrange.ops.matrix_state.common import keep
from longrange.ops.matrix_state.families import family

#: The maintained CUDA kernel of each op that has one: (implementation name, what it is).
EXTERNAL = {
    "ssd": ("mamba", "mamba-ssm's mamba_chunk_scan_combined (Triton)"),
    "gla": ("fla", "flash-linear-attention's chunk_gla (Triton)"),
    "delta_rule": ("fla", "flash-linear-attention's chunk_delta_rule (Triton)"),
    "gated_delta_rule": ("fla", "flash-linear-attention's chunk_gated_delta_rule (Triton)"),
    "mamba3": ("mamba", "mamba-ssm's mamba3_siso_combined (Triton; computes in bfloat16)"),
}
OPS = ("ssd", "gla", "delta_rule", "gated_delta_rule", "mamba3", "mamba3_mimo")


def _external_impl(op: str) -> Impl:
    name, what = EXTERNAL[op]

    def runs(device: torch.device) -> bool:
        if device.type != "cuda":
            return False
        from longrange.ops.matrix_state import external

        return external.kernel(op, device) is not None

    def reason(device: torch.device) -> str:
        from longrange.ops.matrix_state import external

        return f"cannot run on {device.type}: {external.reason(op, device)}"

    fits = misfit = None
    if op == "mamba3":
        from longrange.ops.matrix_state.external import mamba3_fits as fits
        from longrange.ops.matrix_state.external import mamba3_misfit as misfit
    # Their backward passes add partial gradients with atomic additions in places; not established
    # as deterministic here.
    return Impl(
        name,
        runs=runs,
        reason=reason,
        fits=fits,
        misfit=misfit,
        deterministic=False,
        nondeterministic="its Triton backward is not established as deterministic",
        note=what,
    )


def _mamba3_auto(
    d: Dispatcher,
    device: torch.device,
    deterministic: bool,
    dtype: Any = None,
    state_elements: int = 0,
    key_width: int | None = None,
    **context: Any,
) -> str:
    """Mamba-3's ``"auto"``: the kernel on half-precision inputs it takes (it computes in bfloat16);
    on a CPU the numba kernels for the heads of
    :func:`~longrange.ops.matrix_state.numba.runs_by_default`; else ``chunk``."""
    half = dtype in (torch.bfloat16, torch.float16)
    if half and not deterministic and d.runs("mamba", device, **context):
        return "mamba"
    if d.runs("numba", device) and numba_ms.runs_by_default(state_elements, key_width):
        return "numba"
    return "chunk"


#: The ops with numba kernels (:mod:`.numba`; Mamba-3 runs GLA's for its core, with its own ``"auto"``).
NUMBA = ("ssd", "gla", "delta_rule", "gated_delta_rule", "mamba3")


def _numba_auto(
    d: Dispatcher,
    device: torch.device,
    deterministic: bool,
    state_elements: int = 0,
    key_width: int | None = None,
    **context: Any,
) -> str:
    """``"auto"`` of the ops with numba kernels: the default rule, but ``numba`` only for the heads
    of :func:`~longrange.ops.matrix_state.numba.runs_by_default`."""
    small = numba_ms.runs_by_default(state_elements, key_width)
    usable = [name for name in d.candidates(device, deterministic, **context) if name != "numba" or small]
    return usable[0] if usable else "chunk"


def _describe_numba_auto(op: str) -> Callable[[torch.device], str]:
    """``longrange info``'s words for ``"auto"`` of an op with numba kernels."""

    def describe(device: torch.device) -> str:
        if device.type == "cpu" and numba_ms.numba_available():
            return (
                f"numba for states of up to {numba_ms.AUTO_STATE_ELEMENTS} elements per head (dk * dv), or "
                f"{numba_ms.AUTO_NARROW_KEY_STATE_ELEMENTS} for keys of up to {numba_ms.AUTO_KEY_WIDTH} features, "
                "else chunk"
            )
        return DISPATCHERS[op].auto_impl(device)

    return describe


def _dispatcher(op: str) -> Dispatcher:
    impls = [_external_impl(op)] if op in EXTERNAL else []
    if op in NUMBA:
        impls.append(numba_impl(numba_ms, note="float32, float64; small states"))
    impls += [Impl("chunk", note="chunkwise-parallel PyTorch"), Impl("naive", auto=False, note="loop over time")]
    if op in NUMBA:
        auto = _mamba3_auto if op == "mamba3" else _numba_auto
        return Dispatcher(op, impls, reference="naive", auto=auto, describe_auto=_describe_numba_auto(op))
    return Dispatcher(op, impls, reference="naive")


DISPATCHERS: dict[str, Dispatcher] = {op: _dispatcher(op) for op in OPS}
#: The implementations of each op, ``"auto"`` first.
IMPLS: dict[str, tuple[str, ...]] = {op: d.IMPLS for op, d in DISPATCHERS.items()}


def check_impl(op: str, impl: str | None, where: str | None = None) -> None:
    """A ConfigError (``where`` given: a layer's option) or ValueError naming ``op`` and its
    implementations unless ``impl`` is None or one of them."""
    if impl is None or impl in IMPLS[op]:
        return
    message = f"{op}: unknown impl {impl!r}; expected one of {', '.join(IMPLS[op])}"
    if where is not None:
        from longrange.errors import ConfigError

        raise ConfigError(f"{where}: {message}")
    raise ValueError(message)


_module = family  # the module of op's family (families.py)


def _run(
    op: str,
    impl: str | None,
    device: torch.device,
    args: tuple,
    chunk_size: int | None,
    context: dict[str, Any] | None = None,
    normalize_qk: bool = False,
    **kwargs: Any,
) -> Any:
    """``op`` by the implementation ``impl`` resolves to (``context``: what the dispatcher's ``fits``
    and ``"auto"`` read of the inputs; ``normalize_qk``: the delta rules' L2 normalisation of the
    first two arguments, inside the numba kernels, else here); ``kwargs`` go to every implementation."""
    d = DISPATCHERS[op]
    impl = d.resolve(impl, device, stacklevel=4, **(context or {}))
    d.note(impl)
    module = _module(op)
    if normalize_qk and impl != "numba":
        args = (common.normalize_qk(args[0]), common.normalize_qk(args[1]), *args[2:])
    if impl == "naive":
        return getattr(module, f"{op}_naive")(*args, **kwargs)
    extra = {} if chunk_size is None else {"chunk_size": chunk_size}
    if impl == "chunk":
        return getattr(module, f"{op}_chunk")(*args, **kwargs, **extra)
    if impl == "numba":  # chunk_size: the positions between the backward's checkpoints
        qk = {"normalize_qk": normalize_qk} if normalize_qk else {}
        return getattr(numba_ms, f"{op}_numba")(*args, **kwargs, **extra, **qk)
    from longrange.ops.matrix_state import external  # pragma: no cover - CUDA with the maintained kernels

    return external.kernel(op, device)(*args, **kwargs)  # pragma: no cover


def _masked_output(out: Any, mask: Tensor | None) -> Any:
    if mask is None:
        return out
    if isinstance(out, tuple):
        return (keep(mask, out[0]), *out[1:])
    return keep(mask, out)


def _state_context(q: Tensor, v: Tensor) -> dict[str, Any]:
    """What ``"auto"`` reads of the ops with numba kernels: the elements of a head's state (dk * dv;
    SSD's n * p from B and x) and the width of its keys (dk; SSD's n)."""
    return {"state_elements": q.shape[-1] * v.shape[-1], "key_width": q.shape[-1]}


def ssd(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
    *,
    chunk_size: int | None = None,
    impl: str | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Mamba-2's SSD (see :mod:`longrange.ops.matrix_state.ssd`): x (b, l, h, p), dt (b, l, h)
    positive, A (h,) negative, B and C (b, l, g, n), D (h,); state (b, h, n, p)."""
    b, l = x.shape[:2] if isinstance(x, Tensor) and x.dim() == 4 else (None, None)
    if b is not None:
        mask = common.check_mask("ssd", mask, b, l)
        if mask is not None:
            dt = keep(mask, dt)
    context = _state_context(B, x) if b is not None and isinstance(B, Tensor) else None
    out = _run("ssd", impl, x.device, (x, dt, A, B, C, D, initial_state, output_final_state), chunk_size, context)
    return _masked_output(out, mask)


def gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
    *,
    chunk_size: int | None = None,
    impl: str | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Gated linear attention (see :mod:`longrange.ops.matrix_state.gla`): q, k, g (b, l, h, dk),
    v (b, l, h, dv); state (b, h, dk, dv)."""
    b, l, *_ = common.check_qkv("gla", q, k, v)
    mask = common.check_mask("gla", mask, b, l)
    if mask is not None:
        g, k = keep(mask, g), keep(mask, k)
    out = _run(
        "gla", impl, q.device, (q, k, v, g, scale, initial_state, output_final_state), chunk_size, _state_context(q, v)
    )
    return _masked_output(out, mask)


def delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
    *,
    chunk_size: int | None = None,
    impl: str | None = None,
    normalize_qk: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """The delta rule (see :mod:`longrange.ops.matrix_state.delta_rule`): q, k (b, l, h, dk),
    v (b, l, h, dv), beta (b, l, h); state (b, h, dk, dv). ``normalize_qk``: L2-normalise q and k
    per head first (:func:`~longrange.ops.matrix_state.common.normalize_qk`, as the DeltaNet layers
    do), inside the numba kernels where they run."""
    b, l, *_ = common.check_qkv("delta_rule", q, k, v)
    mask = common.check_mask("delta_rule", mask, b, l)
    if mask is not None:
        beta = keep(mask, beta)
    out = _run(
        "delta_rule",
        impl,
        q.device,
        (q, k, v, beta, scale, initial_state, output_final_state),
        chunk_size,
        _state_context(q, v),
        normalize_qk,
    )
    return _masked_output(out, mask)


def gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
    *,
    chunk_size: int | None = None,
    impl: str | None = None,
    normalize_qk: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """The gated delta rule (see :mod:`longrange.ops.matrix_state.delta_rule`): q, k (b, l, h, dk),
    v (b, l, h, dv), g and beta (b, l, h); state (b, h, dk, dv); ``normalize_qk`` as in
    :func:`delta_rule`."""
    b, l, *_ = common.check_qkv("gated_delta_rule", q, k, v)
    mask = common.check_mask("gated_delta_rule", mask, b, l)
    if mask is not None:
        g, beta = keep(mask, g), keep(mask, beta)
    out = _run(
        "gated_delta_rule",
        impl,
        q.device,
        (q, k, v, g, beta, scale, initial_state, output_final_state),
        chunk_size,
        _state_context(q, v),
        normalize_qk,
    )
    return _masked_output(out, mask)


def mamba3(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    trap: Tensor,
    angles: Tensor,
    B_bias: Tensor | None = None,
    C_bias: Tensor | None = None,
    D: Tensor | None = None,
    initial_state: Any = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
    *,
    chunk_size: int | None = None,
    impl: str | None = None,
) -> Any:
    """Mamba-3 SISO (see :mod:`longrange.ops.matrix_state.mamba3`): x (b, l, h, p), dt (b, l, h),
    A (h,) or (b, l, h), B and C (b, l, g, n), trap (b, l, h), angles (b, l, h, m); its state is a
    :class:`~longrange.ops.matrix_state.mamba3.Mamba3State`. The mask goes to the implementation:
    a padded position keeps all four parts of the state, the previous input included."""
    context = None
    if x.device.type == "cpu" and isinstance(B, Tensor):  # the numba kernels' rule reads the state's size
        context = _state_context(B, x)
    if x.device.type == "cuda" and isinstance(B, Tensor):  # what mamba-ssm's kernel takes (a mask: one check)
        from longrange.ops.matrix_state.external import is_prefix_mask

        half = x.dtype in (torch.bfloat16, torch.float16)
        explicit = impl == "mamba" or (impl is None and DISPATCHERS["mamba3"].default == "mamba")
        if torch.compiler.is_compiling():  # reading the mask's values would break the graph
            prefix = mask is None
        else:
            prefix = is_prefix_mask(mask) if (half or explicit) else True
        context = {"dtype": x.dtype, "p": x.shape[-1], "n": B.shape[-1], "m": angles.shape[-1], "prefix_mask": prefix}
    return _run(
        "mamba3",
        impl,
        x.device,
        (x, dt, A, B, C, trap, angles, B_bias, C_bias, D, initial_state, output_final_state),
        chunk_size,
        context,
        mask=mask,
    )


def mamba3_step(*args: Any, **kwargs: Any) -> tuple[Tensor, Any]:
    return _module("mamba3").mamba3_step(*args, **kwargs)


def mamba3_mimo(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    trap: Tensor,
    angles: Tensor,
    B_bias: Tensor | None = None,
    C_bias: Tensor | None = None,
    D: Tensor | None = None,
    initial_state: Any = None,
    output_final_state: bool = False,
    mask: Tensor | None = None,
    *,
    chunk_size: int | None = None,
    impl: str | None = None,
) -> Any:
    """Mamba-3 MIMO (see :mod:`longrange.ops.matrix_state.mamba3_mimo`): x (b, l, r, h, p), dt and
    trap (b, l, h), A (h,) or (b, l, h), B and C (b, l, r, g, n), angles (b, l, h, m), biases (h, r,
    n); its state a :class:`~longrange.ops.matrix_state.mamba3.Mamba3State` with k (b, h, r, n) and v
    (b, h, r, p); ``chunk_size`` in positions of ``r`` ranks. The mask goes to the implementation,
    as Mamba-3 SISO's. mamba-ssm's MIMO kernel (TileLang) is not wrapped: ``chunk`` runs on every
    device."""
    return _run(
        "mamba3_mimo",
        impl,
        x.device,
        (x, dt, A, B, C, trap, angles, B_bias, C_bias, D, initial_state, output_final_state),
        chunk_size,
        mask=mask,
    )


def mamba3_mimo_step(*args: Any, **kwargs: Any) -> tuple[Tensor, Any]:
    return _module("mamba3_mimo").mamba3_mimo_step(*args, **kwargs)


def ssd_step(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
    return _module("ssd").ssd_step(*args, **kwargs)


def gla_step(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
    return _module("gla").gla_step(*args, **kwargs)


def delta_rule_step(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
    return _module("delta_rule").delta_rule_step(*args, **kwargs)


def gated_delta_rule_step(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
    return _module("delta_rule").gated_delta_rule_step(*args, **kwargs)
