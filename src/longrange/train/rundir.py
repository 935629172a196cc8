"""The run directory: the one module that knows its files, holds its lock and decides what a run does.

A run directory holds::

    config.yaml                  the resolved configuration and its fingerprint, the run's record
    metrics.jsonl                one JSON record per log line (train/logging.py)
    summary.json                 the stage's result (written when the stage finishes)
    failed.json                  why the last attempt of a comparison's stage failed
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

**Lifecycle.** :meth:`RunDir.status` reads where a run is: pending (nothing to continue from),
running (a live process holds the lock), done (``summary.json``), failed (``failed.json``) or
interrupted (a checkpoint, nobody holding the lock). :meth:`RunDir.open` takes the lock and makes
the single decision — start afresh, resume from the checkpoint, or reuse the finished run — from
what the caller intends (:class:`Intent`: the command line's plain, ``--resume`` and
``--overwrite``; a comparison's continue, with or without ``--overwrite``) and the fingerprint.
The trainer receives the opened run directory and acts on its decision; nobody else decides.

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
from longrange.errors import CheckpointError, ConfigError, DataFormatError, DataMissingError, DiskWriteError, LongrangeError
from longrange.fileio import append_text, atomic_write, check_out_dir, write_json
from longrange.identity import differences, fingerprint, identity

__all__ = [
    "RunDir", "RunPaths", "OpenRun", "Intent", "Decision", "RunStatus", "RunLock", "RunLockedError",
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
class RunStatus(Enum):
    """Where a run directory is (:meth:`RunDir.status`)."""

    PENDING = "pending"          # nothing to continue from
    RUNNING = "running"          # a live process holds its lock
    DONE = "done"                # summary.json: finished
    FAILED = "failed"            # failed.json: the last attempt failed
    INTERRUPTED = "interrupted"  # a checkpoint to resume from, nobody holding the lock


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
        Invalid YAML is a :class:`DataFormatError` naming the file and line."""
        if not self.config.is_file():
            if required:
                raise DataMissingError(f"{self.root} is not a run directory (no {CONFIG_FILE})")
            return None
        try:
            data = yaml.safe_load(self.config.read_text())
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            raise DataFormatError(f"not valid YAML: {getattr(err, 'problem', err)}", self.config,
                                  mark.line + 1 if mark is not None else None) from None
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
        return self.summary.is_file()

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
        atomic_write(self.config, yaml.safe_dump(out, sort_keys=False).encode())
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

    def clear_failure(self) -> None:
        self.failure.unlink(missing_ok=True)

    def start_log(self, line: str) -> Path:
        """Append a header line to ``stage.log`` (created) and return its path."""
        self.root.mkdir(parents=True, exist_ok=True)
        append_text(self.log, f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
        return self.log

    def clear(self) -> None:
        """Remove what a run wrote (checkpoints, metrics, summary, TensorBoard events) before a fresh start."""
        for f in (self.last, self.checkpoints / "best.pt", self.best_weights, self.metrics, self.summary):
            f.unlink(missing_ok=True)
        if self.tensorboard.is_dir():
            for f in self.tensorboard.glob("events.out.tfevents.*"):
                f.unlink()
        self.checkpoints.mkdir(parents=True, exist_ok=True)

    # -- lock and lifecycle
    def lock(self, stale_after: float | None = None) -> "RunLock":
        """The directory's lock (not yet taken); ``stale_after``: this run's staleness window."""
        return RunLock(self.root, stale_after=STALE_AFTER if stale_after is None else stale_after)

    def status(self) -> RunStatus:
        if self.summary.is_file():
            return RunStatus.DONE
        if self.lock().holder() is not None:
            return RunStatus.RUNNING
        if self.failure.is_file():
            return RunStatus.FAILED
        if self.last.is_file():
            return RunStatus.INTERRUPTED
        return RunStatus.PENDING

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
        """This run's summary, if it finished; else an error naming the run, its state and ``how``
        to finish it. A run is finished when it has a summary, no failure record and no live writer.
        ``role`` names it in the message ("the pretraining run")."""
        holder, failure = self.lock().holder(), self.read_failure()
        if holder is None and failure is None and self.finished():
            return self.read_summary() or {}
        progress = self.progress()  # reads the checkpoint: only for the error
        at = f"step {progress[0]} of {progress[1]}" if progress else "no checkpoint yet"
        if holder is not None:
            state = f"is still running (PID {holder.get('pid')} on host {holder.get('host')}, {at})"
            how = "wait for it to finish"
        elif failure is not None:
            state = f"failed ({failure.get('error') or 'see ' + str(self.failure)}; {at})"
        elif self.last.is_file():
            state = f"was interrupted at {at}"
        elif self.config.is_file():
            state = f"did not finish ({at})"
        else:
            state = "holds no run"
        raise UnfinishedRunError(f"{role} {self.root} {state}: it is not a result to start from; {how}")

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

    def decide(self, config: Mapping[str, Any], intent: Intent) -> Decision:
        """The decision for ``intent`` (no lock taken: :meth:`open` takes it and then decides)."""
        if intent.mode == "overwrite":
            return Decision.FRESH
        if intent.mode == "new":
            held = self.holds_run()
            if held and self.finished():
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
        done, resumable = self.finished(), self.last.is_file()
        if intent.mode == "resume":
            if not (done or resumable):
                raise CheckpointError(f"cannot resume: no checkpoint at {self.last}")
            self.check_same_run(config, "resume")
            return Decision.REUSE if done else Decision.RESUME
        if not (done or resumable):
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
                decision = self.decide(config, intent)
                if decision is Decision.FRESH:
                    self.clear()
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
