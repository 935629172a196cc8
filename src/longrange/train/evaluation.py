"""Evaluation: when to validate, and the metrics of a dataset with every rank's sums added.

evaluator = Evaluator(objective, precision, loader, env, batch_size=64, every=0, steps_per_epoch=100)
if evaluator.due(step, epoch_end, done):
    metrics = evaluator(model, val_set, "val")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from longrange.objectives.base import add_sums
from longrange.train import distributed as D
from longrange.train.precision import Precision
from longrange.train.sampler import eval_shards


def move_to(batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """The batch with its tensors on ``device``."""
    return {k: v.to(device, non_blocking=True) if isinstance(v, Tensor) else v for k, v in batch.items()}


class Evaluator:
    """``every`` 0: validate at the end of each epoch; N: every N steps; always at the end."""

    def __init__(
        self,
        objective: Any,
        precision: Precision,
        loader: Callable[[Dataset, Any, int], DataLoader],
        env: D.DistEnv,
        batch_size: int,
        every: int = 0,
    ):
        self.objective, self.precision, self.loader, self.env = objective, precision, loader, env
        self.batch_size, self.every = batch_size, every

    def due(self, step: int, epoch_end: bool, done: bool) -> bool:
        return done or (self.every == 0 and epoch_end) or (self.every > 0 and step % self.every == 0)

    @torch.no_grad()
    def __call__(self, model: nn.Module, dataset: Dataset, split: str = "val") -> dict[str, float]:
        """Metrics of ``dataset`` (all ranks' sums added), in eval mode without gradients."""
        env = self.env
        if env.distributed:  # every rank evaluates rank 0's buffers (e.g. norm statistics)
            for buf in model.buffers():
                torch.distributed.broadcast(buf, src=0)
        was_training = model.training
        model.eval()
        shards = eval_shards(len(dataset), self.batch_size, env.rank, env.world_size)
        sums: dict[str, Tensor] | None = None
        try:
            for b in self.loader(dataset, shards, 0):
                with self.precision.autocast():
                    out = self.objective(model, move_to(b, env.device))
                sums = add_sums(sums, out.sums)
        finally:
            model.train(was_training)
        total = D.all_reduce_sums(sums, env.device)
        if not total:
            raise ValueError(f"the objective returned no sums on the {split} set ({len(dataset)} items)")
        return {k: float(v) for k, v in self.objective.summarize(total).items()}
