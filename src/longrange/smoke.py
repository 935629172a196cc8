"""Smoke mode: the same commands, shrunk to seconds, to check that they run (not what they find).

With the environment variable ``LONGRANGE_SMOKE=1`` every command runs as written, with less work:

* every training stage (``train``, ``pretrain``, ``finetune``, each stage of ``compare`` and ``demo``)
  stops after :data:`MAX_STEPS` optimiser steps of at most :data:`MAX_BATCH` examples (a longer
  ``grad_accum`` is dropped) and evaluates in batches of :data:`MAX_EVAL`; a compute-matched stage
  still trains as long as its SPT chain did;
* a comparison runs the first :data:`MAX_SEEDS` of its seeds (its verdict then says that one seed
  cannot tell);
* the validation and test splits of every task are cut to their first :data:`MAX_EVAL` examples;
* generated data (``task.generate``, ``longrange data generate``) is built with at most
  :data:`MAX_GENERATED_TRAIN` training and :data:`MAX_EVAL` validation and test examples
  (Pathfinder: :data:`MAX_GENERATED_IMAGES` images).

The documentation's examples run this way in the tests (``tests/test_docs_examples.py``). Each
process that shrinks something says so once on standard error, and a smoke run never passes for a
real one: the capped settings are part of each run's settings (its fingerprint), its data
identity says ``smoke``, and generated data built in smoke mode has its own directory (its sizes
are part of the configuration's hash). Unset, empty or ``0``: off; ``1``: on; any other value is
an error naming the variable.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from longrange.errors import ConfigError

#: The environment variable that turns smoke mode on.
ENV = "LONGRANGE_SMOKE"
#: Optimiser steps per training stage.
MAX_STEPS = 2
#: Examples per optimiser step.
MAX_BATCH = 8
#: Seeds per comparison (the first ones given).
MAX_SEEDS = 1
#: Examples kept of each validation and test split, and generated per held-out split.
MAX_EVAL = 32
#: Training examples of generated data.
MAX_GENERATED_TRAIN = 1000
#: Images of generated Pathfinder data (split 80/10/10 by its loader).
MAX_GENERATED_IMAGES = 200
#: What a run's data identity records in smoke mode.
IDENTITY = f"val/test cut to {MAX_EVAL} examples"

_noticed = False


def active() -> bool:
    """Whether ``LONGRANGE_SMOKE`` asks for smoke mode (a value other than unset, ``0`` or ``1`` is an error)."""
    value = os.environ.get(ENV, "").strip()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise ConfigError(
        f"environment variable {ENV} must be 1 (smoke mode: every command shrunk to seconds) "
        f"or 0 / unset, got {value!r}"
    )


def notice() -> None:
    """Say once per process, on standard error, that smoke mode shrinks the work."""
    global _noticed
    if not _noticed:
        _noticed = True
        print(
            f"{ENV}=1: smoke mode, every training stage capped at {MAX_STEPS} steps of at most {MAX_BATCH} "
            f"examples, {MAX_SEEDS} seed(s) per comparison, {MAX_EVAL} validation and test examples, small "
            "generated data; the numbers mean nothing",
            file=sys.stderr,
            flush=True,
        )


def train_changes(train: Mapping[str, Any]) -> dict[str, Any]:
    """The changes to a stage's training settings (``max_steps``, ``batch_size``, ``grad_accum``,
    ``eval_batch_size``, given as in ``TrainConfig``) that smoke mode makes: {} when off or when
    nothing needs shrinking."""
    if not active():
        return {}
    changes: dict[str, Any] = {}
    steps = int(train.get("max_steps") or 0)
    if steps <= 0 or steps > MAX_STEPS:
        changes["max_steps"] = MAX_STEPS
    if int(train.get("batch_size", MAX_BATCH)) > MAX_BATCH:
        changes["batch_size"] = MAX_BATCH
        if int(train.get("grad_accum", 1)) != 1:
            changes["grad_accum"] = 1
    if int(train.get("eval_batch_size") or 0) != MAX_EVAL:  # each split in one batch
        changes["eval_batch_size"] = MAX_EVAL
    if changes:
        notice()
    return changes


def seeds(values: Sequence[int]) -> list[int]:
    """The seeds a comparison runs: all when off, else the first :data:`MAX_SEEDS`."""
    values = list(values)
    if active() and len(values) > MAX_SEEDS:
        notice()
        return values[:MAX_SEEDS]
    return values


def eval_size(n: int) -> int:
    """How many of a validation or test split's ``n`` examples are kept."""
    if active() and n > MAX_EVAL:
        notice()
        return MAX_EVAL
    return n


#: Caps of the generators' size options, by option name.
GENERATED_SIZES = {
    "n_train": MAX_GENERATED_TRAIN,
    "n_val": MAX_EVAL,
    "n_test": MAX_EVAL,
    "n_samples": MAX_GENERATED_IMAGES,
}


def generated_sizes(options: Mapping[str, Any]) -> dict[str, Any]:
    """A generator's options with its size options (:data:`GENERATED_SIZES`) capped in smoke mode."""
    out = dict(options)
    if not active():
        return out
    for name, limit in GENERATED_SIZES.items():
        if isinstance(out.get(name), int) and out[name] > limit:
            out[name] = limit
            notice()
    return out
