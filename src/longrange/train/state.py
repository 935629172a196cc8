"""Where a run is: the training loop's own part of every checkpoint, and nothing more."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass
class TrainState:
    #: Optimiser steps done.
    step: int = 0
    #: The epoch the data position is in, and the global batches consumed in it.
    epoch: int = 0
    batches_done: int = 0
    #: The seed of the data order (``train/sampler.py``).
    data_seed: int = 0
    #: The peak-group learning rate of the last step (logged with each line).
    last_lr: float = 0.0
    #: Seconds of training in this and earlier (resumed) segments, up to the last checkpoint (wall
    #: time: a process stopped or waiting for a busy machine counts).
    elapsed: float = 0.0
    #: The CPU time the training process spent in those seconds (all its threads; a stopped or
    #: waiting process adds none), or None where an earlier segment's is unknown (a checkpoint
    #: written before this field was recorded: :data:`LATER_FIELDS`).
    cpu_seconds: float | None = 0.0
    #: Lines in metrics.jsonl at the checkpoint (later lines are dropped on resume).
    metrics_lines: int = 0

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: The names of the saved fields.
STATE_FIELDS = tuple(f.name for f in dataclasses.fields(TrainState))
#: Fields recorded since some checkpoints were written, and the value a checkpoint without one
#: resumes with (its earlier segments' value unknown); any other difference in the fields is an
#: error (another version of the trainer).
LATER_FIELDS: dict[str, Any] = {"cpu_seconds": None}
