"""A task's data and the identity of its files, loaded once per process for the same settings."""
from __future__ import annotations

import json
from typing import Any

from longrange.experiment.config import TaskConfig

_DATA: dict[str, Any] = {}
_IDENTITY: dict[str, dict[str, str]] = {}


def load_data(task: TaskConfig):
    """The task's data (``longrange.data.tasks.load_task``), loaded once per process."""
    from longrange.data.tasks import load_task

    t = task
    key = json.dumps([t.name, t.options, t.data_dir, t.train_subset, t.skip_bad, t.seed], sort_keys=True, default=str)
    if key not in _DATA:
        _DATA[key] = load_task(t.name, t.data_dir, seed=t.seed, train_subset=t.train_subset, skip_bad=t.skip_bad,
                               **t.options)
    return _DATA[key]


def data_identity(task: TaskConfig) -> dict[str, str]:
    """The identity of a task's data files (see ``longrange.data.tasks.data_identity``), once per process."""
    from longrange.data.tasks import data_identity as identity

    key = json.dumps([task.name, task.data_dir, task.options], sort_keys=True, default=str)
    if key not in _IDENTITY:
        _IDENTITY[key] = identity(task.name, task.data_dir, **task.options)
    return _IDENTITY[key]
