"""Running a comparison's plan: one walk of the dependency graph over any backend.

:func:`run_plan` decides, for every stage of the plan in order:

* a stage whose dependency failed, was skipped or is held elsewhere is **skipped**;
* a stage whose dependencies are done and whose run directory holds a finished run is **reused** in
  this process (its fingerprint checked, see ``execute.run_stage``);
* a stage that another live process holds is **held** (left alone);
* otherwise it is **submitted** to the backend once its dependencies are done (or, for a backend
  that orders jobs itself, such as SLURM with ``afterok``, once they are submitted), as capacity
  allows; the backend is polled until every submitted stage has an outcome.

A backend is small (:class:`Backend`): ``submit`` stages, ``poll`` a handle for its outcome,
``cancel`` a handle, ``stop`` what is running when the walk ends early. The in-process, local-worker
and SLURM backends live in ``experiment/backends/``; a new launcher is one backend there.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from longrange.experiment.plan import Plan, Stage
from longrange.faults import kill_point
from longrange.train.progress import format_seconds
from longrange.train.rundir import Intent, RunDir, RunState


class Outcome(Enum):
    """How a stage of a comparison ended."""

    DONE = "done"  # finished (trained, resumed or reused)
    FAILED = "failed"  # raised or was killed (its failed.json says why)
    SKIPPED = "skipped"  # a stage it needs did not finish
    HELD = "held"  # another live process holds it (it runs there)
    SUBMITTED = "submitted"  # handed to a scheduler that runs it later (SLURM, --no-wait)

    @property
    def blocks(self) -> bool:
        """Whether the stages after this one cannot run."""
        return self in (Outcome.FAILED, Outcome.SKIPPED, Outcome.HELD)


class Backend(Protocol):
    #: Whether stages may be submitted before their dependencies are done (the backend orders them).
    submits_ahead: bool
    #: Whether the walk waits for the submitted stages (False: return once submitted).
    wait: bool
    #: Seconds between polls.
    poll_interval: float

    def begin(self, plan: Plan, out_dir: Path, intent: Intent) -> None: ...

    def slots(self) -> int | None:
        """How many more stages may be submitted now (None: no limit)."""

    def submit(self, stages: Sequence[Stage], after: dict[str, Any]) -> dict[str, Any]:
        """Start ``stages`` (of one dependency level); ``after`` holds the handles of their
        dependencies that are still running. Returns a handle per stage id."""

    def poll(self, handle: Any) -> Outcome | None:
        """The outcome of a submitted stage, or None while it runs."""

    def cancel(self, handle: Any) -> None: ...

    def stop(self, handles: dict[str, Any], interrupted: bool) -> None:
        """The walk ends early (an error, or Ctrl-C when ``interrupted``) with these stages running."""

    def end(self, handles: dict[str, Any]) -> None:
        """The walk ends (``handles``: every stage submitted)."""


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


#: What a stage's announcement says of the time left before any stage run here has ended: the estimate
#: is the mean time of the stages run so far, and until one ends there is none.
NO_ETA_YET = "overall eta: known when the first stage run here ends"


@contextlib.contextmanager
def terminate_as_interrupt():
    """While the walk runs, SIGTERM to this process (``kill``, a shell's or CI's timeout) stops it as
    Ctrl-C does (a KeyboardInterrupt: the backend stops its running stages, local workers each
    finish their step and write a checkpoint) instead of ending the coordinator alone and leaving
    its workers training. Only where SIGTERM has its default action, in the main thread: a handler
    someone else installed (submitit's, a training loop's) is left as it is."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def overall_eta(seconds: float) -> str:
    """``overall eta 3m05s``, or :data:`NO_ETA_YET` before there is a measurement."""
    return f"overall eta {format_seconds(seconds)}" if seconds != float("inf") else NO_ETA_YET


def run_plan(
    plan: Plan, out_dir: str | Path, backend: Backend, *, intent: Intent = Intent("continue")
) -> dict[str, Outcome]:
    """Run the plan's stages on ``backend``; returns each stage's outcome, in plan order. ``intent``
    (mode continue) says what to do with stages made with other settings or another version."""
    walk = _Walk(plan, Path(out_dir), backend, intent)
    backend.begin(plan, walk.out_dir, intent)
    with terminate_as_interrupt():  # SIGTERM stops the walk as Ctrl-C does
        try:
            while walk.waiting or walk.running:
                walk.submit(walk.ready_stages())
                if not backend.wait:
                    break
                if not walk.running:
                    if walk.waiting:  # pragma: no cover - the plan lists stages after their dependencies
                        raise RuntimeError(f"stages {list(walk.waiting)} wait on stages that never ran")
                    break
                if not walk.poll() and walk.running:
                    time.sleep(backend.poll_interval)
        except BaseException as err:
            backend.stop(walk.running, interrupted=isinstance(err, KeyboardInterrupt))
            raise
    backend.end(walk.submitted)
    return walk.outcomes()


class _Walk:
    """The state of one :func:`run_plan`: which stages wait, run and ended, and the numbers it shows."""

    def __init__(self, plan: Plan, out_dir: Path, backend: Backend, intent: Intent):
        self.plan, self.out_dir, self.backend, self.intent = plan, out_dir, backend, intent
        self.outcome: dict[str, Outcome] = {}
        self.running: dict[str, Any] = {}  # submitted, no outcome yet
        self.submitted: dict[str, Any] = {}  # every handle, for the backend's end
        self.waiting = {s.id: s for s in plan.stages}  # in plan order; removal in O(1)
        self.state: dict[str, RunState] = {}  # each stage's run directory, read once (RunDir.state)
        self.n, self.start = len(plan.stages), time.time()
        self.done = 0  # stages DONE so far
        self.changed = True  # whether an outcome arrived since the waiting stages were last looked at
        self.numbers = iter(range(1, self.n + 1))  # stages are numbered in the order they are announced
        self.began: dict[str, float] = {}  # when each submitted stage started
        self.took: list[float] = []  # how long each stage run by the backend took
        self.peak = 1  # the most stages that ran at once

    def eta(self) -> float:
        """Seconds left: the mean stage so far for each stage not started, less what the running ones
        have done, spread over as many stages at once as have run."""
        if not self.took:
            return float("inf")
        mean, now = sum(self.took) / len(self.took), time.time()
        started = sum(max(mean - (now - self.began[sid]), 0.0) for sid in self.running)
        return (started + mean * (self.n - len(self.outcome) - len(self.running))) / self.peak

    def _where(self) -> str:
        """The next stage's number, as its announcement starts."""
        return f"stage {next(self.numbers)} of {self.n}"

    def _announce(self, what: str) -> str:
        return f"{self._where()}: {what}"

    def ready_stages(self) -> list[Stage]:
        """Look at the waiting stages (once an outcome has arrived): skip those whose dependency
        failed, reuse the finished ones, leave those another process holds; the stages to submit
        now, as the backend's free slots allow."""
        if not self.changed:
            return []
        self.changed = False
        free = self.backend.slots()
        ready: list[Stage] = []
        ready_ids: set[str] = set()
        for stage in list(self.waiting.values()):
            blocked = [a for a in stage.after if a in self.outcome and self.outcome[a].blocks]
            deps_done = all(self.outcome.get(a) is Outcome.DONE for a in stage.after)
            ahead = self.backend.submits_ahead and all(
                self.outcome.get(a) is Outcome.DONE or a in self.running or a in ready_ids for a in stage.after
            )
            if (deps_done or ahead) and stage.id not in self.state:  # read once, when it may first run
                self.state[stage.id] = RunDir(self.out_dir / stage.id).state().kind
            if blocked:
                self.outcome[stage.id] = Outcome.SKIPPED
                say(self._announce(f"skipping {stage.id} (needs {', '.join(blocked)})"))
            elif deps_done and self.state[stage.id] is RunState.FINISHED:
                self.outcome[stage.id] = _reuse(self.plan, stage, self.out_dir, self.intent, self._where())
            elif (deps_done or ahead) and self.state[stage.id] is RunState.HELD:
                self.outcome[stage.id] = Outcome.HELD
                say(self._announce(f"{stage.id} is running in another process; leaving it"))
            elif (deps_done or ahead) and (free is None or len(ready) < free):
                ready.append(stage)
                ready_ids.add(stage.id)
            else:
                continue
            del self.waiting[stage.id]
            if stage.id in self.outcome:
                self.done += self.outcome[stage.id] is Outcome.DONE
        return ready

    def submit(self, ready: list[Stage]) -> None:
        """Hand ``ready`` to the backend, one dependency level at a time."""
        for level in _by_level(self.plan, ready):
            for stage in level:
                say(self._announce(f"{stage.id} ({overall_eta(self.eta())})"))
            after = {a: self.running[a] for s in level for a in s.after if a in self.running}
            began = time.time()  # before submit: the in-process backend runs the stage inside it
            handles = self.backend.submit(level, after)
            self.began.update(dict.fromkeys(handles, began))
            self.running.update(handles)
            self.submitted.update(handles)
            self.peak = max(self.peak, len(self.running))

    def poll(self) -> bool:
        """Ask the backend for the outcome of every running stage; whether any arrived."""
        polled = False
        for sid, handle in list(self.running.items()):
            result = self.backend.poll(handle)
            if result is None or sid not in self.running:
                continue
            del self.running[sid]
            self.took.append(time.time() - self.began[sid])
            polled = True
            self._settle(sid, result)
        return polled

    def _settle(self, sid: str, result: Outcome) -> None:
        self.changed = True
        self.outcome[sid] = result
        self.done += result is Outcome.DONE
        say(f"[{self.done}/{self.n} done, {format_seconds(time.time() - self.start)}] {sid}: {result.value}")
        if result.blocks:  # its dependents will not run: cancel those already submitted
            for dep in self.plan.dependents(sid):
                if dep.id in self.running:
                    self.backend.cancel(self.running.pop(dep.id))
                    self.outcome[dep.id] = Outcome.SKIPPED

    def outcomes(self) -> dict[str, Outcome]:
        """Each stage's outcome in plan order (submitted: handed over and not waited for)."""
        return {
            s.id: self.outcome.get(s.id, Outcome.SUBMITTED if s.id in self.running else Outcome.SKIPPED)
            for s in self.plan.stages
        }


def run_here(plan: Plan, stage: Stage, out_dir: Path, intent: Intent, where: str = "") -> Outcome:
    """Run (or reuse) ``stage`` in this process (:func:`~longrange.experiment.execute.run_stage`):
    DONE, HELD (another process holds it) or FAILED (said on the terminal; recorded in its
    failed.json). What stops the whole comparison
    (:data:`~longrange.experiment.execute.STOPS_THE_GRID`) is raised."""
    from longrange.experiment.execute import STOPS_THE_GRID, run_stage
    from longrange.train.rundir import RunLockedError

    try:
        run_stage(plan.resolve(stage, out_dir), out_dir / stage.id, intent, plan_id=stage.id)
    except RunLockedError:
        return Outcome.HELD
    except STOPS_THE_GRID:
        raise
    except Exception as err:  # the grid goes on
        say(f"{where}{stage.id} FAILED: {type(err).__name__}: {err}")
        return Outcome.FAILED
    return Outcome.DONE


def after_exit(
    plan: Plan, stage: Stage, out_dir: Path, result: Outcome, since: float, reason: Callable[[], str], where: str = ""
) -> Outcome:
    """The outcome of ``stage`` once the process that ran it ended; ``result``: what its exit status
    says, ``reason()``: why it ended, in words (for a failure that the process did not record).

    The run directory's state (:meth:`RunDir.state`) has the last word: a run that finished is DONE
    whatever the exit status (a worker killed after it wrote its summary), once its summary is shown
    to be of this plan's settings (its fingerprint); one that did not finish is not DONE, and a
    failure is recorded in its ``failed.json`` unless the process recorded one since ``since``.
    Every backend whose stages run in other processes settles them here."""
    kill_point("coordinator-after-exit")
    run = RunDir(out_dir / stage.id)
    state = run.state()
    if state.kind is RunState.FINISHED and (result is Outcome.DONE or _planned(plan, stage, out_dir, state.summary)):
        if result is not Outcome.DONE:
            say(f"{where}{stage.id}: {reason()} after its run had finished; recorded as finished")
        return Outcome.DONE
    if result is Outcome.DONE:  # exited cleanly without a result
        result = Outcome.FAILED
    if result is Outcome.FAILED:
        error = run.failure_since(since)
        if error is None:  # a process killed by a signal, or one that ended without a summary, writes nothing
            error = (
                reason()
                if state.kind is not RunState.FINISHED
                else f"{reason()}, and its {run.summary.name} is of other settings"
            )
            run.record_failure(error, stage=stage.id)
            kill_point("coordinator-after-failure")
        say(f"{where}{stage.id} FAILED: {error} (log {run.log})")
    return result


def _planned(plan: Plan, stage: Stage, out_dir: Path, summary: dict[str, Any] | None) -> bool:
    """Whether ``summary`` is the result of ``stage`` with the plan's settings (its fingerprint)."""
    from longrange.errors import LongrangeError

    try:
        expected = plan.resolve(stage, out_dir).fingerprint()
    except LongrangeError:
        return False
    return (summary or {}).get("fingerprint") == expected


def _reuse(plan: Plan, stage: Stage, out_dir: Path, intent: Intent, where: str) -> Outcome:
    """A finished stage, checked and reused in this process (no backend needed)."""
    result = run_here(plan, stage, out_dir, intent, f"{where}: ")
    if result is not Outcome.FAILED:
        say(f"{where}: {'reusing' if result is Outcome.DONE else 'held elsewhere:'} {stage.id}")
    return result


def _by_level(plan: Plan, stages: list[Stage]) -> list[list[Stage]]:
    """``stages`` grouped by dependency level, in order (a level's dependencies are in earlier ones)."""
    depth: dict[str, int] = {}
    for s in plan.stages:
        depth[s.id] = 1 + max((depth[a] for a in s.after), default=-1)
    levels: dict[int, list[Stage]] = {}
    for s in stages:
        levels.setdefault(depth[s.id], []).append(s)
    return [levels[d] for d in sorted(levels)]
