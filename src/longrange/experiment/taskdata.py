"""A task's data and the identity of its files, loaded once per process for the same settings."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from longrange import smoke
from longrange.experiment.config import TaskConfig

if TYPE_CHECKING:
    from longrange.data.state import DataState

_DATA: dict[str, Any] = {}
_IDENTITY: dict[str, dict[str, str]] = {}
_NOTED: set[str] = set()


def unread_files_note(task: TaskConfig, state: DataState | None = None) -> str | None:
    """A line for a task with ``task.generate`` set whose data directory holds the task's own files:
    the generated data is read, those files are not, and how to read them instead (``task.generate=null``,
    and ``task.train_subset=null`` where a subset would keep part of them). None otherwise.
    ``state``: the task's :func:`data_state`, when the caller has it already."""
    if task.generate is None:
        return None
    found = (state or data_state(task)).own_files
    if not found:
        return None
    how = "task.generate=null"
    if task.train_subset is not None:
        how += f" and task.train_subset=null (it is {task.train_subset!r}: part of the training set)"
    return (
        f"note: {task.name}: task.generate is set ({task.generate!r}), so the generated data is read and the "
        f"task's own files in {found[0].parent} are not; to train on those files, add {how}"
    )


def say_unread_files(task: TaskConfig) -> None:
    """Print :func:`unread_files_note` on stderr, once per process for the same data settings."""
    note = unread_files_note(task)
    if note is not None and note not in _NOTED:
        _NOTED.add(note)
        print(note, file=sys.stderr, flush=True)


def load_data(task: TaskConfig):
    """The task's data (``longrange.data.loading.load_task``), loaded once per process."""
    from longrange.data.loading import load_task

    t = task
    key = json.dumps(
        [t.name, t.options, t.data_dir, t.train_subset, t.skip_bad, t.seed, t.generate, smoke.active()],
        sort_keys=True,
        default=str,
    )
    if key not in _DATA:
        say_unread_files(t)
        _DATA[key] = load_task(
            t.name,
            t.data_dir,
            seed=t.seed,
            train_subset=t.train_subset,
            skip_bad=t.skip_bad,
            generate=t.generate,
            **t.options,
        )
    return _DATA[key]


def data_identity(task: TaskConfig) -> dict[str, str]:
    """The identity of a task's data files (``DataState.identity``, see ``longrange.data.state``), once per process."""
    key = json.dumps(
        [task.name, task.data_dir, task.options, task.generate, smoke.active()], sort_keys=True, default=str
    )
    if key not in _IDENTITY:
        _IDENTITY[key] = data_state(task).identity()
    return _IDENTITY[key]


def data_state(task: TaskConfig) -> DataState:
    """Where the task's data stands (``longrange.data.state.data_state``): present, generated on
    first use, or missing with its first missing file and how to obtain it; its listed files, the
    task's own files that generated data leaves unread, and its identity."""
    from longrange.data.state import data_state as state

    return state(task.name, task.data_dir, generate=task.generate, **task.options)


def prepare_generated(task: TaskConfig) -> None:
    """Build the task's generated data now if it has some and it is not there yet (once, in this
    process, before workers start: see ``longrange.data.generated.ensure_generated``)."""
    if task.generate is not None:
        from longrange.data.generated import ensure_generated

        say_unread_files(task)
        ensure_generated(task.name, task.data_dir, task.generate, task.options)
