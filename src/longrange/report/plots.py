"""PNG plots of runs: learning curves, scratch-vs-SPT bars, and kernel decay.

matplotlib runs with the Agg backend (files only, no display). Each function writes one PNG and
returns its path. Colours follow the regime, so a regime looks alike across plots. Accuracy is
shown in percent, as in the tables.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)
import numpy as np  # noqa: E402

from longrange.errors import DataMissingError  # noqa: E402
from longrange.report.collect import Run  # noqa: E402
from longrange.report.kernels import KernelReport  # noqa: E402
from longrange.report.tables import (  # noqa: E402
    CONFIDENCE,
    REGIME_SUFFIX,
    Cell,
    regime_sort_key,
    task_sort_key,
    metric_format,
    row_name,
    t_critical,
)


def regime_colour(regime: str) -> str:
    """A fixed colour per known regime; unknown regimes take the next colours of the cycle."""
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    known = list(REGIME_SUFFIX)
    index = known.index(regime) if regime in known else len(known) + sum(map(ord, regime))
    return palette[index % len(palette)]


def _grid(n: int, width: float = 4.5, height: float = 3.4):
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def mean_curve(curves: Sequence[Sequence[tuple[int, float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean, CI half-width) of curves over seeds, at the union of their logged steps.

    Each curve is linearly interpolated onto the union of steps within its own range (no
    extrapolation); at each step the mean and Student-t interval use the curves that cover it.
    The half-width is NaN where fewer than two curves cover the step.
    """
    steps = np.array(sorted({s for c in curves for s, _ in c}), dtype=np.float64)
    table = np.full((len(curves), len(steps)), np.nan)
    for i, c in enumerate(curves):
        if not c:
            continue
        xs = np.array([s for s, _ in c], dtype=np.float64)
        ys = np.array([v for _, v in c], dtype=np.float64)
        order = np.argsort(xs, kind="stable")
        xs, ys = xs[order], ys[order]
        inside = (steps >= xs[0]) & (steps <= xs[-1])
        table[i, inside] = np.interp(steps[inside], xs, ys)
    count = np.sum(~np.isnan(table), axis=0)
    mean = np.array([np.nanmean(col) if k else np.nan for col, k in zip(table.T, count)])
    half = np.full(len(steps), np.nan)
    for j, k in enumerate(count):
        if k >= 2:
            col = table[~np.isnan(table[:, j]), j]
            half[j] = t_critical(int(k), CONFIDENCE) * col.std(ddof=1) / math.sqrt(k)
    return steps, mean, half


def learning_curves(runs: Sequence[Run], path: str | Path, split: str = "val",
                    warn: Callable[[str], None] | None = None) -> Path | None:
    """Metric on ``split`` vs step: one panel per (task, label), one line per regime (mean over
    seeds, with a 95% CI band; the legend gives the number of seeds). Runs without
    ``metrics.jsonl`` or without values on ``split`` are passed to ``warn`` in one message and
    left out. None if no run has a curve."""
    missing = []
    panels: dict[tuple[str, str], dict[str, list[list[tuple[int, float]]]]] = {}
    metrics: dict[tuple[str, str], str] = {}
    for r in runs:
        try:
            curve = r.curve(split)
        except DataMissingError:
            curve = []
        if not curve:
            missing.append(str(r.path))
            continue
        panels.setdefault((r.task, r.label), {}).setdefault(r.regime, []).append(curve)
        metrics[(r.task, r.label)] = r.metric
    if missing and warn is not None:
        warn(f"{len(missing)} run(s) have no {split} curve in metrics.jsonl, not plotted: {', '.join(missing)}")
    if not panels:
        return None
    keys = sorted(panels, key=lambda k: (task_sort_key(k[0]), k[1]))
    fig, axes = _grid(len(keys))
    for ax, key in zip(axes, keys):
        task, label = key
        fmt = metric_format(metrics[key])
        for regime in sorted(panels[key], key=regime_sort_key):
            curves = panels[key][regime]
            steps, mean, half = mean_curve(curves)
            colour = regime_colour(regime)
            name = row_name(label, regime)
            # Markers keep runs with a single evaluation visible.
            ax.plot(steps, mean * fmt.scale, color=colour, marker="o", markersize=3, label=f"{name} (n={len(curves)})")
            if np.isfinite(half).any():
                ax.fill_between(steps, (mean - half) * fmt.scale, (mean + half) * fmt.scale, color=colour, alpha=0.2, lw=0)
        ax.set_title(f"{task}: {label}, {'validation' if split == 'val' else split} {fmt.name}")
        ax.set_xlabel("step")
        ax.set_ylabel(fmt.name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return _save(fig, path)


def scratch_vs_spt_bars(cells: Sequence[Cell], path: str | Path) -> Path | None:
    """Per task a panel; per label a group of bars, one per regime, with 95% CI error bars."""
    final = [c for c in cells if c.kind == "final"]
    if not final:
        return None
    tasks = sorted({c.task for c in final}, key=task_sort_key)
    fig, axes = _grid(len(tasks), width=5.0)
    for ax, task in zip(axes, tasks):
        here = [c for c in final if c.task == task]
        labels = sorted({c.label for c in here})
        regimes = sorted({c.regime for c in here}, key=regime_sort_key)
        width = 0.8 / len(regimes)
        fmts = {c.format.name for c in here}
        for j, regime in enumerate(regimes):
            xs, ys, errs = [], [], []
            for i, label in enumerate(labels):
                cell = next((c for c in here if c.label == label and c.regime == regime), None)
                if cell is None:
                    continue
                s, f = cell.stat, cell.format
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(s.mean * f.scale)
                errs.append(0.0 if s.half_width is None else s.half_width * f.scale)
            ax.bar(xs, ys, width=width, yerr=errs, capsize=3, color=regime_colour(regime), label=regime)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=15)
        sources = {c.source for c in here}
        what = "test" if sources == {"test"} else "best validation" if sources == {"val"} else "test / best validation"
        ax.set_title(f"{task}: {what} {' / '.join(sorted(fmts))}")
        ax.set_ylabel(" / ".join(sorted(fmts)))
        ax.set_xlabel("model")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize="small", title="regime", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, path)


def kernel_decay_plot(reports: Mapping[str, tuple[str, KernelReport]], path: str | Path, title: str = "") -> Path | None:
    """Kernel envelopes on log-log axes, one panel per layer, one line per run and direction.

    ``reports`` maps a run's name (the legend entry) to (regime, its :class:`KernelReport`).
    The x axis is lag + 1 (log axes need positive values); zero envelope values are not drawn.
    None if no report has kernels.
    """
    layers = sorted({p.layer for _, rep in reports.values() for p in rep.profiles})
    if not layers:
        return None
    fig, axes = _grid(len(layers))
    styles = {"forward": "-", "backward": "--"}
    for ax, layer in zip(axes, layers):
        for name, (regime, rep) in reports.items():
            for p in rep.profiles:
                if p.layer != layer:
                    continue
                env = np.where(p.envelope > 0, p.envelope, np.nan)
                lag = np.arange(1, len(env) + 1)
                ax.plot(lag, env, styles.get(p.direction, ":"), color=regime_colour(regime), lw=1.2,
                        label=f"{name} ({p.direction})" if p.direction != "forward" else name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("lag + 1 (steps)")
        ax.set_ylabel("mean |K| / max")
        ax.set_title(f"{title}layer {layer}" if title else f"layer {layer}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize="x-small")
    return _save(fig, path)
