"""Learning-rate schedules as a multiplier of the peak learning rate, a function of the step.

``multiplier(step)`` is the factor used for the optimiser step with 0-based index ``step``:

  * warmup (all schedules): ``(step + 1) / warmup_steps`` for ``step < warmup_steps``, so the first
    step is not taken at lr 0 and step ``warmup_steps - 1`` is at the peak;
  * ``cosine``: then ``min + (1 - min) * (1 + cos(pi * p)) / 2`` with
    ``p = (step - warmup_steps) / (total_steps - warmup_steps)`` clamped to [0, 1], so that
    ``multiplier(total_steps) == min_lr_ratio`` (and stays there if training runs longer);
  * ``constant``: then 1;
  * ``plateau``: then the current plateau scale, multiplied by ``factor`` each time ``patience``
    evaluations in a row did not improve the selection metric (:meth:`LRSchedule.observe`);
  * ``step``: then ``gamma ** ((step - warmup_steps) // step_every)``: multiplied by ``gamma``
    every ``step_every`` steps after the warmup (PyTorch's ``StepLR``; with ``step_every`` a whole
    number of epochs and no warmup, ``MultiStepLR`` with evenly spaced milestones).

Only the plateau scale is state; :meth:`state_dict` holds it so a resumed run continues exactly.
"""
from __future__ import annotations

import math
from typing import Any

from longrange.errors import ConfigError

KINDS = ("cosine", "constant", "plateau", "step")


class LRSchedule:
    def __init__(
        self,
        kind: str,
        total_steps: int,
        warmup_steps: int = 0,
        min_lr_ratio: float = 0.1,
        plateau_factor: float = 0.5,
        plateau_patience: int = 3,
        higher_is_better: bool = True,
        step_every: int = 0,
        gamma: float = 0.1,
    ):
        if kind not in KINDS:
            raise ConfigError(f"train.schedule must be one of {', '.join(KINDS)}, got {kind!r}")
        if kind == "step" and step_every < 1:
            raise ConfigError(f"the step schedule needs train.step_size >= 1, got {step_every} steps between decays")
        if total_steps < 1:
            raise ConfigError(f"a schedule needs at least one step, got total_steps={total_steps}")
        if warmup_steps < 0:
            raise ConfigError(f"train.warmup must give >= 0 steps, got {warmup_steps}")
        self.kind = kind
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.min_lr_ratio = min_lr_ratio
        self.plateau_factor = plateau_factor
        self.plateau_patience = plateau_patience
        self.higher_is_better = higher_is_better
        self.step_every = step_every
        self.gamma = gamma
        # Plateau state.
        self.scale = 1.0
        self.best: float | None = None
        self.bad_evals = 0

    def multiplier(self, step: int) -> float:
        if step < self.warmup_steps:
            warm = (step + 1) / self.warmup_steps
            return warm * (self.scale if self.kind == "plateau" else 1.0)
        if self.kind == "constant":
            return 1.0
        if self.kind == "plateau":
            return self.scale
        if self.kind == "step":
            return self.gamma ** ((step - self.warmup_steps) // self.step_every)
        span = self.total_steps - self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / span) if span > 0 else 1.0
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def observe(self, value: float) -> None:
        """Record an evaluation of the selection metric (only the plateau schedule reacts)."""
        if self.kind != "plateau":
            return
        improved = not math.isnan(value) and (
            self.best is None or (value > self.best if self.higher_is_better else value < self.best)
        )
        if improved:
            self.best = float(value)
            self.bad_evals = 0
            return
        self.bad_evals += 1
        if self.bad_evals >= self.plateau_patience:
            self.scale *= self.plateau_factor
            self.bad_evals = 0

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "scale": self.scale, "best": self.best, "bad_evals": self.bad_evals}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise ConfigError(
                f"train.schedule is {self.kind!r} but the checkpoint was written with {state.get('kind')!r}"
            )
        self.scale = float(state["scale"])
        self.best = None if state["best"] is None else float(state["best"])
        self.bad_evals = int(state["bad_evals"])


def build_schedule(cfg, total_steps: int, higher_is_better: bool = True, steps_per_epoch: int | None = None) -> LRSchedule:
    """The schedule a :class:`~longrange.train.config.TrainConfig` asks for.

    ``steps_per_epoch`` converts ``train.step_size`` from epochs to steps (``step_unit: epoch``).
    """
    step_every = cfg.step_size
    if cfg.schedule == "step" and cfg.step_unit == "epoch":
        if not steps_per_epoch:
            raise ConfigError("train.step_unit 'epoch' needs the number of steps per epoch")
        step_every = cfg.step_size * steps_per_epoch
    return LRSchedule(
        cfg.schedule,
        total_steps,
        warmup_steps=min(cfg.warmup_steps(total_steps), total_steps),
        min_lr_ratio=cfg.min_lr_ratio,
        plateau_factor=cfg.plateau_factor,
        plateau_patience=cfg.plateau_patience,
        higher_is_better=higher_is_better,
        step_every=step_every,
        gamma=cfg.step_gamma,
    )
