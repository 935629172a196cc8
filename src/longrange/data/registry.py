"""The task registry: each task module registers its tasks by name, with its spec, its loader, its
options and the files it reads::

    register_task("listops", listops_spec, load_listops, {"seq_len": 2048, "truncate": False},
                  expected=listops_expected_paths)

and everything else asks it by name: :func:`list_tasks`, :func:`task_options`, :func:`get_spec`,
and :func:`task_entry` with :func:`resolved_options` for the modules that load a task or tell where
its data stands (``data/loading.py``, ``data/state.py``, ``data/generated.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrange.data.dataset import TaskData
from longrange.data.spec import TaskSpec
from longrange.errors import ConfigError
from longrange.registry import Registry, unknown_option


@dataclass(frozen=True)
class RegisteredTask:
    """A task as registered (see :func:`register_task`)."""

    spec: Callable[..., TaskSpec]
    loader: Callable[..., TaskData]
    options: dict[str, Any]
    expected: Callable[..., list[Path]] | None
    generated: int | None = None


#: The registered tasks by name (each task module registers its tasks with :func:`register_task`).
TASKS: Registry = Registry("task")


def register_task(
    name: str,
    spec: Callable[..., TaskSpec],
    loader: Callable[..., TaskData],
    options: dict,
    expected: Callable[..., list[Path]] | None = None,
    *,
    generated: int | None = None,
) -> None:
    """Add a task to the registry.

    Args:
        name: the task's name (``longrange data list``, ``load_task(name)``).
        spec: ``spec(**options) -> TaskSpec``.
        loader: ``loader(data_dir: Path, spec, seed, skip_bad, **options) -> TaskData``; ``data_dir``
            is the root data directory.
        options: the task's option names with their defaults.
        expected: ``expected(data_dir: Path, **options) -> list[Path]``, the files/directories that
            must exist (for :func:`~longrange.data.state.data_state` and ``longrange data info``).
        generated: for a task whose loader generates its data (no files): the generator's version,
            part of the data's identity (:meth:`~longrange.data.state.DataState.identity`), so runs
            made by an older generator are not taken for runs of this one. Bump it whenever the
            generated data changes.

    Registering a name again replaces the earlier task.
    """
    if generated is not None and expected is not None:
        raise ConfigError(f"task {name}: a generated task has no expected files")
    TASKS.register(name, RegisteredTask(spec, loader, dict(options), expected, generated), replace=True)


def list_tasks() -> list[str]:
    return TASKS.names()


def task_entry(name: str) -> RegisteredTask:
    """The registered task ``name`` (unknown -> ConfigError listing the tasks)."""
    return TASKS.get(name)


def task_options(name: str) -> dict[str, Any]:
    """The task's options with their defaults."""
    return dict(task_entry(name).options)


def resolved_options(name: str, options: dict) -> dict:
    """The task's default options with ``options`` over them (an unknown option -> ConfigError)."""
    entry = task_entry(name)
    unknown = sorted(set(options) - set(entry.options))
    if unknown:
        raise unknown_option(unknown[0], f"task {name}", list(entry.options))
    return {**entry.options, **options}


def get_spec(name: str, **options) -> TaskSpec:
    """The task's spec with ``options`` applied (unknown task or option -> ConfigError)."""
    return task_entry(name).spec(**resolved_options(name, options))
