"""Tables of runs aggregated over seeds: Markdown (the papers' layout) and CSV. Every public name of
the modules below, importable from here as ever.

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

Where each job lives:

* ``report/stats.py``: the mean and its Student-t interval (:func:`mean_ci`, :func:`t_critical`);
* ``report/formats.py``: numbers as the tables show them (:func:`metric_format`, :func:`stat_text`, ...);
* ``report/aggregate.py``: runs grouped into :class:`ResultCell`\\ s (:func:`aggregate`), rows and their order;
* ``report/environment.py``: each run's device and kernels, and the cells that mix them;
* ``report/render.py``: the tables themselves, in Markdown and CSV.
"""

from __future__ import annotations

from longrange.report.aggregate import (
    REGIME_SUFFIX,
    TASK_ORDER,
    ResultCell,
    aggregate,
    regime_sort_key,
    row_name,
    task_sort_key,
)
from longrange.report.environment import UNKNOWN, device_text, kernels_text, mixing_warnings
from longrange.report.formats import MetricFormat, format_duration, metric_format, stat_text
from longrange.report.render import (
    CSV_COLUMNS,
    VAL_MARK,
    Table,
    csv_text,
    details_table,
    further_metrics_table,
    markdown_tables,
    pretrain_table,
    render_markdown,
    results_table,
    state_text,
)
from longrange.report.stats import CONFIDENCE, Stat, mean_ci, t_critical, t_quantile

__all__ = [
    "CONFIDENCE",
    "CSV_COLUMNS",
    "MetricFormat",
    "REGIME_SUFFIX",
    "ResultCell",
    "Stat",
    "TASK_ORDER",
    "Table",
    "UNKNOWN",
    "VAL_MARK",
    "aggregate",
    "csv_text",
    "details_table",
    "device_text",
    "format_duration",
    "further_metrics_table",
    "kernels_text",
    "markdown_tables",
    "mean_ci",
    "metric_format",
    "mixing_warnings",
    "pretrain_table",
    "regime_sort_key",
    "render_markdown",
    "results_table",
    "row_name",
    "stat_text",
    "state_text",
    "t_critical",
    "t_quantile",
    "task_sort_key",
]
