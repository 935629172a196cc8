"""One optimiser step outside the trainer: what ``Trainer._step`` does with a step's micro-batches,
without a run directory, schedule, meter or data loader (dry runs and memory planning).

    loss = training_step(model, objective, [batch], optimizer, Precision("fp32", device), grad_clip=0.0)

Per micro-batch: the objective's forward under the precision's autocast, its loss divided by the
number of micro-batches and backward (scaled under fp16); then gradient clipping and the
optimiser step as ``Precision.step`` takes them, and ``zero_grad(set_to_none=True)``: the order and
the calls of the trainer's step (``longrange/train/loop.py``), so that a step taken here allocates
and fails as one of the trainer's would. The batches must already be on the model's device.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from longrange.train.precision import Precision


def training_step(model: nn.Module, objective: Any, micro_batches: Sequence[Mapping[str, Tensor]],
                  optimizer: torch.optim.Optimizer, precision: Precision, grad_clip: float = 0.0,
                  before_micro_batch: Callable[[int], None] | None = None) -> Tensor:
    """Forward, objective and backward of each micro-batch, then the optimiser step; returns the
    step's loss (detached, the mean over micro-batches). ``before_micro_batch(i)`` is called before
    the i-th micro-batch (instruments use it)."""
    model.train()
    n, step_loss = len(micro_batches), None
    for i, batch in enumerate(micro_batches):
        if before_micro_batch is not None:
            before_micro_batch(i)
        with precision.autocast():
            out = objective(model, batch)
        loss = out.loss / n
        precision.backward(loss)
        step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
    precision.step(optimizer, model.parameters(), grad_clip)
    optimizer.zero_grad(set_to_none=True)
    return step_loss
