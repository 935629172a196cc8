"""One stage of a comparison in a process of its own: ``python -m longrange.experiment.worker OUT STAGE_ID``.

The worker loads ``OUT/plan.json`` and calls :func:`~longrange.experiment.compare.execute_stage`, the
same function the in-process run calls, so a stage's outcome does not depend on how it was launched.
The local-workers and SLURM executors (``experiment/executors.py``) start it; under ``torchrun``
every rank runs it (rank 0 decides and writes). Its exit status says what happened:

    0  the stage is done (trained, resumed, or reused)
    1  the stage failed (``OUT/<stage>/failed.json`` says why)
    3  another live process holds the stage (it is running elsewhere)
    4  the stage holds a run made with other settings (the message is the last line of the log)
    5  a stage it needs is not finished
    130 interrupted (SIGINT or SIGTERM): the stage's lock is released, its last checkpoint kept

``--threads N`` sets torch's threads (the executor also sets OMP/MKL_NUM_THREADS in its environment).
"""
from __future__ import annotations

import argparse
import signal
import sys

DONE, FAILED, HELD, MISMATCH, NOT_READY, INTERRUPTED = 0, 1, 3, 4, 5, 130


def _interrupt(signum, frame):  # SIGTERM behaves as Ctrl-C: locks are released, no failure recorded
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m longrange.experiment.worker", description=__doc__.splitlines()[0])
    p.add_argument("out", help="the comparison's output directory (holds plan.json)")
    p.add_argument("stage", help="the stage id (its run directory relative to OUT)")
    p.add_argument("--overwrite", action="store_true", help="replace a finished run made with other settings")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:  # not inside a submitit job, which handles it
        signal.signal(signal.SIGTERM, _interrupt)

    import torch

    from longrange.errors import LongrangeError
    from longrange.experiment.compare import StageFailed, execute_stage
    from longrange.experiment.plan import Plan
    from longrange.train import distributed, rundir

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        plan = Plan.load(args.out)
        if args.stage not in plan.by_id:
            print(f"worker: error: {args.out}/plan.json has no stage {args.stage}", file=sys.stderr, flush=True)
            return FAILED
        summary = execute_stage(plan, args.stage, args.out, overwrite=args.overwrite)
    except KeyboardInterrupt:
        print(f"worker: interrupted; {args.stage} resumes from its last checkpoint", file=sys.stderr, flush=True)
        return INTERRUPTED
    except rundir.RunMismatchError as err:
        print(f"worker: error: {err}", file=sys.stderr, flush=True)
        return MISMATCH
    except StageFailed as err:
        print(f"worker: error: {err}", file=sys.stderr, flush=True)
        return NOT_READY
    except Exception as err:  # recorded in failed.json by execute_stage
        if not isinstance(err, LongrangeError):
            import traceback

            traceback.print_exc()
        print(f"worker: error: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return FAILED
    if distributed.world_size() > 1:
        distributed.cleanup()
    if summary is None:
        print(f"worker: {args.stage} is running in another process; leaving it", file=sys.stderr, flush=True)
        return HELD
    print(f"worker: {args.stage} done", file=sys.stderr, flush=True)
    return DONE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
