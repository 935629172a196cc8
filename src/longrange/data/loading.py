"""Loading a registered task by name::

    data = load_task("listops", "data", seed=0, train_subset=0.1)
    loader = DataLoader(data.train, batch_size=32, collate_fn=data.collate)

    data = load_task("listops", "data", generate="short", seq_len=128)    # generated on first use

``data_dir`` is the root data directory (default ``$LONGRANGE_DATA`` or ``./data``); each task
reads its own sub-directory of it (see ``docs/data.md``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from torch.utils.data import Subset

from longrange import smoke
from longrange.data.dataset import TaskData, subset_indices
from longrange.data.generated import ensure_generated
from longrange.data.locations import default_data_dir
from longrange.data.registry import resolved_options, task_entry


def load_task(
    name: str,
    data_dir: str | os.PathLike | None = None,
    *,
    seed: int = 0,
    train_subset: float | int | None = None,
    skip_bad: bool = False,
    generate: str | Mapping[str, Any] | None = None,
    **options,
) -> TaskData:
    """Load a registered task.

    Args:
        name: task name (unknown -> ConfigError listing the tasks).
        data_dir: root data directory (default ``$LONGRANGE_DATA`` or ``./data``).
        seed: seeds every random choice of the loader (held-out splits) and of ``train_subset``.
        train_subset: keep only a fraction in (0, 1] or a count of the training set (data-scarcity
            experiments); deterministic for the seed.
        skip_bad: skip malformed records (counted in ``TaskData.skipped``) instead of raising.
        generate: read generated data instead of the task's files: a named configuration of the
            task's generator, or a mapping of generator options (``config``: the named configuration
            they start from); built on first use (:func:`ensure_generated`).
        options: task options (see ``longrange data list`` / :func:`~longrange.data.registry.task_options`).
    """
    entry = task_entry(name)
    opts = resolved_options(name, options)
    spec = entry.spec(**opts)
    root = default_data_dir(data_dir) if generate is None else ensure_generated(name, data_dir, generate, opts)
    data = entry.loader(root, spec, seed=seed, skip_bad=skip_bad, **opts)
    if generate is not None:
        data.info["generated"] = str(root)
    if data.skipped:
        for path, count in sorted(data.skipped.items()):
            if count:
                print(f"{name}: skipped {count} bad record(s) in {path}", file=sys.stderr, flush=True)
    if train_subset is not None:
        data.info.setdefault("train_size_full", len(data.train))
        data.train = Subset(data.train, subset_indices(len(data.train), train_subset, seed))
    for split in ("val", "test"):  # LONGRANGE_SMOKE=1: the first examples only
        dataset = getattr(data, split)
        keep = smoke.eval_size(len(dataset))
        if keep < len(dataset):
            setattr(data, split, Subset(dataset, range(keep)))
    return data
