"""Numbers as the report shows them: a metric in its display units (:func:`metric_format`:
accuracy in percent with two decimals, R² and anything else with three), a mean with its interval
(:func:`stat_text`), a range over seeds (:func:`range_text`) and a duration (:func:`format_duration`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from longrange.report.stats import Stat


@dataclass(frozen=True)
class MetricFormat:
    """How a metric is displayed: ``value * scale`` with ``decimals`` decimals (None: 4 significant)."""

    name: str
    scale: float = 1.0
    decimals: int | None = None

    def number(self, value: float) -> str:
        v = value * self.scale
        if math.isnan(v):
            return "nan"
        if self.decimals is None:
            return f"{v:.4g}"
        return f"{v:.{self.decimals}f}"


def metric_format(metric: str) -> MetricFormat:
    if metric == "accuracy":
        return MetricFormat("accuracy (%)", 100.0, 2)
    if metric.endswith("accuracy"):  # sequence_accuracy: "sequence accuracy (%)"
        return MetricFormat(metric.replace("_", " ") + " (%)", 100.0, 2)
    if metric == "r2":
        return MetricFormat("R²", 1.0, 3)
    return MetricFormat(metric, 1.0, 3)


def stat_text(s: Stat, f: MetricFormat) -> str:
    if s.half_width is None:
        return f"{f.number(s.mean)} (n=1)"
    return f"{f.number(s.mean)} ± {f.number(s.half_width)}"


def range_text(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}–{fmt.format(hi)}"


def format_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
