"""How a training step's time and memory grow with sequence length (``longrange bench --scaling``).

Each primitive is measured as the length doubles (default 256 -> 16384) on one fixed synthetic
batch of standard-normal inputs of shape (batch, length, d_model). The unit measured is either

- ``"primitive"`` (default): the sequence primitive alone (causal), so that what grows is the
  sequence mixing itself; the loss is the mean square of its output;
- ``"block"``: a one-block backbone around it (a Mamba block for the SSMs, a Transformer block for
  attention), i.e. with the projections, convolution and norms the models add.

A training step is forward, backward and an AdamW step. A primitive stops at the first length whose
measured time per step exceeds ``time_budget_s`` or whose measured peak memory exceeds
``memory_budget_mb``, and also before a length whose peak memory, extrapolated from the growth
between the last two lengths, would exceed the memory budget (so that a quadratic primitive is not
run into an out-of-memory kill). Lengths not run appear in the table with the reason.

The empirical exponent is the least-squares slope of log(time) against log(length) over the upper
half of the measured lengths (at least two points): about 1 for linear growth, a little above 1 for
L·log L (FFT convolutions), about 2 for quadratic attention. Short lengths are left out of the fit
because fixed per-call overheads dominate there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch

from longrange.bench import measure
from longrange.errors import ConfigError, LongrangeError

#: Primitives measured by default; "attention-blocked" is attention within blocks of ``block_size``.
SCALING_PRIMITIVES = ("attention", "attention-blocked", "s4", "s4d", "s6", "dlr")
UNITS = ("primitive", "block")


def default_lengths(start: int = 256, stop: int = 16384) -> list[int]:
    """Doubling lengths from ``start`` to ``stop`` (both included when stop = start * 2^k)."""
    if start < 1 or stop < start:
        raise ConfigError(f"need 1 <= first length <= last length, got {start} and {stop}")
    lengths = []
    n = start
    while n <= stop:
        lengths.append(n)
        n *= 2
    return lengths


@dataclass
class ScalingSettings(measure.Measurement):
    """The unit measured at each length (a primitive, or a block around it) and its sizes, with
    :class:`~longrange.bench.measure.Measurement`'s batch, calls, device, seed, threads and kernels."""

    unit: str = "primitive"
    d_model: int = 128
    d_state: int = 16
    n_heads: int = 4
    block_size: int = 1024

    POSITIVE: ClassVar[tuple[str, ...]] = ("d_model", "d_state", "n_heads", "block_size", "batch_size", "batches")

    def validate(self) -> torch.device:
        if self.unit not in UNITS:
            raise ConfigError(f"--unit {self.unit!r} is unknown; expected one of {', '.join(UNITS)}")
        device = super().validate()
        if self.d_model % self.n_heads:
            raise ConfigError(f"--d-model {self.d_model} must be divisible by --n-heads {self.n_heads} (attention)")
        return device


def build_unit(primitive: str, s: ScalingSettings) -> torch.nn.Module:
    """The module measured for ``primitive`` (see the module docstring); causal."""
    if primitive not in SCALING_PRIMITIVES:
        raise ConfigError(f"unknown scaling primitive {primitive!r}; expected one of {', '.join(SCALING_PRIMITIVES)}")
    name = "attention" if primitive.startswith("attention") else primitive
    block_size = s.block_size if primitive == "attention-blocked" else None
    if s.unit == "primitive":
        from longrange.models.backbone import make_primitive

        options: dict[str, Any] = {}
        if name == "attention":
            options = {"n_heads": s.n_heads, "block_size": block_size}
        return make_primitive(name, s.d_model, d_state=s.d_state, bidirectional=False, **options)
    from longrange.models import ModelConfig
    from longrange.models.backbone import Backbone

    block = "transformer" if name == "attention" else "mamba"
    cfg = ModelConfig(
        block=block,
        primitive=name,
        n_layers=1,
        d_model=s.d_model,
        d_state=s.d_state,
        n_heads=s.n_heads,
        attn_block_size=block_size,
    )
    return Backbone(cfg)


def measure_point(primitive: str, length: int, settings: dict[str, Any]) -> dict[str, Any]:
    """Seconds per training step and peak memory of one primitive at one length (JSON-able)."""
    s = ScalingSettings(**settings)
    s.validate()
    with (
        measure.torch_threads(s.threads),
        measure.scan_impl(s.scan_impl, s.device) as impl,
        measure.ssm_kernel_impl(s.ssm_kernel_impl, s.device) as kernel_impl,
    ):
        return {**_measure_point(primitive, length, s), "scan_impl": impl, "ssm_kernel_impl": kernel_impl}


def _measure_point(primitive: str, length: int, s: ScalingSettings) -> dict[str, Any]:
    device = measure.resolve_device(s.device)
    torch.manual_seed(s.seed)
    module = build_unit(primitive, s).to(device)
    x = torch.randn(s.batch_size, length, s.d_model, device=device)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    module.train()

    def step() -> None:
        module(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    with measure.PeakMemory(device) as mem:
        times = measure.time_calls(step, warmup=s.warmup, batches=s.batches, device=device)
    summary = measure.summarize_times(times)
    return {"time_s": summary["mean"], "time_std": summary["std"], "peak_mb": mem.peak_mb, "memory_method": mem.method}


def fit_exponent(lengths: list[int], times: list[float]) -> float | None:
    """Slope of log(time) vs log(length) over the upper half of the points (>= 2), or None."""
    points = sorted((n, t) for n, t in zip(lengths, times) if t and t > 0)
    if len(points) < 2:
        return None
    upper = points[len(points) // 2 :] if len(points) >= 4 else points[-2:]
    xs = [math.log(n) for n, _ in upper]
    ys = [math.log(t) for _, t in upper]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def growth_label(exponent: float | None) -> str:
    """A reading of the exponent for the table (rough: measured wall-clock, not FLOPs)."""
    if exponent is None:
        return "n/a"
    if exponent < 1.2:
        return "~linear"
    if exponent < 1.6:
        return "between linear and quadratic"
    return "~quadratic"


def run_scaling(
    primitives: list[str] | tuple[str, ...] = SCALING_PRIMITIVES,
    lengths: list[int] | None = None,
    settings: ScalingSettings | None = None,
    *,
    time_budget_s: float = 10.0,
    memory_budget_mb: float = 4096.0,
    isolate: bool = True,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, float | None]]:
    """Measure each primitive at each length until a budget stops it.

    Returns (rows, exponents): one row per (primitive, length) with ``status`` "ok",
    "over time budget" / "over memory budget" (measured, and the last length run), "not run: ..."
    (after a stop) or "failed: ..."; and the fitted exponent per primitive (None with < 2 points).
    """
    settings = settings or ScalingSettings()
    settings.validate()
    lengths = sorted(set(lengths or default_lengths()))
    if lengths[0] < 1:
        raise ConfigError(f"lengths must be positive, got {lengths}")
    if time_budget_s <= 0 or memory_budget_mb <= 0:
        raise ConfigError(f"budgets must be positive, got {time_budget_s} s and {memory_budget_mb} MB")
    for p in primitives:
        if p not in SCALING_PRIMITIVES:
            raise ConfigError(f"unknown scaling primitive {p!r}; expected one of {', '.join(SCALING_PRIMITIVES)}")
    rows: list[dict[str, Any]] = []
    exponents: dict[str, float | None] = {}
    for p in dict.fromkeys(primitives):
        stop_reason = None
        measured: list[dict[str, Any]] = []
        for length in lengths:
            row: dict[str, Any] = {"primitive": p, "length": length, "unit": settings.unit}
            if stop_reason is None and len(measured) >= 2:
                stop_reason = _predicted_memory_stop(measured, length, memory_budget_mb)
            if stop_reason is not None:
                rows.append({**row, "status": f"not run: {stop_reason}"})
                continue
            if progress is not None:
                progress(f"{p} L={length}")
            try:
                point = measure.run_isolated(
                    "longrange.bench.scaling:measure_point",
                    {"primitive": p, "length": length, "settings": asdict(settings)},
                    isolate=isolate,
                )
            except LongrangeError:
                raise
            except Exception as err:  # e.g. killed for lack of memory: reported, and the primitive stops
                first_line = (str(err).strip().splitlines() or [type(err).__name__])[-1]
                rows.append({**row, "status": f"failed: {first_line}"})
                stop_reason = f"failed at L={length}"
                continue
            row.update(point)
            if point["time_s"] > time_budget_s:
                row["status"] = "over time budget"
                stop_reason = f"L={length} took {point['time_s']:.2f} s > {time_budget_s:g} s per step"
            elif point["peak_mb"] > memory_budget_mb:
                row["status"] = "over memory budget"
                stop_reason = f"L={length} needed {point['peak_mb']:.0f} MB > {memory_budget_mb:g} MB"
            else:
                row["status"] = "ok"
            measured.append(row)
            rows.append(row)
        exponents[p] = fit_exponent([r["length"] for r in measured], [r["time_s"] for r in measured])
    return rows, exponents


def _predicted_memory_stop(measured: list[dict[str, Any]], length: int, budget_mb: float) -> str | None:
    prev, last = measured[-2], measured[-1]
    if prev["peak_mb"] <= 0 or last["peak_mb"] <= 0:
        return None
    # Per-doubling growth of the peak, extended to the next length (which may skip doublings).
    ratio = max(1.0, last["peak_mb"] / prev["peak_mb"]) ** (
        math.log2(length / last["length"]) / math.log2(last["length"] / prev["length"])
    )
    predicted = last["peak_mb"] * ratio
    if predicted > budget_mb:
        return f"L={length} would need about {predicted:.0f} MB > {budget_mb:g} MB (extrapolated)"
    return None
