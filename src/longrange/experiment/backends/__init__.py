"""Where a comparison's stages run: the backends of ``experiment/scheduler.py``.

* :class:`InProcess` (``compare``, the default): one stage after another in this process.
* :class:`LocalWorkers` (``compare --jobs N``): up to N worker processes at once on this machine.
* :class:`SlurmLauncher` (``compare --launcher slurm``): SLURM jobs through submitit.

Every backend runs a stage through the same function (``execute.execute_stage``, directly or in a
worker process), so the stage lock, reuse by fingerprint, resume from the last checkpoint and
``failed.json`` work the same under all of them.
"""
from __future__ import annotations

from longrange.experiment.backends.inprocess import InProcess
from longrange.experiment.backends.local import LocalWorkers, visible_gpus
from longrange.experiment.backends.slurm import SlurmLauncher, jobs_file, read_jobs
from longrange.experiment.config import LauncherConfig

__all__ = ["InProcess", "LocalWorkers", "SlurmLauncher", "jobs_file", "make_backend", "read_jobs", "visible_gpus"]


def make_backend(settings: LauncherConfig):
    """The backend ``settings`` describes: in process (local, 1 job), local workers, or SLURM."""
    if settings.kind == "slurm":
        return SlurmLauncher(settings)
    if settings.jobs > 1:
        return LocalWorkers(settings.jobs, settings.threads_per_job)
    return InProcess(settings.threads_per_job)
