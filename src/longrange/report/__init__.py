"""Reports of finished runs: tables with 95% confidence intervals over seeds, plots, kernel decay.

    from longrange.report import write_report
    print(write_report(["runs/"], out_dir="runs/"))     # also writes runs/report.md and PNGs

Modules: ``collect`` (reading run directories), ``stats`` (mean and Student-t interval), ``formats``
(numbers as shown), ``aggregate`` (runs grouped into cells over seeds), ``environment`` (devices and
kernels of a cell's runs), ``render`` (the Markdown and CSV tables; ``tables`` gathers the names of
these five), ``plots`` (PNG figures), ``kernels`` (convolution-kernel decay), ``writer`` (``report.md``),
``extrapolation`` (runs evaluated at other values of a task option: ``longrange extrapolate``),
``cli`` (``longrange report``: argument handling only).
"""

from __future__ import annotations

from longrange.report.aggregate import aggregate
from longrange.report.collect import Run, collect_runs
from longrange.report.kernels import kernel_decay
from longrange.report.stats import mean_ci, t_critical
from longrange.report.writer import write_report

__all__ = ["Run", "aggregate", "collect_runs", "kernel_decay", "mean_ci", "t_critical", "write_report"]
