"""PNG plots of runs: learning curves, scratch-vs-SPT bars, and kernel decay.

matplotlib runs with the Agg backend (files only, no display). Each function writes one PNG and
returns its path. Colour, line style and marker follow the regime, so a regime looks alike across
plots and overlapping curves stay visible; lines and bars are named as the rows of the tables.
Accuracy is shown in percent, as in the tables; 95% bands are clipped to the metric's range
(``METRIC_RANGE``). The data behind each plot comes from a plain function (``curve_panels``,
``bar_panels``, ``kernel_lines``) that the tests check.

Legible at a glance, whatever the grid: the panels of one task share their axes (models compared by
eye), legends sit outside the data (below the panels), bars are horizontal with their row names
wrapped beside them, titles are wrapped, and the layout is matplotlib's constrained layout, saved
with every text inside the image. ``tests/report/test_plot_layout.py`` draws each plot at a large
grid and checks that no two texts overlap and that no legend covers a panel.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)
import numpy as np  # noqa: E402

from longrange.errors import DataMissingError  # noqa: E402
from longrange.report.aggregate import (  # noqa: E402
    REGIME_SUFFIX,
    ResultCell,
    regime_sort_key,
    row_name,
    task_sort_key,
)
from longrange.report.collect import Run  # noqa: E402
from longrange.report.formats import metric_format  # noqa: E402
from longrange.report.kernels import DIRECTION_NAMES, KernelReport  # noqa: E402
from longrange.report.stats import CONFIDENCE, mean_ci  # noqa: E402
from longrange.train.rundir import METRICS_FILE  # noqa: E402


def _regime_index(regime: str) -> int:
    known = list(REGIME_SUFFIX)
    return known.index(regime) if regime in known else len(known) + sum(map(ord, regime))


def regime_colour(regime: str) -> str:
    """A fixed colour per known regime; unknown regimes take the next colours of the cycle."""
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return palette[_regime_index(regime) % len(palette)]


#: Line styles and markers by regime (with the colour), so that curves lying on top of each other,
#: or printed in grey, stay distinguishable.
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 2)), (0, (5, 5)), (0, (3, 1, 1, 1, 1, 1, 1, 1)))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def regime_style(regime: str) -> dict:
    """``color``, ``linestyle`` and ``marker`` of a regime: fixed for the known regimes, distinct
    from each other (known regimes differ in all three)."""
    i = _regime_index(regime)
    return {
        "color": regime_colour(regime),
        "linestyle": LINESTYLES[i % len(LINESTYLES)],
        "marker": MARKERS[i % len(MARKERS)],
    }


#: The range each metric can take, in its raw units (accuracy as a fraction): confidence bands and
#: error bars are clipped to it, so a band never shows an accuracy above 100% or a negative loss.
METRIC_RANGE: dict[str, tuple[float, float]] = {
    "accuracy": (0.0, 1.0),
    "r2": (-math.inf, 1.0),
    "loss": (0.0, math.inf),
    "mse": (0.0, math.inf),
    "mae": (0.0, math.inf),
    "rmse": (0.0, math.inf),
    "perplexity": (1.0, math.inf),
}


def clip_band(metric: str, mean: np.ndarray, half: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) of ``mean ± half`` clipped to :data:`METRIC_RANGE` (unchanged for a metric
    without a known range); NaN where ``half`` is NaN."""
    lo, hi = METRIC_RANGE.get(metric, (-math.inf, math.inf))
    mean, half = np.asarray(mean, dtype=np.float64), np.asarray(half, dtype=np.float64)
    return np.clip(mean - half, lo, hi), np.clip(mean + half, lo, hi)


def _grid(n: int, width: float = 4.5, height: float = 3.4, cols: int = 3):
    """A figure of ``n`` panels in rows of up to ``cols`` (constrained layout); the panels, in order."""
    cols = max(1, min(n, cols))
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, layout="constrained")
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def wrap(text: str, width: int) -> str:
    """``text`` broken into lines of at most ``width`` characters (at spaces where it can)."""
    return textwrap.fill(text, width=width, break_long_words=True, break_on_hyphens=False)


def legend_below(fig, handles: list, labels: list[str], title: str | None = None, columns: int = 3):
    """One legend for the whole figure, below its panels (never over the data)."""
    if not handles:
        return None
    width, height = fig.get_size_inches()
    ncol = max(1, min(columns, len(handles), int(width // 3.3)))
    lines = sum(max(label.count("\n") + 1, len(wrap(label, 48).splitlines())) for label in labels[::ncol])
    fig.set_size_inches(width, height + 0.2 * lines + 0.5)  # the panels keep their size; the legend gets its own
    return fig.legend(
        handles,
        [wrap(label, 48) for label in labels],
        loc="outside lower center",
        ncol=ncol,
        fontsize="small",
        title=title,
        title_fontsize="small",
        frameon=False,
    )


def thin_tick_labels(fig, axes, pad: float = 3.0) -> None:
    """On each of ``axes``, hide the x tick labels that would overlap the label before them (left to
    right; the ticks stay, so every value keeps its mark): an axis with a tick at each of a sweep's
    values (training sizes 400, 500, 800, ..., or lengths 64 ... 131072 beside a legend) labels
    as many as fit. Measured by the renderer on the figure as laid out, so call it last."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in axes:
        lo, hi = sorted(ax.xaxis.get_view_interval())
        ticks = [
            t
            for t in ax.xaxis.get_major_ticks()
            if t.label1.get_visible() and t.label1.get_text().strip() and lo - 1e-9 <= t.get_loc() <= hi + 1e-9
        ]
        kept = None
        for tick in sorted(ticks, key=lambda t: t.get_loc()):
            box = tick.label1.get_window_extent(renderer)
            if kept is not None and box.x0 < kept.x1 + pad:
                tick.label1.set_visible(False)
            else:
                kept = box


#: How the chance level is drawn: a dashed grey horizontal line, named in the legend.
CHANCE_STYLE = {"color": "0.35", "linestyle": "--", "linewidth": 1.0, "zorder": 1.5}


def chance_legend(levels: Sequence[float]) -> str:
    """The legend entry of the chance lines: ``chance level 6.25% (1 in 16)`` when one level, else
    ``chance level (per task)``."""
    from longrange.report.chance import chance_text

    distinct = sorted(set(levels))
    return f"chance level {chance_text(distinct[0])}" if len(distinct) == 1 else "chance level (per task)"


def draw_chance(ax, chance: float | None, scale: float = 100.0, vertical: bool = False):
    """A dashed line at the chance level (``chance`` a fraction, drawn times ``scale``) labelled
    "chance"; the line, or None when there is no chance level."""
    if chance is None:
        return None
    if vertical:
        return ax.axvline(chance * scale, label="chance", **CHANCE_STYLE)
    return ax.axhline(chance * scale, label="chance", **CHANCE_STYLE)


def save_figure(fig, path: str | Path, dpi: int = 100) -> Path:
    """Write ``fig`` as a PNG at ``path`` atomically (a reader never sees half a file) and close it."""
    import io

    from longrange.fileio import atomic_write

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(Path(path), buf.getvalue())


_save = save_figure  # the name the report's own plots use


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
            half[j] = mean_ci(col, CONFIDENCE).half_width
    return steps, mean, half


@dataclass
class Series:
    """One line of a learning-curve panel: a regime's mean over ``n`` seeds with its 95% band
    (clipped to the metric's range), in display units."""

    name: str  # the table's row name, e.g. "S4 + masked SPT"
    regime: str
    n: int
    steps: np.ndarray
    mean: np.ndarray
    lower: np.ndarray
    upper: np.ndarray

    @property
    def legend(self) -> str:
        return f"{self.name} (n={self.n})"


@dataclass
class CurvePanel:
    task: str
    label: str
    metric: str
    title: str
    ylabel: str
    series: list[Series]
    #: The chance level of the panel's accuracy (a fraction; ``report/chance.py``), or None.
    chance: float | None = None


def curve_panels(runs: Sequence[Run], split: str = "val") -> tuple[list[CurvePanel], list[str]]:
    """The data behind :func:`learning_curves`: panels per (task, label) with one series per
    regime, and the runs without a curve on ``split``."""
    missing = []
    panels: dict[tuple[str, str], dict[str, list[list[tuple[int, float]]]]] = {}
    metrics: dict[tuple[str, str], str] = {}
    members: dict[tuple[str, str], list[Run]] = {}
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
        members.setdefault((r.task, r.label), []).append(r)
    out = []
    for key in sorted(panels, key=lambda k: (task_sort_key(k[0]), k[1])):
        task, label = key
        metric = metrics[key]
        fmt = metric_format(metric)
        series = []
        for regime in sorted(panels[key], key=regime_sort_key):
            curves = panels[key][regime]
            steps, mean, half = mean_curve(curves)
            lower, upper = clip_band(metric, mean, half)
            series.append(
                Series(
                    row_name(label, regime),
                    regime,
                    len(curves),
                    steps,
                    mean * fmt.scale,
                    lower * fmt.scale,
                    upper * fmt.scale,
                )
            )
        title = f"{task}: {label}, {'validation' if split == 'val' else split} {fmt.name}"
        from longrange.report.chance import common_chance

        chance = common_chance(members[key]) if metric == "accuracy" else None
        out.append(CurvePanel(task, label, metric, title, fmt.name, series, chance))
    return out, missing


#: Regimes as a legend says them beside a panel titled by the model.
def regime_words(regime: str) -> str:
    """``scratch``, ``masked SPT``, ``scratch, matched compute``: a row name without its model."""
    suffix = REGIME_SUFFIX.get(regime)
    if suffix is None:
        return regime
    words = suffix.strip().removeprefix("+ ")
    if words.startswith("(") and words.endswith(")"):  # " (scratch, matched compute)": the parentheses around all of it
        words = words[1:-1]
    return words or "scratch"


def _n_text(ns: Sequence[int]) -> str:
    lo, hi = min(ns), max(ns)
    return f"n={lo}" if lo == hi else f"n={lo}–{hi}"


def curves_figure(panels: Sequence[CurvePanel], split: str = "val"):
    """The figure of :func:`learning_curves`: per task a block of panels, one per model (label) in rows
    of up to 4, sharing their x and y axes; one line per regime; one legend of the regimes below."""
    by_task: dict[str, list[CurvePanel]] = {}
    for panel in panels:
        by_task.setdefault(panel.task, []).append(panel)
    cols = min(4, max(len(v) for v in by_task.values()))
    blocks = [(task, items, math.ceil(len(items) / cols)) for task, items in by_task.items()]
    nrows = sum(rows for _, _, rows in blocks)
    fig, grid = plt.subplots(nrows, cols, figsize=(3.6 * cols, 2.9 * nrows + 0.8), squeeze=False, layout="constrained")
    handles: dict[str, object] = {}
    chances: list[float] = []
    row = 0
    for task, items, rows in blocks:
        axes = [grid[row + k // cols][k % cols] for k in range(len(items))]
        for k in range(len(items), rows * cols):
            grid[row + k // cols][k % cols].set_visible(False)
        first = axes[0]
        for k, (ax, panel) in enumerate(zip(axes, items)):
            if ax is not first:
                ax.sharex(first)
                ax.sharey(first)
            for j, s in enumerate(panel.series):
                style = regime_style(s.regime)
                # Markers keep runs with a single evaluation visible; markevery staggers them so that
                # markers of overlapping lines do not hide each other.
                every = (j % 3, 3) if len(s.steps) > 12 else None
                (line,) = ax.plot(s.steps, s.mean, markersize=4, lw=1.4, markevery=every, label=s.legend, **style)
                handles.setdefault(s.regime, line)
                if np.isfinite(s.upper).any():
                    ax.fill_between(s.steps, s.lower, s.upper, color=style["color"], alpha=0.15, lw=0)
            chance_line = draw_chance(ax, panel.chance, metric_format(panel.metric).scale)
            if chance_line is not None:
                handles.setdefault("chance", chance_line)
                chances.append(panel.chance)
            ax.set_title(wrap(f"{panel.label} ({_n_text([s.n for s in panel.series])})", 34), fontsize="medium")
            ax.grid(alpha=0.3)
            if k % cols == 0:
                ax.set_ylabel(wrap(f"{task}: {'validation' if split == 'val' else split} {panel.ylabel}", 30))
            else:
                ax.tick_params(labelleft=False)
            if k >= len(items) - cols:
                ax.set_xlabel("step")
            ax.tick_params(labelsize="small")
        lo, hi = METRIC_RANGE.get(items[0].metric, (-math.inf, math.inf))
        scale = metric_format(items[0].metric).scale
        bottom, top = first.get_ylim()
        first.set_ylim(max(bottom, lo * scale), min(top, hi * scale))
        row += rows
    order = sorted((r for r in handles if r != "chance"), key=regime_sort_key) + (["chance"] if chances else [])
    legend_below(
        fig,
        [handles[r] for r in order],
        [chance_legend(chances) if r == "chance" else regime_words(r) for r in order],
        "mean over seeds (n), 95% CI band",
        columns=4,
    )
    return fig


def learning_curves(
    runs: Sequence[Run], path: str | Path, split: str = "val", warn: Callable[[str], None] | None = None
) -> Path | None:
    """Metric on ``split`` vs step: per task, one panel per model (label) sharing one x and one y axis,
    one line per regime (mean over seeds, with a 95% CI band clipped to the metric's range; the
    panel's title gives the number of seeds), the regimes in one legend below the panels. Each
    regime has its own colour, line style and marker. Runs without ``metrics.jsonl`` or without
    values on ``split`` are passed to ``warn`` in one message and left out. None if no run has a curve."""
    panels, missing = curve_panels(runs, split)
    if missing and warn is not None:
        warn(f"{len(missing)} run(s) have no {split} curve in {METRICS_FILE}, not plotted: {', '.join(missing)}")
    if not panels:
        return None
    return _save(curves_figure(panels, split), path)


@dataclass
class Bar:
    """One bar of :func:`scratch_vs_spt_bars`: a table row's mean with its 95% CI clipped to the
    metric's range, in display units (``lower``/``upper`` None for a single seed)."""

    name: str  # the table's row name
    regime: str
    x: float
    mean: float
    lower: float | None
    upper: float | None
    n: int


@dataclass
class BarPanel:
    task: str
    title: str
    ylabel: str
    bars: list[Bar]


def bar_panels(cells: Sequence[ResultCell]) -> list[BarPanel]:
    """The data behind :func:`scratch_vs_spt_bars`: per task a panel of bars, grouped by model
    label (a gap between models), each named as its row of the results table."""
    final = [c for c in cells if c.kind == "final"]
    out = []
    for task in sorted({c.task for c in final}, key=task_sort_key):
        here = [c for c in final if c.task == task]
        bars: list[Bar] = []
        x = 0.0
        for label in sorted({c.label for c in here}):
            mine = sorted((c for c in here if c.label == label), key=lambda c: regime_sort_key(c.regime))
            for cell in mine:
                s, f = cell.stat, cell.format
                lower = upper = None
                if s.half_width is not None and math.isfinite(s.half_width):
                    lo, hi = clip_band(cell.metric, np.array([s.mean]), np.array([s.half_width]))
                    lower, upper = float(lo[0]) * f.scale, float(hi[0]) * f.scale
                bars.append(Bar(cell.row, cell.regime, x, s.mean * f.scale, lower, upper, s.n))
                x += 1.0
            x += 0.6  # a gap between models
        fmts = sorted({c.format.name for c in here})
        sources = {c.source for c in here}
        what = "test" if sources == {"test"} else "best validation" if sources == {"val"} else "test / best validation"
        out.append(BarPanel(task, f"{task}: {what} {' / '.join(fmts)}", " / ".join(fmts), bars))
    return out


HATCHES = ("", "//", "..", "xx", "\\\\", "--")


def bars_figure(panels: Sequence[BarPanel]):
    """The figure of :func:`scratch_vs_spt_bars`: per task a panel of horizontal bars, stacked, each as
    tall as its bars need, the row names (wrapped) beside their bars."""
    sizes = [max(len(p.bars), 1) for p in panels]
    heights = [0.42 * n + 1.1 for n in sizes]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(8.0, sum(heights)),
        squeeze=False,
        layout="constrained",
        gridspec_kw={"height_ratios": heights},
    )
    for ax, panel in zip(axes[:, 0], panels):
        for b in panel.bars:
            err = None
            if b.lower is not None and b.upper is not None:
                err = [[b.mean - b.lower], [b.upper - b.mean]]
            ax.barh(
                [b.x],
                [b.mean],
                height=0.8,
                xerr=err,
                capsize=3,
                color=regime_colour(b.regime),
                hatch=HATCHES[_regime_index(b.regime) % len(HATCHES)],
                edgecolor="white",
                linewidth=0,
            )
        ax.set_yticks([b.x for b in panel.bars])
        ax.set_yticklabels([wrap(f"{b.name} (n={b.n})", 52) for b in panel.bars], fontsize="small")
        ax.invert_yaxis()  # the first row of the table on top
        ax.set_title(wrap(panel.title, 80), fontsize="medium")
        ax.set_xlabel(panel.ylabel)
        ax.grid(axis="x", alpha=0.3)
    return fig


def scratch_vs_spt_bars(cells: Sequence[ResultCell], path: str | Path) -> Path | None:
    """Per task a panel with one horizontal bar per row of the results table (named as there beside
    it, grouped by model, coloured and hatched by regime) with its 95% CI clipped to the metric's range."""
    panels = bar_panels(cells)
    if not panels:
        return None
    return _save(bars_figure(panels), path)


@dataclass
class KernelLine:
    """One (row, direction) of a kernel panel: the mean envelope over its runs and each run's."""

    label: str
    regime: str
    direction: str
    mean: np.ndarray  # (L,) mean over runs of the normalised envelopes
    runs: list[np.ndarray]  # one envelope per run (seed)


def kernel_lines(
    reports: Mapping[str, tuple[str, KernelReport | Sequence[KernelReport]]],
) -> dict[int, list[KernelLine]]:
    """Per layer, one :class:`KernelLine` per (row, direction): ``reports`` maps a row's name to (its
    regime, its runs' :class:`KernelReport` or reports, e.g. one per seed)."""
    lines: dict[int, list[KernelLine]] = {}
    for name, (regime, reps) in reports.items():
        reps = [reps] if isinstance(reps, KernelReport) else list(reps)
        keys = sorted(
            {(p.layer, p.direction) for rep in reps for p in rep.profiles},
            key=lambda k: (k[0], DIRECTION_NAMES.index(k[1]) if k[1] in DIRECTION_NAMES else 2),
        )
        for layer, direction in keys:
            envs = [p.envelope for rep in reps for p in rep.profiles if p.layer == layer and p.direction == direction]
            size = min(len(e) for e in envs)
            envs = [np.asarray(e[:size], dtype=np.float64) for e in envs]
            label = (
                name
                + (f" ({direction})" if direction != "forward" else "")
                + (f", n={len(envs)}" if len(envs) > 1 else "")
            )
            lines.setdefault(layer, []).append(KernelLine(label, regime, direction, np.mean(envs, axis=0), envs))
    return dict(sorted(lines.items()))


def kernel_figure(panels: Mapping[int, list[KernelLine]], title: str = ""):
    """The figure of :func:`kernel_decay_plot`: a panel per layer sharing both log axes, the rows in one
    legend below the panels."""
    fig, axes = _grid(len(panels), width=4.2, height=3.2)
    styles = {"forward": "-", "backward": "--"}
    handles: dict[str, object] = {}
    for k, (ax, (layer, lines)) in enumerate(zip(axes, panels.items())):
        if k:
            ax.sharex(axes[0])
            ax.sharey(axes[0])
        for line in lines:
            colour, style = regime_colour(line.regime), styles.get(line.direction, ":")
            lag = np.arange(1, len(line.mean) + 1)
            if len(line.runs) > 1:
                for env in line.runs:
                    ax.plot(lag, np.where(env > 0, env, np.nan), style, color=colour, lw=0.6, alpha=0.25)
            (drawn,) = ax.plot(
                lag, np.where(line.mean > 0, line.mean, np.nan), style, color=colour, lw=1.6, label=line.label
            )
            handles.setdefault(line.label, drawn)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("lag + 1 (steps)")
        ax.set_ylabel("mean |K| / max")
        ax.set_title(f"layer {layer}", fontsize="medium")
        ax.grid(alpha=0.3, which="both")
        ax.tick_params(labelsize="small")
    legend_below(fig, list(handles.values()), list(handles), "mean over seeds (thin: each seed)", columns=2)
    if title:
        fig.suptitle(wrap(title.rstrip(", "), 90))
    return fig


def kernel_decay_plot(
    reports: Mapping[str, tuple[str, KernelReport | Sequence[KernelReport]]], path: str | Path, title: str = ""
) -> Path | None:
    """Kernel envelopes on log-log axes, one panel per layer, all panels on the same axes.

    ``reports`` maps a row's name (the legend entry, as in the tables) to (its regime, its runs'
    :class:`KernelReport`, or one per seed). Each row and direction is one thick line, the mean
    envelope over its runs, with each run as a thin line of the same style behind it; the legend
    (below the panels) names rows, not runs. The x axis is lag + 1 (log axes need positive
    values); zero envelope values are not drawn. None if no report has kernels.
    """
    panels = kernel_lines(reports)
    if not panels:
        return None
    return _save(kernel_figure(panels, title), path)


def accuracy_against(
    series: Mapping[str, Sequence[tuple[int, float | None]]],
    path: str | Path,
    xlabel: str,
    title: str,
    mark: int | None = None,
    chance: float | None = None,
) -> Path:
    """Test accuracy (%) against a length or size on a log2 axis, one line per series (points of
    None left out); ``mark``: a dotted vertical line there (a training length); ``chance`` (a
    fraction): the dashed chance line. The studies' plots of accuracy against length draw with it."""
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    xs_all = sorted({x for pts in series.values() for x, _ in pts})
    for i, (name, pts) in enumerate(series.items()):
        shown = [(x, 100 * y) for x, y in pts if y is not None]
        if shown:
            ax.plot(
                [x for x, _ in shown],
                [y for _, y in shown],
                marker=MARKERS[i % len(MARKERS)],
                linestyle=LINESTYLES[i % len(LINESTYLES)],
                label=name,
            )
    if mark is not None:
        ax.axvline(mark, color="grey", linestyle=":", linewidth=1)
    draw_chance(ax, chance)
    ax.set_xscale("log", base=2)
    if xs_all and len(xs_all) <= 8:
        ax.set_xticks(xs_all, [str(x) for x in xs_all])
        ax.minorticks_off()
    ax.set_ylim(-2, 102)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize="medium")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", frameon=False)
    fig.tight_layout()
    return save_figure(fig, path)
