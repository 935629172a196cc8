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

import dataclasses
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from longrange.errors import ConfigError
from longrange.experiment import worker as W
from longrange.experiment.backends.local import visible_gpus
from longrange.experiment.config import LauncherConfig
from longrange.experiment.plan import Plan, Stage
from longrange.experiment.scheduler import Outcome, after_exit, say
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


def _submitit():
    try:
        import submitit
    except ImportError:
        raise ConfigError("--launcher slurm needs submitit: pip install 'longrange[slurm]'") from None
    return submitit


def _exit_file(folder: Path, job_id: str) -> Path:
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
        cmd = W.command(self.out_dir, self.stage_id, overwrite=self.overwrite, rerun_other_versions=self.rerun_other_versions,
                        threads=threads, gpus=self.gpus)
        log = RunDir(Path(self.out_dir) / self.stage_id).start_log(
            f"job {os.environ.get('SLURM_JOB_ID', os.getpid())}: {' '.join(cmd)}")
        with open(log, "ab") as f:
            self._proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=W.environment(threads))
            rc = self._proc.wait()
        env = _submitit().JobEnvironment()
        _exit_file(env.paths.folder, env.job_id).write_text(json.dumps({"rc": rc}))
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
        return _submitit().helpers.DelayedSubmission(dataclasses.replace(self))


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
            raise ConfigError("--no-wait needs SLURM to order the jobs; submitit's local executor runs only while compare waits")

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
        self._ex = self._executor(out_dir)

    def _executor(self, out_dir: Path):
        submitit = _submitit()
        if self.cluster == "slurm" and shutil.which("sbatch") is None:
            raise ConfigError("--launcher slurm needs SLURM's sbatch on PATH, and this host has none; "
                              "run compare on a SLURM login node, or use --jobs N on this machine")
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
        fns = [StageJob(str(self.out_dir), st.id, self.intent.replace_stale, self.intent.rerun_other_versions,
                        max(1, s.gpus_per_job), s.threads_per_job) for st in stages]
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
        run = RunDir(self.out_dir / stage.id)
        exit_file = _exit_file(job.paths.folder, job.job_id)
        rc = json.loads(exit_file.read_text())["rc"] if exit_file.is_file() else None
        result = W.outcome(rc) if rc is not None else Outcome.FAILED
        if result is None:
            raise RunMismatchError(W.error_line(run.log) or f"{stage.id}: a run made with other settings (see {run.log})")

        def reason() -> str:  # the job was killed, timed out, never started or ended without a summary
            if rc == W.DONE:
                return f"job {job.job_id}: the job ended without a summary"
            return f"job {job.job_id}: {W.error_line(run.log) or (W.exit_reason(rc) if rc is not None else job.state)}"

        return after_exit(self.plan, stage, self.out_dir, result, handle.submitted, reason, where=f"(job {job.job_id}) ")

    def cancel(self, handle: _Job) -> None:
        handle.job.cancel(check=False)

    def stop(self, handles: dict[str, _Job], interrupted: bool) -> None:
        running = [h for h in handles.values() if not h.job.done()]
        if interrupted and self.cluster == "slurm":  # SLURM jobs run on; the next compare reuses their stages
            if running:
                say(f"interrupted: {len(running)} SLURM job(s) keep running ({' '.join(h.job.job_id for h in running)}); "
                    f"`longrange compare --status {self.out_dir}` shows them, scancel stops them")
            return
        if interrupted:
            say(f"interrupted: cancelling {len(running)} job(s)")
        for h in running:
            h.job.cancel(check=False)

    def end(self, handles: dict[str, _Job]) -> None:
        if self.cluster == "slurm" and not self.wait:
            ids = sorted({h.job.job_id.split("_")[0] for h in handles.values()})
            say(f"submitted {len(handles)} job(s): {' '.join(ids)}; `longrange compare --status {self.out_dir}` shows "
                f"progress, and compare again (or `longrange report {self.out_dir}`) writes the report once they are done")
