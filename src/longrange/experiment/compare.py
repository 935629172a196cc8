"""The fair comparison: training from scratch versus self-pretraining (SPT) then finetuning.

``compare`` expands the grid into a plan of stages (``experiment/plan.py``), saves it as
``OUT/plan.json``, and runs every stage that is not finished, in dependency order. A stage is:

* **done** (its ``summary.json`` exists): reused, only if it was made with the same settings (its
  fingerprint, see ``train/rundir.py``); otherwise the comparison stops before training anything,
  naming the differing fields (``overwrite=True`` replaces such stages);
* **interrupted** (a last checkpoint, nobody holding its lock): resumed from its checkpoint;
* **running** (its lock is held by a live process, e.g. a second ``compare`` on the same output):
  left alone, and so is everything after it;
* **failed** (``failed.json`` says why): run again; a stage that fails is recorded there, the
  stages after it are skipped, and the rest of the grid goes on; the comparison then ends with an
  error naming every failed stage.

:func:`execute_stage` runs one stage under its lock; every executor (in process, local workers, SLURM)
goes through it, so a stage's outcome depends only on its settings and seed.
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

from longrange.errors import LongrangeError
from longrange.experiment.config import ExperimentConfig
from longrange.experiment.plan import Plan, Stage, default_objectives, describe, plan_grid, slug, stage_arguments
from longrange.experiment.runs import plan_stage, read_summary, run_stage
from longrange.train import rundir
from longrange.train.loop import format_seconds

__all__ = ["compare", "default_objectives", "execute_stage", "slug", "stage_statuses", "StageFailed"]

FAILED_FILE = "failed.json"
LOG_FILE = "stage.log"


class StageFailed(LongrangeError):
    """Stages of a comparison failed or could not run; the message names them."""


def _summaries(out_dir: Path, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    out = {}
    for i in ids:
        summary = read_summary(out_dir / i)
        if summary is not None:
            out[i] = summary
    return out


def stage_status(out_dir: Path, stage: Stage) -> str:
    """pending, running, done, failed or interrupted (a checkpoint to resume from)."""
    paths = rundir.RunPaths(out_dir / stage.id)
    if paths.summary.is_file():
        return "done"
    if rundir.RunLock(paths.root).holder() is not None:
        return "running"
    if (paths.root / FAILED_FILE).is_file():
        return "failed"
    if paths.last.is_file():
        return "interrupted"
    return "pending"


def stage_statuses(out_dir: str | Path, plan: Plan | None = None) -> dict[str, str]:
    out_dir = Path(out_dir)
    plan = plan or Plan.load(out_dir)
    return {s.id: stage_status(out_dir, s) for s in plan.stages}


def check_reuse(plan: Plan, out_dir: Path, overwrite: bool = False) -> list[str]:
    """Stages whose finished run was made with other settings, as ``id: differences`` lines; an
    error before anything runs unless ``overwrite`` (then they are run again)."""
    stale = []
    for stage in plan.stages:
        run = out_dir / stage.id
        if read_summary(run) is None:
            continue
        deps = _summaries(out_dir, stage.after)
        if len(deps) < len(stage.after):
            continue  # its inputs are not finished: checked when it is reached
        config = plan_stage(**stage_arguments(plan, stage, out_dir, deps)).config()
        saved = rundir.read_config(run) or {}
        diff = rundir.differences(saved, config)
        if diff:
            stale.append(f"{stage.id}: {'; '.join(diff[:4])}{' ...' if len(diff) > 4 else ''}")
    if stale and not overwrite:
        raise rundir.RunMismatchError(
            f"{len(stale)} finished stage(s) in {out_dir} were made with other settings: " + " | ".join(stale[:6])
            + (f" | and {len(stale) - 6} more" if len(stale) > 6 else "")
            + "; pass --overwrite to run them again with these settings, or choose a new --out"
        )
    return stale


def _decide(plan: Plan, stage: Stage, run: Path, kwargs: dict[str, Any], overwrite: bool) -> tuple[str, Any]:
    """Under the stage's lock: ("done", summary), ("resume", None) or ("fresh", None)."""
    done = read_summary(run)
    resume = done is not None or rundir.RunPaths(run).last.is_file()
    if resume:
        try:
            rundir.check_same_run(run, plan_stage(**kwargs).config(), "reuse" if done else "resume")
        except rundir.RunMismatchError:
            if not overwrite:
                raise
            resume, done = False, None
    if done is not None:
        return "done", done
    return ("resume" if resume else "fresh"), None


def _record_failure(run: Path, stage: Stage, err: BaseException) -> None:
    record = {"stage": stage.id, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc(),
              "log": str(run / LOG_FILE) if (run / LOG_FILE).is_file() else None, "time": time.time()}
    (run / FAILED_FILE).write_text(json.dumps(record, indent=1))


def execute_stage(plan: Plan, stage_id: str, out_dir: str | Path, *, overwrite: bool = False) -> dict[str, Any] | None:
    """Run (or reuse, or resume) one stage under its lock; returns its summary.

    Returns None when another live process holds the stage (it is running there). Raises when the
    stage fails, after recording the failure in ``failed.json``.

    Under ``torchrun`` (WORLD_SIZE > 1) every rank calls this: rank 0 takes the lock and decides
    (reuse, resume or start afresh), the other ranks follow its decision, and only rank 0 writes.
    """
    from longrange.train import distributed as D

    out_dir = Path(out_dir)
    stage = plan.by_id[stage_id]
    run = out_dir / stage.id
    deps = _summaries(out_dir, stage.after)
    missing = [a for a in stage.after if a not in deps]
    if missing:
        raise StageFailed(f"stage {stage.id} needs {', '.join(missing)} finished first")
    kwargs = stage_arguments(plan, stage, out_dir, deps)
    env = D.init_distributed() if D._env_int("WORLD_SIZE", 1) > 1 else None
    main = env is None or env.is_main
    lock, decision, error = None, ("held", None), None
    if main:
        try:
            lock = rundir.RunLock(rundir.check_out_dir(run)).acquire()
            decision = _decide(plan, stage, run, kwargs, overwrite)
        except rundir.RunLockedError:
            decision = ("held", None)
        except BaseException as err:
            decision, error = ("error", f"{type(err).__name__}: {err}"), err
            if lock is not None:
                lock.release()
            if env is None:
                raise
    if env is not None:
        shared = [decision]
        D.dist.broadcast_object_list(shared, src=0)
        decision = shared[0]
    what, value = decision
    if what == "error":
        raise error if error is not None else StageFailed(f"stage {stage.id}: rank 0 stopped: {value}")
    if what in ("held", "done"):
        if lock is not None:
            lock.release()
        return value
    try:
        if main:
            print(f"{'resuming' if what == 'resume' else 'running'} {run}", file=sys.stderr, flush=True)
        summary = run_stage(run_dir=run, resume=what == "resume", overwrite=what != "resume", lock=lock, **kwargs)
        if main:
            (run / FAILED_FILE).unlink(missing_ok=True)
        return summary
    except BaseException as err:
        if main and not isinstance(err, (KeyboardInterrupt, SystemExit, rundir.RunMismatchError)):
            _record_failure(run, stage, err)
        raise
    finally:
        if lock is not None:
            lock.release()


def run_in_process(plan: Plan, out_dir: Path, *, overwrite: bool = False,
                   on_stage: Callable[[str], None] | None = None) -> dict[str, str]:
    """Run the plan's stages one after another in this process; returns each stage's outcome
    (done, failed, skipped: after a failed stage, held: running elsewhere)."""
    outcome: dict[str, str] = {}
    n = len(plan.stages)
    start, ran = time.time(), 0
    for k, stage in enumerate(plan.stages, 1):
        blocked = [a for a in stage.after if outcome.get(a) != "done"]
        if blocked:
            outcome[stage.id] = "skipped"
            print(f"stage {k} of {n}: skipping {stage.id} (needs {', '.join(blocked)})", file=sys.stderr, flush=True)
            continue
        if read_summary(out_dir / stage.id) is not None:
            print(f"stage {k} of {n}: reusing {stage.id}", file=sys.stderr, flush=True)
        else:
            eta = (time.time() - start) / ran * (n - k + 1) if ran else float("inf")
            print(f"stage {k} of {n}: {stage.id} (overall eta {format_seconds(eta)})", file=sys.stderr, flush=True)
        try:
            t0 = time.time()
            summary = execute_stage(plan, stage.id, out_dir, overwrite=overwrite)
            if time.time() - t0 > 1:
                ran += 1
        except rundir.RunMismatchError:
            raise
        except KeyboardInterrupt:
            raise
        except Exception as err:  # recorded in failed.json; the grid goes on
            outcome[stage.id] = "failed"
            print(f"stage {k} of {n}: {stage.id} FAILED: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
            continue
        outcome[stage.id] = "held" if summary is None else "done"
        if summary is None:
            print(f"stage {k} of {n}: {stage.id} is running in another process; leaving it", file=sys.stderr, flush=True)
        if on_stage is not None:
            on_stage(stage.id)
    return outcome


def raise_for_outcome(plan: Plan, out_dir: Path, outcome: dict[str, str]) -> None:
    """A StageFailed naming every stage that did not finish, if any."""
    failed = [i for i, o in outcome.items() if o == "failed"]
    held = [i for i, o in outcome.items() if o == "held"]
    skipped = [i for i, o in outcome.items() if o == "skipped"]
    if not (failed or held or skipped):
        return
    parts = []
    if failed:
        parts.append(f"{len(failed)} stage(s) failed: " + ", ".join(f"{i} (see {out_dir / i / FAILED_FILE})" for i in failed))
    if held:
        parts.append(f"{len(held)} stage(s) are running in another process: {', '.join(held)}")
    if skipped:
        parts.append(f"{len(skipped)} stage(s) after them did not run")
    raise StageFailed("; ".join(parts) + f"; `longrange compare --status {out_dir}` shows every stage, "
                      "and running compare again does only the missing work")


def compare(
    experiments: Sequence[ExperimentConfig],
    out_dir: str | Path,
    *,
    seeds: Sequence[int] | None = None,
    objectives: Sequence[str] | None = None,
    compute_matched: bool | None = None,
    train_subsets: Sequence[float | int] | None = None,
    overwrite: bool = False,
    dry_run: bool = False,
    executor: Callable[..., dict[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """Run scratch and SPT for every experiment and seed; return the final-stage summaries
    (scratch, finetuned, compute-matched), in plan order.

    ``executor(plan, out_dir, overwrite=...)`` runs the stages and returns their outcomes; the
    default runs them one after another in this process (others: ``experiment/executors.py``). When
    the executor only submitted them (outcome "submitted"), nothing is returned. ``dry_run`` prints
    the plan and runs nothing. ``train_subsets`` (default: each experiment's
    ``compare.train_subsets``) sweeps the training set's size: every regime and seed once per
    subset (see ``experiment/plan.py``).
    """
    out_dir = rundir.check_out_dir(out_dir, "--out")
    plan = plan_grid(experiments, seeds=seeds, objectives=objectives, compute_matched=compute_matched,
                     train_subsets=train_subsets)
    if dry_run:
        statuses = stage_statuses(out_dir, plan) if out_dir.is_dir() else None
        print(describe(plan, statuses))
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    check_reuse(plan, out_dir, overwrite)
    plan.save(out_dir)
    outcome = (executor or run_in_process)(plan, out_dir, overwrite=overwrite)
    if "submitted" in outcome.values():  # a scheduler runs them (compare --launcher slurm --no-wait)
        return []
    raise_for_outcome(plan, out_dir, outcome)
    summaries = _summaries(out_dir, [s.id for s in plan.stages if s.is_final])
    return [summaries[s.id] for s in plan.stages if s.is_final]
