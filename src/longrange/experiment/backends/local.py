"""Local worker processes (``compare --jobs N``): up to N stages at once on this machine.

Each stage runs in a process of its own, forked from a server process that imported torch and
longrange once (``multiprocessing``'s forkserver; spawn where there is none), so a stage starts at
once instead of importing torch again. The process runs the worker's ``main`` exactly as the
command ``python -m longrange.experiment.worker OUT STAGE_ID`` does, with its output in
``OUT/<stage>/stage.log``, its own threads (``threads_per_job``; torch threads and OMP/MKL) or its
own GPU (``CUDA_VISIBLE_DEVICES``, round-robin over the visible GPUs).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longrange.errors import ConfigError
from longrange.experiment import worker as W
from longrange.experiment.plan import Plan, Stage
from longrange.experiment.scheduler import Outcome, after_exit, say
from longrange.train.rundir import Intent, RunDir, RunMismatchError

#: Modules the worker processes' fork server imports once, so that a worker starts in a fraction of
#: a second instead of importing torch again (a few seconds per stage on a small machine).
PRELOAD = ["longrange.experiment.worker", "longrange.experiment.execute", "torch._dynamo"]


def usable_cores() -> int:
    """The CPUs this process may run on: its affinity (what a container or a SLURM allocation gives
    it), else ``os.cpu_count()``."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def auto_jobs(gpus: Sequence[str] | None = None) -> int:
    """``--jobs auto``: one stage per GPU where there are GPUs (``gpus``, default the visible ones),
    else one stage per usable core, each on one thread. On a 2-core machine one thread per stage
    and a stage per core trained the synthetic studies' small models fastest of every placement
    measured (docs/cluster.md, "How many stages at once"), and on 16 cores 16 x 1 beat 8 x 2 by 1.7x
    and 4 x 4 by 3x: their steps are too small for a second thread to pay, and the stages of a grid
    are independent."""
    gpus = list(visible_gpus() if gpus is None else gpus)
    return len(gpus) if gpus else usable_cores()


def resolve_jobs(jobs: int | str) -> int:
    """A number of stages at once: ``jobs``, with ``auto`` resolved on this machine (:func:`auto_jobs`)."""
    return auto_jobs() if jobs == "auto" else int(jobs)


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


def _worker_process(
    target: Callable[[list[str]], int], argv: list[str], log: str, env: dict[str, str], threads: int
) -> None:
    """The body of a local worker process: output to the stage's log, its GPU and threads, then the worker.

    The worker ignores Ctrl-C (the terminal sends it to the whole process group): the coordinator,
    which sees it too, stops each worker with SIGTERM, on which the worker finishes its step and
    writes a checkpoint; two signals in a row would stop it at once, without one."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
class _Worker:
    stage: Stage
    proc: Any
    slot: int
    start: float
    run: RunDir


@dataclass
class LocalWorkers:
    """Run up to ``jobs`` stages at once as worker processes on this machine (see the module docstring).

    ``threads_per_job`` 0 = the usable cores // jobs (:func:`usable_cores`). ``gpus``: the GPUs to hand out round-robin
    (one per worker; None: the visible ones; [] for none). ``target``: a module-level function that
    replaces the worker's ``main`` (argv -> exit status; tests use it).
    """

    jobs: int
    threads_per_job: int = 0
    gpus: Sequence[str] | None = None
    target: Callable[[list[str]], int] | None = None
    poll_interval: float = 0.1
    #: Seconds a worker has to exit after SIGTERM (on Ctrl-C) before it is killed.
    grace: float = 20.0
    submits_ahead = False
    wait = True
    _free: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ConfigError(f"--jobs must be >= 1, got {self.jobs}")
        if self.threads_per_job < 0:
            raise ConfigError(f"--threads-per-job must be >= 0, got {self.threads_per_job}")

    @property
    def threads(self) -> int:
        return self.threads_per_job or max(1, usable_cores() // self.jobs)

    def begin(self, plan: Plan, out_dir: Path, intent: Intent) -> None:
        self.plan, self.out_dir, self.intent = plan, out_dir, intent
        self._gpus = list(visible_gpus() if self.gpus is None else self.gpus)
        self._free = list(range(self.jobs))
        where = f"GPU {', '.join(self._gpus)} round-robin" if self._gpus else f"{self.threads} thread(s) each"
        say(
            f"{len(plan.stages)} stages, up to {self.jobs} at once as worker processes ({where}); "
            f"logs in OUT/<stage>/{RunDir(out_dir).log.name}"
        )

    def slots(self) -> int | None:
        return len(self._free)

    @staticmethod
    def _context():
        import multiprocessing as mp

        if "forkserver" not in mp.get_all_start_methods():  # pragma: no cover - Windows
            return mp.get_context("spawn")
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx

    def submit(self, stages: Sequence[Stage], after: dict[str, Any]) -> dict[str, Any]:
        return {stage.id: self._start(stage, self._free.pop(0)) for stage in stages}

    def _start(self, stage: Stage, slot: int) -> _Worker:
        gpu = self._gpus[slot % len(self._gpus)] if self._gpus else None
        threads = self.threads
        argv = [str(self.out_dir), stage.id, "--threads", str(threads)] + W.intent_args(self.intent)
        how = f"worker {slot}" + (f" on GPU {gpu}" if gpu is not None else f" with {threads} thread(s)")
        run = RunDir(self.out_dir / stage.id)
        log = run.start_log(f"{how}: worker {' '.join(argv)}")
        env = {v: str(threads) for v in W.THREAD_VARS}
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        proc = self._context().Process(
            target=_worker_process,
            args=(self.target or W.main, argv, str(log), env, threads),
            name=f"longrange-worker-{slot}",
        )
        proc.start()
        say(f"started {stage.id} ({how}, PID {proc.pid}; log {log})")
        return _Worker(stage, proc, slot, time.time(), run)

    def poll(self, job: _Worker) -> Outcome | None:
        rc = job.proc.exitcode
        if rc is None:
            return None
        self._free.append(job.slot)
        self._free.sort()
        result = W.outcome(rc)
        if result is None:
            raise RunMismatchError(
                W.error_line(job.run.log) or f"{job.stage.id}: a run made with other settings (see {job.run.log})"
            )
        return after_exit(
            self.plan,
            job.stage,
            self.out_dir,
            result,
            job.start,
            lambda: (W.error_line(job.run.log) if rc == W.FAILED else "") or W.exit_reason(rc),
        )

    def cancel(self, job: _Worker) -> None:
        self.stop({job.stage.id: job}, interrupted=False)

    def stop(self, handles: dict[str, Any], interrupted: bool) -> None:
        """Terminate the workers (SIGTERM: each finishes its step, writes a checkpoint and releases
        its lock), then kill those that do not exit in time; Ctrl-C while waiting kills them at once."""
        running = list(handles.values())
        for job in running:
            if job.proc.is_alive():
                job.proc.terminate()
        if running:
            say(
                f"stopping {len(running)} worker(s) after their current step, with a checkpoint "
                f"(Ctrl-C again stops them at once)"
            )
        deadline = time.time() + self.grace
        killed = []
        try:
            for job in running:
                job.proc.join(max(0.1, deadline - time.time()))
        except KeyboardInterrupt:
            pass
        for job in running:
            if job.proc.is_alive():
                job.proc.kill()
                job.proc.join()
                killed.append(job.stage.id)
        kept = [j.stage.id for j in running if j.stage.id not in killed]
        if kept:
            say(f"stopped {len(kept)} worker(s) with their checkpoints: {', '.join(kept)} resume from them")
        if killed:
            say(
                f"killed {len(killed)} worker(s) at once: {', '.join(killed)} resume from their last periodic "
                "checkpoints, or start again where they wrote none"
            )

    def end(self, handles: dict[str, Any]) -> None:
        pass
