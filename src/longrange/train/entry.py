"""The one-call entry point: :func:`train` a model on a task's loaded data.

summary = train(model, objective, data, {"lr": 1e-3, "epochs": 10}, "runs/x")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from longrange.errors import ConfigError
from longrange.train import distributed as D
from longrange.train.config import TrainConfig
from longrange.train.loop import FitResult, Trainer
from longrange.train.rundir import OpenRun


def _splits(data: Any) -> tuple[Dataset, Dataset | None, Dataset | None]:
    if isinstance(data, Mapping):
        if set(data) - {"train", "val", "test"} or "train" not in data:
            raise ConfigError(
                f"training data must map 'train' (and optionally 'val', 'test') to datasets, got keys {sorted(data)}"
            )
        return data["train"], data.get("val"), data.get("test")
    if isinstance(data, (list, tuple)):
        if not 1 <= len(data) <= 3:
            raise ConfigError(f"training data as a sequence must be (train[, val[, test]]), got {len(data)} items")
        parts = list(data) + [None] * (3 - len(data))
        return parts[0], parts[1], parts[2]
    if hasattr(data, "train"):
        return data.train, getattr(data, "val", None), getattr(data, "test", None)
    raise ConfigError(f"cannot find train/val/test datasets in a {type(data).__name__}")


def train(
    model: nn.Module,
    objective: Any,
    data: Any,
    cfg: TrainConfig | Mapping[str, Any],
    run_dir: str | Path | OpenRun,
    *,
    collate: Callable[[Sequence[dict]], dict[str, Tensor]] | None = None,
    extra_config: Mapping[str, Any] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    device: torch.device | str | None = None,
    evaluate_test: bool = True,
    tensorboard: bool = True,
    run_name: str | None = None,
    run_group: str | None = None,
) -> FitResult:
    """Train ``model`` on ``data`` and return :meth:`Trainer.fit`'s result (a :class:`FitResult`).

    ``data`` is a task's loaded data (anything with ``train``/``val``/``test`` attributes, e.g.
    ``longrange.data.tasks.TaskData``), a dict with those keys, or a tuple (train, val, test).
    ``collate`` defaults to ``data.collate`` when present, else :func:`longrange.data.batch.collate`.
    Under ``torchrun`` this joins the process group and leaves it at the end (unless it was joined before).
    """
    train_set, val_set, test_set = _splits(data)
    if collate is None:
        collate = getattr(data, "collate", None)
        if collate is None:
            from longrange.data.batch import collate
    trainer = Trainer(
        model,
        objective,
        train_set,
        val_set,
        collate,
        cfg,
        run_dir,
        test_set=test_set if evaluate_test else None,
        device=device,
        extra_config=extra_config,
        resume=resume,
        overwrite=overwrite,
        tensorboard=tensorboard,
        run_name=run_name,
        run_group=run_group,
    )
    try:
        return trainer.fit()
    finally:
        trainer.close()
        D.cleanup(trainer.env)
