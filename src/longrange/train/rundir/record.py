"""``config.yaml``'s ``record`` section as a type: :class:`RunRecord`, what a run records beside its
settings (not part of its fingerprint).

The experiment layer builds one when a stage starts training (``experiment/record.run_record``:
where the data came from, what was skipped, software versions, host, what was transferred, the
task's vocabulary) and completes it when training ends (``experiment/record.finish_record``: the
device, precision, deterministic mode and the implementation each op ran, known only then; see
``train/environment.py``). Inference (``train/trained.py``) reads it back with
:meth:`RunRecord.from_json`, which checks the type of every field it finds. Every field may be
absent: records written by earlier versions, or before training ended, lack some, and an absent
field reads as None and is not written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrange.errors import DataFormatError
from longrange.fileio import json_field

#: Every field of the record: name -> its JSON types. The order is the file's.
FIELDS: dict[str, tuple[type, ...]] = {
    "data_dir": (str,),
    "skip_bad": (bool,),
    "skipped": (dict,),
    "train_size": (int,),
    "versions": (dict,),
    "host": (str,),
    "init": (dict,),
    "transfer": (dict,),
    "vocabulary": (dict,),
    "lock_taken_over": (dict,),
    "device": (dict,),
    "precision": (dict,),
    "deterministic": (bool,),
    "kernels": (dict,),
}
#: What the trainer reports of how the run ran (:meth:`Trainer.fit`'s result), recorded at the end.
RAN = ("device", "precision", "deterministic", "kernels")


@dataclass(frozen=True)
class RunRecord:
    """The ``record`` section of a run's ``config.yaml`` (the module doc says when each part is written)."""

    #: The data directory the run read, resolved; whether bad records were skipped, and how many per split.
    data_dir: str | None = None
    skip_bad: bool | None = None
    skipped: dict[str, int] | None = None
    #: The number of training examples (after a training subset).
    train_size: int | None = None
    #: Software versions (``versions.longrange``: the version that made the run) and the host.
    versions: dict[str, Any] | None = None
    host: str | None = None
    #: A finetuning run's pretrained runs (``from``, ``reverse_from``) and what was transferred.
    init: dict[str, Any] | None = None
    transfer: dict[str, Any] | None = None
    #: The task's tokens and their ids, so that new inputs are encoded as the model learned them.
    vocabulary: dict[str, Any] | None = None
    #: The holder of a stale lock that this run took over, when one was.
    lock_taken_over: dict[str, Any] | None = None
    #: Where the run trained, its precision and mode, and the implementation each op ran (:data:`RAN`).
    device: dict[str, Any] | None = None
    precision: dict[str, Any] | None = None
    deterministic: bool | None = None
    kernels: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``record`` mapping, fields in :data:`FIELDS`' order; a field that is None is left out."""
        return {name: getattr(self, name) for name in FIELDS if getattr(self, name) is not None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None, path: Path | str | None = None) -> RunRecord:
        """The record ``d`` (from ``path``'s ``record`` section, named in errors), every field
        present checked; None or an empty mapping is an empty record. A field this version does not
        know (a newer version's) is not read, as :meth:`RunSummary.from_json` does."""
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise DataFormatError(f"the 'record' section must be a mapping, got {type(d).__name__}", path)
        return cls(
            **{
                name: json_field(d, name, kinds, path, optional=True, prefix="record.")
                for name, kinds in FIELDS.items()
            }
        )
