"""A task's data and the identity of its files, loaded once per process for the same settings."""
from __future__ import annotations

import json
from typing import Any

from longrange import smoke
from longrange.experiment.config import TaskConfig

_DATA: dict[str, Any] = {}
_IDENTITY: dict[str, dict[str, str]] = {}


def load_data(task: TaskConfig):
    """The task's data (``longrange.data.tasks.load_task``), loaded once per process."""
    from longrange.data.tasks import load_task

    t = task
    key = json.dumps([t.name, t.options, t.data_dir, t.train_subset, t.skip_bad, t.seed, t.generate, smoke.active()],
                     sort_keys=True, default=str)
    if key not in _DATA:
        _DATA[key] = load_task(t.name, t.data_dir, seed=t.seed, train_subset=t.train_subset, skip_bad=t.skip_bad,
                               generate=t.generate, **t.options)
    return _DATA[key]


def data_identity(task: TaskConfig) -> dict[str, str]:
    """The identity of a task's data files (see ``longrange.data.tasks.data_identity``), once per process."""
    from longrange.data.tasks import data_identity as identity

    key = json.dumps([task.name, task.data_dir, task.options, task.generate, smoke.active()], sort_keys=True, default=str)
    if key not in _IDENTITY:
        _IDENTITY[key] = identity(task.name, task.data_dir, generate=task.generate, **task.options)
    return _IDENTITY[key]


def data_state(task: TaskConfig):
    """Where the task's data stands (``longrange.data.tasks.data_state``): present, generated on
    first use, or missing with its first missing file and how to obtain it."""
    from longrange.data.tasks import data_state as state

    return state(task.name, task.data_dir, generate=task.generate, **task.options)


def prepare_generated(task: TaskConfig) -> None:
    """Build the task's generated data now if it has some and it is not there yet (once, in this
    process, before workers start: see ``longrange.data.tasks.ensure_generated``)."""
    if task.generate is not None:
        from longrange.data.tasks import ensure_generated

        ensure_generated(task.name, task.data_dir, task.generate, task.options)
