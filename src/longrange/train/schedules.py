"""Learning-rate schedules as a multiplier of the peak learning rate, a function of the step.

``multiplier(step)`` is the factor used for the optimiser step with 0-based index ``step``:

  * warmup (all schedules but ``rsqrt``): ``(step + 1) / warmup_steps`` for ``step < warmup_steps``,
    so the first step is not taken at lr 0 and step ``warmup_steps - 1`` is at the peak;
  * ``cosine``: then ``min + (1 - min) * (1 + cos(pi * p)) / 2`` with
    ``p = (step - warmup_steps) / (end - warmup_steps)``, where ``end`` is ``cosine_steps`` (the
    steps one decay spans, counted from step 0 with the warmup: transformers'
    ``num_training_steps``) or, when that is 0, ``total_steps``. After ``end``, ``cycles`` decides:
    ``once`` clamps p at 1, so that ``multiplier(end) == min_lr_ratio`` and stays there;
    ``periodic`` lets p run on, so the lr rises back to the peak over the next span and so on
    (``transformers.get_cosine_schedule_with_warmup`` past its ``num_training_steps``); ``restart``
    takes p modulo 1, back at the peak at the start of every span (LRA's ``cosine_decay``);
  * ``rsqrt``: LRA's ``constant * linear_warmup * rsqrt_decay`` as its code computes it, the peak
    learning rate being LRA's constant: ``min(1, step / warmup_steps) / sqrt(max(step, warmup_steps))``
    for the 0-based step (so step 0 is at lr 0 and the peak, reached at the end of the warmup, is
    ``lr / sqrt(warmup_steps)``); the warmup may outlast the run;
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

KINDS = ("cosine", "constant", "plateau", "step", "rsqrt")
CYCLES = ("once", "periodic", "restart")


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
        cosine_steps: int = 0,
        cycles: str = "once",
    ):
        if kind not in KINDS:
            raise ConfigError(f"train.schedule must be one of {', '.join(KINDS)}, got {kind!r}")
        if kind == "step" and step_every < 1:
            raise ConfigError(f"the step schedule needs train.step_size >= 1, got {step_every} steps between decays")
        if total_steps < 1:
            raise ConfigError(f"a schedule needs at least one step, got total_steps={total_steps}")
        if warmup_steps < 0:
            raise ConfigError(f"train.warmup must give >= 0 steps, got {warmup_steps}")
        if kind == "rsqrt" and warmup_steps < 1:
            raise ConfigError(
                "the rsqrt schedule needs train.warmup >= 1 step (it decays as 1 / sqrt(max(step, warmup)))"
            )
        if cycles not in CYCLES:
            raise ConfigError(f"train.cycles must be one of {', '.join(CYCLES)}, got {cycles!r}")
        if kind == "cosine" and cosine_steps and cosine_steps <= warmup_steps:
            raise ConfigError(
                f"train.cosine_steps ({cosine_steps}) must exceed the warmup ({warmup_steps} steps): "
                "it counts the steps from 0 to the end of the decay, warmup included"
            )
        self.kind = kind
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.min_lr_ratio = min_lr_ratio
        self.plateau_factor = plateau_factor
        self.plateau_patience = plateau_patience
        self.higher_is_better = higher_is_better
        self.step_every = step_every
        self.gamma = gamma
        self.cosine_steps = cosine_steps
        self.cycles = cycles
        # Plateau state.
        self.scale = 1.0
        self.best: float | None = None
        self.bad_evals = 0

    def multiplier(self, step: int) -> float:
        if self.kind == "rsqrt":
            return min(1.0, step / self.warmup_steps) / math.sqrt(max(step, self.warmup_steps))
        if step < self.warmup_steps:
            warm = (step + 1) / self.warmup_steps
            return warm * (self.scale if self.kind == "plateau" else 1.0)
        if self.kind == "constant":
            return 1.0
        if self.kind == "plateau":
            return self.scale
        if self.kind == "step":
            return self.gamma ** ((step - self.warmup_steps) // self.step_every)
        span = (self.cosine_steps or self.total_steps) - self.warmup_steps
        if span <= 0:
            progress = 1.0
        elif self.cycles == "once":
            progress = min(1.0, (step - self.warmup_steps) / span)
        elif self.cycles == "periodic":
            progress = (step - self.warmup_steps) / span
        else:  # restart
            progress = ((step - self.warmup_steps) / span) % 1.0
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


def build_schedule(
    cfg, total_steps: int, higher_is_better: bool = True, steps_per_epoch: int | None = None
) -> LRSchedule:
    """The schedule a :class:`~longrange.train.config.TrainConfig` asks for.

    ``steps_per_epoch`` converts ``train.step_size`` from epochs to steps (``step_unit: epoch``).
    """
    step_every = cfg.step_size
    if cfg.schedule == "step" and cfg.step_unit == "epoch":
        if not steps_per_epoch:
            raise ConfigError("train.step_unit 'epoch' needs the number of steps per epoch")
        step_every = cfg.step_size * steps_per_epoch
    warmup = cfg.warmup_steps(total_steps)
    return LRSchedule(
        cfg.schedule,
        total_steps,
        # LRA's rsqrt warmup may outlast the run (its retrieval config: 8000 warmup steps of 5000).
        warmup_steps=warmup if cfg.schedule == "rsqrt" else min(warmup, total_steps),
        min_lr_ratio=cfg.min_lr_ratio,
        plateau_factor=cfg.plateau_factor,
        plateau_patience=cfg.plateau_patience,
        higher_is_better=higher_is_better,
        step_every=step_every,
        gamma=cfg.step_gamma,
        cosine_steps=cfg.cosine_steps,
        cycles=cfg.cycles,
    )
