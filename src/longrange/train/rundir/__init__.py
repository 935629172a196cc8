"""The run directory: its files, what they hold, its lock, and the fresh / resume / reuse decision.

    from longrange.train.rundir import Intent, RunDir
    run = RunDir("runs/listops")
    run.state()                                   # pending, finished, resumable, failed or held
    with run.open(config, Intent("resume")) as opened:
        opened.decision                           # Decision.FRESH, RESUME or REUSE

:class:`RunDir` is the one object through which the rest of the toolkit reaches a run directory;
each of its jobs is one module here:

    layout.py     the files' names and paths (RunLayout): the only module that spells them
    summary.py    RunSummary: summary.json as a type (what a finished stage recorded), written and read
    record.py     RunRecord: config.yaml's record section as a type (data, versions, how the run ran)
    lock.py       RunLock: one writer at a time, across hosts, with a heartbeat
    integrity.py  whether a checkpoint file is whole, without loading it
    files.py      reading and writing config.yaml, summary.json, failed.json, stage.log; clearing a run
    messages.py   lines that several commands show about runs (ways on from a damaged checkpoint,
                  runs made by another longrange version)
    state.py      RunState: where a run is, the one reading of its files and lock; require_finished
    decide.py     Intent and Decision: fresh, resume or reuse, decided once under the lock (open_run)
    directory.py  RunDir (a method for each of the jobs above) and OpenRun (a run directory opened)

Each module imports only those above it in this list (``tests/test_layering.py`` fails on an
import circle). Importing this package does not import torch (a SLURM job's first step, the report).
"""

from longrange.fileio import check_out_dir
from longrange.identity import differences, fingerprint, identity
from longrange.train.rundir.decide import Decision, Intent, RunMismatchError
from longrange.train.rundir.directory import OpenRun, RunDir
from longrange.train.rundir.files import YAML_LOADER, plain, summary_version
from longrange.train.rundir.layout import (
    BEST_WEIGHTS,
    CHECKPOINT_DIR,
    CONFIG_FILE,
    FAILED_FILE,
    LAST_CHECKPOINT,
    LOCK_FILE,
    LOG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    TENSORBOARD_DIR,
    RunLayout,
)
from longrange.train.rundir.lock import HEARTBEAT_EVERY, STALE_AFTER, RunLock, RunLockedError
from longrange.train.rundir.messages import other_versions_line, ways_on
from longrange.train.rundir.state import RunState, State, UnfinishedRunError
from longrange.train.rundir.summary import ParamCounts, RunSummary

__all__ = [
    "RunDir",
    "RunSummary",
    "ParamCounts",
    "RunLayout",
    "OpenRun",
    "Intent",
    "Decision",
    "RunState",
    "State",
    "RunLock",
    "RunLockedError",
    "RunMismatchError",
    "UnfinishedRunError",
    "check_out_dir",
    "identity",
    "fingerprint",
    "differences",
    "YAML_LOADER",
    "plain",
    "summary_version",
    "other_versions_line",
    "ways_on",
    "STALE_AFTER",
    "HEARTBEAT_EVERY",
    "CONFIG_FILE",
    "SUMMARY_FILE",
    "METRICS_FILE",
    "FAILED_FILE",
    "LOG_FILE",
    "LOCK_FILE",
    "CHECKPOINT_DIR",
    "LAST_CHECKPOINT",
    "BEST_WEIGHTS",
    "TENSORBOARD_DIR",
]
