"""Where a run is: the one reading of a run directory's files and lock (:func:`read_state`), and the
one check that a run another needs has finished (:func:`require_finished`).

Everything that asks where a run is reads it here: the scheduler, reuse, finetuning's check of its
pretraining run, inference's check of the run it loads, ``compare --status``, the report, a
coordinator after its worker ended. A run is pending (nothing written), finished (``summary.json``,
the commit point, written last and atomically), held (a live process holds the lock), failed
(``failed.json``) or resumable (anything else written); files that cannot be read are named.
docs/reliability.md writes the rule down.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from longrange.errors import ConfigError, DataFormatError, DataMissingError
from longrange.train.rundir.files import read_config, read_failure, try_json
from longrange.train.rundir.integrity import safetensors_problem, zip_problem
from longrange.train.rundir.layout import CONFIG_FILE, FAILED_FILE, SUMMARY_FILE, RunLayout
from longrange.train.rundir.lock import RunLock


class RunState(Enum):
    """Where a run directory is: the one reading of its files and its lock (:func:`read_state`).

    Every combination of files that a kill can leave is exactly one of these; a rerun (``compare``
    again, or the command line's ``--resume``) moves each to FINISHED without manual steps.
    """

    PENDING = "pending"  # nothing written yet: a rerun starts it
    FINISHED = "finished"  # summary.json, the commit point, is there and readable: the result
    RESUMABLE = "resumable"  # started, not finished, nobody writing: a rerun continues it (from last.pt, or afresh)
    FAILED = "failed"  # its last attempt failed (failed.json): a rerun tries again, as RESUMABLE
    HELD = "held"  # a live process holds its lock: it is running there


@dataclass(frozen=True)
class State:
    """A run directory's state and what it was read from (:func:`read_state`).

    ``restart``: a rerun must start afresh (no usable checkpoint, or a damaged file that makes what is
    there unusable); ``damaged``: the files that could not be read, each with why; ``stale_failure``:
    a ``failed.json`` beside a finished run (a worker that died, or was reported dead, after its
    summary was written), which the next opening removes.
    """

    kind: RunState
    detail: str
    summary: dict[str, Any] | None = None
    holder: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None
    checkpoint: bool = False
    restart: bool = False
    damaged: tuple[str, ...] = ()
    stale_failure: bool = False

    @property
    def value(self) -> str:
        return self.kind.value

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}"


class UnfinishedRunError(ConfigError):
    """A run that another one needs finished has not finished (no run, running, failed, interrupted)."""


def read_state(run: RunLayout, *, locked_here: bool = False) -> State:
    """Where ``run`` is: the one reading of its files and lock, used by everything that asks.

    The rule (the commit point is ``summary.json``, written atomically as the last file of a run):

    1. a readable ``summary.json``, with a readable ``config.yaml`` and intact best weights, is
       FINISHED, whatever else is there: a ``failed.json`` beside it is stale (written by a
       coordinator that saw the worker die after the summary, or left by an earlier attempt) and
       a lock beside it is a reader's or a dying writer's;
    2. otherwise a lock held by a live process is HELD (``locked_here``: the caller holds it);
    3. otherwise a ``failed.json`` (readable or not) is FAILED;
    4. otherwise anything written (a checkpoint, the config, metrics, a damaged summary) is RESUMABLE;
    5. otherwise PENDING.

    A file that cannot be read (half-written by a file system without atomic renames, or damaged)
    is listed in ``damaged``; a damaged ``last.pt`` counts as no checkpoint, and a damaged
    ``config.yaml`` or best weights mean the run starts afresh (``restart``): its identity, or
    its result, cannot be checked. Cheap: small files are parsed, checkpoints only opened.
    """
    damaged: list[str] = []
    summary, problem = try_json(run.summary)
    if problem:
        damaged.append(problem)
    config_ok = True
    if run.config.is_file():
        try:
            read_config(run)
        except DataFormatError as err:
            config_ok = False
            damaged.append(str(err))
    weights_ok = True
    if run.best_weights.is_file():
        problem = safetensors_problem(run.best_weights)
        if problem:
            weights_ok = False
            damaged.append(problem)
    checkpoint = False
    if run.last.is_file():
        problem = zip_problem(run.last)
        checkpoint = problem is None
        if problem:
            damaged.append(problem)
    failure = read_failure(run)
    restart = not (checkpoint and config_ok and weights_ok)
    common = dict(failure=failure, checkpoint=checkpoint, restart=restart, damaged=tuple(damaged))
    if summary is not None and config_ok and weights_ok:
        return State(
            RunState.FINISHED,
            f"{SUMMARY_FILE} written",
            summary=summary,
            stale_failure=failure is not None,
            **{**common, "restart": False},
        )
    holder = None if locked_here else RunLock(run.root).holder()
    if holder is not None:
        return State(
            RunState.HELD, f"held by PID {holder.get('pid')} on host {holder.get('host')}", holder=holder, **common
        )
    resume = "starts afresh" if restart else "resumes from its last checkpoint"
    why = f" ({'; '.join(damaged)})" if damaged else ""
    if failure is not None:
        error = failure.get("error") or f"unreadable {FAILED_FILE}"
        return State(RunState.FAILED, f"{error}; a rerun {resume}{why}", **common)
    if checkpoint or damaged or run.config.is_file() or run.metrics.is_file():
        if checkpoint:
            return State(RunState.RESUMABLE, f"a checkpoint, no summary: a rerun {resume}{why}", **common)
        return State(RunState.RESUMABLE, f"started, no checkpoint: a rerun starts afresh{why}", **common)
    return State(RunState.PENDING, "nothing written yet", **common)


def progress(run: RunLayout) -> tuple[int, int] | None:
    """(steps done, steps planned) at the last checkpoint, or None when there is none readable."""
    import torch

    try:
        state = torch.load(run.last, map_location="cpu", weights_only=True)
        step = int(state["trainer"]["step"])
        cfg, data = state["config"], state["data"]
        planned = int(cfg["max_steps"]) or int(cfg["epochs"]) * (int(data["n_items"]) // int(data["batch_size"]))
    except Exception:  # absent, unreadable or of another layout: progress unknown
        return None
    return step, planned


#: Where a directory that holds a finished run comes from.
_GIVE_ONE = (
    "give the directory of a finished run (the --out of the command that made it, or a stage's "
    "directory under a comparison's --out)"
)


def require_finished(run: RunLayout, role: str, how: str) -> dict[str, Any]:
    """The summary of the finished run in ``run``; else an error naming the run (``role``: "the
    pretraining run", "run directory"), what the directory holds and ``how`` to finish it.

    A directory that does not exist is a :class:`DataMissingError`; one that holds no run (no
    ``config.yaml``), or a run that is still running, failed or did not finish, an
    :class:`UnfinishedRunError`.
    """
    name = f"{role} {run.root}"
    if not run.root.is_dir():
        raise DataMissingError(f"{name} does not exist: {_GIVE_ONE}")
    state = read_state(run)
    if state.kind is RunState.FINISHED and run.config.is_file():
        return state.summary or {}
    if state.kind is RunState.PENDING:
        raise UnfinishedRunError(f"{name} holds no run (no {CONFIG_FILE}): {_GIVE_ONE}")
    steps = progress(run) if state.checkpoint else None  # reads the checkpoint: only for the error
    at = f"step {steps[0]} of {steps[1]}" if steps else "no checkpoint yet"
    why = f"; unreadable: {'; '.join(state.damaged)}" if state.damaged else ""
    if state.kind is RunState.HELD:
        holder = state.holder or {}
        what = f"is still running (PID {holder.get('pid')} on host {holder.get('host')}, {at})"
        how = "wait for it to finish"
    elif state.kind is RunState.FAILED:
        what = f"failed ({(state.failure or {}).get('error') or 'see ' + str(run.failure)}; {at}{why})"
    elif not run.config.is_file():
        raise UnfinishedRunError(f"{name} holds no run (no {CONFIG_FILE}): {_GIVE_ONE}")
    elif steps:
        what = f"was interrupted at {at} (no summary{why})"
    else:
        what = f"has not finished (no summary), {'its progress unknown' if state.checkpoint else at}{why}"
    raise UnfinishedRunError(f"{name} {what}: it is not a result; {how}")
