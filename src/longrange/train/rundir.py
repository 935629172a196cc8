"""The run directory: the one module that knows its files, holds its lock and decides what a run does.

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

Every other module reaches these files through :class:`RunDir`; none spells their names.

**Identity.** ``config.yaml`` holds the resolved configuration; its *identity* is that configuration
without the parts that cannot change a result (presentation settings, the sections the run writes,
fields at their default: ``longrange/identity.py``), and its *fingerprint* a short hash of the
identity. A run is resumed, and a finished one reused, only when the identities match; otherwise
the error names every field that differs.

**Lifecycle.** :meth:`RunDir.state` is the one reading of where a run is, used by everything that
asks (the scheduler, reuse, finetuning's check of its pretraining run, ``compare --status``, the
report, a coordinator after its worker ended): pending (nothing written), finished (``summary.json``,
the commit point, written last and atomically), held (a live process holds the lock), failed
(``failed.json``) or resumable (anything else written); files that cannot be read are named.
:meth:`RunDir.open` takes the lock and makes the single decision — start afresh, resume from the
checkpoint, or reuse the finished run — from that state, what the caller intends (:class:`Intent`:
the command line's plain, ``--resume`` and ``--overwrite``; a comparison's continue, with or
without ``--overwrite``) and the fingerprint. The trainer receives the opened run directory and
acts on its decision; nobody else decides. docs/reliability.md writes the rule down.

**Lock.** ``.lock`` holds the writer's PID and host: a second writer stops at once naming them. A
lock left by a process that died is detected (same host, PID gone; or no heartbeat for
``STALE_AFTER`` seconds when the holder is on another host, e.g. a SLURM node that went down) and
taken over safely.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Mapping

import yaml

from longrange import __version__
from longrange.faults import kill_point
from longrange.errors import CheckpointError, ConfigError, DataFormatError, DataMissingError, DiskWriteError, LongrangeError
from longrange.fileio import SEAL_PREFIX, append_text, atomic_write, check_out_dir, seal, unseal, write_json
from longrange.identity import differences, fingerprint, identity

__all__ = [
    "RunDir", "RunPaths", "OpenRun", "Intent", "Decision", "RunState", "RunStatus", "State", "RunLock", "RunLockedError",
    "RunMismatchError", "check_out_dir", "identity", "fingerprint", "differences",
]

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

#: PyYAML's safe loader, its C implementation where PyYAML has one (tens of times faster: a grid's
#: coordinator reads every stage's config.yaml, a 10,000-stage grid tens of thousands of them).
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def plain(value: Any, where: str = "config") -> Any:
    """``value`` as YAML-safe plain data (tuples become lists, paths strings); a ConfigError naming
    the field for anything else."""
    if isinstance(value, Mapping):
        return {str(k): plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, str):
        return str(value)  # also str subclasses (e.g. torch's version string), which YAML cannot write
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise ConfigError(f"config value {where} of type {type(value).__name__} cannot be saved to YAML")


class RunMismatchError(ConfigError):
    """A run directory holds a run made with other settings."""


class UnfinishedRunError(ConfigError):
    """A run that another one needs finished has not finished (running, failed, interrupted)."""


# ----------------------------------------------------------------------------- lifecycle
class RunState(Enum):
    """Where a run directory is: the one reading of its files and its lock (:meth:`RunDir.state`).

    Every combination of files that a kill can leave is exactly one of these; a rerun (``compare``
    again, or the command line's ``--resume``) moves each to FINISHED without manual steps.
    """

    PENDING = "pending"        # nothing written yet: a rerun starts it
    FINISHED = "finished"      # summary.json, the commit point, is there and readable: the result
    RESUMABLE = "resumable"    # started, not finished, nobody writing: a rerun continues it (from last.pt, or afresh)
    FAILED = "failed"          # its last attempt failed (failed.json): a rerun tries again, as RESUMABLE
    HELD = "held"              # a live process holds its lock: it is running there


#: The name under which earlier versions exported :class:`RunState` (its values were renamed:
#: done -> finished, running -> held, interrupted -> resumable).
RunStatus = RunState


@dataclass(frozen=True)
class State:
    """A run directory's state and what it was read from (:meth:`RunDir.state`).

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
    def from_flags(cls, resume: bool = False, overwrite: bool = False, continue_: bool = False) -> "Intent":
        """The intent of the command line's ``--resume`` / ``--overwrite`` / ``--continue`` (none: new)."""
        given = [flag for flag, on in (("--resume", resume), ("--overwrite", overwrite), ("--continue", continue_)) if on]
        if len(given) > 1:
            if set(given) == {"--resume", "--overwrite"}:
                raise ConfigError("--resume and --overwrite contradict each other: resume a run, or replace it")
            raise ConfigError(f"{' and '.join(given)} contradict each other: give one of them")
        return cls("resume" if resume else "overwrite" if overwrite else "continue" if continue_ else "new")


class Decision(Enum):
    """What a run does, decided once by :meth:`RunDir.open`."""

    FRESH = "fresh"    # train from the start (the directory was cleared)
    RESUME = "resume"  # continue from checkpoints/last.pt
    REUSE = "reuse"    # finished with the same settings: its summary is the result


@dataclass(frozen=True)
class RunDir:
    """A run directory: its files, what they hold, its lock and its lifecycle (see the module doc)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    # -- files
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

    # -- reading
    def read_config(self, required: bool = False) -> dict[str, Any] | None:
        """``config.yaml`` as a dict; None when it is missing (an error naming it with ``required``).
        A file cut short or altered (its seal does not match, see :func:`longrange.fileio.seal`) or
        invalid YAML is a :class:`DataFormatError` naming the file (and the line)."""
        if not self.config.is_file():
            if required:
                raise DataMissingError(f"{self.root} is not a run directory (no {CONFIG_FILE})")
            return None
        try:
            raw = self.config.read_bytes()
            data = yaml.load(unseal(raw, self.config), Loader=YAML_LOADER)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            seal_line = 1 if raw.startswith(SEAL_PREFIX) else 0  # lines are counted in the file, seal included
            raise DataFormatError(f"not valid YAML: {getattr(err, 'problem', err)}", self.config,
                                  mark.line + 1 + seal_line if mark is not None else None) from None
        if not isinstance(data, dict):
            raise DataFormatError(f"expected a mapping at the top level, got {type(data).__name__}", self.config)
        return data

    def read_summary(self) -> dict[str, Any] | None:
        """``summary.json`` as a dict, or None when the run has not finished."""
        return self._read_json(self.summary)

    def read_failure(self) -> dict[str, Any] | None:
        """``failed.json`` as a dict, or None (an unreadable record reads as ``{}``)."""
        try:
            return self._read_json(self.failure)
        except DataFormatError:
            return {}

    @staticmethod
    def _read_json(path: Path) -> dict[str, Any] | None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataFormatError(f"not valid JSON: {err.msg} (column {err.colno})", path, err.lineno) from None
        if not isinstance(data, dict):
            raise DataFormatError(f"expected a JSON object, got {type(data).__name__}", path)
        return data

    def finished(self) -> bool:
        """Whether the run finished (:meth:`state` is FINISHED)."""
        return self.state().kind is RunState.FINISHED

    def holds_run(self) -> str | None:
        """The name of the first file that shows a run was made here, or None."""
        for f in (self.last, self.best_weights, self.metrics, self.summary):
            if f.exists():
                return f.name
        return None

    # -- writing
    def write_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Write ``config`` (plain data, see :func:`plain`) with its fingerprint; returns what was written."""
        out = plain({k: v for k, v in config.items() if k != "fingerprint"})
        out["fingerprint"] = fingerprint(out)
        atomic_write(self.config, seal(yaml.safe_dump(out, sort_keys=False)))
        return out

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        write_json(self.summary, dict(summary))

    def record_failure(self, error: str, *, stage: str | None = None, trace: str | None = None) -> None:
        """Write ``failed.json``: the error, its traceback and where the log is."""
        record = {"stage": stage, "error": error, "traceback": trace,
                  "log": str(self.log) if self.log.is_file() else None, "time": time.time()}
        try:
            write_json(self.failure, record, indent=1)
        except DiskWriteError as err:  # the failure itself is raised by the caller; say why it is not on record
            print(f"warning: the failure of {self.root} is not recorded: {err}", file=sys.stderr, flush=True)

    def record_exception(self, err: BaseException, stage: str | None = None) -> None:
        self.record_failure(f"{type(err).__name__}: {err}", stage=stage, trace=traceback.format_exc())

    def failure_since(self, since: float) -> str | None:
        """The error of a failure recorded at ``since`` or later, else None."""
        record = self.read_failure()
        if record and record.get("time", 0) >= since - 1:
            return str(record.get("error"))
        return None

    def remove_leftovers(self) -> list[Path]:
        """Remove the temporary files of atomic writes whose writer died before renaming them
        (``.NAME.tmp-PID``, PID gone on this host); returns them. Called by the lock's holder."""
        removed = []
        for folder in (self.root, self.checkpoints):
            for tmp in folder.glob(".*.tmp-*"):
                pid = tmp.name.rpartition(".tmp-")[2]
                if pid.isdigit() and not _pid_alive(int(pid)):
                    tmp.unlink(missing_ok=True)
                    removed.append(tmp)
        return removed

    def clear_failure(self) -> None:
        self.failure.unlink(missing_ok=True)

    def start_log(self, line: str) -> Path:
        """Append a header line to ``stage.log`` (created) and return its path."""
        self.root.mkdir(parents=True, exist_ok=True)
        append_text(self.log, f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
        return self.log

    def clear(self) -> None:
        """Remove what a run wrote (checkpoints, metrics, summary, TensorBoard events) before a fresh start."""
        # The summary first: once it is gone, a kill anywhere below leaves a run that is not finished.
        for f in (self.summary, self.last, self.checkpoints / "best.pt", self.best_weights, self.metrics):
            f.unlink(missing_ok=True)
            if f == self.summary:
                kill_point("after-clear-summary")
        if self.tensorboard.is_dir():
            for f in self.tensorboard.glob("events.out.tfevents.*"):
                f.unlink()
        self.checkpoints.mkdir(parents=True, exist_ok=True)

    # -- lock and lifecycle
    def lock(self, stale_after: float | None = None) -> "RunLock":
        """The directory's lock (not yet taken); ``stale_after``: this run's staleness window."""
        return RunLock(self.root, stale_after=STALE_AFTER if stale_after is None else stale_after)

    def state(self, *, locked_here: bool = False) -> State:
        """Where this run is: the one reading of its files and lock, used by everything that asks.

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
        summary, problem = self._try_json(self.summary)
        if problem:
            damaged.append(problem)
        config_ok = True
        if self.config.is_file():
            try:
                self.read_config()
            except DataFormatError as err:
                config_ok = False
                damaged.append(str(err))
        weights_ok = True
        if self.best_weights.is_file():
            problem = _safetensors_problem(self.best_weights)
            if problem:
                weights_ok = False
                damaged.append(problem)
        checkpoint = False
        if self.last.is_file():
            problem = _zip_problem(self.last)
            checkpoint = problem is None
            if problem:
                damaged.append(problem)
        failure = self.read_failure()
        restart = not (checkpoint and config_ok and weights_ok)
        common = dict(failure=failure, checkpoint=checkpoint, restart=restart, damaged=tuple(damaged))
        if summary is not None and config_ok and weights_ok:
            return State(RunState.FINISHED, f"{SUMMARY_FILE} written", summary=summary,
                         stale_failure=failure is not None, **{**common, "restart": False})
        holder = None if locked_here else self.lock().holder()
        if holder is not None:
            return State(RunState.HELD, f"held by PID {holder.get('pid')} on host {holder.get('host')}",
                         holder=holder, **common)
        resume = ("starts afresh" if restart else "resumes from its last checkpoint")
        why = f" ({'; '.join(damaged)})" if damaged else ""
        if failure is not None:
            error = failure.get("error") or f"unreadable {FAILED_FILE}"
            return State(RunState.FAILED, f"{error}; a rerun {resume}{why}", **common)
        if checkpoint or damaged or self.config.is_file() or self.metrics.is_file():
            if checkpoint:
                return State(RunState.RESUMABLE, f"a checkpoint, no summary: a rerun {resume}{why}", **common)
            return State(RunState.RESUMABLE, f"started, no checkpoint: a rerun starts afresh{why}", **common)
        return State(RunState.PENDING, "nothing written yet", **common)

    @staticmethod
    def _try_json(path: Path) -> tuple[dict[str, Any] | None, str | None]:
        """(the JSON object in ``path`` or None, why it cannot be read or None)."""
        try:
            return RunDir._read_json(path), None
        except DataFormatError as err:
            return None, str(err)
        except OSError as err:
            return None, f"{path}: cannot read ({err.strerror})"

    def progress(self) -> tuple[int, int] | None:
        """(steps done, steps planned) at the last checkpoint, or None when there is none readable."""
        import torch

        try:
            state = torch.load(self.last, map_location="cpu", weights_only=True)
            step = int(state["trainer"]["step"])
            cfg, data = state["config"], state["data"]
            planned = int(cfg["max_steps"]) or int(cfg["epochs"]) * (int(data["n_items"]) // int(data["batch_size"]))
        except Exception:  # absent, unreadable or of another layout: progress unknown
            return None
        return step, planned

    def require_finished(self, role: str, how: str) -> dict[str, Any]:
        """This run's summary, if it finished (:meth:`state`); else an error naming the run, its
        state and ``how`` to finish it. ``role`` names it in the message ("the pretraining run")."""
        state = self.state()
        if state.kind is RunState.FINISHED:
            return state.summary or {}
        progress = self.progress() if state.checkpoint else None  # reads the checkpoint: only for the error
        at = f"step {progress[0]} of {progress[1]}" if progress else "no checkpoint yet"
        why = f"; unreadable: {'; '.join(state.damaged)}" if state.damaged else ""
        if state.kind is RunState.HELD:
            holder = state.holder or {}
            what = f"is still running (PID {holder.get('pid')} on host {holder.get('host')}, {at})"
            how = "wait for it to finish"
        elif state.kind is RunState.FAILED:
            what = f"failed ({(state.failure or {}).get('error') or 'see ' + str(self.failure)}; {at}{why})"
        elif state.kind is RunState.RESUMABLE:
            what = f"did not finish ({at}{why})" if not state.checkpoint else f"was interrupted at {at}{why}"
        else:
            what = "holds no run"
        raise UnfinishedRunError(f"{role} {self.root} {what}: it is not a result to start from; {how}")

    def mismatch(self, config: Mapping[str, Any]) -> list[str]:
        """The fields whose values differ between the saved run and ``config`` ([] when none is saved)."""
        saved = self.read_config()
        return [] if saved is None else differences(saved, config)

    def check_same_run(self, config: Mapping[str, Any], action: str) -> None:
        """A :class:`RunMismatchError` if the saved run's identity differs from ``config``'s."""
        diff = self.mismatch(config)
        if diff:
            shown = "; ".join(diff[:8]) + (f"; and {len(diff) - 8} more" if len(diff) > 8 else "")
            raise RunMismatchError(
                f"cannot {action} {self.root}: it holds a run made with other settings ({shown}); "
                "pass --overwrite to replace it, or choose a new --out"
            )

    def made_by(self) -> str | None:
        """The longrange version that finished this run (from its summary), or None."""
        return summary_version(self.read_summary() or {})

    def decide(self, config: Mapping[str, Any], intent: Intent, state: State | None = None) -> Decision:
        """The decision for ``intent``, from the run's :meth:`state` (no lock taken: :meth:`open`
        takes it, reads the state and then decides)."""
        if intent.mode == "overwrite":
            return Decision.FRESH
        if intent.mode == "new":
            held = self.holds_run()
            if held and self.state(locked_here=True).kind is RunState.FINISHED:
                raise ConfigError(
                    f"run directory {self.root} already holds a finished run (its result: {self.summary}); "
                    "pass --overwrite to train it again, or choose a new --out"
                )
            if held:
                raise ConfigError(
                    f"run directory {self.root} already holds an unfinished run ({held}); pass --resume to continue "
                    "it, --overwrite to replace it, or choose a new --out"
                )
            return Decision.FRESH
        state = state or self.state(locked_here=True)
        done = state.kind is RunState.FINISHED
        if intent.mode == "resume":
            if not done and (state.restart or not state.checkpoint):
                if self.last.is_file():  # damaged
                    raise CheckpointError(f"cannot resume from {self.last}: the file is truncated or corrupt"
                                          f"{ways_on(self.last)}")
                why = f" ({'; '.join(state.damaged)})" if state.damaged else ""
                raise CheckpointError(f"cannot resume: no checkpoint at {self.last}{why}")
            self.check_same_run(config, "resume")
            return Decision.REUSE if done else Decision.RESUME
        if not done and state.restart:  # nothing usable to continue from (or its identity unreadable)
            if state.damaged:
                print(f"starting {self.root} afresh: {'; '.join(state.damaged)}", file=sys.stderr, flush=True)
            return Decision.FRESH
        if intent.replace_stale and self.mismatch(config):
            return Decision.FRESH
        if done and intent.rerun_other_versions and self.made_by() not in (None, __version__):
            return Decision.FRESH
        self.check_same_run(config, "reuse" if done else "resume")
        return Decision.REUSE if done else Decision.RESUME

    def open(self, config: Mapping[str, Any], intent: Intent) -> "OpenRun":
        """Lock the directory, decide what the run does (:meth:`decide`) and clear it for a fresh start.

        Under ``torchrun`` every rank calls this: rank 0 takes the lock and decides, the other ranks
        receive its decision (or its error). A directory locked by another live process raises
        :class:`RunLockedError`.
        """
        from longrange.train import distributed as D

        main = D.is_main_process()
        lock, outcome = None, None
        if main:
            try:
                check_out_dir(self.root)
                lock = self.lock(_stale_after(config)).acquire()
                kill_point("after-lock")
                self.remove_leftovers()
                decision = self.decide(config, intent)
                if decision is Decision.FRESH:
                    self.clear()
                self.clear_failure()  # an earlier attempt's, or a stale one beside a finished run
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
            raise ConfigError(f"rank 0 could not open {self.root}: {value}")
        return OpenRun(self, Decision(value), lock)


def _zip_problem(path: Path) -> str | None:
    """Why the checkpoint ``path`` (a zip archive, as ``torch.save`` writes) cannot be loaded, or
    None. Reads only its central directory at the end: a cut-off file has none."""
    import zipfile

    try:
        with zipfile.ZipFile(path):
            return None
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        return f"{path}: damaged or cut off ({err})"


def _safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file ``path`` cannot be read whole, or None: its header must parse and
    its size must be the header's length plus the end of its last tensor."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path}: damaged or cut off (no header)"
            n = int.from_bytes(head, "little")
            size = os.fstat(f.fileno()).st_size
            if n > size - 8:
                return f"{path}: damaged or cut off (header of {n} bytes in a file of {size})"
            header = json.loads(f.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
        return f"{path}: damaged ({err})"
    if size != 8 + n + end:
        return f"{path}: damaged or cut off ({size} bytes where its header says {8 + n + end})"
    return None


def ways_on(path: Path) -> str:
    """The ways on from an unreadable checkpoint: for a run's ``last.pt``, its best weights
    (``best.safetensors`` beside it) and ``--overwrite``."""
    if path.name != LAST_CHECKPOINT:
        return ""
    best = path.parent / BEST_WEIGHTS
    if best.is_file():
        keep = f"the run's best weights so far are intact in {best} (loadable as model weights)"
    else:
        keep = f"the run has no best weights yet ({best} does not exist)"
    return f"; the run cannot be resumed from it: {keep}; run again with --overwrite to start it afresh"


def summary_version(summary: Mapping[str, Any]) -> str | None:
    """The longrange version a ``summary.json`` says made the run (``versions.longrange``), or None."""
    versions = summary.get("versions")
    version = versions.get("longrange") if isinstance(versions, Mapping) else None
    return str(version) if version is not None else None


def other_versions_line(versions: list[str | None], noun: str = "stages") -> str:
    """"3 of 20 stages were made by longrange 0.1.0" for the finished runs among ``versions`` (each
    run's :meth:`RunDir.made_by`, None when unfinished) made by another longrange; '' when none."""
    others: dict[str, int] = {}
    for version in versions:
        if version is not None and version != __version__:
            others[version] = others.get(version, 0) + 1
    return "; ".join(f"{k} of {len(versions)} {noun} were made by longrange {v}" for v, k in sorted(others.items()))


def _stale_after(config: Mapping[str, Any]) -> float | None:
    train = config.get("train")
    value = train.get("lock_stale_after") if isinstance(train, Mapping) else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


#: The files of a run directory (the name under which earlier versions exported :class:`RunDir`).
RunPaths = RunDir


@dataclass
class OpenRun:
    """A run directory opened by :meth:`RunDir.open`: its decision, and its lock (rank 0) until closed."""

    dir: RunDir
    decision: Decision
    lock: "RunLock | None" = None

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

    def __enter__(self) -> "OpenRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ----------------------------------------------------------------------------- lock
#: Seconds without a heartbeat after which a lock held on another host is stale (a node that died);
#: a run sets its own with ``train.lock_stale_after``, written into its lock file.
STALE_AFTER = 300.0
#: Seconds between two heartbeats of a held lock (a background thread refreshes its time stamp).
HEARTBEAT_EVERY = 30.0


class RunLockedError(LongrangeError):
    """Another live process writes to this run directory."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """An exclusive lock on a directory, held by one process (``with RunLock(dir): ...``).

    Acquiring creates ``<dir>/.lock`` with ``O_EXCL`` (atomic, also on NFS v3+), holding the PID,
    host, start time and the holder's staleness window (``stale_after`` seconds). While it is held,
    a background thread refreshes its time stamp every ``heartbeat_every`` seconds, so a lock whose
    holder died on another host is recognised as stale within minutes (one on this host at once:
    its PID is gone) and taken over; :attr:`took_over` then describes the holder it replaced.
    """

    def __init__(self, directory: str | os.PathLike, name: str = LOCK_FILE, what: str = "run directory",
                 stale_after: float = STALE_AFTER, heartbeat_every: float = HEARTBEAT_EVERY):
        self.path = Path(directory) / name
        self.what = what
        self.stale_after = stale_after
        self.heartbeat_every = heartbeat_every
        self.held = False
        self.took_over: dict[str, Any] | None = None
        self._stop: threading.Event | None = None

    def _info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "stale_after": self.stale_after}

    def _read(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text() or "{}")
            return data if isinstance(data, dict) else {}
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}

    def holder(self) -> dict[str, Any] | None:
        """The holder's {pid, host, started, ...} if the lock is held by a live process, else None."""
        info = self._read()
        if info is None or self._stale(info):
            return None
        return info

    def _age(self) -> float:
        """Seconds since the holder's last heartbeat."""
        return time.time() - self.path.stat().st_mtime

    def _stale(self, info: Mapping[str, Any]) -> bool:
        pid, host = info.get("pid"), info.get("host")
        if host == socket.gethostname() and isinstance(pid, int):
            return not _pid_alive(pid)
        window = info.get("stale_after")
        window = float(window) if isinstance(window, (int, float)) and window > 0 else STALE_AFTER
        try:
            return self._age() > window
        except FileNotFoundError:
            return True

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(20):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                info = self._read()
                if info is None:
                    continue  # released meanwhile
                if not self._stale(info):
                    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
                    raise RunLockedError(
                        f"{self.what} {self.path.parent} is in use by PID {info.get('pid')} on host "
                        f"{info.get('host')} (since {since}); wait for it to finish, or choose another --out"
                    )
                self._take_over_stale()
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(self._info(), f)
            self.held = True
            self._start_heartbeat()
            return self
        raise RunLockedError(f"could not lock {self.what} {self.path.parent}: another process keeps taking it")

    def _take_over_stale(self) -> None:
        """Remove a stale lock. Take-overs are serialised by a second lock file, so that two
        processes that both saw the stale lock never remove a fresh one taken by the first."""
        guard = self.path.with_name(self.path.name + ".takeover")
        try:
            fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:  # a taker that died inside this short section leaves the guard behind
                if time.time() - guard.stat().st_mtime > 60:
                    guard.unlink(missing_ok=True)
            except FileNotFoundError:
                pass
            time.sleep(0.05)
            return
        os.close(fd)
        try:
            info = self._read()
            if info is not None and self._stale(info):
                try:
                    silent = round(self._age())
                except FileNotFoundError:
                    silent = None
                self.path.unlink(missing_ok=True)
                self.took_over = {"pid": info.get("pid"), "host": info.get("host"), "started": info.get("started"),
                                  "silent_seconds": silent, "taken": time.time()}
                print(f"taking over the lock of {self.what} {self.path.parent}: its holder (PID {info.get('pid')} on "
                      f"host {info.get('host')}) is gone"
                      + (f" (no heartbeat for {silent} s)" if info.get("host") != socket.gethostname() else ""),
                      file=sys.stderr, flush=True)
        finally:
            guard.unlink(missing_ok=True)

    def _start_heartbeat(self) -> None:
        stop = self._stop = threading.Event()
        path, every = self.path, self.heartbeat_every

        def beat() -> None:
            while not stop.wait(every):
                try:
                    os.utime(path)
                except OSError:  # released, or the file system is away: the next beat tries again
                    pass

        threading.Thread(target=beat, name="longrange-lock-heartbeat", daemon=True).start()

    def _stop_heartbeat(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def release(self) -> None:
        self._stop_heartbeat()
        if not self.held:
            return
        info = self._read()
        if info and info.get("pid") == os.getpid() and info.get("host") == socket.gethostname():
            self.path.unlink(missing_ok=True)
        self.held = False

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
