"""The fused kernels as registered PyTorch operators, in the namespace ``torch.ops.longrange``.

Every fused kernel (the numba and Triton selective scans, the numba and Triton Vandermonde and
Cauchy products) is a ``torch.library.custom_op`` with, beside its implementation:

- a fake (shape-only) implementation, so that ``FakeTensorMode``, the ``meta`` device and
  ``torch.compile`` trace through it without running it;
- its backward, registered with ``register_autograd`` as a second operator
  (``<name>_backward``), so that autograd, AOTAutograd and ``torch.compile`` see the backward as
  one opaque call as well;
- its FLOP count, registered for ``torch.utils.flop_counter.FlopCounterMode``.

The operators are the kernels' boundary only: the public functions
(:func:`longrange.ops.scan.selective_scan`, :func:`longrange.ops.ssm_kernels.vandermonde_kernel`,
:func:`~longrange.ops.ssm_kernels.cauchy`) check their arguments, choose the implementation,
report it to :mod:`longrange.ops.used` and bring the inputs to the layout each operator takes
(complex tensors as their real and imaginary parts). :data:`OPERATORS` lists the forward operators
by implementation module; :func:`operators` returns them as ``torch.ops`` objects.

FLOPs: each operator counts the real floating-point operations of its kernel's main terms, one per
addition, multiplication, division or elementary function (exp, log1p, sin, cos), two per
multiply-add; the formulas are in :func:`longrange.ops.scan.common.scan_flops` and
:mod:`longrange.ops.ssm_kernels.common` (:func:`~longrange.ops.ssm_kernels.common.vandermonde_flops`,
:func:`~longrange.ops.ssm_kernels.common.cauchy_flops`). PyTorch's own counter counts only
matrix products, convolutions and attention, not elementwise operations.

**Plain eager calls skip the dispatcher.** The modules call their operators through
:func:`autograd_and_eager` (and their backward operators through :func:`eager`): in plain eager
code on CPU tensors the operator's own implementation runs directly, under an ``autograd.Function``
of the same ``setup_context`` and backward, since the dispatcher costs more than the small
models' kernels; compiling, a dispatch mode (``FlopCounterMode``, ``FakeTensorMode``), the profiler
and other tensors still go through the operator (:func:`direct_call_allowed`; ``EAGER_CALLS =
False`` sends every call there).

**Compiled code and the operators' versions.** Inductor and AOTAutograd cache compiled graphs on
disk with keys that do not cover a custom operator's Python definition: after an operator's fake
implementation changes (its outputs' shapes, say), a warm cache can hand back code compiled for the
old one, which fails its own shape assertions. Importing this module therefore adds a digest of the
operators' source files to ``torch.compiler.config.cache_key_tag`` (:func:`tag_compile_caches`),
after whatever tag is already set, so that compiled code is reused only with the operators it was
compiled for.

The Triton kernels are ``custom_op``s too, not ``torch.library.triton_op``s: a ``triton_op`` lets
Inductor see into the kernel, but its launches must be traceable (``wrap_triton``), which the
kernels run by Triton's CPU interpreter are not (``wrap_triton`` returns them unwrapped), so it
could be neither run nor tested without a GPU; as an opaque ``custom_op`` the same code runs
compiled on CUDA and interpreted on the CPU.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch.utils.flop_counter import register_flop_formula

#: The namespace of the operators: ``torch.ops.longrange.<name>``.
NAMESPACE = "longrange"

#: The forward operators by the module that registers them (importing it registers them).
OPERATORS: dict[str, tuple[str, ...]] = {
    "longrange.ops.scan.numba": ("selective_scan_numba", "selective_scan_numba_cl"),
    "longrange.ops.scan.triton": ("selective_scan_triton",),
    "longrange.ops.conv.numba": ("causal_conv1d_numba",),
    "longrange.ops.norm.numba": ("rms_norm_numba",),
    "longrange.ops.glu.numba": ("swiglu_numba",),
    "longrange.ops.attention.numba": ("attention_numba",),
    "longrange.ops.matrix_state.numba": ("delta_rule_numba", "gla_numba"),
    "longrange.ops.ssm_kernels.numba": ("vandermonde_numba", "cauchy_numba"),
    "longrange.ops.ssm_kernels.triton": ("vandermonde_triton", "cauchy_triton"),
    "longrange.ops.wkv.numba": ("wkv_numba",),
}


#: The modules whose source defines the operators, their fake implementations and their backward
#: passes: their digest keys compiled code (:func:`tag_compile_caches`).
DEFINING_MODULES = (
    __name__,
    *OPERATORS,
    "longrange.ops.scan.common",
    "longrange.ops.ssm_kernels.common",
    "longrange.ops.matmul",
    "longrange.ops.used",
)


def operators_digest(modules: tuple[str, ...] = DEFINING_MODULES) -> str:
    """A digest of the source files of ``modules`` (modules of this package, read from its folder:
    nothing is imported)."""
    import hashlib
    from pathlib import Path

    package = Path(__file__).resolve().parents[1]  # the longrange folder
    digest = hashlib.sha256()
    for name in modules:
        path = package.joinpath(*name.split(".")[1:])
        source = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"
        digest.update(name.encode())
        if source.is_file():
            digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def tag_compile_caches() -> str | None:
    """Add ``longrange-ops-<digest>`` to ``torch.compiler.config.cache_key_tag`` (once, after any tag
    already set); returns the tag, or None on a PyTorch without that setting (before 2.6), whose
    caches cannot be told apart this way."""
    config = getattr(torch.compiler, "config", None)
    if config is None or not hasattr(config, "cache_key_tag"):
        return None
    ours = f"longrange-ops-{operators_digest()}"
    tag = config.cache_key_tag
    if ours not in tag.split("|"):
        config.cache_key_tag = f"{tag}|{ours}" if tag else ours
    return config.cache_key_tag


def qualname(name: str) -> str:
    """``"longrange::<name>"``, the name ``torch.library`` registers an operator under."""
    return f"{NAMESPACE}::{name}"


def operators() -> dict[str, torch._ops.OpOverloadPacket]:
    """Every forward and backward operator, by name (``torch.ops.longrange.<name>``), after
    importing the modules that register them."""
    for module in OPERATORS:
        importlib.import_module(module)
    namespace = getattr(torch.ops, NAMESPACE)
    names = [n for group in OPERATORS.values() for n in group]
    return {name: getattr(namespace, name) for base in names for name in (base, base + "_backward")}


def register_flops(op: torch.library.CustomOpDef, formula: Callable[..., int]) -> None:
    """Count ``formula(*args)`` FLOPs for each call of ``op`` under ``FlopCounterMode``; ``args`` are
    the operator's arguments with every tensor replaced by its shape (None stays None)."""
    packet = getattr(getattr(torch.ops, NAMESPACE), op._name)

    @register_flop_formula(packet)
    def _count(*args, out_shape=None, **kwargs) -> int:
        return int(formula(*args, **kwargs))


#: Whether a plain eager call on CPU tensors runs an operator's implementation directly
#: (:func:`autograd_and_eager`, :func:`eager`); False sends every call through the dispatcher.
EAGER_CALLS = True
#: The tensor types a direct call takes (anything else, a fake or functional tensor say, goes
#: through the dispatcher).
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
_profiling = getattr(torch._C._autograd, "_profiler_enabled", None)


def direct_call_allowed(args: tuple) -> bool:
    """Whether a call with ``args`` may skip the dispatcher: plain eager code (not compiling, no
    dispatch mode such as ``FlopCounterMode`` or ``FakeTensorMode`` active, the profiler off, so
    that these still see the operator) on plain CPU tensors."""
    if not EAGER_CALLS or _dispatch_modes is None or _profiling is None:
        return False
    if torch.compiler.is_compiling() or _dispatch_modes() or _profiling():
        return False
    return all(not isinstance(a, torch.Tensor) or (type(a) in _PLAIN_TENSORS and a.device.type == "cpu") for a in args)


def eager(op: torch.library.CustomOpDef) -> Callable[..., object]:
    """``op`` (one without autograd: a backward operator) as a callable that runs its implementation
    directly where :func:`direct_call_allowed`, and the operator otherwise. The dispatcher costs
    about 25 µs a call, against a few µs for the small models' kernels."""
    impl = getattr(op, "_init_fn", None)  # the decorated function (torch's CustomOpDef keeps it)

    def call(*args):
        if impl is not None and direct_call_allowed(args):
            return impl(*args)
        return op(*args)

    call.op = op
    return call


def autograd_and_eager(
    op: torch.library.CustomOpDef, backward: Callable[..., object], setup_context: Callable[..., None]
) -> Callable[..., object]:
    """Register ``backward`` and ``setup_context`` as ``op``'s autograd (``op.register_autograd``) and
    return ``op`` as a callable that, where :func:`direct_call_allowed`, runs its implementation
    directly, under an ``autograd.Function`` of the same ``setup_context`` and ``backward`` when a
    gradient is needed: the same functions the operator's autograd runs, without the dispatcher
    (measured on an RMS norm of 8 rows: 46 µs a call with a gradient through the dispatcher, 23
    directly; 27 and 3 without one)."""
    op.register_autograd(backward, setup_context=setup_context)
    impl = getattr(op, "_init_fn", None)

    def forward(ctx, *args):
        output = impl(*args)
        setup_context(ctx, args, output)
        return output

    # its nodes in the autograd graph are named <op>_directBackward
    Direct = type(
        f"{op._name}_direct",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(lambda ctx, *grads: backward(ctx, *grads))},
    )

    def call(*args):
        if impl is None or not direct_call_allowed(args):
            return op(*args)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return Direct.apply(*args)
        return impl(*args)

    call.op = op
    return call


tag_compile_caches()
