"""One stage of a comparison in a process of its own: ``python -m longrange.experiment.worker OUT STAGE_ID``.

The worker loads ``OUT/plan.json``, resolves its stage (``Plan.resolve``) and runs it with
:func:`~longrange.experiment.execute.run_stage`, as the in-process backend does, so a stage's
outcome does not depend on how it was launched. The local-worker and SLURM backends (``experiment/backends/``) start it; under ``torchrun``
every rank runs it (rank 0 decides and writes). Its exit status says what happened
(:func:`outcome` reads it, for every backend):

    0  the stage is done (trained, resumed, or reused)
    1  the stage failed (``OUT/<stage>/failed.json`` says why)
    3  another live process holds the stage (it is running elsewhere)
    4  the stage holds a run made with other settings (the message is the last line of the log)
    5  a stage it needs is not finished
    130 interrupted (SIGINT, or SIGTERM / SIGUSR1: a training stage first finishes its step and
        writes a checkpoint): the stage's lock is released, and it resumes from its last checkpoint

``--threads N`` sets torch's threads (the backend also sets OMP/MKL_NUM_THREADS in its environment).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

DONE, FAILED, HELD, MISMATCH, NOT_READY, INTERRUPTED = 0, 1, 3, 4, 5, 130
#: The prefix of the worker's error line (the last such line of a stage's log is its error).
ERROR_PREFIX = "worker: error: "
#: Environment variables that set the thread pools of a worker.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")


def outcome(rc: int):
    """The :class:`~longrange.experiment.scheduler.Outcome` of a worker's exit status; None for
    :data:`MISMATCH`, which is not an outcome but an error that stops the comparison."""
    from longrange.experiment.scheduler import Outcome

    if rc == MISMATCH:
        return None
    return {DONE: Outcome.DONE, HELD: Outcome.HELD, NOT_READY: Outcome.SKIPPED}.get(rc, Outcome.FAILED)


def exit_reason(rc: int) -> str:
    """Why a worker ended, in words, from its exit status (a negative status: the signal)."""
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"the worker was killed by {name}" + (" (out of memory?)" if -rc == signal.SIGKILL else "")
    return f"the worker exited with status {rc}"


def error_line(log: Path) -> str:
    """The worker's last error line in ``log`` (without its prefix), or ''."""
    try:
        lines = [l for l in log.read_text(errors="replace").splitlines() if l.startswith(ERROR_PREFIX)]
    except OSError:
        return ""
    return lines[-1][len(ERROR_PREFIX) :] if lines else ""


def intent_args(intent) -> list[str]:
    """The worker's options for a comparison's :class:`~longrange.train.rundir.Intent`."""
    return (["--overwrite"] if intent.replace_stale else []) + (
        ["--rerun-other-versions"] if intent.rerun_other_versions else []
    )


def command(
    out_dir: str | Path,
    stage_id: str,
    *,
    overwrite: bool = False,
    rerun_other_versions: bool = False,
    threads: int = 0,
    gpus: int = 1,
) -> list[str]:
    """The command that runs one stage; under torchrun (``gpus > 1``) on that many GPUs of one node."""
    from longrange.train.rundir import Intent

    args = ["-m", "longrange.experiment.worker", str(out_dir), stage_id]
    args += intent_args(Intent("continue", replace_stale=overwrite, rerun_other_versions=rerun_other_versions))
    if threads > 0:
        args += ["--threads", str(threads)]
    if gpus > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}", *args]
    return [sys.executable, *args]


def environment(threads: int = 0, gpu: str | None = None) -> dict[str, str]:
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


def _interrupt(signum, frame):  # SIGTERM behaves as Ctrl-C: locks are released, no failure recorded
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m longrange.experiment.worker", description=__doc__.splitlines()[0])
    p.add_argument("out", help="the comparison's output directory (holds plan.json)")
    p.add_argument("stage", help="the stage id (its run directory relative to OUT)")
    p.add_argument("--overwrite", action="store_true", help="replace a finished run made with other settings")
    p.add_argument(
        "--rerun-other-versions", action="store_true", help="run again a stage finished by another longrange version"
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:  # not inside a submitit job, which handles it
        signal.signal(signal.SIGTERM, _interrupt)

    import torch

    from longrange.errors import LongrangeError, Preempted
    from longrange.experiment.execute import run_stage
    from longrange.experiment.plan import Plan, StageNotReady
    from longrange.faults import kill_point
    from longrange.train.denormals import flush_denormals
    from longrange.train.rundir import Intent, RunLockedError, RunMismatchError

    flush_denormals("cpu")  # before any thread pool starts: the stage's threads inherit it (train/denormals.py)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        plan = Plan.load(args.out)
        if args.stage not in plan.by_id:
            print(f"{ERROR_PREFIX}{args.out}/plan.json has no stage {args.stage}", file=sys.stderr, flush=True)
            return FAILED
        intent = Intent("continue", replace_stale=args.overwrite, rerun_other_versions=args.rerun_other_versions)
        stage = plan.by_id[args.stage]
        run_stage(plan.resolve(stage, args.out), Path(args.out) / stage.id, intent, plan_id=stage.id)
    except RunLockedError:
        print(f"worker: {args.stage} is running in another process; leaving it", file=sys.stderr, flush=True)
        return HELD
    except KeyboardInterrupt:
        print(
            f"worker: interrupted; {args.stage} resumes from its last checkpoint when the same "
            "`longrange compare` runs again",
            file=sys.stderr,
            flush=True,
        )
        return INTERRUPTED
    except Preempted as err:  # a comparison has no --resume: it resumes by running again
        print(
            f"worker: {args.stage} stopped at step {err.step} of {err.total}, its checkpoint written; it resumes "
            "when the same `longrange compare` runs again",
            file=sys.stderr,
            flush=True,
        )
        return INTERRUPTED
    except RunMismatchError as err:
        print(f"{ERROR_PREFIX}{err}", file=sys.stderr, flush=True)
        return MISMATCH
    except StageNotReady as err:
        print(f"{ERROR_PREFIX}{err}", file=sys.stderr, flush=True)
        return NOT_READY
    except Exception as err:  # recorded in failed.json by run_stage
        if not isinstance(err, LongrangeError):
            import traceback

            traceback.print_exc()
        print(f"{ERROR_PREFIX}{type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return FAILED
    kill_point("after-unlock")
    print(f"worker: {args.stage} done", file=sys.stderr, flush=True)
    return DONE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
