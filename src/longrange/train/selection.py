"""Model selection by a validation metric, with early stopping.

    selector = BestSelector("accuracy", higher_is_better=True, patience=3)
    if selector.observe(step, metrics):      # True when this evaluation is the best so far
        selector.keep(model)                 # the best weights, copied to the CPU
    if selector.stopped_early: ...

Its state (the best value, step and metrics, evaluations without improvement, the history of
evaluations) is saved in checkpoints; the best weights are saved apart (``best.safetensors``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn


@dataclass
class SelectionState:
    best_value: float | None = None
    best_step: int = -1
    best_metrics: dict[str, float] = field(default_factory=dict)
    bad_evals: int = 0
    stopped_early: bool = False
    #: Every evaluation: {"step", "metrics"}.
    history: list[dict[str, Any]] = field(default_factory=list)
    #: The metrics of the last evaluation.
    final_val: dict[str, float] = field(default_factory=dict)


class BestSelector:
    def __init__(self, metric: str, higher_is_better: bool, patience: int = 0):
        self.metric = metric
        self.higher_is_better = higher_is_better
        self.patience = patience
        self.state = SelectionState()
        #: The best weights so far (CPU copies), or None before the first.
        self.best_weights: dict[str, Tensor] | None = None

    def better(self, value: float, than: float | None) -> bool:
        if math.isnan(value):
            return False
        if than is None:
            return True
        return value > than if self.higher_is_better else value < than

    def observe(self, step: int, metrics: Mapping[str, float]) -> bool:
        """Record an evaluation; True when it is the best so far (then :meth:`keep` the weights)."""
        st = self.state
        st.final_val = dict(metrics)
        st.history.append({"step": step, "metrics": dict(metrics)})
        value = metrics[self.metric]
        if self.better(value, st.best_value):
            st.best_value, st.best_step, st.best_metrics = value, step, dict(metrics)
            st.bad_evals = 0
            return True
        st.bad_evals += 1
        if self.patience and st.bad_evals >= self.patience:
            st.stopped_early = True
        return False

    def keep(self, model: nn.Module, step: int | None = None) -> None:
        """Copy ``model``'s weights as the best (``step``: when there is no validation to select by)."""
        if step is not None:
            self.state.best_step = step
        self.best_weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    @property
    def stopped_early(self) -> bool:
        return self.state.stopped_early

    def result(self) -> dict[str, Any]:
        st = self.state
        return {"step": st.best_step, "value": st.best_value, "metrics": dict(st.best_metrics)}

    #: The names of the saved state's fields.
    FIELDS = tuple(f.name for f in dataclasses.fields(SelectionState))

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.state = SelectionState(**{k: state[k] for k in self.FIELDS})
