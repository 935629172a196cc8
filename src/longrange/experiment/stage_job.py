"""The function a SLURM job runs (:class:`StageJob`), in a module of its own that imports neither
torch nor the rest of the stack: a job unpickles it and starts its stage's worker at once, instead
of first importing what only the worker needs (seconds per job, per stage of a grid)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrange.errors import ConfigError
from longrange.experiment import worker as W
from longrange.train.rundir import RunDir

__all__ = ["StageJob", "StageJobFailed"]


def require_submitit():
    try:
        import submitit
    except ImportError:
        raise ConfigError("--launcher slurm needs submitit: pip install 'longrange[slurm]'") from None
    return submitit


def exit_file(folder: Path, job_id: str) -> Path:
    return Path(folder) / f"{job_id}_exit.json"


class StageJobFailed(RuntimeError):
    """The job's stage did not finish (so that SLURM's afterok holds its dependents)."""


@dataclass
class StageJob:
    """The function a SLURM job runs: one stage, its output appended to ``OUT/<stage>/stage.log``.

    The job starts the worker as a process of its own (with ``gpus > 1`` under ``torchrun
    --standalone --nproc_per_node G``). It records the worker's exit status and raises unless the
    stage is done, so that the job fails and ``afterok`` holds its dependents. On a time-out or
    preemption signal submitit calls :meth:`checkpoint`, which sends the worker SIGTERM: the stage
    finishes its step and writes a checkpoint (as ``longrange train`` does on SIGTERM), the job is
    requeued and the stage resumes from that checkpoint.
    """

    out_dir: str
    stage_id: str
    overwrite: bool = False
    rerun_other_versions: bool = False
    gpus: int = 1
    threads: int = 0

    def __call__(self) -> str:
        threads = self.threads or int(os.environ.get("SLURM_CPUS_PER_TASK", "0") or 0) // max(1, self.gpus)
        cmd = W.command(
            self.out_dir,
            self.stage_id,
            overwrite=self.overwrite,
            rerun_other_versions=self.rerun_other_versions,
            threads=threads,
            gpus=self.gpus,
        )
        log = RunDir(Path(self.out_dir) / self.stage_id).start_log(
            f"job {os.environ.get('SLURM_JOB_ID', os.getpid())}: {' '.join(cmd)}"
        )
        with open(log, "ab") as f:
            self._proc = subprocess.Popen(
                cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=W.environment(threads)
            )
            rc = self._proc.wait()
        env = require_submitit().JobEnvironment()
        exit_file(env.paths.folder, env.job_id).write_text(json.dumps({"rc": rc}))
        if rc != W.DONE:
            raise StageJobFailed(f"{self.stage_id}: {W.error_line(log) or W.exit_reason(rc)} (log {log})")
        return "done"

    def checkpoint(self, *args: Any, **kwargs: Any):
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()  # the worker finishes its step, writes last.pt and releases the lock
            try:
                proc.wait(100)
            except subprocess.TimeoutExpired:
                proc.kill()
        return require_submitit().helpers.DelayedSubmission(dataclasses.replace(self))
