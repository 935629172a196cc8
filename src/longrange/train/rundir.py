"""What a run directory is: its files, its identity (fingerprint) and its lock.

A run directory knows what made it. ``config.yaml`` holds the resolved configuration; its
*identity* is that configuration without the parts that cannot change a result (presentation
settings such as ``train.progress``, and the ``record`` and ``head`` sections, which are written by
the run or derived from its data), and its *fingerprint* is a short hash of the identity. A run is
resumed, and a finished stage reused, only when the fingerprints match; otherwise the error names
every field that differs.

A run directory is also locked while a process writes to it (``.lock``, holding the writer's PID
and host): a second writer stops at once with the holder's PID and host. A lock left by a process
that died is detected (same host, PID gone; or no heartbeat for ``STALE_AFTER`` seconds when the
holder is on another host, e.g. a SLURM node that went down) and taken over safely.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from longrange.errors import ConfigError, LongrangeError
from longrange.train.logging import METRICS_FILE

#: Settings that change how a run is shown, not what it computes.
VOLATILE = {
    ("train", "progress"),
    ("train", "progress_every"),
    ("train", "log_every"),
    ("train", "num_workers"),
    ("train", "checkpoint_every"),
}
#: Top-level sections of config.yaml that are outcomes or derived values, not settings.
NOT_IDENTITY = ("fingerprint", "record", "head")


@dataclass(frozen=True)
class RunPaths:
    """The files of a run directory."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def last(self) -> Path:
        return self.checkpoints / "last.pt"

    @property
    def best_weights(self) -> Path:
        return self.checkpoints / "best.safetensors"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"


def check_out_dir(path: str | os.PathLike, what: str = "--out") -> Path:
    """``path`` as a directory that exists or can be created; a ConfigError if a file is in the way."""
    path = Path(path)
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                where = "" if parent == path else f" (its parent {parent} is a file)"
                raise ConfigError(f"{what} {path} is not a directory{where}; choose another {what}")
            break
    return path


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


def read_config(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    path = RunPaths(Path(run_dir)).config
    if not path.is_file():
        return None
    data = yaml.safe_load(path.read_text())
    return data if isinstance(data, dict) else None


class RunMismatchError(ConfigError):
    """A run directory holds a run made with other settings."""


def check_same_run(run_dir: str | os.PathLike, config: Mapping[str, Any], action: str) -> None:
    """Raise :class:`RunMismatchError` if ``run_dir`` holds a run whose identity differs from ``config``'s.

    ``action`` says what was attempted ("resume", "reuse") for the message.
    """
    saved = read_config(run_dir)
    if saved is None:
        return
    diff = differences(saved, config)
    if diff:
        shown = "; ".join(diff[:8]) + (f"; and {len(diff) - 8} more" if len(diff) > 8 else "")
        raise RunMismatchError(
            f"cannot {action} {run_dir}: it holds a run made with other settings ({shown}); "
            "pass --overwrite to replace it, or choose a new --out"
        )


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

    def __init__(self, directory: str | os.PathLike, name: str = ".lock", what: str = "run directory"):
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
