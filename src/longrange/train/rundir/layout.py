"""Where each file of a run directory is: the files' names and :class:`RunLayout`, their paths.

A run directory holds::

    config.yaml                  the resolved configuration and its fingerprint, the run's record
    metrics.jsonl                one JSON record per log line (train/logging.py)
    summary.json                 the stage's result (written when the stage finishes)
    failed.json                  why the last attempt of a comparison's stage failed (stale beside a summary)
    stage.log                    a worker's output (comparisons run by workers or SLURM)
    checkpoints/last.pt          everything needed to continue exactly
    checkpoints/best.safetensors the model weights at the best evaluation
    tensorboard/                 TensorBoard events, when tensorboard is installed
    .lock                        held while a process writes to the directory

This module is the only one that spells these names (``tests/test_layering.py`` checks); every other
module reaches the files through a run directory's paths. Nothing here reads or writes a file
except :meth:`RunLayout.holds_run`, which asks whether some exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
FAILED_FILE = "failed.json"
LOG_FILE = "stage.log"
LOCK_FILE = ".lock"
CHECKPOINT_DIR = "checkpoints"
LAST_CHECKPOINT = "last.pt"
BEST_WEIGHTS = "best.safetensors"
TENSORBOARD_DIR = "tensorboard"


@dataclass(frozen=True)
class RunLayout:
    """The paths of a run directory's files (the module doc lists them). :class:`RunDir` adds what
    is done with them; the modules of this package take a layout and use only its paths."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def metrics(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY_FILE

    @property
    def failure(self) -> Path:
        return self.root / FAILED_FILE

    @property
    def log(self) -> Path:
        return self.root / LOG_FILE

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINT_DIR

    @property
    def last(self) -> Path:
        return self.checkpoints / LAST_CHECKPOINT

    @property
    def best_weights(self) -> Path:
        return self.checkpoints / BEST_WEIGHTS

    def weights(self, which: str = "best") -> list[Path]:
        """The files that may hold the ``best`` (or ``last``) weights, preferred first."""
        return [self.checkpoints / f"{which}.safetensors", self.checkpoints / f"{which}.pt"]

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD_DIR

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK_FILE

    def holds_run(self) -> str | None:
        """The name of the first file that shows a run was made here, or None."""
        for f in (self.last, self.best_weights, self.metrics, self.summary):
            if f.exists():
                return f.name
        return None
