"""The report's tables: the table model (:class:`Table`), its Markdown (:func:`render_markdown`), the
tables of aggregated cells (results, further metrics, runs per cell, pretraining:
:func:`markdown_tables`) and their CSV (:func:`csv_text`).

The results table has rows model + regime and columns tasks, then "Avg." over tasks; each cell
shows the mean over seeds ± the half-width of the 95% Student-t confidence interval (n - 1 degrees
of freedom), or the value and "n=1" for a single seed. The table header says whether the test or
the best validation metric was used, and cells on validation are marked (:data:`VAL_MARK`) when
the table mixes both. Pretraining runs are listed apart, with their pretraining metric (usually the
loss). The runs-per-cell table says where each cell's runs trained and which implementation each
op ran (``report/environment.py``).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass, field

from longrange.report.aggregate import ResultCell, regime_sort_key, row_name, task_sort_key
from longrange.report.chance import CHANCE_MARK
from longrange.report.collect import Run
from longrange.report.environment import device_text, kernels_text, seeds_by_value, values_text
from longrange.report.formats import format_duration, metric_format, range_text
from longrange.report.stats import CONFIDENCE

#: The mark of a cell on the best validation metric in a table whose other cells are on test.
VAL_MARK = "†"


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


def _rows_and_tasks(cells: Sequence[ResultCell]) -> tuple[list[tuple[str, str]], list[str]]:
    rows: list[tuple[str, str]] = []
    for c in cells:  # cells are sorted by label, then regime
        if (c.label, c.regime) not in rows:
            rows.append((c.label, c.regime))
    tasks = sorted({c.task for c in cells}, key=task_sort_key)
    return rows, tasks


def results_table(cells: Sequence[ResultCell]) -> Table:
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
            notes.append(
                "Avg. omitted: the tasks use different metrics (" + ", ".join(sorted(f.name for f in formats)) + ")."
            )
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
    title = f"Results: {what}, mean ± {int(CONFIDENCE * 100)}% confidence interval over seeds (Student t, n−1 d.o.f.)"
    if show_avg:
        notes.append("Avg. is the mean over tasks of the per-task means.")
    from longrange.report.chance import chance_note, levels_of

    chance = chance_note(levels_of(final), any(c.at_chance for c in final))
    if chance:
        notes.append(chance)
    return Table(title, headers, body, notes)


def state_text(runs: Sequence[Run]) -> str:
    """The recurrent state per sequence of a cell's runs (elements at the task's length); "-" where
    none is recorded (a bidirectional model, which does not generate, or a run made before the
    state size was recorded)."""
    states = [r.state for r in runs if r.state is not None]
    return range_text(states) if states else "-"


def details_table(cells: Sequence[ResultCell], kind: str = "final") -> Table:
    """Seeds, steps, parameters, recurrent state, mean wall time, device and kernels per cell (ranges
    where seeds differ; each value with its seeds where they differ)."""
    chosen = [c for c in cells if c.kind == kind]
    headers = [
        "Model",
        "Task",
        "Seeds",
        "Steps",
        "Params (total)",
        "Params (in primitives)",
        "State",
        "Wall time (mean)",
        "Device",
        "Kernels",
    ]
    rows = []
    for c in sorted(chosen, key=lambda c: (c.label, regime_sort_key(c.regime), task_sort_key(c.task))):
        rows.append(
            [
                c.row,
                c.task,
                f"{len(c.runs)} ({', '.join(str(s) for s in c.seeds)})",
                range_text([r.steps for r in c.runs]),
                range_text([r.params_total for r in c.runs]),
                range_text([r.params_in_primitives for r in c.runs]),
                state_text(c.runs),
                format_duration(sum(r.seconds for r in c.runs) / len(c.runs)),
                values_text(seeds_by_value(c, device_text)),
                values_text(seeds_by_value(c, kernels_text)),
            ]
        )
    stage = "final-stage" if kind == "final" else "pretraining"
    return Table(f"Runs per cell ({stage})", headers, rows)


def pretrain_table(cells: Sequence[ResultCell]) -> Table | None:
    """Pretraining runs with their pretraining metric (mean ± CI over seeds); None if there are none."""
    chosen = [c for c in cells if c.kind == "pretrain"]
    if not chosen:
        return None
    headers = ["Model", "Task", "Metric", "Value", "Seeds", "Steps", "Wall time (mean)"]
    rows = []
    for c in sorted(chosen, key=lambda c: (c.label, regime_sort_key(c.regime), task_sort_key(c.task))):
        better = "higher" if c.higher_is_better else "lower"
        rows.append(
            [
                c.row,
                c.task,
                f"{_source_words(c.source)} {c.format.name} ({better} is better)",
                c.text(),
                f"{len(c.runs)} ({', '.join(str(s) for s in c.seeds)})",
                range_text([r.steps for r in c.runs]),
                format_duration(sum(r.seconds for r in c.runs) / len(c.runs)),
            ]
        )
    return Table(f"Pretraining runs: mean ± {int(CONFIDENCE * 100)}% confidence interval over seeds", headers, rows)


def further_metrics_table(cells: Sequence[ResultCell]) -> Table | None:
    """The final-stage cells' further metrics (:attr:`ResultCell.further_metrics`, e.g. the sequence
    accuracy of per-position tasks), mean ± CI over seeds; None when no cell has any."""
    chosen = [c for c in cells if c.kind == "final" and c.further_metrics]
    if not chosen:
        return None
    names = sorted({m for c in chosen for m in c.further_metrics})
    headers = ["Model", "Task", "Source"] + [metric_format(m).name for m in names]
    rows = []
    for c in sorted(chosen, key=lambda c: (c.label, regime_sort_key(c.regime), task_sort_key(c.task))):
        rows.append(
            [c.row, c.task, _source_words(c.source)]
            + [c.further_text(m) if m in c.further_metrics else "—" for m in names]
        )
    return Table(
        f"Further metrics: mean ± {int(CONFIDENCE * 100)}% confidence interval over seeds (the runs' "
        "values beside the metric of the table above, from the same evaluation)",
        headers,
        rows,
    )


def markdown_tables(cells: Sequence[ResultCell]) -> str:
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
    "kind",
    "task",
    "label",
    "regime",
    "row",
    "metric",
    "source",
    "n",
    "seeds",
    "mean",
    "ci95_half_width",
    "std",
    "display",
    "steps_mean",
    "params_total",
    "params_in_primitives",
    "state",
    "seconds_mean",
]


def csv_text(cells: Sequence[ResultCell]) -> str:
    """One line per cell (final and pretraining), values in the metric's own units (accuracy as a
    fraction); steps and seconds are means over seeds, parameter counts the largest over seeds."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for c in cells:
        s = c.stat
        w.writerow(
            [
                c.kind,
                c.task,
                c.label,
                c.regime,
                c.row,
                c.metric,
                c.source,
                s.n,
                " ".join(str(x) for x in c.seeds),
                repr(s.mean),
                "" if s.half_width is None else repr(s.half_width),
                "" if s.std is None else repr(s.std),
                c.text(),
                sum(r.steps for r in c.runs) / len(c.runs),
                max(r.params_total for r in c.runs),
                max(r.params_in_primitives for r in c.runs),
                max((r.state for r in c.runs if r.state is not None), default=""),
                sum(r.seconds for r in c.runs) / len(c.runs),
            ]
        )
    return buf.getvalue()
