"""Run metrics: one JSON object per line in ``metrics.jsonl``, and TensorBoard when installed.

Each line is ``{"step", "epoch", "split", "metrics", "lr", "elapsed"}``: ``step`` counts optimiser
steps done, ``epoch`` is the fractional number of epochs done, ``split`` is ``train``, ``val`` or
``test``, ``lr`` the peak-group learning rate of the last step, ``elapsed`` wall-clock seconds of
training (summed over resumed segments). Non-finite metric values are written as ``null`` so
every line is strict JSON.

Only the main process writes; other ranks get a disabled logger.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

METRICS_FILE = "metrics.jsonl"


def _tensorboard_writer(log_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # tensorboard is optional
        return None
    try:
        return SummaryWriter(log_dir=str(log_dir))
    except Exception:
        return None


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


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
    def __init__(self, run_dir: str | Path, enabled: bool = True, tensorboard: bool = True):
        self.enabled = enabled
        self.path = Path(run_dir) / METRICS_FILE
        self.lines = 0
        self._tb = None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                self.lines = len(read_metrics(self.path))
            if tensorboard:
                self._tb = _tensorboard_writer(Path(run_dir) / "tensorboard")

    def log(self, step: int, epoch: float, split: str, metrics: Mapping[str, float], lr: float, elapsed: float) -> None:
        if not self.enabled:
            return
        record = {
            "step": int(step),
            "epoch": round(float(epoch), 6),
            "split": split,
            "metrics": {k: _finite_or_none(float(v)) for k, v in metrics.items()},
            "lr": float(lr),
            "elapsed": round(float(elapsed), 3),
        }
        # Flushed per line: a killed process loses at most the line being written.
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        self.lines += 1
        if self._tb is not None:
            for name, value in metrics.items():
                self._tb.add_scalar(f"{split}/{name}", float(value), step)
            if split == "train":
                self._tb.add_scalar("train/lr", float(lr), step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
