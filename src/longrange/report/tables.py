"""Tables of runs aggregated over seeds: Markdown (the papers' layout) and CSV.

Final-stage runs (stage ``train`` or ``finetune``) are grouped by (task, label, regime) into
cells; each cell shows the mean over seeds ± the half-width of the 95% Student-t confidence
interval (n - 1 degrees of freedom), or the value and "n=1" for a single seed. Rows are model +
regime ("Transformer", "Transformer + masked SPT", ...), columns tasks, then "Avg." over tasks.

The value of a run is its test metric when the summary has one, else its best validation
metric. A cell uses the test metric only if every seed in it has one (so a cell never mixes the
two); the table header says which was used, and cells on validation are marked when the table
mixes both. Accuracy is shown in percent with two decimals, R² and anything else (e.g. a loss)
with three.

Pretraining runs are listed apart, with their pretraining metric (usually the loss).

The runs-per-cell table says where each cell's runs trained and which implementation each op ran
(from their summaries; "unknown" for summaries that do not record it), and
:func:`mixing_warnings` names the cells whose runs differ in either.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from longrange.errors import DataFormatError
from longrange.report.chance import CHANCE_MARK
from longrange.report.collect import FINAL_STAGES, Run

#: Task columns in the order of the Long Range Arena tables; other tasks follow alphabetically.
TASK_ORDER = ("listops", "text", "retrieval", "image", "pathfinder", "pathx", "pathx256")
#: Regimes in the order of the tables and the name each adds to the model label.
REGIME_SUFFIX = {
    "scratch": "",
    "scratch-matched": " (scratch, matched compute)",
    "causal-spt": " + causal SPT",
    "masked-spt": " + masked SPT",
    "f1-spt": " + F1 SPT",
    "f1r1-spt": " + F1R1 SPT",
    "causal-spt-all": " + causal SPT (all inputs)",
    "masked-spt-all": " + masked SPT (all inputs)",
}
CONFIDENCE = 0.95
VAL_MARK = "†"


# ---------------------------------------------------------------------- statistics
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


def row_name(label: str, regime: str) -> str:
    """The table row of a model label under a regime, e.g. ("S4", "masked-spt") -> "S4 + masked SPT"."""
    suffix = REGIME_SUFFIX.get(regime)
    return label + (suffix if suffix is not None else f" ({regime})")


def task_sort_key(task: str) -> tuple[int, str]:
    return (TASK_ORDER.index(task), "") if task in TASK_ORDER else (len(TASK_ORDER), task)


def regime_sort_key(regime: str) -> tuple[int, str]:
    order = list(REGIME_SUFFIX)
    return (order.index(regime), "") if regime in order else (len(order), regime)


@dataclass
class Cell:
    """The runs of one (task, label, regime) and stage kind ("final" or "pretrain"), over seeds."""

    task: str
    label: str
    regime: str
    kind: str
    metric: str
    higher_is_better: bool
    source: str  # "test" or "val"
    runs: list[Run] = field(default_factory=list)

    @property
    def row(self) -> str:
        return row_name(self.label, self.regime)

    @property
    def seeds(self) -> list[int]:
        return sorted(r.seed for r in self.runs)

    @property
    def values(self) -> list[float]:
        """Per-run values in the metric's own units, in seed order."""
        return [r.value(self.source) for r in sorted(self.runs, key=lambda r: r.seed)]

    @property
    def stat(self) -> Stat:
        return mean_ci(self.values, CONFIDENCE)

    @property
    def format(self) -> MetricFormat:
        return metric_format(self.metric)

    def text(self) -> str:
        """"mean ± half-width" in display units, or "value (n=1)"."""
        return stat_text(self.stat, self.format)

    @property
    def chance(self) -> float | None:
        """The chance level of the cell's accuracy (``report/chance.py``), or None."""
        from longrange.report.chance import common_chance

        return common_chance(self.runs) if self.metric == "accuracy" else None

    @property
    def at_chance(self) -> bool:
        """Whether the cell cannot be told from guessing (its interval contains chance, or its mean is at or below it)."""
        from longrange.report.chance import at_chance

        return at_chance(self.stat.mean, self.stat.half_width, self.chance)

    def marked_text(self) -> str:
        """:meth:`text`, with the chance mark when :attr:`at_chance`."""
        return self.text() + (f" {CHANCE_MARK}" if self.at_chance else "")

    @property
    def further_metrics(self) -> list[str]:
        """The metrics besides the cell's own and the loss that every run of the cell reports from
        its source (e.g. ``sequence_accuracy`` of per-position tasks), sorted."""
        names = None
        for r in self.runs:
            found = r.test if self.source == "test" else r.best_val
            have = {k for k, v in (found or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            names = have if names is None else names & have
        return sorted((names or set()) - {self.metric, "loss"})

    def further_text(self, metric: str) -> str:
        """:meth:`text` of a further metric (mean ± half-width over the cell's seeds)."""
        values = [r.value(self.source, metric) for r in sorted(self.runs, key=lambda r: r.seed)]
        return stat_text(mean_ci(values, CONFIDENCE), metric_format(metric))


def stat_text(s: Stat, f: MetricFormat) -> str:
    if s.half_width is None:
        return f"{f.number(s.mean)} (n=1)"
    return f"{f.number(s.mean)} ± {f.number(s.half_width)}"


def aggregate(runs: Iterable[Run]) -> list[Cell]:
    """Cells of ``runs``: one per (stage kind, task, label, regime), sorted for the tables.

    Raises :class:`DataFormatError` when a cell has one seed twice or its runs disagree on the
    metric (both would make the interval meaningless).
    """
    groups: dict[tuple[str, str, str, str], list[Run]] = {}
    for r in runs:
        kind = "final" if r.stage in FINAL_STAGES else "pretrain"
        groups.setdefault((kind, *r.key), []).append(r)
    cells = []
    for (kind, task, label, regime), group in groups.items():
        where = f"(task {task!r}, label {label!r}, regime {regime!r}, {kind} stage)"
        by_seed: dict[int, Run] = {}
        for r in group:
            if r.seed in by_seed:
                raise DataFormatError(
                    f"seed {r.seed} of {where} appears twice: {by_seed[r.seed].path} and {r.path}; "
                    "report one of them", r.summary_file)
            by_seed[r.seed] = r
        metrics = {(r.metric, r.higher_is_better) for r in group}
        if len(metrics) > 1:
            raise DataFormatError(
                f"the runs of {where} use different metrics {sorted(metrics)}", group[0].summary_file)
        metric, hib = metrics.pop()
        source = "test" if all(r.has_test() for r in group) else "val"
        cells.append(Cell(task, label, regime, kind, metric, hib, source, sorted(group, key=lambda r: r.seed)))
    cells.sort(key=lambda c: (c.kind, c.label, regime_sort_key(c.regime), task_sort_key(c.task)))
    return cells


# ---------------------------------------------------------------------- table model
@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(table: Table) -> str:
    lines = [f"### {table.title}", ""]
    lines.append("| " + " | ".join(_escape(h) for h in table.headers) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(table.headers) - 1)) + "|")
    for row in table.rows:
        lines.append("| " + " | ".join(_escape(c) for c in row) + " |")
    if table.notes:
        lines.append("")
        lines.extend(table.notes)
    return "\n".join(lines) + "\n"


def _source_words(source: str) -> str:
    return "test" if source == "test" else "best validation"


def _rows_and_tasks(cells: Sequence[Cell]) -> tuple[list[tuple[str, str]], list[str]]:
    rows: list[tuple[str, str]] = []
    for c in cells:  # cells are sorted by label, then regime
        if (c.label, c.regime) not in rows:
            rows.append((c.label, c.regime))
    tasks = sorted({c.task for c in cells}, key=task_sort_key)
    return rows, tasks


def results_table(cells: Sequence[Cell]) -> Table:
    """The main table of final-stage cells: rows model + regime, columns tasks, then Avg."""
    final = [c for c in cells if c.kind == "final"]
    if not final:
        return Table("Results", ["Model"], [], ["No final-stage (train or finetune) runs."])
    rows, tasks = _rows_and_tasks(final)
    by_key = {(c.label, c.regime, c.task): c for c in final}
    sources = {c.source for c in final}
    task_metric = {}
    for t in tasks:
        names = {c.format.name for c in final if c.task == t}
        task_metric[t] = " / ".join(sorted(names))
    headers = ["Model"] + [f"{t} ({task_metric[t]})" for t in tasks]

    notes = []
    missing = [(row_name(lab, reg), t) for lab, reg in rows for t in tasks if (lab, reg, t) not in by_key]
    formats = {c.format for c in final}
    show_avg = len(tasks) > 1 and not missing and len(formats) == 1
    if len(tasks) > 1 and not show_avg:
        if missing:
            name, t = missing[0]
            more = f" (and {len(missing) - 1} more missing cells)" if len(missing) > 1 else ""
            notes.append(f"Avg. omitted: {name} has no result for {t}{more}.")
        else:
            notes.append("Avg. omitted: the tasks use different metrics (" + ", ".join(sorted(f.name for f in formats)) + ").")
    if show_avg:
        headers.append("Avg.")

    body = []
    for lab, reg in rows:
        line = [row_name(lab, reg)]
        means = []
        for t in tasks:
            c = by_key.get((lab, reg, t))
            if c is None:
                line.append("—")
                continue
            mark = VAL_MARK if len(sources) > 1 and c.source == "val" else ""
            line.append(c.text() + mark + (f" {CHANCE_MARK}" if c.at_chance else ""))
            means.append(c.stat.mean)
        if show_avg:
            fmt = next(iter(formats))
            line.append(fmt.number(sum(means) / len(means)))
        body.append(line)

    if sources == {"test"}:
        what = "test metric"
    elif sources == {"val"}:
        what = "best validation metric (no test results)"
    else:
        what = f"test metric; cells marked {VAL_MARK} have no test result and show the best validation metric"
    title = (f"Results: {what}, mean ± {int(CONFIDENCE * 100)}% confidence interval over seeds "
             "(Student t, n−1 d.o.f.)")
    if show_avg:
        notes.append("Avg. is the mean over tasks of the per-task means.")
    from longrange.report.chance import chance_note, levels_of

    chance = chance_note(levels_of(final), any(c.at_chance for c in final))
    if chance:
        notes.append(chance)
    return Table(title, headers, body, notes)


def _range_text(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}–{fmt.format(hi)}"


def format_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


UNKNOWN = "unknown"


def device_text(run: Run) -> str:
    """Where a run trained, e.g. ``cuda: NVIDIA A100-SXM4-80GB ×4`` or ``cpu: AMD EPYC``."""
    d = run.device
    if not d:
        return UNKNOWN
    kind, name, count = str(d.get("type", "?")), d.get("name"), d.get("count")
    text = f"{kind}: {name}" if name and name != kind else kind
    return text + (f" ×{count}" if isinstance(count, int) and count > 1 else "")


def kernels_text(run: Run) -> str:
    """The implementation each op ran, e.g. ``causal_conv1d=torch, selective_scan=numba``; "-" when
    no op with several implementations ran."""
    if run.kernels is None:
        return UNKNOWN
    return ", ".join(f"{op}={impl}" for op, impl in sorted(run.kernels.items())) or "-"


def _by_value(cell: Cell, text: Callable[[Run], str]) -> dict[str, list[int]]:
    """The seeds of the cell's runs under each value of ``text``, in seed order."""
    out: dict[str, list[int]] = {}
    for r in cell.runs:
        out.setdefault(text(r), []).append(r.seed)
    return out


def _values_text(values: dict[str, list[int]]) -> str:
    if len(values) == 1:
        return next(iter(values))
    return "; ".join(f"{v} (seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))})"
                     for v, seeds in values.items())


def mixing_warnings(cells: Sequence[Cell]) -> list[str]:
    """One line per cell whose runs trained on different devices or ran different kernels (runs
    that do not record them are not counted): their seeds may differ by more than chance."""
    out = []
    for c in cells:
        for what, text in (("devices", device_text), ("kernels", kernels_text)):
            values = {v: seeds for v, seeds in _by_value(c, text).items() if v != UNKNOWN}
            if len(values) > 1:
                stage = "final stage" if c.kind == "final" else "pretraining"
                out.append(f"{c.row} on {c.task} ({stage}) mixes {what}: {_values_text(values)}")
    return out


def state_text(runs: Sequence[Run]) -> str:
    """The recurrent state per sequence of a cell's runs (elements at the task's length); "-" where
    none is recorded (a bidirectional model, which does not generate, or a run made before the
    state size was recorded)."""
    states = [r.state for r in runs if r.state is not None]
    return _range_text(states) if states else "-"


def details_table(cells: Sequence[Cell], kind: str = "final") -> Table:
    """Seeds, steps, parameters, recurrent state, mean wall time, device and kernels per cell (ranges
    where seeds differ; each value with its seeds where they differ)."""
    chosen = [c for c in cells if c.kind == kind]
    headers = ["Model", "Task", "Seeds", "Steps", "Params (total)", "Params (in primitives)", "State",
               "Wall time (mean)", "Device", "Kernels"]
    rows = []
    for c in sorted(chosen, key=lambda c: (c.label, regime_sort_key(c.regime), task_sort_key(c.task))):
        rows.append([
            c.row, c.task,
            f"{len(c.runs)} ({', '.join(str(s) for s in c.seeds)})",
            _range_text([r.steps for r in c.runs]),
            _range_text([r.params_total for r in c.runs]),
            _range_text([r.params_in_primitives for r in c.runs]),
            state_text(c.runs),
            format_duration(sum(r.seconds for r in c.runs) / len(c.runs)),
            _values_text(_by_value(c, device_text)),
            _values_text(_by_value(c, kernels_text)),
        ])
    stage = "final-stage" if kind == "final" else "pretraining"
    return Table(f"Runs per cell ({stage})", headers, rows)


def pretrain_table(cells: Sequence[Cell]) -> Table | None:
    """Pretraining runs with their pretraining metric (mean ± CI over seeds); None if there are none."""
    chosen = [c for c in cells if c.kind == "pretrain"]
    if not chosen:
        return None
    headers = ["Model", "Task", "Metric", "Value", "Seeds", "Steps", "Wall time (mean)"]
    rows = []
    for c in sorted(chosen, key=lambda c: (c.label, regime_sort_key(c.regime), task_sort_key(c.task))):
        better = "higher" if c.higher_is_better else "lower"
        rows.append([
            c.row, c.task, f"{_source_words(c.source)} {c.format.name} ({better} is better)", c.text(),
            f"{len(c.runs)} ({', '.join(str(s) for s in c.seeds)})",
            _range_text([r.steps for r in c.runs]),
            format_duration(sum(r.seconds for r in c.runs) / len(c.runs)),
        ])
    return Table(f"Pretraining runs: mean ± {int(CONFIDENCE * 100)}% confidence interval over seeds", headers, rows)


def further_metrics_table(cells: Sequence[Cell]) -> Table | None:
    """The final-stage cells' further metrics (:attr:`Cell.further_metrics`, e.g. the sequence
    accuracy of per-position tasks), mean ± CI over seeds; None when no cell has any."""
    chosen = [c for c in cells if c.kind == "final" and c.further_metrics]
    if not chosen:
        return None
    names = sorted({m for c in chosen for m in c.further_metrics})
    headers = ["Model", "Task", "Source"] + [metric_format(m).name for m in names]
    rows = []
    for c in sorted(chosen, key=lambda c: (c.label, regime_sort_key(c.regime), task_sort_key(c.task))):
        rows.append([c.row, c.task, _source_words(c.source)]
                    + [c.further_text(m) if m in c.further_metrics else "—" for m in names])
    return Table(f"Further metrics: mean ± {int(CONFIDENCE * 100)}% confidence interval over seeds (the runs' "
                 "values beside the metric of the table above, from the same evaluation)", headers, rows)


def markdown_tables(cells: Sequence[Cell]) -> str:
    """All tables, in Markdown: results, further metrics (when the runs report any), runs per
    cell, and pretraining (when present; runs of pretraining alone have no results table)."""
    final = any(c.kind == "final" for c in cells)
    parts = [render_markdown(results_table(cells))] if final or not cells else []
    further = further_metrics_table(cells)
    if further is not None:
        parts.append(render_markdown(further))
    if final:
        parts.append(render_markdown(details_table(cells, "final")))
    pre = pretrain_table(cells)
    if pre is not None:
        parts.append(render_markdown(pre))
        parts.append(render_markdown(details_table(cells, "pretrain")))
    return "\n".join(parts)


CSV_COLUMNS = [
    "kind", "task", "label", "regime", "row", "metric", "source", "n", "seeds", "mean", "ci95_half_width",
    "std", "display", "steps_mean", "params_total", "params_in_primitives", "state", "seconds_mean",
]


def csv_text(cells: Sequence[Cell]) -> str:
    """One line per cell (final and pretraining), values in the metric's own units (accuracy as a
    fraction); steps and seconds are means over seeds, parameter counts the largest over seeds."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for c in cells:
        s = c.stat
        w.writerow([
            c.kind, c.task, c.label, c.regime, c.row, c.metric, c.source, s.n,
            " ".join(str(x) for x in c.seeds), repr(s.mean),
            "" if s.half_width is None else repr(s.half_width),
            "" if s.std is None else repr(s.std), c.text(),
            sum(r.steps for r in c.runs) / len(c.runs),
            max(r.params_total for r in c.runs), max(r.params_in_primitives for r in c.runs),
            max((r.state for r in c.runs if r.state is not None), default=""),
            sum(r.seconds for r in c.runs) / len(c.runs),
        ])
    return buf.getvalue()
