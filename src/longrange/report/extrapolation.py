"""Length extrapolation: finished runs evaluated on their task at other values of one task option
(usually ``seq_len``), as a table (Markdown, JSON, CSV) and a plot of the metric against the value.

    from longrange import load_run
    from longrange.report.extrapolation import option_sweep, write_sweep
    runs = [load_run(d) for d in ("runs/s6", "runs/s4d", "runs/attention")]
    sweep = option_sweep(runs, "seq_len", [64, 128, 256, 512], split="test")
    write_sweep(sweep, "runs/extrapolation")   # extrapolation.{md,json,csv,png}

Every (run, value) is one evaluation (:meth:`longrange.train.trained.TrainedRun.evaluate`), its
metrics kept as the objective reports them. An unknown option or a bad value stops the sweep
before anything runs; a value a run cannot be evaluated at (a position table shorter than the
length, more memory than the budget, data that do not fit) is a cell with its reason, and the
sweep goes on.
"""

from __future__ import annotations

import csv
import io
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longrange.errors import ConfigError, LongrangeError
from longrange.fileio import atomic_write, check_out_dir, write_json
from longrange.report.formats import metric_format
from longrange.report.render import Table, render_markdown

FILES = {
    "markdown": "extrapolation.md",
    "json": "extrapolation.json",
    "csv": "extrapolation.csv",
    "plot": "extrapolation.png",
}


@dataclass
class ValueResult:
    """One run at one value: its metrics (as the objective reports them), or why there are none."""

    value: Any
    metrics: dict[str, float] | None = None
    error: str | None = None
    evaluation: dict[str, Any] | None = None


@dataclass
class RunRow:
    """One run of a sweep: its name, the value it was trained at, and a cell per value."""

    run: str
    label: str
    task: str
    metric: str
    trained_at: Any
    cells: list[ValueResult] = field(default_factory=list)


@dataclass
class Sweep:
    option: str
    values: list[Any]
    split: str
    fixed: dict[str, Any]
    rows: list[RunRow]
    #: The metric tabled and plotted (None: each run's objective metric).
    metric: str | None = None

    def metric_of(self, row: RunRow) -> str:
        return self.metric or row.metric


def option_sweep(
    runs: Sequence[Any],
    option: str,
    values: Sequence[Any],
    split: str = "test",
    fixed: Mapping[str, Any] | None = None,
    metric: str | None = None,
    progress: Callable[[str], None] | None = None,
    **evaluate: Any,
) -> Sweep:
    """Evaluate each of ``runs`` (:class:`~longrange.train.trained.TrainedRun`) at ``option`` = each
    of ``values`` (with the task options ``fixed`` too); ``evaluate`` goes to
    :meth:`~longrange.train.trained.TrainedRun.evaluate` (data_dir, batch_size, memory_budget).

    Every run's task must take ``option`` and every value (checked before anything runs)."""
    if not runs:
        raise ConfigError("an extrapolation sweep needs at least one run")
    if not values:
        raise ConfigError(f"give the values of {option} to evaluate at")
    fixed = dict(fixed or {})
    if option in fixed:
        raise ConfigError(f"task option {option} is the swept option; do not also fix it")
    for run in runs:  # unknown options and bad values stop the sweep before any evaluation
        for value in values:
            run.options({**fixed, option: value})
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    rows = []
    for run in runs:
        row = RunRow(str(run.root), run.label, run.task_name, "", run.options().get(option))
        for value in values:
            say(f"{run.root}: {split} at {option}={value} ...")
            cell = ValueResult(value)
            try:
                ev = run.evaluate(split, {**fixed, option: value}, **evaluate)
            except LongrangeError as err:
                cell.error = str(err)
                say(f"  not evaluated: {err}")
            else:
                row.metric = ev.metric
                cell.metrics, cell.evaluation = dict(ev.metrics), ev.to_dict()
                shown = ev.metrics.get(metric or ev.metric)
                say(
                    f"  {metric or ev.metric} {shown:.4f} ({ev.items} items, batch {ev.batch_size}, {ev.seconds:.1f} s)"
                    if isinstance(shown, float)
                    else f"  metrics {ev.metrics}"
                )
            row.cells.append(cell)
        if not row.metric:  # no value could be evaluated: the objective's metric from its summary
            row.metric = str(run.summary.get("metric") or "accuracy")
        rows.append(row)
    if metric is not None:
        missing = [r.label for r in rows for c in r.cells if c.metrics is not None and metric not in c.metrics]
        if missing:
            raise ConfigError(f"metric {metric!r} is not reported by {', '.join(sorted(set(missing)))}")
    return Sweep(option, list(values), split, fixed, rows, metric)


def _formatted(value: float | None, metric: str) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return metric_format(metric).number(value)


def sweep_table(sweep: Sweep) -> Table:
    """Rows: runs; columns: the values (the run's own value marked with *); cells: the metric,
    or "—" with a numbered note saying why a run was not evaluated there."""
    metrics = sorted({sweep.metric_of(r) for r in sweep.rows})
    unit = metric_format(metrics[0]).name if len(metrics) == 1 else "metric"
    headers = ["Run", "Task", f"Trained at {sweep.option}"] + [str(v) for v in sweep.values]
    rows, notes, reasons = [], [], {}
    for row in sweep.rows:
        metric = sweep.metric_of(row)
        cells = [row.label + ("" if len(metrics) == 1 else f" ({metric})"), row.task, str(row.trained_at)]
        for cell in row.cells:
            if cell.error is not None:
                number = reasons.setdefault(cell.error, len(reasons) + 1)
                cells.append(f"— ({number})")
            else:
                mark = "*" if cell.value == row.trained_at else ""
                cells.append(_formatted((cell.metrics or {}).get(metric), metric) + mark)
        rows.append(cells)
    if any(c.value == r.trained_at for r in sweep.rows for c in r.cells):
        notes.append("- \\* the value the run was trained at.")
    notes += [f"- ({n}) {reason}" for reason, n in reasons.items()]
    fixed = ", ".join(f"{k}={v}" for k, v in sweep.fixed.items())
    title = f"{unit} on the {sweep.split} split against {sweep.option}" + (f" ({fixed})" if fixed else "")
    return Table(title, headers, rows, notes)


def sweep_csv(sweep: Sweep) -> str:
    """One row per run and value with every metric (long format)."""
    names = sorted({k for r in sweep.rows for c in r.cells for k in (c.metrics or {})})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(
        ["run", "label", "task", "split", "option", "value", "trained_at", *names, "batch_size", "seconds", "error"]
    )
    for row in sweep.rows:
        for cell in row.cells:
            ev = cell.evaluation or {}
            writer.writerow(
                [
                    row.run,
                    row.label,
                    row.task,
                    sweep.split,
                    sweep.option,
                    cell.value,
                    row.trained_at,
                    *[(cell.metrics or {}).get(n, "") for n in names],
                    ev.get("batch_size", ""),
                    f"{ev['seconds']:.3f}" if "seconds" in ev else "",
                    cell.error or "",
                ]
            )
    return out.getvalue()


def sweep_json(sweep: Sweep) -> dict[str, Any]:
    return {
        "option": sweep.option,
        "values": sweep.values,
        "split": sweep.split,
        "fixed": sweep.fixed,
        "metric": sweep.metric,
        "runs": [
            {
                "run": r.run,
                "label": r.label,
                "task": r.task,
                "metric": r.metric,
                "trained_at": r.trained_at,
                "cells": [
                    {"value": c.value, "metrics": c.metrics, "error": c.error, "evaluation": c.evaluation}
                    for c in r.cells
                ],
            }
            for r in sweep.rows
        ],
    }


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def sweep_plot(sweep: Sweep, path: str | Path) -> Path:
    """The metric against the option's value, one line per run on one shared axis (a log2 axis for
    positive numbers spanning a factor of 4 or more), the training value of each run marked by an
    open circle, the legend beside the axes. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from longrange.report.plots import LINESTYLES, MARKERS, thin_tick_labels

    metrics = sorted({sweep.metric_of(r) for r in sweep.rows})
    numeric = _numeric(sweep.values)
    xs = list(sweep.values) if numeric else list(range(len(sweep.values)))
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    for i, row in enumerate(sweep.rows):
        metric = sweep.metric_of(row)
        scale = metric_format(metric).scale
        ys = [(c.metrics or {}).get(metric) for c in row.cells]
        ys = [y * scale if isinstance(y, (int, float)) and math.isfinite(y) else float("nan") for y in ys]
        (line,) = ax.plot(
            xs, ys, marker=MARKERS[i % len(MARKERS)], linestyle=LINESTYLES[i % len(LINESTYLES)], label=row.label
        )
        if row.trained_at in sweep.values:
            at = sweep.values.index(row.trained_at)
            if not math.isnan(ys[at]):
                ax.plot([xs[at]], [ys[at]], "o", markersize=13, markerfacecolor="none", color=line.get_color())
    if numeric and min(sweep.values) > 0 and max(sweep.values) >= 4 * min(sweep.values):
        ax.set_xscale("log", base=2)
    if not numeric:
        ax.set_xticks(xs, [str(v) for v in sweep.values])
    elif len(xs) <= 12:
        ax.set_xticks(xs, [str(v) for v in sweep.values])
        ax.minorticks_off()
    ax.set_xlabel(f"{sweep.option} ({sweep.split} split)")
    ax.set_ylabel(metric_format(metrics[0]).name if len(metrics) == 1 else ", ".join(metrics))
    if metrics == ["accuracy"]:
        ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.set_title(
        f"{', '.join(metrics)} against {sweep.option} (open circle: the run's training value)", fontsize="medium"
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", frameon=False)
    buffer = io.BytesIO()
    fig.tight_layout()
    thin_tick_labels(fig, [ax])  # a value per tick: those whose labels would overlap keep their tick alone
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return atomic_write(path, buffer.getvalue())


def write_sweep(sweep: Sweep, out_dir: str | Path, plot: bool = True) -> dict[str, Path]:
    """Write the sweep's table (Markdown, with the plot), its JSON and CSV into ``out_dir``; returns the paths."""
    out = check_out_dir(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": write_json(out / FILES["json"], sweep_json(sweep)),
        "csv": atomic_write(out / FILES["csv"], sweep_csv(sweep).encode()),
    }
    text = ["# Extrapolation", "", render_markdown(sweep_table(sweep))]
    if plot:
        paths["plot"] = sweep_plot(sweep, out / FILES["plot"])
        text += [f"![{sweep.option} sweep]({FILES['plot']})", ""]
    paths["markdown"] = atomic_write(out / FILES["markdown"], "\n".join(text).encode())
    return paths
