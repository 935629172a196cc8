"""The interface between the training loop and an objective.

An objective turns a batch into a loss and into *sums* from which its metrics are computed. Sums
(not means) add up exactly across batches and across distributed ranks, so the metrics of an
evaluation do not depend on how the data was split into batches or processes.

    out = objective(model, batch)            # StepOutput
    out.loss.backward()                      # the mean loss of this batch
    totals = add_sums(totals, out.sums)      # accumulate (all-reduce across ranks if distributed)
    metrics = objective.summarize(totals)    # {"loss": ..., "accuracy": ...}

Objectives are registered by name (:data:`OBJECTIVES`): "classification", "regression" and
"positions" (supervised; per-position answers), "causal" (next-token) and "masked" SPT. ``OBJECTIVES.build("masked",
input_kind="tokens", ratio=0.15)`` checks the options against the constructor before building.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor, nn

from longrange.registry import Registry

#: Objective classes by name; the built-ins are registered by the modules named here.
OBJECTIVES: Registry = Registry(
    "objective", modules=("longrange.objectives.supervised", "longrange.objectives.pretraining")
)

#: Decorator: ``@register_objective("name")`` on an objective class.
register_objective = OBJECTIVES.register


@dataclass
class StepOutput:
    loss: Tensor
    #: Additive statistics of this batch, e.g. {"loss_sum": ..., "count": ..., "correct": ...};
    #: 0-dim float64 tensors (detached).
    sums: dict[str, Tensor] = field(default_factory=dict)


class Objective(Protocol):
    #: Name of the metric used for model selection and early stopping, and whether higher is better.
    metric: str
    higher_is_better: bool

    def __call__(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput: ...

    def summarize(self, sums: Mapping[str, Tensor]) -> dict[str, float]: ...


def check_objective(objective: object) -> None:
    """A ConfigError naming what ``objective`` lacks of the :class:`Objective` interface."""
    from longrange.errors import ConfigError

    for attr in ("metric", "higher_is_better", "summarize"):
        if not hasattr(objective, attr):
            raise ConfigError(f"the objective {type(objective).__name__} has no '{attr}' (see objectives/base.py)")


def add_sums(total: dict[str, Tensor] | None, new: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Accumulate ``new`` into ``total`` (returns a new dict; ``total`` may be None)."""
    out = {} if total is None else dict(total)
    for key, value in new.items():
        value = value.detach().to(torch.float64)
        out[key] = out[key] + value if key in out else value
    return out
