"""Reports of finished runs: tables with 95% confidence intervals over seeds, plots, kernel decay.

    from longrange.report import write_report
    print(write_report(["runs/"], out_dir="runs/"))     # also writes runs/report.md and PNGs

Modules: ``collect`` (reading run directories), ``tables`` (aggregation, statistics, Markdown and
CSV), ``plots`` (PNG figures), ``kernels`` (convolution-kernel decay), ``cli`` (``longrange report``).
"""
from __future__ import annotations

from longrange.report.cli import write_report
from longrange.report.collect import Run, collect_runs
from longrange.report.tables import aggregate, mean_ci

__all__ = ["Run", "aggregate", "collect_runs", "mean_ci", "write_report"]
