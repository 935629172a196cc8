"""A run directory as one object: :class:`RunDir`, its files' paths with a method for each thing done
with them, and :class:`OpenRun`, a run directory opened for writing.

Each method is a call into the module of this package whose job it is (the table in
``longrange/train/rundir/__init__.py``); callers use the methods and never those modules, so that
``RunDir(path)`` is the whole interface to a run directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrange.train.rundir import decide as _decide
from longrange.train.rundir import files as _files
from longrange.train.rundir import state as _state
from longrange.train.rundir.decide import Decision, Intent
from longrange.train.rundir.layout import RunLayout
from longrange.train.rundir.lock import STALE_AFTER, RunLock
from longrange.train.rundir.state import RunState, State


@dataclass(frozen=True)
class RunDir(RunLayout):
    """A run directory: its files (:class:`RunLayout`), what they hold, its lock and its lifecycle."""

    # -- reading (files.py)
    def read_config(self, required: bool = False) -> dict[str, Any] | None:
        """``config.yaml`` as a dict; None when it is missing (an error naming it with ``required``).
        A file cut short, altered or not valid YAML is a DataFormatError naming the file."""
        return _files.read_config(self, required)

    def read_summary(self) -> dict[str, Any] | None:
        """``summary.json`` as a dict, or None when the run has not finished."""
        return _files.read_summary(self)

    def read_failure(self) -> dict[str, Any] | None:
        """``failed.json`` as a dict, or None (an unreadable record reads as ``{}``)."""
        return _files.read_failure(self)

    def failure_since(self, since: float) -> str | None:
        """The error of a failure recorded at ``since`` or later, else None."""
        return _files.failure_since(self, since)

    def made_by(self) -> str | None:
        """The longrange version that finished this run (from its summary), or None."""
        return _files.summary_version(self.read_summary() or {})

    # -- writing (files.py)
    def write_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Write ``config`` (plain data) with its fingerprint; returns what was written."""
        return _files.write_config(self, config)

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        _files.write_summary(self, summary)

    def record_failure(self, error: str, *, stage: str | None = None, trace: str | None = None) -> None:
        """Write ``failed.json``: the error, its traceback and where the log is."""
        _files.record_failure(self, error, stage=stage, trace=trace)

    def record_exception(self, err: BaseException, stage: str | None = None) -> None:
        _files.record_exception(self, err, stage)

    def clear_failure(self) -> None:
        _files.clear_failure(self)

    def start_log(self, line: str) -> Path:
        """Append a header line to ``stage.log`` (created) and return its path."""
        return _files.start_log(self, line)

    def remove_leftovers(self) -> list[Path]:
        """Remove the temporary files of atomic writes whose writer died; returns them."""
        return _files.remove_leftovers(self)

    def clear(self) -> None:
        """Remove what a run wrote (checkpoints, metrics, summary, TensorBoard events) before a fresh start."""
        _files.clear(self)

    # -- where the run is (state.py)
    def state(self, *, locked_here: bool = False) -> State:
        """Where this run is: the one reading of its files and lock (:func:`.state.read_state`)."""
        return _state.read_state(self, locked_here=locked_here)

    def finished(self) -> bool:
        """Whether the run finished (:meth:`state` is FINISHED)."""
        return self.state().kind is RunState.FINISHED

    def progress(self) -> tuple[int, int] | None:
        """(steps done, steps planned) at the last checkpoint, or None when there is none readable."""
        return _state.progress(self)

    def require_finished(self, role: str, how: str) -> dict[str, Any]:
        """This run's summary, if it finished; else an error naming the run (``role``), its state
        and ``how`` to finish it (:func:`.state.require_finished`)."""
        return _state.require_finished(self, role, how)

    # -- the lock (lock.py) and the decision (decide.py)
    def lock(self, stale_after: float | None = None) -> RunLock:
        """The directory's lock (not yet taken); ``stale_after``: this run's staleness window."""
        return RunLock(self.root, stale_after=STALE_AFTER if stale_after is None else stale_after)

    def mismatch(self, config: Mapping[str, Any]) -> list[str]:
        """The fields whose values differ between the saved run and ``config`` ([] when none is saved)."""
        return _decide.mismatch(self, config)

    def check_same_run(self, config: Mapping[str, Any], action: str) -> None:
        """A RunMismatchError if the saved run's identity differs from ``config``'s."""
        _decide.check_same_run(self, config, action)

    def decide(self, config: Mapping[str, Any], intent: Intent, state: State | None = None) -> Decision:
        """The decision for ``intent``, from the run's :meth:`state` (no lock taken: :meth:`open`
        takes it, reads the state and then decides)."""
        return _decide.decide(self, config, intent, state)

    def open(self, config: Mapping[str, Any], intent: Intent) -> OpenRun:
        """Lock the directory, decide what the run does and clear it for a fresh start
        (:func:`.decide.open_run`; under ``torchrun`` rank 0 decides for every rank)."""
        decision, lock = _decide.open_run(self, config, intent)
        return OpenRun(self, decision, lock)


@dataclass
class OpenRun:
    """A run directory opened by :meth:`RunDir.open`: its decision, and its lock (rank 0) until closed."""

    dir: RunDir
    decision: Decision
    lock: RunLock | None = None

    @property
    def resumes(self) -> bool:
        """Whether the run continues from its checkpoint (a finished run is continued too)."""
        return self.decision is not Decision.FRESH

    @property
    def took_over(self) -> dict[str, Any] | None:
        """The holder of a stale lock this run took over (for its record), or None."""
        return self.lock.took_over if self.lock is not None else None

    def close(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def __enter__(self) -> OpenRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
