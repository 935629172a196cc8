"""Chance level in the report: the accuracy of guessing, drawn in the plots and marked in the tables.

A run's chance level is its task's (:func:`longrange.data.tasks.chance_level` of the task at the
run's options, read from its ``config.yaml``): 1 / the number of possible answers of the generated
recall tasks (1/16 = 6.25% for associative recall with 16 values, 1/15 for induction heads with
vocabulary 16), 1 / n_classes for a classification; none for regression, for metrics other than
accuracy (a pretraining loss), or for a run whose task is not registered in this process.

A cell is **at chance** when it cannot be told from guessing: its 95% confidence interval over
seeds contains the chance level, or its mean is at or below it (a single seed has no interval, so
one seed is marked only at or below chance). The tables mark such cells with :data:`CHANCE_MARK`
and say in a note what it means and each task's chance level; the plots draw a dashed line there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from functools import lru_cache

from longrange.errors import LongrangeError
from longrange.report.collect import Run

#: What a table cell at chance carries after its value.
CHANCE_MARK = "(≈ chance)"


@lru_cache(maxsize=256)
def _task_chance(task: str, options: str) -> float | None:
    from longrange.data.tasks import chance_level, get_spec

    try:
        spec = get_spec(task, **json.loads(options))
    except (LongrangeError, TypeError, ValueError):  # a task or options this installation does not know
        return None
    return chance_level(spec) if spec.metric == "accuracy" else None


def run_chance(run: Run) -> float | None:
    """The chance level of ``run``'s metric (an accuracy as a fraction), or None (see the module docstring)."""
    if run.metric != "accuracy":
        return None
    try:
        task = run.config.get("task") or {}
        options = task.get("options") or {}
        name = str(task.get("name") or run.task)
        key = json.dumps(options, sort_keys=True, default=str)
    except (LongrangeError, AttributeError, TypeError):  # no readable config.yaml
        return None
    return _task_chance(name, key)


def common_chance(runs: Iterable[Run]) -> float | None:
    """The chance level the runs share, or None when one has none or two differ."""
    levels = {run_chance(r) for r in runs}
    if len(levels) != 1:
        return None
    return levels.pop()


def at_chance(mean: float, half_width: float | None, chance: float | None) -> bool:
    """True when a cell (mean ± half-width, accuracy as a fraction) cannot be told from ``chance``:
    the interval contains it, or the mean is at or below it."""
    if chance is None or mean is None or math.isnan(mean):
        return False
    if mean <= chance:
        return True
    return half_width is not None and math.isfinite(half_width) and mean - half_width <= chance


def chance_text(chance: float) -> str:
    """``6.25% (1 in 16)``."""
    n = 1.0 / chance
    share = f" (1 in {round(n):,})" if abs(n - round(n)) < 1e-6 else ""
    return f"{100 * chance:.3g}%{share}"


def chance_note(levels: dict[str, float], marked: bool) -> str:
    """The note under a table: the chance level of each task and, when a cell is marked, what the mark says."""
    if not levels:
        return ""
    shown = "; ".join(f"{task} {chance_text(c)}" for task, c in levels.items())
    text = f"Chance level (guessing uniformly among the task's answers): {shown}."
    if marked:
        text += (
            f" {CHANCE_MARK}: the cell's 95% interval contains it, or its mean is at or below it (one seed: "
            "marked only at or below it)."
        )
    return text


def levels_of(cells: Sequence) -> dict[str, float]:
    """The chance level of each task of ``cells`` (those whose runs share one), in the cells' order."""
    out: dict[str, float] = {}
    for c in cells:
        if c.task not in out:
            level = common_chance(r for cell in cells if cell.task == c.task for r in cell.runs)
            if level is not None:
                out[c.task] = level
    return out
