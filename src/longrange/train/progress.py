"""What a person watching a run sees on stderr (rank 0 only), and durations in words.

On a terminal: a progress bar with the loss and lr. Elsewhere (nohup, SLURM, ``> log``): a plain
line every ``every`` seconds with step/total, loss, lr, the last validation metric and the ETA.
Validation metrics are printed after each evaluation in both cases, accuracy in percent as in the
reports.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping


def format_seconds(seconds: float) -> str:
    """``1h02m``, ``3m05s``, ``12s``; ``?`` when unknown."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def show_metric(name: str, value: float) -> str:
    """A metric as the reports show it (``longrange.report.tables.metric_format``): an accuracy in
    percent (``23.10%``; ``sequence_accuracy`` too), anything else to 4 digits."""
    if name.endswith("accuracy") and math.isfinite(value):
        return f"{100 * value:.2f}%"
    return f"{value:.4g}"


class Progress:
    """The trainer calls :meth:`start`, :meth:`trained` after every step, :meth:`validated` after
    every evaluation and :meth:`close` at the end."""

    def __init__(self, enabled: bool, total_steps: int, metric: str, every: float = 60.0):
        self.enabled = enabled
        self.total = total_steps
        self.metric = metric
        self.every = every
        self.tty = enabled and sys.stderr.isatty()
        self.bar = None
        self.step = 0
        self.lr = 0.0
        self.loss: float | None = None
        self.val: str = ""
        self._last_line = 0.0
        self._start_step = 0
        self._start = 0.0

    def start(self, step: int) -> None:
        self.step = self._start_step = step
        self._start = self._last_line = time.time()
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, initial=step, desc="train", dynamic_ncols=True)

    def trained(self, step: int, lr: float, metrics: Mapping[str, float] | None) -> None:
        """After a step; ``metrics`` when the step logged its training metrics."""
        if not self.enabled:
            return
        self.step, self.lr = step, lr
        if metrics is not None:
            self.loss = metrics["loss"]
        if self.bar is not None:
            self.bar.update(1)
            if metrics is not None:
                self.bar.set_postfix(loss=f"{self.loss:.4g}", lr=f"{lr:.3g}")
            return
        now = time.time()
        if now - self._last_line >= self.every:
            self._last_line = now
            print(self.line(now), file=sys.stderr, flush=True)

    def line(self, now: float) -> str:
        rate = (self.step - self._start_step) / max(now - self._start, 1e-9)
        eta = (self.total - self.step) / rate if rate > 0 else float("inf")
        loss = f"{self.loss:.4g}" if self.loss is not None else "-"
        return (
            f"step {self.step}/{self.total} ({100 * self.step / self.total:.0f}%)  loss {loss}  lr {self.lr:.3g}"
            f"{'  ' + self.val if self.val else ''}  eta {format_seconds(eta)}"
        )

    def validated(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        shown = ", ".join(f"{k} {show_metric(k, v)}" for k, v in metrics.items())
        self.val = f"val {self.metric} {show_metric(self.metric, metrics.get(self.metric, float('nan')))}"
        text = f"step {step}/{self.total}: val {shown}"
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
