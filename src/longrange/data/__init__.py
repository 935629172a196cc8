"""Data: the task registry, readers of the published formats, generators, vocabularies, caching.

Importing this package registers every task (each task module calls ``register_task`` at import;
task modules import heavy optional packages only inside their loaders).

    from longrange.data import load_task
    data = load_task("listops", "data")
"""

from __future__ import annotations

import importlib
import importlib.util

from longrange.data.batch import IGNORE_INDEX, PAD_ID, collate, padding_mask
from longrange.data.tasks import (
    GENERATORS,
    TASKS,
    DataState,
    SequenceDataset,
    TaskData,
    TaskSpec,
    data_state,
    ensure_generated,
    get_spec,
    list_tasks,
    load_task,
    register_generator,
    register_task,
    task_options,
    task_status,
)
from longrange.data.tokenize import CLS_ID, EOS_ID, FIRST_TOKEN_ID, MASK_ID, SPECIALS, UNK_ID, Vocabulary

#: Modules that register tasks, in ``longrange data list`` order of authorship.
TASK_MODULES = (
    "longrange.data.listops",
    "longrange.data.text",
    "longrange.data.retrieval",
    "longrange.data.image",
    "longrange.data.pathfinder",
    "longrange.data.speech",
    "longrange.data.bidmc",
    "longrange.data.species",
    "longrange.data.synthetic",
    "longrange.data.mad",
    "longrange.data.state_tracking",
    # generators, which register themselves for their tasks (``task.generate``)
    "longrange.data.generate.listops",
    "longrange.data.generate.pathfinder",
)

for _name in TASK_MODULES:
    # A task module that is not part of this installation is absent, not broken: only modules that
    # exist are imported, and an import error inside one propagates.
    if importlib.util.find_spec(_name) is not None:
        importlib.import_module(_name)

__all__ = [
    "CLS_ID",
    "EOS_ID",
    "FIRST_TOKEN_ID",
    "GENERATORS",
    "IGNORE_INDEX",
    "MASK_ID",
    "PAD_ID",
    "SPECIALS",
    "TASKS",
    "UNK_ID",
    "DataState",
    "SequenceDataset",
    "TaskData",
    "TaskSpec",
    "Vocabulary",
    "collate",
    "data_state",
    "ensure_generated",
    "get_spec",
    "list_tasks",
    "load_task",
    "padding_mask",
    "register_generator",
    "register_task",
    "task_options",
    "task_status",
]
