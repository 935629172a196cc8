"""Comparing an implementation with its float64 reference, for ``longrange check``
(:mod:`longrange.check`): a check :class:`Case` and :func:`compare`.

**The error** :func:`compare` returns: for each output and each input gradient (of a fixed random
weighting of the outputs), ``max |x - x_ref| / max |x_ref|``, the largest over them. The inputs are
drawn in float64, rounded to the checked dtype, and the reference runs in float64 (complex128) on
the CPU on those rounded values, with the outputs' weights rounded alike, so the error measures the
implementation, not the rounding of its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

#: Tolerances on the largest relative error, by dtype (a case may set its own).
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
#: The float32 tolerance of a kernel whose products run in TF32 (10-bit mantissas, Triton's default
#: for ``tl.dot`` on float32 operands from Ampere on): mamba-ssm's SSD kernel measured 1.9e-3 on an
#: H200 at the matrix-state cases' size, where our float32 kernels stay below 1e-5.
TF32_TOLERANCE = 1e-2

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


def preferred(passed: Sequence[str], order: Sequence[str]) -> str | None:
    """The first implementation of ``order`` among those that ``passed``."""
    return next((impl for impl in order if impl in passed), None)


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
    fn: Callable[..., Any],
    ref: Callable[..., Any],
    inputs: dict[str, Tensor],
    dtype: torch.dtype,
    device: str,
    keep_float32: Sequence[str] = (),
) -> float:
    """The largest relative error of ``fn``'s outputs and input gradients, on copies of ``inputs``
    in ``dtype`` on ``device``, against ``ref``'s on their float64 CPU copies. ``inputs`` are
    float64 / complex128 CPU tensors (other tensors, e.g. masks, are passed as they are); both
    functions take them as keyword arguments and return a tensor or a sequence of tensors.
    ``keep_float32`` names inputs given in float32 whatever ``dtype`` is (parameters under mixed
    precision, as kernels such as mamba-ssm's expect them)."""
    low = {k: _low(v, torch.float32 if k in keep_float32 else dtype, device) for k, v in inputs.items()}
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


def random_inputs(seed: int, **shapes: tuple[int, ...]) -> dict[str, Tensor]:
    """Standard-normal float64 tensors of the given shapes, from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(*shape, generator=g, dtype=torch.float64) for name, shape in shapes.items()}
