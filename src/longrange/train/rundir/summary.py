"""``summary.json`` as a type: :class:`RunSummary`, what a finished stage records of its result.

The experiment layer builds one at the end of a stage (``experiment/record.py``) and writes
:meth:`RunSummary.to_json`; the report and the studies read one back with
:meth:`RunSummary.from_json`, which checks every field (a missing or mistyped field is a
:class:`~longrange.errors.DataFormatError` naming the file and the field). :data:`FIELDS` is the
one list of the fields, their types and whether a summary must hold them: summaries written before
an optional field was recorded read with it as None.

``format`` is the layout's version (:data:`SUMMARY_FORMAT`; summaries written before it was
recorded are format 1): a summary of a newer format is an error saying so, never read as if it
were this one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from longrange.errors import DataFormatError
from longrange.fileio import is_number, json_field

#: The layout of ``summary.json`` this module writes and reads.
SUMMARY_FORMAT = 1
#: The stages a run can be.
STAGES = ("train", "finetune", "pretrain")


@dataclass(frozen=True)
class ParamCounts:
    """``params``: the model's parameters, those inside its sequence primitives, and the elements
    of recurrent state per sequence at the task's length (None: not generating, or not recorded)."""

    total: int
    in_primitives: int
    state: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"total": self.total, "in_primitives": self.in_primitives}
        if self.state is not None:
            out["state"] = self.state
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any], path: Path | str | None = None) -> ParamCounts:
        return cls(
            total=json_field(d, "total", (int,), path),
            in_primitives=json_field(d, "in_primitives", (int,), path),
            state=json_field(d, "state", (int,), path, optional=True),
        )


#: Every field of ``summary.json``: name -> (JSON types, required). The order is the file's.
FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "format": ((int,), False),
    "task": ((str,), True),
    "label": ((str,), True),
    "regime": ((str,), True),
    "stage": ((str,), True),
    "seed": ((int,), True),
    "metric": ((str,), True),
    "higher_is_better": ((bool,), True),
    "best_val": ((dict,), True),
    "test": ((dict,), False),
    "steps": ((int,), True),
    "epochs": ((int, float), False),
    "stopped_early": ((bool,), False),
    "params": ((dict,), True),
    "pretrain_run": ((str,), False),
    "pretrain": ((dict,), False),
    "pretrain_reverse": ((dict,), False),
    "train_subset": ((float, int), False),
    "train_size": ((int,), False),
    "seconds": ((int, float), True),
    "cpu_seconds": ((int, float), False),
    "fingerprint": ((str,), False),
    "data_dir": ((str,), False),
    "skip_bad": ((bool,), False),
    "skipped": ((dict,), False),
    "versions": ((dict,), False),
    "device": ((dict,), False),
    "precision": ((dict,), False),
    "deterministic": ((bool,), False),
    "kernels": ((dict,), False),
}


@dataclass(frozen=True)
class RunSummary:
    """What a finished stage recorded (``summary.json``); see :data:`FIELDS` for which fields a
    summary must hold. ``best_val`` and ``test`` map metric names to numbers (None where a value
    was not finite); ``test`` is None where the stage was not tested."""

    task: str
    label: str
    regime: str
    stage: str
    seed: int
    metric: str
    higher_is_better: bool
    best_val: dict[str, float | None]
    steps: int
    params: ParamCounts
    seconds: float
    test: dict[str, float | None] | None = None
    #: The training process's CPU time (``seconds`` is wall time); None where not recorded.
    cpu_seconds: float | None = None
    epochs: float | None = None
    stopped_early: bool | None = None
    #: A finetuning stage's pretraining run, relative to this run's directory, and what it was.
    pretrain_run: str | None = None
    pretrain: dict[str, Any] | None = None
    pretrain_reverse: dict[str, Any] | None = None
    #: The task's train_subset (a data-fraction sweep's dimension) and the training set size it left.
    train_subset: float | int | None = None
    train_size: int | None = None
    fingerprint: str | None = None
    data_dir: str | None = None
    skip_bad: bool | None = None
    skipped: dict[str, int] | None = None
    #: Software versions (``versions.longrange``: the version that made the run).
    versions: dict[str, Any] | None = None
    #: Where the run trained, its precision and mode, and the implementation each op ran.
    device: dict[str, Any] | None = None
    precision: dict[str, Any] | None = None
    deterministic: bool | None = None
    kernels: dict[str, str] | None = None
    format: int = SUMMARY_FORMAT

    @property
    def version(self) -> str | None:
        """The longrange version that made the run (None where the summary does not say)."""
        version = (self.versions or {}).get("longrange")
        return str(version) if version is not None else None

    def to_json(self) -> dict[str, Any]:
        """The ``summary.json`` object, fields in :data:`FIELDS`' order."""
        out: dict[str, Any] = {}
        for name in FIELDS:
            value = getattr(self, name)
            out[name] = value.to_json() if isinstance(value, ParamCounts) else value
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any], path: Path | str | None = None) -> RunSummary:
        """The summary ``d`` (read from ``path``, named in errors), every field checked."""
        if not isinstance(d, Mapping):
            raise DataFormatError(f"expected a JSON object, got {type(d).__name__}", path)
        fmt = json_field(d, "format", (int,), path, optional=True) or 1
        if fmt > SUMMARY_FORMAT:
            raise DataFormatError(
                f"summary format {fmt} is newer than this longrange reads ({SUMMARY_FORMAT}); upgrade longrange "
                "to read it",
                path,
            )
        values = {
            name: json_field(d, name, kinds, path, optional=not required) for name, (kinds, required) in FIELDS.items()
        }
        if values["stage"] not in STAGES:
            raise DataFormatError(f"field 'stage' must be one of {', '.join(STAGES)}, got {values['stage']!r}", path)
        for name in ("best_val", "test"):
            for k, v in (values[name] or {}).items():
                if v is not None and not is_number(v):
                    raise DataFormatError(f"field '{name}.{k}' must be a number or null, got {v!r}", path)
        if values["metric"] not in values["best_val"]:
            raise DataFormatError(
                f"field 'best_val' has no '{values['metric']}' (the run's metric); it has {sorted(values['best_val'])}",
                path,
            )
        values["params"] = ParamCounts.from_json(values["params"], path)
        values["seconds"] = float(values["seconds"])
        if values["cpu_seconds"] is not None:
            values["cpu_seconds"] = float(values["cpu_seconds"])
        values["format"] = fmt
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


__all__ = ["FIELDS", "STAGES", "SUMMARY_FORMAT", "ParamCounts", "RunSummary"]
