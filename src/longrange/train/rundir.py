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
without the parts that cannot change a result (presentation settings such as ``train.progress``,
and the ``record`` and ``head`` sections, written by the run or derived from its data), and its
*fingerprint* a short hash of the identity. A run is resumed, and a finished one reused, only when
the identities match; otherwise the error names every field that differs.

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

import hashlib
import json
import os
import socket
import time
import traceback
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Mapping

import yaml

from longrange.errors import CheckpointError, ConfigError, DataFormatError, DataMissingError, LongrangeError
from longrange.fileio import atomic_write, check_out_dir, write_json

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

#: Settings that change how a run is shown, not what it computes.
VOLATILE = {
    ("train", "progress"),
    ("train", "progress_every"),
    ("train", "log_every"),
    ("train", "num_workers"),
    ("train", "checkpoint_every"),
    ("train", "loggers"),
    ("train", "wandb"),
}
#: Top-level sections of config.yaml that are outcomes or derived values, not settings.
NOT_IDENTITY = ("fingerprint", "record", "head")


# ----------------------------------------------------------------------------- identity
def identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a resolved configuration that determines the run's result, as plain data (as it
    reads back from config.yaml: tuples are lists, other objects their strings)."""
    plain = json.loads(json.dumps(dict(config), default=str))
    out = {k: v for k, v in plain.items() if k not in NOT_IDENTITY}
    for section, key in VOLATILE:
        if isinstance(out.get(section), Mapping) and key in out[section]:
            out[section] = {k: v for k, v in out[section].items() if k != key}
    return out


def fingerprint(config: Mapping[str, Any]) -> str:
    """A short hash of :func:`identity`."""
    text = json.dumps(identity(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``field: old -> new`` for every dotted field whose value differs between two identities."""
    a, b = _flatten(identity(old)), _flatten(identity(new))
    out = []
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<unset>") != b.get(key, "<unset>"):
            out.append(f"{key}: {a.get(key, '<unset>')!r} -> {b.get(key, '<unset>')!r}")
    return out


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


# ----------------------------------------------------------------------------- lifecycle
class RunStatus(Enum):
    """Where a run directory is (:meth:`RunDir.status`)."""

    PENDING = "pending"          # nothing to continue from
    RUNNING = "running"          # a live process holds its lock
    DONE = "done"                # summary.json: finished
    FAILED = "failed"            # failed.json: the last attempt failed
    INTERRUPTED = "interrupted"  # a checkpoint to resume from, nobody holding the lock


class Intent(Enum):
    """What the caller asks of a run directory (:meth:`RunDir.open`)."""

    NEW = "new"                  # start a run; an error if the directory holds one
    RESUME = "resume"            # continue it from its checkpoint (a finished run is returned as it is)
    OVERWRITE = "overwrite"      # start afresh, replacing whatever is there
    CONTINUE = "continue"        # reuse it if finished, resume it if interrupted, else start
    REPLACE_STALE = "replace-stale"  # as CONTINUE, but a run made with other settings is replaced

    @classmethod
    def from_flags(cls, resume: bool = False, overwrite: bool = False) -> "Intent":
        """The intent of the command line's ``--resume`` / ``--overwrite`` (neither: NEW)."""
        if resume and overwrite:
            raise ConfigError("--resume and --overwrite contradict each other: resume a run, or replace it")
        return cls.RESUME if resume else cls.OVERWRITE if overwrite else cls.NEW


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
        text = yaml.safe_dump(out, sort_keys=False).encode()
        atomic_write(self.config, lambda f: f.write(text))
        return out

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        write_json(self.summary, dict(summary))

    def record_failure(self, error: str, *, stage: str | None = None, trace: str | None = None) -> None:
        """Write ``failed.json``: the error, its traceback and where the log is."""
        record = {"stage": stage, "error": error, "traceback": trace,
                  "log": str(self.log) if self.log.is_file() else None, "time": time.time()}
        self.root.mkdir(parents=True, exist_ok=True)
        self.failure.write_text(json.dumps(record, indent=1))

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
        with open(self.log, "a") as f:
            f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
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
    def lock(self) -> "RunLock":
        return RunLock(self.root)

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

    def decide(self, config: Mapping[str, Any], intent: Intent) -> Decision:
        """The decision for ``intent`` (no lock taken: :meth:`open` takes it and then decides)."""
        if intent is Intent.OVERWRITE:
            return Decision.FRESH
        if intent is Intent.NEW:
            held = self.holds_run()
            if held:
                raise ConfigError(
                    f"run directory {self.root} already holds a run ({held}); pass --resume to continue it, "
                    "--overwrite to replace it, or choose a new --out"
                )
            return Decision.FRESH
        done, resumable = self.finished(), self.last.is_file()
        if intent is Intent.RESUME:
            if not (done or resumable):
                raise CheckpointError(f"cannot resume: no checkpoint at {self.last}")
            self.check_same_run(config, "resume")
            return Decision.REUSE if done else Decision.RESUME
        if not (done or resumable):
            return Decision.FRESH
        if intent is Intent.REPLACE_STALE and self.mismatch(config):
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
                lock = self.lock().acquire()
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

    def heartbeat(self, every: float = 60.0) -> None:
        if self.lock is not None:
            self.lock.heartbeat(every)

    def close(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def __enter__(self) -> "OpenRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ----------------------------------------------------------------------------- lock
#: A lock whose holder is on another host and has shown no heartbeat for this long is stale.
STALE_AFTER = 3600.0


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
    host and start time. :meth:`heartbeat` refreshes its modification time.
    """

    def __init__(self, directory: str | os.PathLike, name: str = LOCK_FILE, what: str = "run directory"):
        self.path = Path(directory) / name
        self.what = what
        self.held = False
        self._last_beat = 0.0

    def _info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}

    def _read(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text() or "{}")
            return data if isinstance(data, dict) else {}
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}

    def holder(self) -> dict[str, Any] | None:
        """The holder's {pid, host, started} if the lock is held by a live process, else None."""
        info = self._read()
        if info is None or self._stale(info):
            return None
        return info

    def _stale(self, info: Mapping[str, Any]) -> bool:
        pid, host = info.get("pid"), info.get("host")
        if host == socket.gethostname() and isinstance(pid, int):
            return not _pid_alive(pid)
        try:
            age = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return True
        return age > STALE_AFTER

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
            self._last_beat = time.time()
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
                self.path.unlink(missing_ok=True)
        finally:
            guard.unlink(missing_ok=True)

    def heartbeat(self, every: float = 60.0) -> None:
        """Refresh the lock's time stamp (at most once per ``every`` seconds)."""
        if self.held and time.time() - self._last_beat >= every:
            try:
                os.utime(self.path)
            except FileNotFoundError:
                pass
            self._last_beat = time.time()

    def release(self) -> None:
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
