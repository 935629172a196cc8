"""Stopping a run cleanly when asked: SIGTERM, SIGUSR1 and Ctrl-C (SIGINT) during training.

SLURM (and most schedulers) send SIGTERM before killing a job, and ``--signal=USR1@120`` sends
SIGUSR1 two minutes before its time limit; a user presses Ctrl-C. While :class:`StopOnSignal` is
active (the trainer's ``fit``), the first such signal only asks the run to stop: the current
optimiser step finishes, a checkpoint is written, the lock is released and the run ends with
:class:`~longrange.errors.Preempted` (exit status 75, or 130 after Ctrl-C; ``--resume``, or a
comparison run again, continues exactly). A second signal exits at once (Ctrl-C: a
KeyboardInterrupt; others: status 128 + the signal's number), as the default handler would.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

#: The signals that ask a run to stop (those the platform has).
SIGNALS = tuple(
    s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None), signal.SIGINT) if s is not None
)


class StopOnSignal:
    """``with StopOnSignal() as stop: ... if stop.requested: ...`` — handlers for :data:`SIGNALS`
    while the block runs (the main thread only; elsewhere nothing is installed)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def _handle(self, signum: int, frame: Any) -> None:
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if self.signal is not None:
            print(f"received {name} again: stopping at once", file=sys.stderr, flush=True)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        self.signal = signum
        again = "Ctrl-C again" if signum == signal.SIGINT else "a second signal"
        print(
            f"received {name}: stopping after this step with a checkpoint ({again} stops at once)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                if sig == signal.SIGINT and signal.getsignal(sig) is signal.SIG_IGN:
                    continue  # a process that ignores Ctrl-C (a comparison's worker) keeps ignoring it
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
