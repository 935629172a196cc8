"""One optimiser step: the step of the trainer (``Trainer._step``), of dry runs and of memory planning.

    loss = training_step(model, objective, [batch], optimizer, Precision("fp32", device), grad_clip=0.0)

Per micro-batch: the objective's forward under the precision's autocast, its loss divided by the
number of micro-batches and backward (scaled under fp16); then gradient clipping and the optimiser
step as ``Precision.step`` takes them, and ``zero_grad(set_to_none=True)``. The trainer passes its
hooks (moving a micro-batch to the device, DDP's ``no_sync`` for all but the last micro-batch, the
metric meter); a dry run takes the same step without them, so that it allocates and fails as one
of the trainer's steps would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import Tensor, nn

from longrange.train.precision import Precision


def training_step(
    model: nn.Module,
    objective: Any,
    micro_batches: Sequence[Mapping[str, Any]],
    optimizer: torch.optim.Optimizer,
    precision: Precision,
    grad_clip: float = 0.0,
    before_micro_batch: Callable[[int], None] | None = None,
    *,
    prepare: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
    sync: Callable[[int], AbstractContextManager[Any]] | None = None,
    after_micro_batch: Callable[[Any], None] | None = None,
    clip_parameters: Iterable[Tensor] | None = None,
) -> Tensor:
    """Forward, objective and backward of each micro-batch, then the optimiser step; returns the
    step's loss (detached, the sum of each micro-batch's loss over their number).

    ``before_micro_batch(i)``: called before the i-th micro-batch (instruments use it);
    ``prepare(batch)``: the micro-batch as the model takes it (the trainer moves it to the device here,
    one micro-batch at a time); ``sync(i)``: the context of the i-th micro-batch's forward and backward
    (DDP's ``no_sync`` but for the last); ``after_micro_batch(out)``: the objective's output (the
    trainer's meter); ``clip_parameters``: the parameters whose gradients are clipped and stepped
    (default ``model``'s; the trainer's model behind a DDP or compiled wrapper)."""
    model.train()
    n, step_loss = len(micro_batches), None
    for i, batch in enumerate(micro_batches):
        if before_micro_batch is not None:
            before_micro_batch(i)
        if prepare is not None:
            batch = prepare(batch)
        with sync(i) if sync is not None else nullcontext():
            with precision.autocast():
                out = objective(model, batch)
            loss = out.loss / n
            precision.backward(loss)
        step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
        if after_micro_batch is not None:
            after_micro_batch(out)
    precision.step(optimizer, model.parameters() if clip_parameters is None else clip_parameters, grad_clip)
    optimizer.zero_grad(set_to_none=True)
    return step_loss
