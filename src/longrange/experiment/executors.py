"""Executors of a comparison's plan: local worker processes, and SLURM jobs through submitit.

An executor is ``executor(plan, out_dir, overwrite=...) -> {stage id: outcome}`` with the outcomes of
``run_in_process`` (done, failed, skipped: after a stage that did not finish, held: running in
another process). Every executor runs a stage the same way, through the worker
(``longrange.experiment.worker``: the command ``python -m longrange.experiment.worker OUT STAGE_ID``, or
its ``main`` in a process of its own), which loads ``OUT/plan.json`` and calls ``execute_stage``; so a
stage's outcome depends only on its settings and seed, and the stage lock, reuse by fingerprint,
resume from the last checkpoint and ``failed.json`` work the same under every executor. A worker's
output goes to ``OUT/<stage id>/stage.log``.

* :class:`LocalWorkers` (``compare --jobs N``): up to N worker processes at once on this machine (forked
  from a server process that imported torch once, so a stage starts at once), each with its own
  threads (``threads_per_job``; torch threads and OMP/MKL_NUM_THREADS) or its own GPU
  (``CUDA_VISIBLE_DEVICES``, round-robin over the visible GPUs). A stage starts when every stage in
  its ``after`` list is done; this process enforces the order.
* :class:`SlurmLauncher` (``compare --launcher slurm``): one SLURM job per stage, or one job array per
  dependency level, submitted through submitit. On SLURM, the order is enforced by SLURM itself:
  ``afterok`` dependencies (per-stage jobs, with ``kill-on-invalid-dep`` so that the dependents of a
  failed stage are cancelled), or ``afterany`` on the previous level's array (each task then checks
  that the stages it needs are finished, and ends as "skipped" otherwise). With submitit's local
  executor (``cluster="local"``, no SLURM needed; used by the tests), which ignores dependencies,
  this process submits one dependency level at a time and waits for it. A job with
  ``gpus_per_job > 1`` runs its stage data-parallel: the job starts ``torchrun --standalone
  --nproc_per_node G`` on the worker (one node, one task, G GPUs).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from longrange.errors import ConfigError
from longrange.experiment import worker as W
from longrange.experiment.compare import FAILED_FILE, LOG_FILE, StageFailed, execute_stage, run_in_process
from longrange.experiment.config import LauncherConfig
from longrange.experiment.plan import Plan, Stage
from longrange.experiment.runs import read_summary
from longrange.train import rundir
from longrange.train.loop import format_seconds

JOBS_FILE = "jobs.json"
#: Environment variables that set the thread pools of a worker.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")


def worker_command(out_dir: str | Path, stage_id: str, *, overwrite: bool = False, threads: int = 0,
                   gpus: int = 1) -> list[str]:
    """The command that runs one stage; under torchrun (``gpus > 1``) on that many GPUs of one node."""
    args = ["-m", "longrange.experiment.worker", str(out_dir), stage_id]
    if overwrite:
        args.append("--overwrite")
    if threads > 0:
        args += ["--threads", str(threads)]
    if gpus > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}", *args]
    return [sys.executable, *args]


def worker_env(threads: int = 0, gpu: str | None = None) -> dict[str, str]:
    """This process's environment for a worker: longrange importable, its threads, its GPU."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])  # the directory that holds the longrange package
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    if threads > 0:
        env.update({v: str(threads) for v in THREAD_VARS})
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def visible_gpus() -> list[str]:
    """The GPUs a worker may be given: CUDA_VISIBLE_DEVICES if set, else every CUDA device."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip() and g.strip() != "-1"]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # pragma: no cover - a broken CUDA setup runs on the CPU
        return []


def _start_log(out_dir: Path, stage_id: str, command: Sequence[str], how: str) -> Path:
    run = out_dir / stage_id
    run.mkdir(parents=True, exist_ok=True)
    log = run / LOG_FILE
    with open(log, "a") as f:
        f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {how}: {' '.join(command)}\n")
    return log


def _failure(out_dir: Path, stage: Stage, since: float, fallback: str) -> str:
    """The stage's error from failed.json if the worker wrote one after ``since``; otherwise record
    ``fallback`` there (a worker killed by a signal writes nothing) and return it."""
    path = out_dir / stage.id / FAILED_FILE
    try:
        record = json.loads(path.read_text())
        if record.get("time", 0) >= since - 1:
            return str(record.get("error"))
    except (OSError, ValueError):
        pass
    log = out_dir / stage.id / LOG_FILE
    record = {"stage": stage.id, "error": fallback, "traceback": None,
              "log": str(log) if log.is_file() else None, "time": time.time()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    return fallback


def _last_line(path: Path, prefix: str = "worker: error: ") -> str:
    try:
        lines = [l for l in path.read_text(errors="replace").splitlines() if l.startswith(prefix)]
    except OSError:
        return ""
    return lines[-1][len(prefix):] if lines else ""


def _exit_reason(rc: int) -> str:
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"the worker was killed by {name}" + (" (out of memory?)" if -rc == signal.SIGKILL else "")
    return f"the worker exited with status {rc}"


def _reuse_finished(plan: Plan, out_dir: Path, stage: Stage, overwrite: bool) -> str:
    """A finished stage is checked and reused in this process (no worker needed): done or held."""
    return "held" if execute_stage(plan, stage.id, out_dir, overwrite=overwrite) is None else "done"


def _blocked(stage: Stage, outcome: dict[str, str]) -> list[str]:
    return [a for a in stage.after if outcome.get(a) in ("failed", "skipped", "held")]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ local workers
#: Modules the worker processes' fork server imports once, so that a worker starts in a fraction of
#: a second instead of importing torch again (a few seconds per stage on a small machine).
PRELOAD = ["longrange.experiment.worker", "longrange.experiment.compare", "torch._dynamo"]


def _worker_process(target: Callable[[list[str]], int], argv: list[str], log: str, env: dict[str, str],
                    threads: int) -> None:
    """The body of a local worker process: output to the stage's log, its GPU and threads, then the worker."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.update(env)  # before CUDA initialises (the fork server never initialised it)
    if threads > 0 and "numba" in sys.modules:
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    code = target(argv)  # the worker sets torch's threads (--threads)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


@dataclass
class _Running:
    stage: Stage
    proc: Any
    slot: int
    start: float
    log: Path

    @property
    def returncode(self) -> int | None:
        return self.proc.exitcode


@dataclass
class LocalWorkers:
    """Run up to ``jobs`` stages at once as worker processes on this machine (see the module docstring).

    Each stage runs in a process of its own, forked from a server process that imported torch and
    longrange once (``multiprocessing``'s forkserver; spawn where there is none); the process runs
    ``longrange.experiment.worker``'s ``main`` exactly as the command ``python -m
    longrange.experiment.worker OUT STAGE_ID`` does, with its output in ``OUT/<stage>/stage.log``.

    ``threads_per_job`` 0 = the machine's cores // jobs. ``gpus``: the GPUs to hand out round-robin
    (one per worker; None: the visible ones; [] for none). ``target``: a module-level function that
    replaces the worker's ``main`` (argv -> exit status; tests use it).
    """

    jobs: int
    threads_per_job: int = 0
    gpus: Sequence[str] | None = None
    target: Callable[[list[str]], int] | None = None
    poll: float = 0.1
    #: Seconds a worker has to exit after SIGTERM (on Ctrl-C) before it is killed.
    grace: float = 20.0

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ConfigError(f"--jobs must be >= 1, got {self.jobs}")
        if self.threads_per_job < 0:
            raise ConfigError(f"--threads-per-job must be >= 0, got {self.threads_per_job}")

    @property
    def threads(self) -> int:
        return self.threads_per_job or max(1, (os.cpu_count() or 1) // self.jobs)

    def __call__(self, plan: Plan, out_dir: Path, *, overwrite: bool = False) -> dict[str, str]:
        out_dir = Path(out_dir)
        gpus = list(visible_gpus() if self.gpus is None else self.gpus)
        outcome: dict[str, str] = {}
        waiting = list(plan.stages)
        running: list[_Running] = []
        free = list(range(self.jobs))
        n, first = len(plan.stages), time.time()
        where = f"GPU {', '.join(gpus)} round-robin" if gpus else f"{self.threads} thread(s) each"
        _say(f"{n} stages, up to {self.jobs} at once as worker processes ({where}); logs in OUT/<stage>/{LOG_FILE}")
        try:
            while waiting or running:
                for stage in list(waiting):
                    blocked = _blocked(stage, outcome)
                    if blocked:
                        outcome[stage.id] = "skipped"
                        waiting.remove(stage)
                        _say(f"skipping {stage.id} (needs {', '.join(blocked)})")
                    elif all(outcome.get(a) == "done" for a in stage.after):
                        if read_summary(out_dir / stage.id) is not None:
                            outcome[stage.id] = _reuse_finished(plan, out_dir, stage, overwrite)
                            waiting.remove(stage)
                            _say(f"{'reusing' if outcome[stage.id] == 'done' else 'held elsewhere:'} {stage.id}")
                        elif free:
                            running.append(self._start(out_dir, stage, free.pop(0), gpus, overwrite))
                            waiting.remove(stage)
                if not running:
                    if waiting:  # pragma: no cover - the plan lists stages after their dependencies
                        raise StageFailed(f"stages {[s.id for s in waiting]} wait on stages that never ran")
                    break
                time.sleep(self.poll)
                for job in [j for j in running if j.returncode is not None]:
                    running.remove(job)
                    free.append(job.slot)
                    free.sort()
                    outcome[job.stage.id] = self._finished(out_dir, job)
                    done = sum(1 for o in outcome.values() if o == "done")
                    _say(f"[{done}/{n} done, {format_seconds(time.time() - first)}] {job.stage.id}: {outcome[job.stage.id]}")
        except BaseException:
            self._stop(running)
            raise
        return {s.id: outcome[s.id] for s in plan.stages}

    @staticmethod
    def _context():
        import multiprocessing as mp

        if "forkserver" not in mp.get_all_start_methods():  # pragma: no cover - Windows
            return mp.get_context("spawn")
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx

    def _start(self, out_dir: Path, stage: Stage, slot: int, gpus: list[str], overwrite: bool) -> _Running:
        gpu = gpus[slot % len(gpus)] if gpus else None
        threads = self.threads
        argv = [str(out_dir), stage.id, "--threads", str(threads)] + (["--overwrite"] if overwrite else [])
        how = f"worker {slot}" + (f" on GPU {gpu}" if gpu is not None else f" with {threads} thread(s)")
        log = _start_log(out_dir, stage.id, ["worker", *argv], how)
        env = {v: str(threads) for v in THREAD_VARS}
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        proc = self._context().Process(target=_worker_process, args=(self.target or W.main, argv, str(log), env, threads),
                                       name=f"longrange-worker-{slot}")
        proc.start()
        _say(f"started {stage.id} ({how}, PID {proc.pid}; log {log})")
        return _Running(stage, proc, slot, time.time(), log)

    def _finished(self, out_dir: Path, job: _Running) -> str:
        rc, stage = job.returncode, job.stage
        if rc == W.DONE and read_summary(out_dir / stage.id) is not None:
            return "done"
        if rc == W.HELD:
            return "held"
        if rc == W.MISMATCH:
            raise rundir.RunMismatchError(_last_line(job.log) or f"{stage.id}: a run made with other settings (see {job.log})")
        reason = _last_line(job.log) if rc in (W.FAILED, W.NOT_READY) else ""
        error = _failure(out_dir, stage, job.start, reason or _exit_reason(rc))
        _say(f"{stage.id} FAILED: {error} (log {job.log})")
        return "failed"

    def _stop(self, running: list[_Running]) -> None:
        """Ctrl-C or an error: terminate the workers (they release their locks and keep their last
        checkpoints), then kill those that do not exit in time."""
        for job in running:
            if job.proc.is_alive():
                job.proc.terminate()
        deadline = time.time() + self.grace
        for job in running:
            job.proc.join(max(0.1, deadline - time.time()))
            if job.proc.is_alive():
                job.proc.kill()
                job.proc.join()
        if running:
            _say(f"stopped {len(running)} worker(s): {', '.join(j.stage.id for j in running)} resume from their last checkpoints")


# ------------------------------------------------------------------------------ SLURM (submitit)
def _submitit():
    try:
        import submitit
    except ImportError:
        raise ConfigError("--launcher slurm needs submitit: pip install 'longrange[slurm]'") from None
    return submitit


class StageHeld(StageFailed):
    """The stage is running in another process."""


class StageNotReady(StageFailed):
    """A stage it needs is not finished."""


def _run_logged(argv: list[str], log: Path) -> int:
    """The worker's ``main`` in this process, its output (file descriptors 1 and 2) appended to ``log``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        return W.main(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


@dataclass
class StageJob:
    """The function a SLURM job runs: one stage, its output appended to ``OUT/<stage>/stage.log``.

    With one GPU (or none) the job calls the worker (``execute_stage``) in its own process; with
    ``gpus > 1`` it starts the worker under ``torchrun --standalone --nproc_per_node G``. Returns
    "done"; raises otherwise, so that the job fails and ``afterok`` holds its dependents. On a
    time-out or preemption signal submitit calls :meth:`checkpoint`: the job is requeued and the
    stage resumes from its last checkpoint.
    """

    out_dir: str
    stage_id: str
    overwrite: bool = False
    gpus: int = 1
    threads: int = 0

    def __call__(self) -> str:
        threads = self.threads or int(os.environ.get("SLURM_CPUS_PER_TASK", "0") or 0) // max(1, self.gpus)
        cmd = worker_command(self.out_dir, self.stage_id, overwrite=self.overwrite, threads=threads, gpus=self.gpus)
        log = _start_log(Path(self.out_dir), self.stage_id, cmd, f"job {os.environ.get('SLURM_JOB_ID', os.getpid())}")
        if self.gpus > 1:
            with open(log, "ab") as f:
                self._proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              env=worker_env(threads))
                rc = self._proc.wait()
        else:
            if threads > 0:
                os.environ.update({v: str(threads) for v in THREAD_VARS})
            rc = _run_logged(cmd[cmd.index("longrange.experiment.worker") + 1:], log)
        if rc == W.DONE:
            return "done"
        if rc == W.HELD:
            raise StageHeld(f"{self.stage_id} is running in another process")
        if rc == W.NOT_READY:
            raise StageNotReady(_last_line(log) or f"{self.stage_id}: a stage it needs is not finished")
        if rc == W.MISMATCH:
            raise rundir.RunMismatchError(_last_line(log))
        raise StageFailed(f"{self.stage_id}: {_last_line(log) or _exit_reason(rc)} (log {log})")

    def checkpoint(self, *args: Any, **kwargs: Any):
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()  # the worker releases the lock; the stage resumes from last.pt
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        return _submitit().helpers.DelayedSubmission(StageJob(self.out_dir, self.stage_id, self.overwrite, self.gpus, self.threads))


@dataclass
class SlurmLauncher:
    """Submit the plan's stages as SLURM jobs through submitit (see the module docstring).

    ``cluster``: "slurm" (``sbatch`` must be on PATH), or "local" for submitit's local executor
    (jobs are local processes; used by the tests). ``folder``: submitit's scripts and logs
    (default ``OUT/slurm``).
    """

    settings: LauncherConfig = field(default_factory=LauncherConfig)
    cluster: str = "slurm"
    folder: str | Path | None = None
    poll: float | None = None

    def __post_init__(self) -> None:
        if self.cluster not in ("slurm", "local"):
            raise ConfigError(f"unknown submitit cluster {self.cluster!r}; expected slurm or local")
        if self.cluster == "local" and not self.settings.wait:
            raise ConfigError("--no-wait needs SLURM to order the jobs; submitit's local executor runs only while compare waits")

    # -- submission
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

    def _extra(self, dependency: str | None) -> dict[str, Any]:
        extra = {str(k): v for k, v in self.settings.extra.items()}
        if dependency:
            extra["dependency"] = dependency
            extra.setdefault("kill-on-invalid-dep", "yes")
        return extra

    def _submit(self, ex, out_dir: Path, stages: list[Stage], overwrite: bool, dependency: str | None) -> dict[str, Any]:
        s = self.settings
        jobs_fns = [StageJob(str(out_dir), st.id, overwrite, max(1, s.gpus_per_job), s.threads_per_job) for st in stages]
        if self.cluster == "slurm":
            ex.update_parameters(slurm_additional_parameters=self._extra(dependency))
        if s.array and len(stages) > 1:
            if self.cluster == "slurm":
                ex.update_parameters(slurm_array_parallelism=len(stages))
            with ex.batch():
                submitted = [ex.submit(fn) for fn in jobs_fns]
        else:
            submitted = [ex.submit(fn) for fn in jobs_fns]
        for st, job in zip(stages, submitted):
            _say(f"submitted {st.id}: job {job.job_id}" + (f" ({dependency})" if dependency else ""))
        return dict(zip((st.id for st in stages), submitted))

    # -- outcome
    @staticmethod
    def _job_outcome(job) -> tuple[str, str]:
        try:
            job.result()
            return "done", ""
        except Exception as err:
            text = str(err)
            for name, outcome in (("StageHeld", "held"), ("StageNotReady", "skipped"), ("RunMismatchError", "mismatch")):
                if name in text:
                    return outcome, text
            return "failed", text

    def _wait(self, plan: Plan, out_dir: Path, jobs: dict[str, Any], outcome: dict[str, str], submitted_at: float) -> None:
        poll = self.poll if self.poll is not None else (0.5 if self.cluster == "local" else 30.0)
        pending = dict(jobs)
        while pending:
            for sid, job in list(pending.items()):
                if not job.done():
                    continue
                del pending[sid]
                stage = plan.by_id[sid]
                if _blocked(stage, outcome):
                    outcome[sid] = "skipped"
                    continue
                result, text = self._job_outcome(job)
                if result == "mismatch":
                    for other in pending.values():
                        other.cancel(check=False)
                    raise rundir.RunMismatchError(text.strip().splitlines()[-1] if text.strip() else sid)
                if result == "done" and read_summary(out_dir / sid) is None:
                    result, text = "failed", "the job ended without a summary"
                if result == "failed":
                    error = _failure(out_dir, stage, submitted_at, f"job {job.job_id}: {text.strip().splitlines()[-1] if text.strip() else job.state}")
                    _say(f"{sid} FAILED (job {job.job_id}): {error} (log {out_dir / sid / LOG_FILE})")
                outcome[sid] = result
                if result != "done":  # its dependents will not run: cancel their jobs
                    for dep in plan.dependents(sid):
                        if dep.id in pending and not pending[dep.id].done():
                            pending[dep.id].cancel(check=False)
                _say(f"{sid}: {result} (job {job.job_id})")
            if pending:
                time.sleep(poll)

    def __call__(self, plan: Plan, out_dir: Path, *, overwrite: bool = False) -> dict[str, str]:
        out_dir = Path(out_dir)
        ex = self._executor(out_dir)
        outcome: dict[str, str] = {}
        jobs: dict[str, Any] = {}
        start = time.time()
        try:
            for level in plan.levels():
                todo = []
                for stage in level:
                    if _blocked(stage, outcome):
                        outcome[stage.id] = "skipped"
                    elif read_summary(out_dir / stage.id) is not None and all(outcome.get(a) == "done" for a in stage.after):
                        outcome[stage.id] = _reuse_finished(plan, out_dir, stage, overwrite)
                    elif rundir.RunLock(out_dir / stage.id).holder() is not None:
                        outcome[stage.id] = "held"
                    else:
                        todo.append(stage)
                if not todo:
                    continue
                if self.cluster == "local":  # no dependencies: submit this level once the previous one ended
                    level_jobs = self._submit(ex, out_dir, todo, overwrite, None)
                    jobs.update(level_jobs)
                    self._wait(plan, out_dir, level_jobs, outcome, start)
                    continue
                need = sorted({jobs[a].job_id for st in todo for a in st.after if a in jobs})
                if self.settings.array:
                    need = sorted({i.split("_")[0] for i in need})
                    dependency = f"afterany:{':'.join(need)}" if need else None
                    jobs.update(self._submit(ex, out_dir, todo, overwrite, dependency))
                else:
                    for stage in todo:
                        deps = [jobs[a].job_id for a in stage.after if a in jobs]
                        jobs.update(self._submit(ex, out_dir, [stage], overwrite, f"afterok:{':'.join(deps)}" if deps else None))
            if self.cluster == "slurm":
                (out_dir / JOBS_FILE).write_text(json.dumps({sid: j.job_id for sid, j in jobs.items()}, indent=1))
                if not self.settings.wait:
                    _say(f"submitted {len(jobs)} job(s): {' '.join(sorted({j.job_id.split('_')[0] for j in jobs.values()}))}; "
                         f"`longrange compare --status {out_dir}` shows progress, and compare again (or "
                         f"`longrange report {out_dir}`) writes the report once they are done")
                    return {s.id: outcome.get(s.id, "submitted") for s in plan.stages}
                self._wait(plan, out_dir, jobs, outcome, start)
        except KeyboardInterrupt:
            running = [j for j in jobs.values() if not j.done()]
            if self.cluster == "local":  # the jobs are this machine's processes: stop them
                _say(f"interrupted: cancelling {len(running)} job(s)")
                for job in running:
                    job.cancel(check=False)
            elif running:  # SLURM jobs run on without this process; the next compare reuses their stages
                (out_dir / JOBS_FILE).write_text(json.dumps({sid: j.job_id for sid, j in jobs.items()}, indent=1))
                _say(f"interrupted: {len(running)} SLURM job(s) keep running ({' '.join(j.job_id for j in running)}); "
                     f"`longrange compare --status {out_dir}` shows them, scancel stops them")
            raise
        return {s.id: outcome.get(s.id, "skipped") for s in plan.stages}


# ------------------------------------------------------------------------------ choice
def make_executor(settings: LauncherConfig) -> Callable[..., dict[str, str]]:
    """The executor ``settings`` describes: in process (local, 1 job), local workers, or SLURM."""
    if settings.kind == "slurm":
        return SlurmLauncher(settings)
    if settings.jobs > 1:
        return LocalWorkers(settings.jobs, settings.threads_per_job)
    if settings.threads_per_job:
        return InProcess(settings.threads_per_job)
    return run_in_process


@dataclass
class InProcess:
    """``run_in_process`` with torch set to ``threads`` threads while it runs (``--threads-per-job`` without ``--jobs``)."""

    threads: int

    def __call__(self, plan: Plan, out_dir: Path, *, overwrite: bool = False) -> dict[str, str]:
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            return run_in_process(plan, out_dir, overwrite=overwrite)
        finally:
            torch.set_num_threads(before)
