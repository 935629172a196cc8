"""Data-fraction sweeps in reports: the runs split by training subset, tables per subset, and the
metric against the subset's size.

A comparison run with ``--train-subsets`` (``compare.train_subsets``) records each stage's
``train_subset`` (a fraction in (0, 1] or a count) and the training set size it left
(``train_size``) in its ``summary.json``. Runs of one subset form a :class:`SubsetGroup`,
aggregated into cells as usual (``aggregate.aggregate``); without a sweep there is one group and the
report is as it always was.

With several subsets the report has first one table per task of the metric against the subset
(rows model + regime, the same names as the other tables; columns the subsets), then, per
subset, the usual tables under a ``## Train subset`` heading, and a plot of the same numbers
(:func:`sweep_plot`): x the fraction of the training set, or the number of training examples
when some subsets are counts (log scale); one line per model + regime, the mean over seeds with
its 95% confidence band clipped to the metric's range.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from longrange.report.aggregate import ResultCell, aggregate, regime_sort_key, row_name, task_sort_key
from longrange.report.collect import Run
from longrange.report.plots import METRIC_RANGE
from longrange.report.render import Table, csv_text, markdown_tables, render_markdown
from longrange.report.stats import CONFIDENCE


def metric_range(metric: str) -> tuple[float, float]:
    """(lowest, highest) value ``metric`` can take."""
    return METRIC_RANGE.get(metric, (-math.inf, math.inf))


def confidence_band(mean: float, half_width: float | None, metric: str) -> tuple[float, float]:
    """``mean ± half_width`` clipped to ``metric``'s range (NaN, NaN when there is no interval)."""
    if half_width is None:
        return math.nan, math.nan
    lo, hi = metric_range(metric)
    return max(lo, mean - half_width), min(hi, mean + half_width)


def subset_text(subset: float | int | None) -> str:
    """``0.1``, ``500 examples``, or ``all`` (no subset)."""
    if subset is None:
        return "all"
    return f"{subset!r}" if isinstance(subset, float) else f"{subset} examples"


@dataclass
class SubsetGroup:
    """The runs of one training subset (``subset`` None: runs without one) and their cells."""

    subset: float | int | None
    runs: list[Run]
    cells: list[ResultCell] = field(default_factory=list)

    def train_size(self, task: str | None = None) -> int | None:
        """The training set size of the group's final runs (of ``task``), None if not recorded
        (or not the same for every run)."""
        sizes = {r.train_size for r in self.runs if r.is_final and (task is None or r.task == task)}
        return sizes.pop() if len(sizes) == 1 and None not in sizes else None

    @property
    def title(self) -> str:
        if self.subset is None and not any(r.is_final for r in self.runs):
            return "Pretraining on all training inputs"
        if self.subset is None:
            return "Train subset: all training data"
        size = self.train_size()
        return f"Train subset {subset_text(self.subset)}" + (f" ({size:,} training examples)" if size else "")

    @property
    def file_suffix(self) -> str:
        """A suffix for the group's plot files: ``_subset0.1``, ``_subset500``, ``_all``."""
        return "_all" if self.subset is None else f"_subset{self.subset!r}"


def _sort_key(group: SubsetGroup) -> tuple:
    size = group.train_size()
    if group.subset is None:
        return (1, math.inf, math.inf)
    fraction = group.subset if isinstance(group.subset, float) else math.inf
    return (0, size if size is not None else math.inf, fraction, group.subset)


def split_by_subset(runs: Sequence[Run]) -> list[SubsetGroup]:
    """The runs grouped by ``train_subset`` (smallest training set first), each aggregated into cells.

    Runs without a sweep have one group, whose cells are ``aggregate(runs)``.
    """
    by_subset: dict[tuple[str, float | int | None], list[Run]] = {}
    for r in runs:
        # 1.0 (the whole set, a fraction) and 1 (one example, a count) are different subsets.
        by_subset.setdefault((type(r.train_subset).__name__, r.train_subset), []).append(r)
    groups = [SubsetGroup(subset, group) for (_, subset), group in by_subset.items()]
    for g in groups:
        g.cells = aggregate(g.runs)
    return sorted(groups, key=_sort_key)


def is_sweep(groups: Sequence[SubsetGroup]) -> bool:
    return len(groups) > 1


def final_subsets(groups: Sequence[SubsetGroup]) -> int:
    """How many groups hold final-stage runs (pretraining on all inputs has a group of its own)."""
    return sum(any(r.is_final for r in g.runs) for g in groups)


# ---------------------------------------------------------------------------------- tables
def sweep_table(groups: Sequence[SubsetGroup], task: str) -> Table:
    """The final-stage metric of ``task`` against the subset: rows model + regime, columns subsets."""
    cols = [g for g in groups if any(c.kind == "final" and c.task == task for c in g.cells)]
    rows: list[tuple[str, str]] = sorted(
        {(c.label, c.regime) for g in cols for c in g.cells if c.kind == "final" and c.task == task},
        key=lambda k: (k[0], regime_sort_key(k[1])),
    )
    headers = ["Model"]
    for g in cols:
        size = g.train_size(task)
        headers.append(subset_text(g.subset) + (f" (n_train={size:,})" if size else ""))
    body, sources, names = [], set(), set()
    for label, regime in rows:
        line = [row_name(label, regime)]
        for g in cols:
            cell = next(
                (
                    c
                    for c in g.cells
                    if c.kind == "final" and c.task == task and c.label == label and c.regime == regime
                ),
                None,
            )
            line.append("—" if cell is None else cell.marked_text())
            if cell is not None:
                sources.add(cell.source)
                names.add(cell.format.name)
        body.append(line)
    what = "test" if sources == {"test"} else "best validation" if sources == {"val"} else "test / best validation"
    title = (
        f"{task}: {what} {' / '.join(sorted(names))} against the training subset, mean ± "
        f"{int(CONFIDENCE * 100)}% confidence interval over seeds"
    )
    from longrange.report.chance import chance_note, levels_of

    cells = [c for g in cols for c in g.cells if c.kind == "final" and c.task == task]
    note = chance_note(levels_of(cells), any(c.at_chance for c in cells))
    return Table(title, headers, body, [note] if note else [])


def sweep_tables(groups: Sequence[SubsetGroup]) -> str:
    """The report's tables in Markdown: as ever without a sweep; with one, the metric against the
    subset per task, then the tables of each subset under its heading."""
    if not is_sweep(groups):
        return markdown_tables(groups[0].cells if groups else [])
    parts = []
    tasks = sorted({c.task for g in groups for c in g.cells if c.kind == "final"}, key=task_sort_key)
    if tasks and final_subsets(groups) > 1:
        parts.append(
            "## Metric against the training subset\n\n"
            + "\n".join(render_markdown(sweep_table(groups, t)) for t in tasks)
        )
    parts += [f"## {g.title}\n\n" + markdown_tables(g.cells) for g in groups]
    return "\n".join(parts)


def sweep_csv_text(groups: Sequence[SubsetGroup]) -> str:
    """The cells as CSV (``render.csv_text``); with a sweep, two more leading columns:
    ``train_subset`` and ``train_size`` (empty when not recorded)."""
    if not is_sweep(groups):
        return csv_text(groups[0].cells if groups else [])
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for i, g in enumerate(groups):
        rows = list(csv.reader(io.StringIO(csv_text(g.cells))))
        if i == 0:
            w.writerow(["train_subset", "train_size"] + rows[0])
        for row, cell in zip(rows[1:], g.cells):
            size = g.train_size(cell.task) if cell.kind == "final" else None
            w.writerow(["" if g.subset is None else repr(g.subset), "" if size is None else size] + row)
    return buf.getvalue()


def write_sweep_csv(groups: Sequence[SubsetGroup], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(sweep_csv_text(groups))
    return path


# ----------------------------------------------------------------------------------- plot
def _x_of(groups: Sequence[SubsetGroup], task: str) -> tuple[str, dict[int, float]]:
    """The x axis of ``task``'s panel: ("fraction", ...) when every subset is a fraction (no
    subset = 1.0), else ("size", ...) from the recorded training set sizes; maps group index to x."""
    if all(g.subset is None or isinstance(g.subset, float) for g in groups):
        return "fraction", {i: (1.0 if g.subset is None else float(g.subset)) for i, g in enumerate(groups)}
    xs = {}
    for i, g in enumerate(groups):
        size = g.train_size(task)
        if size is not None:
            xs[i] = float(size)
    return "size", xs


def _n_text(ns: Sequence[int]) -> str:
    lo, hi = min(ns), max(ns)
    return f"n={lo}" if lo == hi else f"n={lo}–{hi}"


def sweep_plot(
    groups: Sequence[SubsetGroup], path: str | Path, warn: Callable[[str], None] | None = None
) -> Path | None:
    """The final-stage metric against the training subset: one panel per task, one line per model +
    regime (mean over seeds, 95% confidence band clipped to the metric's range, the number of seeds
    in the legend). None without a sweep (two or more subsets with final-stage runs)."""
    if final_subsets(groups) < 2:
        return None
    import numpy as np

    from longrange.report.chance import common_chance
    from longrange.report.plots import (
        _grid,
        _save,
        chance_legend,
        draw_chance,
        legend_below,
        regime_colour,
        thin_tick_labels,
        wrap,
    )

    tasks = sorted({c.task for g in groups for c in g.cells if c.kind == "final"}, key=task_sort_key)
    if not tasks:
        return None
    fig, axes = _grid(len(tasks), width=5.0)
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D", "v"]
    handles: dict[str, object] = {}
    seeds: dict[str, list[int]] = {}
    chances: list[float] = []
    for ax, task in zip(axes, tasks):
        kind, xs = _x_of(groups, task)
        left_out = [
            subset_text(g.subset)
            for i, g in enumerate(groups)
            if i not in xs and any(c.task == task and c.kind == "final" for c in g.cells)
        ]
        if left_out and warn is not None:
            warn(f"{task}: the training set size of subset(s) {', '.join(left_out)} is not recorded; not plotted")
        lines: dict[tuple[str, str], list[tuple[float, ResultCell]]] = {}
        for i, g in enumerate(groups):
            if i not in xs:
                continue
            for c in g.cells:
                if c.kind == "final" and c.task == task:
                    lines.setdefault((c.label, c.regime), []).append((xs[i], c))
        labels = sorted({label for label, _ in lines})
        names, sources = set(), set()
        for label, regime in sorted(lines, key=lambda k: (k[0], regime_sort_key(k[1]))):
            points = sorted(lines[(label, regime)], key=lambda p: p[0])
            x = np.array([p[0] for p in points])
            stats = [c.stat for _, c in points]
            fmt = points[0][1].format
            mean = np.array([s.mean for s in stats])
            low, high = np.array(
                [confidence_band(s.mean, s.half_width, c.metric) for s, (_, c) in zip(stats, points)]
            ).T
            k = labels.index(label)
            colour = regime_colour(regime)
            name = row_name(label, regime)
            (line,) = ax.plot(
                x,
                mean * fmt.scale,
                linestyle=styles[k % len(styles)],
                marker=markers[k % len(markers)],
                color=colour,
                label=name,
            )
            handles.setdefault(name, line)
            seeds.setdefault(name, []).extend(s.n for s in stats)
            band = np.isfinite(low)
            if band.any():
                ax.fill_between(x[band], low[band] * fmt.scale, high[band] * fmt.scale, color=colour, alpha=0.15, lw=0)
            names.add(fmt.name)
            sources.update(c.source for _, c in points)
        cells = [c for points in lines.values() for _, c in points]
        chance = common_chance(r for c in cells for r in c.runs) if cells and cells[0].metric == "accuracy" else None
        chance_line = draw_chance(ax, chance, cells[0].format.scale if cells else 100.0)
        if chance_line is not None:
            chances.append(chance)
            chance_handle = chance_line
        what = "test" if sources == {"test"} else "best validation" if sources == {"val"} else "test / best val."
        ax.set_xscale("log")
        ticks = sorted({x for pts in lines.values() for x, _ in pts})
        ax.set_xticks(ticks, [f"{t:g}" if kind == "fraction" else f"{t:,.0f}" for t in ticks])  # a tick at each size
        ax.minorticks_off()
        ax.set_xlabel("fraction of the training set" if kind == "fraction" else "training examples")
        ax.set_ylabel(" / ".join(sorted(names)))
        ax.set_title(
            wrap(f"{task}: {what} {' / '.join(sorted(names))} against the training subset", 44), fontsize="medium"
        )
        ax.grid(alpha=0.3, which="both")
    names = [f"{name} ({_n_text(seeds[name])})" for name in handles]
    shown = list(handles.values())
    if chances:
        shown.append(chance_handle)
        names.append(chance_legend(chances))
    legend_below(fig, shown, names, "mean over seeds, 95% CI band", columns=2)
    thin_tick_labels(fig, axes)
    return _save(fig, path)
