"""Statistics of the report: the mean of a cell's seeds with the half-width of its Student-t
confidence interval (:func:`mean_ci`, ``t_{n-1} · s / √n``), and the t quantiles behind it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: The confidence of every interval in the report.
CONFIDENCE = 0.95


def t_quantile(p: float, df: float) -> float:
    """The t value with P(T <= t) = p, for 0 < p < 1, of Student's t with ``df`` degrees of freedom."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"t_quantile: degrees of freedom must be positive, got {df}")
    from scipy.stats import t  # imported here: reading and tabulating runs does not need it

    return float(t.ppf(p, df))


def t_critical(n: int, confidence: float = 0.95) -> float:
    """The two-sided critical value for a mean of ``n`` samples (df = n - 1), n >= 2."""
    if n < 2:
        raise ValueError(f"a confidence interval needs at least 2 samples, got {n}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return t_quantile(0.5 + confidence / 2.0, n - 1)


@dataclass(frozen=True)
class Stat:
    """Mean of ``n`` values, their sample standard deviation (ddof 1) and the CI half-width.

    ``std`` and ``half_width`` are None for n = 1 (no interval from one sample).
    """

    n: int
    mean: float
    std: float | None
    half_width: float | None
    confidence: float = 0.95


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> Stat:
    """Mean ± Student-t ``confidence`` interval half-width ``t_{n-1} · s / √n``."""
    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        raise ValueError("mean_ci of no values")
    mean = sum(vals) / n
    if n == 1:
        return Stat(1, mean, None, None, confidence)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    return Stat(n, mean, std, t_critical(n, confidence) * std / math.sqrt(n), confidence)
