"""SLURM jobs through submitit (``compare --launcher slurm``).

One SLURM job per stage, or one job array per dependency level (``--slurm-array``). SLURM orders
them itself: ``afterok`` dependencies (per-stage jobs, with ``kill-on-invalid-dep`` so that the
dependents of a failed stage are cancelled), or ``afterany`` on the previous level's array (each
task then checks that the stages it needs are finished, and ends as skipped otherwise). With
submitit's local executor (``cluster="local"``, no SLURM needed; used by the tests), which ignores
dependencies, the scheduler submits a stage once its dependencies are done. A job with
``gpus_per_job > 1`` runs its stage data-parallel under ``torchrun --standalone --nproc_per_node G``.

A job records the worker's exit status in submitit's folder (``<job id>_exit.json``), which is how
this process learns each stage's outcome; the job ids are kept in ``OUT/jobs.json`` for
``compare --status``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longrange.errors import ConfigError
from longrange.experiment import worker as W
from longrange.experiment.backends.local import resolve_jobs, visible_gpus
from longrange.experiment.config import LauncherConfig
from longrange.experiment.plan import Plan, Stage
from longrange.experiment.scheduler import Outcome, after_exit, say
from longrange.experiment.stage_job import StageJob, exit_file, require_submitit
from longrange.train.rundir import Intent, RunDir, RunMismatchError

#: The SLURM job of each stage, in the comparison's output directory.
JOBS_FILE = "jobs.json"


def jobs_file(out_dir: str | Path) -> Path:
    """Where a comparison submitted to SLURM keeps ``{stage id: SLURM job id}``."""
    return Path(out_dir) / JOBS_FILE


def read_jobs(out_dir: str | Path) -> dict[str, str] | None:
    """``{stage id: SLURM job id}`` of a comparison submitted to SLURM, or None."""
    path = jobs_file(out_dir)
    return json.loads(path.read_text()) if path.is_file() else None


@dataclass
class _Job:
    stage: Stage
    job: Any
    submitted: float


@dataclass
class SlurmLauncher:
    """Submit the plan's stages as SLURM jobs through submitit (see the module docstring).

    ``cluster``: "slurm" (``sbatch`` must be on PATH), or "local" for submitit's local executor
    (jobs are local processes; used by the tests). ``folder``: submitit's scripts and logs
    (default ``OUT/slurm``). ``poll_every``: seconds between polls (default 30, 0.5 locally).
    """

    settings: LauncherConfig = field(default_factory=LauncherConfig)
    cluster: str = "slurm"
    folder: str | Path | None = None
    poll_every: float | None = None

    def __post_init__(self) -> None:
        if self.cluster not in ("slurm", "local"):
            raise ConfigError(f"unknown submitit cluster {self.cluster!r}; expected slurm or local")
        if self.cluster == "local" and not self.settings.wait:
            raise ConfigError(
                "--no-wait needs SLURM to order the jobs; submitit's local executor runs only while compare waits"
            )

    @property
    def submits_ahead(self) -> bool:
        return self.cluster == "slurm"  # SLURM orders the jobs; the local executor ignores dependencies

    @property
    def wait(self) -> bool:
        return self.settings.wait

    @property
    def poll_interval(self) -> float:
        return self.poll_every if self.poll_every is not None else (0.5 if self.cluster == "local" else 30.0)

    def begin(self, plan: Plan, out_dir: Path, intent: Intent) -> None:
        self.plan, self.out_dir, self.intent = plan, out_dir, intent
        self._jobs: dict[str, str] = {}
        self._running = 0
        self._ex = self._executor(out_dir)

    def _executor(self, out_dir: Path):
        submitit = require_submitit()
        if self.cluster == "slurm" and shutil.which("sbatch") is None:
            raise ConfigError(
                "--launcher slurm needs SLURM's sbatch on PATH, and this host has none; "
                "run compare on a SLURM login node, or use --jobs N on this machine"
            )
        s = self.settings
        folder = Path(self.folder) if self.folder else out_dir / "slurm"
        ex = submitit.AutoExecutor(folder=str(folder / "%j"), cluster=self.cluster)
        params: dict[str, Any] = {"timeout_min": s.time_min, "nodes": 1, "tasks_per_node": 1, "name": "longrange"}
        if s.gpus_per_job:
            params["gpus_per_node"] = s.gpus_per_job
        if s.cpus_per_job:
            params["cpus_per_task"] = s.cpus_per_job
        if s.mem_gb:
            params["mem_gb"] = s.mem_gb
        if self.cluster == "slurm":
            for key, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos)):
                if value:
                    params[f"slurm_{key}"] = value
            params["slurm_signal_delay_s"] = 120
        elif s.gpus_per_job and not visible_gpus():
            params.pop("gpus_per_node")  # the local executor would set CUDA_VISIBLE_DEVICES to GPUs that are absent
        ex.update_parameters(**params)
        return ex

    def slots(self) -> int | None:
        """SLURM queues every job itself; submitit's local executor starts each at once, so that it
        runs at most ``jobs`` (when more than 1) at a time."""
        if self.cluster == "local" and resolve_jobs(self.settings.jobs) > 1:
            return max(0, resolve_jobs(self.settings.jobs) - self._running)
        return None

    def _extra(self, dependency: str | None) -> dict[str, Any]:
        extra = {str(k): v for k, v in self.settings.extra.items()}
        if dependency:
            extra["dependency"] = dependency
            extra.setdefault("kill-on-invalid-dep", "yes")
        return extra

    def submit(self, stages: Sequence[Stage], after: dict[str, _Job]) -> dict[str, _Job]:
        if self.cluster == "local":
            return self._submit(stages, None)
        if self.settings.array:  # one array for the level, after the previous level's arrays
            need = sorted({after[a].job.job_id.split("_")[0] for st in stages for a in st.after if a in after})
            return self._submit(stages, f"afterany:{':'.join(need)}" if need else None)
        out: dict[str, _Job] = {}
        for stage in stages:
            deps = [after[a].job.job_id for a in stage.after if a in after]
            out.update(self._submit([stage], f"afterok:{':'.join(deps)}" if deps else None))
        return out

    def _submit(self, stages: Sequence[Stage], dependency: str | None) -> dict[str, _Job]:
        s, ex = self.settings, self._ex
        fns = [
            StageJob(
                str(self.out_dir),
                st.id,
                self.intent.replace_stale,
                self.intent.rerun_other_versions,
                max(1, s.gpus_per_job),
                s.threads_per_job,
            )
            for st in stages
        ]
        if self.cluster == "slurm":
            ex.update_parameters(slurm_additional_parameters=self._extra(dependency))
        if s.array and len(stages) > 1:
            if self.cluster == "slurm":
                ex.update_parameters(slurm_array_parallelism=len(stages))
            with ex.batch():
                submitted = [ex.submit(fn) for fn in fns]
        else:
            submitted = [ex.submit(fn) for fn in fns]
        now = time.time()
        self._running += len(stages)
        out = {}
        for st, job in zip(stages, submitted):
            say(f"submitted {st.id}: job {job.job_id}" + (f" ({dependency})" if dependency else ""))
            out[st.id] = _Job(st, job, now)
            self._jobs[st.id] = job.job_id
        if self.cluster == "slurm":
            jobs_file(self.out_dir).write_text(json.dumps(self._jobs, indent=1))
        return out

    def poll(self, handle: _Job) -> Outcome | None:
        job, stage = handle.job, handle.stage
        if not job.done():
            return None
        self._running -= 1
        run = RunDir(self.out_dir / stage.id)
        status = exit_file(job.paths.folder, job.job_id)
        rc = json.loads(status.read_text())["rc"] if status.is_file() else None
        result = W.outcome(rc) if rc is not None else Outcome.FAILED
        if result is None:
            raise RunMismatchError(
                W.error_line(run.log) or f"{stage.id}: a run made with other settings (see {run.log})"
            )

        def reason() -> str:  # the job was killed, timed out, never started or ended without a summary
            if rc == W.DONE:
                return f"job {job.job_id}: the job ended without a summary"
            return f"job {job.job_id}: {W.error_line(run.log) or (W.exit_reason(rc) if rc is not None else job.state)}"

        return after_exit(
            self.plan, stage, self.out_dir, result, handle.submitted, reason, where=f"(job {job.job_id}) "
        )

    def cancel(self, handle: _Job) -> None:
        self._running -= 1
        handle.job.cancel(check=False)

    def stop(self, handles: dict[str, _Job], interrupted: bool) -> None:
        running = [h for h in handles.values() if not h.job.done()]
        if interrupted and self.cluster == "slurm":  # SLURM jobs run on; the next compare reuses their stages
            if running:
                say(
                    f"interrupted: {len(running)} SLURM job(s) keep running ({' '.join(h.job.job_id for h in running)}); "
                    f"`longrange compare --status {self.out_dir}` shows them, scancel stops them"
                )
            return
        if interrupted:
            say(f"interrupted: cancelling {len(running)} job(s)")
        for h in running:
            h.job.cancel(check=False)

    def end(self, handles: dict[str, _Job]) -> None:
        if self.cluster == "slurm" and not self.wait:
            ids = sorted({h.job.job_id.split("_")[0] for h in handles.values()})
            say(
                f"submitted {len(handles)} job(s): {' '.join(ids)}; `longrange compare --status {self.out_dir}` shows "
                f"progress, and compare again (or `longrange report {self.out_dir}`) writes the report once they are done"
            )
