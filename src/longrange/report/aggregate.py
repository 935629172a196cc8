"""Runs aggregated over seeds into cells (:class:`ResultCell`), one per (stage kind, task, label, regime).

Final-stage runs (stage ``train`` or ``finetune``) are grouped by (task, label, regime) into
cells, pretraining runs apart; rows are model + regime (:func:`row_name`: "Transformer",
"Transformer + masked SPT", ...), tasks in the order of the Long Range Arena tables
(:func:`task_sort_key`), regimes in the order of :data:`REGIME_SUFFIX`.

The value of a run is its test metric when the summary has one, else its best validation
metric. A cell uses the test metric only if every seed in it has one (so a cell never mixes the
two).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from longrange.errors import DataFormatError
from longrange.report.chance import CHANCE_MARK
from longrange.report.collect import FINAL_STAGES, Run
from longrange.report.formats import MetricFormat, metric_format, stat_text
from longrange.report.stats import CONFIDENCE, Stat, mean_ci

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
class ResultCell:
    """A cell of the results tables: the runs of one (task, label, regime) and stage kind ("final" or
    "pretrain"), over seeds, with their mean and confidence interval."""

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
        """ "mean ± half-width" in display units, or "value (n=1)"."""
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


def aggregate(runs: Iterable[Run]) -> list[ResultCell]:
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
                    f"seed {r.seed} of {where} appears twice: {by_seed[r.seed].path} and {r.path}; report one of them",
                    r.summary_file,
                )
            by_seed[r.seed] = r
        metrics = {(r.metric, r.higher_is_better) for r in group}
        if len(metrics) > 1:
            raise DataFormatError(f"the runs of {where} use different metrics {sorted(metrics)}", group[0].summary_file)
        metric, hib = metrics.pop()
        source = "test" if all(r.has_test() for r in group) else "val"
        cells.append(ResultCell(task, label, regime, kind, metric, hib, source, sorted(group, key=lambda r: r.seed)))
    cells.sort(key=lambda c: (c.kind, c.label, regime_sort_key(c.regime), task_sort_key(c.task)))
    return cells
