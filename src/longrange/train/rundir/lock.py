"""The lock of a run directory: one writer at a time, across processes and hosts.

``.lock`` holds the writer's PID and host: a second writer stops at once naming them. A lock left
by a process that died is detected (same host, PID gone; or no heartbeat for ``STALE_AFTER``
seconds when the holder is on another host, e.g. a SLURM node that went down) and taken over
safely.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from longrange.errors import LongrangeError
from longrange.train.rundir.layout import LOCK_FILE

#: Seconds without a heartbeat after which a lock held on another host is stale (a node that died);
#: a run sets its own with ``train.lock_stale_after``, written into its lock file.
STALE_AFTER = 300.0
#: Seconds between two heartbeats of a held lock (a background thread refreshes its time stamp).
HEARTBEAT_EVERY = 30.0


class RunLockedError(LongrangeError):
    """Another live process writes to this run directory."""


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host."""
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

    def __init__(
        self,
        directory: str | os.PathLike,
        name: str = LOCK_FILE,
        what: str = "run directory",
        stale_after: float = STALE_AFTER,
        heartbeat_every: float = HEARTBEAT_EVERY,
    ):
        self.path = Path(directory) / name
        self.what = what
        self.stale_after = stale_after
        self.heartbeat_every = heartbeat_every
        self.held = False
        self.took_over: dict[str, Any] | None = None
        self._stop: threading.Event | None = None

    def _info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
            "stale_after": self.stale_after,
        }

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
            return not pid_alive(pid)
        window = info.get("stale_after")
        window = float(window) if isinstance(window, (int, float)) and window > 0 else STALE_AFTER
        try:
            return self._age() > window
        except FileNotFoundError:
            return True

    def acquire(self) -> RunLock:
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
                    ) from None
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
                self.took_over = {
                    "pid": info.get("pid"),
                    "host": info.get("host"),
                    "started": info.get("started"),
                    "silent_seconds": silent,
                    "taken": time.time(),
                }
                print(
                    f"taking over the lock of {self.what} {self.path.parent}: its holder (PID {info.get('pid')} on "
                    f"host {info.get('host')}) is gone"
                    + (f" (no heartbeat for {silent} s)" if info.get("host") != socket.gethostname() else ""),
                    file=sys.stderr,
                    flush=True,
                )
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

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
