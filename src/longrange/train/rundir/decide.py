"""What a run does when it is opened: start afresh, resume from its checkpoint, or reuse the
finished run — decided once, under the directory's lock (:func:`open_run`).

The decision follows from the run's state (:func:`~longrange.train.rundir.state.read_state`), what
the caller intends (:class:`Intent`: the command line's plain, ``--resume`` and ``--overwrite``; a
comparison's continue, with or without ``--overwrite``) and the run's identity.

**Identity.** ``config.yaml`` holds the resolved configuration; its *identity* is that configuration
without the parts that cannot change a result (presentation settings, the sections the run writes,
fields at their default: ``longrange/identity.py``), and its *fingerprint* a short hash of the
identity. A run is resumed, and a finished one reused, only when the identities match; otherwise
the error (:class:`RunMismatchError`) names every field that differs. The trainer receives the
opened run directory and acts on its decision; nobody else decides. docs/reliability.md writes the
rule down.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from longrange import __version__
from longrange.errors import CheckpointError, ConfigError
from longrange.faults import kill_point
from longrange.fileio import check_out_dir
from longrange.identity import differences
from longrange.train.rundir.files import (
    clear,
    clear_failure,
    read_config,
    read_summary,
    remove_leftovers,
    summary_version,
)
from longrange.train.rundir.layout import RunLayout
from longrange.train.rundir.lock import STALE_AFTER, RunLock, RunLockedError
from longrange.train.rundir.messages import ways_on
from longrange.train.rundir.state import RunState, State, read_state


class RunMismatchError(ConfigError):
    """A run directory holds a run made with other settings."""


@dataclass(frozen=True)
class Intent:
    """What the caller asks of a run directory (:meth:`RunDir.open`).

    ``mode``: ``new`` (start a run; an error if the directory holds one), ``resume`` (continue it
    from its checkpoint; a finished run is returned as it is), ``overwrite`` (start afresh,
    replacing whatever is there), ``continue`` (reuse it if finished, resume it if interrupted,
    else start). For ``continue``: ``replace_stale`` starts afresh a run made with other settings
    (instead of an error), ``rerun_other_versions`` one finished by another longrange version.
    """

    mode: str
    replace_stale: bool = False
    rerun_other_versions: bool = False

    MODES: ClassVar[tuple[str, ...]] = ("new", "resume", "overwrite", "continue")

    def __post_init__(self) -> None:
        if self.mode not in self.MODES:
            raise ValueError(f"unknown intent {self.mode!r}; expected one of {', '.join(self.MODES)}")

    @classmethod
    def from_flags(cls, resume: bool = False, overwrite: bool = False, continue_: bool = False) -> Intent:
        """The intent of the command line's ``--resume`` / ``--overwrite`` / ``--continue`` (none: new)."""
        given = [
            flag for flag, on in (("--resume", resume), ("--overwrite", overwrite), ("--continue", continue_)) if on
        ]
        if len(given) > 1:
            if set(given) == {"--resume", "--overwrite"}:
                raise ConfigError("--resume and --overwrite contradict each other: resume a run, or replace it")
            raise ConfigError(f"{' and '.join(given)} contradict each other: give one of them")
        return cls("resume" if resume else "overwrite" if overwrite else "continue" if continue_ else "new")


class Decision(Enum):
    """What a run does, decided once by :meth:`RunDir.open`."""

    FRESH = "fresh"  # train from the start (the directory was cleared)
    RESUME = "resume"  # continue from checkpoints/last.pt
    REUSE = "reuse"  # finished with the same settings: its summary is the result


def mismatch(run: RunLayout, config: Mapping[str, Any]) -> list[str]:
    """The fields whose values differ between the saved run and ``config`` ([] when none is saved)."""
    saved = read_config(run)
    return [] if saved is None else differences(saved, config)


def check_same_run(run: RunLayout, config: Mapping[str, Any], action: str) -> None:
    """A :class:`RunMismatchError` if the saved run's identity differs from ``config``'s."""
    diff = mismatch(run, config)
    if diff:
        shown = "; ".join(diff[:8]) + (f"; and {len(diff) - 8} more" if len(diff) > 8 else "")
        raise RunMismatchError(
            f"cannot {action} {run.root}: it holds a run made with other settings ({shown}); "
            "pass --overwrite to replace it, or choose a new --out"
        )


def decide(run: RunLayout, config: Mapping[str, Any], intent: Intent, state: State | None = None) -> Decision:
    """The decision for ``intent``, from the run's state (no lock taken: :func:`open_run` takes it,
    reads the state and then decides)."""
    if intent.mode == "overwrite":
        return Decision.FRESH
    if intent.mode == "new":
        held = run.holds_run()
        if held and read_state(run, locked_here=True).kind is RunState.FINISHED:
            raise ConfigError(
                f"run directory {run.root} already holds a finished run (its result: {run.summary}); "
                "pass --overwrite to train it again, or choose a new --out"
            )
        if held:
            raise ConfigError(
                f"run directory {run.root} already holds an unfinished run ({held}); pass --resume to continue "
                "it, --overwrite to replace it, or choose a new --out"
            )
        return Decision.FRESH
    state = state or read_state(run, locked_here=True)
    done = state.kind is RunState.FINISHED
    if intent.mode == "resume":
        if not done and (state.restart or not state.checkpoint):
            if run.last.is_file():  # damaged
                raise CheckpointError(
                    f"cannot resume from {run.last}: the file is truncated or corrupt{ways_on(run.last)}"
                )
            why = f" ({'; '.join(state.damaged)})" if state.damaged else ""
            raise CheckpointError(f"cannot resume: no checkpoint at {run.last}{why}")
        check_same_run(run, config, "resume")
        return Decision.REUSE if done else Decision.RESUME
    if not done and state.restart:  # nothing usable to continue from (or its identity unreadable)
        if state.damaged:
            print(f"starting {run.root} afresh: {'; '.join(state.damaged)}", file=sys.stderr, flush=True)
        return Decision.FRESH
    if intent.replace_stale and mismatch(run, config):
        return Decision.FRESH
    if done and intent.rerun_other_versions and summary_version(read_summary(run) or {}) not in (None, __version__):
        return Decision.FRESH
    check_same_run(run, config, "reuse" if done else "resume")
    return Decision.REUSE if done else Decision.RESUME


def stale_after(config: Mapping[str, Any]) -> float:
    """The run's staleness window of its lock (``train.lock_stale_after``, else :data:`STALE_AFTER`)."""
    train = config.get("train")
    value = train.get("lock_stale_after") if isinstance(train, Mapping) else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else STALE_AFTER


def open_run(run: RunLayout, config: Mapping[str, Any], intent: Intent) -> tuple[Decision, RunLock | None]:
    """Lock the directory, decide what the run does (:func:`decide`) and clear it for a fresh start;
    returns the decision and the lock (held by rank 0, None on the other ranks).

    Under ``torchrun`` every rank calls this: rank 0 takes the lock and decides, the other ranks
    receive its decision (or its error). A directory locked by another live process raises
    :class:`RunLockedError`.
    """
    from longrange.train import distributed as D

    main = D.is_main_process()
    lock, outcome = None, None
    if main:
        try:
            check_out_dir(run.root)
            lock = RunLock(run.root, stale_after=stale_after(config)).acquire()
            kill_point("after-lock")
            remove_leftovers(run)
            decision = decide(run, config, intent)
            if decision is Decision.FRESH:
                clear(run)
            clear_failure(run)  # an earlier attempt's, or a stale one beside a finished run
            outcome = ("ok", decision.value)
        except BaseException as err:
            if lock is not None:
                lock.release()
            if D.world_size() > 1:
                D.broadcast_object(("locked" if isinstance(err, RunLockedError) else "error", f"{err}"))
            raise
    outcome = D.broadcast_object(outcome)
    kind, value = outcome
    if kind == "locked":
        raise RunLockedError(value)
    if kind == "error":
        raise ConfigError(f"rank 0 could not open {run.root}: {value}")
    return Decision(value), lock
