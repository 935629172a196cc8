"""Named points at which a test kills this process, to show that no kill leaves a state a rerun
cannot finish (fault injection at named points, not timing luck).

A point is one call, ``kill_point("after-summary")``, placed between two consecutive writes of a
run's life. With the environment variable ``LONGRANGE_KILL_AT`` set to a comma-separated list of
point names, the process kills itself with SIGKILL (no clean-up, no ``finally``: exactly what a
node that loses power or the kernel's OOM killer does) when it reaches one of them; unset, a point
costs one dictionary lookup. :data:`POINTS` lists every point, in the order a stage reaches them;
docs/reliability.md says what a kill at each one leaves and how a rerun finishes it.
"""

from __future__ import annotations

import os
import signal

#: The environment variable that names the points to die at.
ENV = "LONGRANGE_KILL_AT"

#: Every point, in the order a comparison's stage reaches them (worker, then coordinator).
POINTS = (
    "after-lock",  # the run directory is locked, nothing written yet
    "after-clear-summary",  # a fresh start removed the old summary (the commit point) first
    "after-checkpoint",  # the final last.pt (and best weights) are written
    "after-test-metrics",  # the test metrics line is appended to metrics.jsonl
    "after-record",  # config.yaml is rewritten with the run's record
    "after-summary",  # summary.json is written: the run is finished
    "after-unlock",  # the lock is released; the worker is about to exit
    "coordinator-after-exit",  # the coordinator saw the worker end, before it reads the state
    "coordinator-after-failure",  # the coordinator recorded a failure in failed.json
)


def kill_point(name: str) -> None:
    """Kill this process with SIGKILL if ``name`` is among the points in ``LONGRANGE_KILL_AT``."""
    wanted = os.environ.get(ENV)
    if wanted and name in wanted.split(","):
        os.kill(os.getpid(), signal.SIGKILL)
