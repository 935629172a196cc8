"""Run metrics: one JSON object per line in ``metrics.jsonl``, and the loggers of ``train.loggers``:
TensorBoard events (when installed) and Weights & Biases (``train/wandb_logger.py``).

Each line is ``{"step", "epoch", "split", "metrics", "lr", "elapsed"}``: ``step`` counts optimiser
steps done, ``epoch`` is the fractional number of epochs done, ``split`` is ``train``, ``val`` or
``test``, ``lr`` the peak-group learning rate of the last step, ``elapsed`` wall-clock seconds of
training (summed over resumed segments). Non-finite metric values are written as ``null`` so
every line is strict JSON.

Only the main process writes; other ranks get a disabled logger. :func:`open_logger` builds the
logger of a run from its train config.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from longrange.errors import DataFormatError, DataMissingError
from longrange.fileio import append_text, finite_or_none
from longrange.train.config import TrainConfig
from longrange.train.rundir import METRICS_FILE, RunDir

if TYPE_CHECKING:
    from longrange.train.wandb_logger import WandbLogger

__all__ = ["METRICS_FILE", "MetricsLogger", "open_logger", "read_metrics", "truncate_metrics"]


def _tensorboard_writer(log_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # tensorboard is optional
        return None
    try:
        return SummaryWriter(log_dir=str(log_dir))
    except Exception:
        return None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, checked line by line.

    Each record needs ``step`` (int), ``split`` (str) and ``metrics`` (object of numbers or null);
    a missing file is a :class:`DataMissingError`, a bad line a :class:`DataFormatError` naming the
    file and the line.
    """
    path = Path(path)
    if not path.is_file():
        raise DataMissingError(f"{path}: no such file")
    out = []
    with open(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataFormatError(f"not valid JSON: {err.msg} (column {err.colno})", path, lineno) from None
            if not isinstance(rec, dict):
                raise DataFormatError(f"expected a JSON object, got {type(rec).__name__}", path, lineno)
            step, split, metrics = rec.get("step"), rec.get("split"), rec.get("metrics")
            if not isinstance(step, int) or isinstance(step, bool):
                raise DataFormatError(f"'step' must be an integer, got {step!r}", path, lineno)
            if not isinstance(split, str):
                raise DataFormatError(f"'split' must be a string, got {split!r}", path, lineno)
            if not isinstance(metrics, dict) or any(v is not None and not _is_number(v) for v in metrics.values()):
                raise DataFormatError(f"'metrics' must be an object of numbers or null, got {metrics!r}", path, lineno)
            out.append(rec)
    return out


def truncate_metrics(path: str | Path, n_lines: int) -> None:
    """Keep the first ``n_lines`` records (a resumed run drops what was logged after its checkpoint)."""
    path = Path(path)
    if not path.exists():
        return
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    with open(path, "w") as f:
        f.writelines(lines[:n_lines])


class MetricsLogger:
    """Appends records to a run directory's ``metrics.jsonl`` (and TensorBoard events when installed),
    and logs them to a W&B run when given one."""

    def __init__(
        self,
        run_dir: str | Path | RunDir,
        enabled: bool = True,
        tensorboard: bool = True,
        wandb: WandbLogger | None = None,
    ):
        run = run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))
        self.enabled = enabled
        self.path = run.metrics
        self.lines = 0
        self._tb = None
        self.wandb = wandb if enabled else None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                self.lines = len(read_metrics(self.path))
            if tensorboard:
                self._tb = _tensorboard_writer(run.tensorboard)

    def log(self, step: int, epoch: float, split: str, metrics: Mapping[str, float], lr: float, elapsed: float) -> None:
        if not self.enabled:
            return
        record = {
            "step": int(step),
            "epoch": round(float(epoch), 6),
            "split": split,
            "metrics": {k: finite_or_none(float(v)) for k, v in metrics.items()},
            "lr": float(lr),
            "elapsed": round(float(elapsed), 3),
        }
        # Flushed per line: a killed process loses at most the line being written; a full disk
        # leaves no half line (and is an error naming the file).
        append_text(self.path, json.dumps(record) + "\n")
        self.lines += 1
        if self._tb is not None:
            for name, value in metrics.items():
                self._tb.add_scalar(f"{split}/{name}", float(value), step)
            if split == "train":
                self._tb.add_scalar("train/lr", float(lr), step)
            self._tb.flush()
        if self.wandb is not None:
            self.wandb.log(step, epoch, split, metrics, lr)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue its loggers (the W&B run's id)."""
        return {"wandb": self.wandb.state_dict()} if self.wandb is not None else {}

    def close(self, result: Mapping[str, Any] | None = None, record: Mapping[str, Any] | None = None) -> None:
        """Close the loggers; a W&B run gets ``result`` as its summary and ``record`` in its config
        (without a result it ended early). Closing twice does nothing."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self.wandb is not None:
            wandb, self.wandb = self.wandb, None
            wandb.finish(result, record)


def open_logger(
    run: RunDir,
    cfg: TrainConfig,
    *,
    enabled: bool = True,
    tensorboard: bool = True,
    name: str,
    group: str | None = None,
    config: Mapping[str, Any] | None = None,
    state: Mapping[str, Any] | None = None,
) -> MetricsLogger:
    """The logger of a run with the loggers of ``cfg.loggers``: TensorBoard (unless ``tensorboard``
    is False), and W&B with the run's ``name``, ``group`` (``cfg.wandb.group`` wins) and ``config``,
    continuing the W&B run of ``state`` (:meth:`MetricsLogger.state_dict` of a resumed checkpoint)."""
    wandb = None
    if enabled and "wandb" in cfg.loggers:
        from longrange.train.wandb_logger import WandbLogger

        run_id = ((state or {}).get("wandb") or {}).get("id")
        wandb = WandbLogger(cfg.wandb, name=name, group=group, config=config or {}, run_id=run_id)
    try:
        return MetricsLogger(
            run, enabled=enabled, tensorboard=tensorboard and "tensorboard" in cfg.loggers, wandb=wandb
        )
    except BaseException:
        if wandb is not None:
            wandb.finish()
        raise
