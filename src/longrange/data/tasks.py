"""The task API in one place: every public name of the modules below, importable from here as ever.

A task module registers itself when :mod:`longrange.data` is imported::

    register_task("listops", listops_spec, load_listops, {"seq_len": 2048, "truncate": False},
                  expected=listops_expected_paths)

and users load it by name::

    data = load_task("listops", "data", seed=0, train_subset=0.1)
    loader = DataLoader(data.train, batch_size=32, collate_fn=data.collate)

``data_dir`` is the root data directory (default ``$LONGRANGE_DATA`` or ``./data``); each task
reads its own sub-directory of it (see ``docs/data.md``).

A task whose data a generator makes (ListOps, Pathfinder) also registers the generator::

    register_generator("listops", build, defaults, {"short": {...}, "lra": {}})

and then loads *generated* data, built on first use from a named configuration or from options::

    data = load_task("listops", "data", generate="short", seq_len=128)
    data = load_task("listops", "data", generate={"config": "short", "n_train": 2000}, seq_len=128)

Where each job lives:

* ``data/spec.py``: :class:`TaskSpec`, what a task is, and :func:`chance_level`;
* ``data/dataset.py``: :class:`SequenceDataset`, :class:`TaskData`, :func:`unpack_split`, :func:`subset_indices`;
* ``data/packing.py``: sequences stored flat (:func:`pack`, :func:`unpack`, :func:`pack_split`, :func:`id_dtype`);
* ``data/registry.py``: the registered tasks (:func:`register_task`, :func:`list_tasks`, :func:`get_spec`, ...);
* ``data/locations.py``: the data directory and a task's folder in it (:func:`default_data_dir`, :func:`task_dir`);
* ``data/generated.py``: data built on first use by a generator (:func:`register_generator`, :func:`ensure_generated`);
* ``data/state.py``: whether the data is there, the one answer (:func:`data_state` -> :class:`DataState`);
* ``data/loading.py``: :func:`load_task`;
* ``data/reading.py``: what loaders share to read files (:func:`require_files`, :func:`read_lines`, :class:`BadRecords`).
"""

from __future__ import annotations

from longrange.data.dataset import SequenceDataset, TaskData, subset_indices, unpack_split
from longrange.data.generated import (
    GENERATED_DIR,
    GENERATED_MANIFEST,
    GENERATORS,
    Generator,
    ensure_generated,
    generated_configuration,
    generated_root,
    generator,
    register_generator,
)
from longrange.data.loading import load_task
from longrange.data.locations import DATA_ENV, default_data_dir, task_dir
from longrange.data.packing import id_dtype, pack, pack_split, unpack
from longrange.data.reading import BadRecords, read_lines, require_files
from longrange.data.registry import TASKS, RegisteredTask, get_spec, list_tasks, register_task, task_options
from longrange.data.spec import TaskSpec, chance_level
from longrange.data.state import DRAWN_WHEN_LOADED, DataState, data_identity, data_state, task_status

__all__ = [
    "BadRecords",
    "DATA_ENV",
    "DRAWN_WHEN_LOADED",
    "DataState",
    "GENERATED_DIR",
    "GENERATED_MANIFEST",
    "GENERATORS",
    "Generator",
    "RegisteredTask",
    "SequenceDataset",
    "TASKS",
    "TaskData",
    "TaskSpec",
    "chance_level",
    "data_identity",
    "data_state",
    "default_data_dir",
    "ensure_generated",
    "generated_configuration",
    "generated_root",
    "generator",
    "get_spec",
    "id_dtype",
    "list_tasks",
    "load_task",
    "pack",
    "pack_split",
    "read_lines",
    "register_generator",
    "register_task",
    "require_files",
    "subset_indices",
    "task_dir",
    "task_options",
    "task_status",
    "unpack",
    "unpack_split",
]
