"""Training: the loop, optimiser groups, schedules, checkpoints, distributed data parallelism.

    from longrange.train import Trainer, TrainConfig
    summary = Trainer(model, objective, train_set, val_set, collate, TrainConfig(lr=1e-3), "runs/x").fit()
"""
from longrange.train.checkpoint import load_checkpoint, load_weights, save_checkpoint
from longrange.train.config import TrainConfig
from longrange.train.loop import Trainer, train
from longrange.train.optim import build_optimizer, group_report, param_groups
from longrange.train.rundir import RunDir, RunPaths
from longrange.train.schedules import LRSchedule, build_schedule

__all__ = [
    "LRSchedule",
    "RunDir",
    "RunPaths",
    "TrainConfig",
    "Trainer",
    "build_optimizer",
    "build_schedule",
    "group_report",
    "load_checkpoint",
    "load_weights",
    "param_groups",
    "save_checkpoint",
    "train",
]
