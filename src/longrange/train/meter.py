"""The training metrics between two log lines: the objective's sums and the mean step loss.

Step losses are added as tensors, so a step never waits for the device; :meth:`MetricMeter.summary`
synchronises once per log line, adding every rank's sums. The meter's state is saved in
checkpoints: a run resumed between two log lines logs the same numbers as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from longrange.objectives.base import add_sums
from longrange.train import distributed as D


class MetricMeter:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        #: The objective's sums since the last log line (tensors).
        self.sums: dict[str, Any] = {}
        #: Sum of step losses (a tensor between logs) and the steps it covers.
        self.loss_sum: Any = 0.0
        self.steps = 0

    def add_batch(self, sums: Mapping[str, Tensor]) -> None:
        """The sums of one micro-batch."""
        self.sums = add_sums(self.sums or None, sums)

    def add_step(self, loss: Any) -> None:
        """The loss of one optimiser step (a tensor: no device sync)."""
        self.loss_sum = self.loss_sum + loss
        self.steps += 1

    def summary(self, objective: Any, device: torch.device, world_size: int = 1) -> dict[str, float]:
        """The objective's metrics and the mean step loss since the last reset, over all ranks."""
        sums = D.all_reduce_sums(self.sums or None, device)
        loss = torch.tensor([float(self.loss_sum), float(self.steps)], dtype=torch.float64, device=device)
        if world_size > 1:
            torch.distributed.all_reduce(loss)
            loss /= world_size  # every rank counted every step
        metrics = {k: float(v) for k, v in objective.summarize(sums).items()} if sums else {}
        metrics.setdefault("loss", float(loss[0] / max(loss[1], 1.0)))
        return metrics

    #: The names of the saved state's fields.
    FIELDS = ("train_sums", "loss_sum", "loss_steps")

    def state_dict(self) -> dict[str, Any]:
        return {
            "train_sums": {k: v.detach().to("cpu") if isinstance(v, Tensor) else v for k, v in self.sums.items()},
            "loss_sum": float(self.loss_sum),
            "loss_steps": self.steps,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sums = dict(state["train_sums"])
        self.loss_sum = state["loss_sum"]
        self.steps = int(state["loss_steps"])
