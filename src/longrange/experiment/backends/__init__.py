"""Where a comparison's stages run: the backends of ``experiment/scheduler.py``.

* :class:`InProcess` (``compare``, the default): one stage after another in this process.
* :class:`LocalWorkers` (``compare --jobs N``): up to N worker processes at once on this machine
  (``--jobs auto``: one per GPU, else one per core: :func:`~longrange.experiment.backends.local.auto_jobs`).
* :class:`SlurmLauncher` (``compare --launcher slurm``): SLURM jobs through submitit.

Every backend runs a stage through the same function (``execute.run_stage``, in this process or
in a worker process), so the stage lock, reuse by fingerprint, resume from the last checkpoint and
``failed.json`` work the same under all of them.
"""

from __future__ import annotations

from longrange.experiment.backends.inprocess import InProcess
from longrange.experiment.backends.local import LocalWorkers, auto_jobs, resolve_jobs, usable_cores, visible_gpus
from longrange.experiment.backends.slurm import SlurmLauncher, jobs_file, read_jobs
from longrange.experiment.config import LauncherConfig

__all__ = [
    "InProcess",
    "LocalWorkers",
    "SlurmLauncher",
    "auto_jobs",
    "jobs_file",
    "make_backend",
    "read_jobs",
    "resolve_jobs",
    "usable_cores",
    "visible_gpus",
]


def make_backend(settings: LauncherConfig):
    """The backend ``settings`` describes: in process (local, 1 job), local workers, or SLURM."""
    if settings.kind == "slurm":
        return SlurmLauncher(settings)
    jobs = resolve_jobs(settings.jobs)
    if jobs > 1:
        return LocalWorkers(jobs, settings.threads_per_job)
    return InProcess(settings.threads_per_job)
