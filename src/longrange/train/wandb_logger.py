"""Weights & Biases as a logger of runs: ``train.loggers: [tensorboard, wandb]``.

One W&B run per training run (a comparison's stage), named by its stage id; the resolved
configuration and the run's record (versions, device, precision) as its config; every log line's
metrics at the run's optimiser step (``<split>/<metric>``, ``train/lr``, ``epoch``); at the end the
result (best evaluation, steps, epochs, seconds) as its summary and the kernels that ran added to
its config. A resumed run continues the same W&B run: the id is saved in the trainer's checkpoints
(:meth:`WandbLogger.state_dict`). Settings: ``train.wandb: {project, entity, group, mode}``
(:class:`~longrange.train.config.WandbConfig`); W&B's own environment variables (``WANDB_MODE``,
``WANDB_DIR``, ``WANDB_API_KEY``, ...) apply as usual. The console is not captured (the metrics
are logged as data; a comparison's worker keeps its output in ``stage.log``).

Only the main process logs (the trainer creates this logger on rank 0 only).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from longrange.errors import ConfigError
from longrange.train.config import WANDB_MISSING, WandbConfig


def import_wandb() -> Any:
    """The ``wandb`` module, or a one-line ConfigError naming the extra that installs it."""
    try:
        import wandb
    except ImportError:
        raise ConfigError(WANDB_MISSING) from None
    return wandb


def summary_of(result: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of :meth:`Trainer.fit`'s result that become the W&B run's summary."""
    best = result.get("best") or {}
    out: dict[str, Any] = {"best/step": best.get("step"), "best/value": best.get("value")}
    out.update({f"best/{k}": v for k, v in (best.get("metrics") or {}).items()})
    out.update({k: result[k] for k in ("metric", "step", "epochs", "stopped_early", "seconds") if k in result})
    return out


class WandbLogger:
    """A W&B run: started here (or resumed, given the ``run_id`` of :meth:`state_dict`), logged to by
    :meth:`log`, finished by :meth:`finish`."""

    def __init__(
        self,
        settings: WandbConfig,
        *,
        name: str,
        group: str | None,
        config: Mapping[str, Any],
        run_id: str | None = None,
    ):
        wandb = import_wandb()
        self.run = wandb.init(
            project=settings.project,
            entity=settings.entity,
            group=settings.group or group,
            name=name,
            mode=settings.mode,
            id=run_id,
            resume="allow" if run_id else None,
            config=dict(config),
            reinit="create_new",
            settings=wandb.Settings(console="off"),
        )
        self.id = self.run.id

    def log(self, step: int, epoch: float, split: str, metrics: Mapping[str, float], lr: float) -> None:
        data: dict[str, Any] = {f"{split}/{k}": v for k, v in metrics.items()}
        if split == "train":
            data["train/lr"] = lr
        data["epoch"] = epoch
        self.run.log(data, step=int(step))

    def finish(self, result: Mapping[str, Any] | None = None, record: Mapping[str, Any] | None = None) -> None:
        """End the run: with ``result`` (fit's) as its summary and ``record`` added to its config's
        ``record``; without a result the run ended early and W&B marks it failed."""
        if self.run is None:
            return
        run, self.run = self.run, None
        if result is None:
            run.finish(exit_code=1)
            return
        if record:
            run.config.update({"record": {**dict(run.config.get("record") or {}), **record}}, allow_val_change=True)
        run.summary.update(summary_of(result))
        run.finish()

    def state_dict(self) -> dict[str, Any]:
        return {"id": self.id}
