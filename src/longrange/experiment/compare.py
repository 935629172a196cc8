"""The fair comparison: training from scratch versus self-pretraining (SPT) then finetuning.

``compare`` expands the grid into a plan of stages (``experiment/plan.py``), saves it as
``OUT/plan.json``, checks that no finished stage was made with other settings, and runs every stage
that is not finished, in dependency order (``experiment/scheduler.py``, on a backend of
``experiment/backends/``). A stage is:

* **finished** (its ``summary.json`` exists, see ``RunDir.state``): reused, only if it was made with the same settings (its
  fingerprint, see ``train/rundir/decide.py``); otherwise the comparison stops before training anything,
  naming the differing fields (``overwrite=True`` replaces such stages);
* **resumable** (started, nobody holding its lock): resumed from its last checkpoint (afresh when it has none);
* **held** (its lock is held by a live process, e.g. a second ``compare`` on the same output):
  left alone, and so is everything after it;
* **failed** (``failed.json`` says why): run again; a stage that fails is recorded there, the
  stages after it are skipped, and the rest of the grid goes on; the comparison then ends with an
  error naming every failed stage.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from longrange.errors import ConfigError, DataMissingError, LongrangeError
from longrange.experiment.backends import InProcess
from longrange.experiment.config import ExperimentConfig, TaskConfig
from longrange.experiment.params import WIDTH, match_field, model_size, size_warning, with_value
from longrange.experiment.plan import Plan, StageFailed, StageNotReady, default_objectives, describe, plan_grid, slug
from longrange.experiment.scheduler import Backend, Outcome, run_plan
from longrange.experiment.taskdata import data_state, prepare_generated, unread_files_note
from longrange.fileio import check_out_dir
from longrange.train.rundir import Intent, RunDir, RunMismatchError, other_versions_line

__all__ = ["compare", "default_objectives", "run_grid", "slug", "stage_statuses", "StageFailed"]


def stage_statuses(out_dir: str | Path, plan: Plan | None = None) -> dict[str, str]:
    """Each stage's state (:meth:`RunDir.state`): pending, finished, resumable, failed or held."""
    out_dir = Path(out_dir)
    plan = plan or Plan.load(out_dir)
    return {s.id: RunDir(out_dir / s.id).state().value for s in plan.stages}


def check_reuse(plan: Plan, out_dir: Path, overwrite: bool = False) -> list[str]:
    """Stages whose finished run was made with other settings, as ``id: differences`` lines; an
    error before anything runs unless ``overwrite`` (then they are run again)."""
    stale = []
    for stage in plan.stages:
        run = RunDir(out_dir / stage.id)
        if not run.finished():
            continue
        try:
            resolved = plan.resolve(stage, out_dir)
        except StageNotReady:
            continue  # its inputs are not finished: checked when it is reached
        diff = run.mismatch(resolved.config())
        if diff:
            stale.append(resolved.name_fields(f"{stage.id}: {'; '.join(diff[:4])}{' ...' if len(diff) > 4 else ''}"))
    if stale and not overwrite:
        raise RunMismatchError(
            f"{len(stale)} finished stage(s) in {out_dir} were made with other settings: "
            + " | ".join(stale[:6])
            + (f" | and {len(stale) - 6} more" if len(stale) > 6 else "")
            + "; pass --overwrite to run them again with these settings, or choose a new --out"
        )
    return stale


def size_lines(
    experiments: Sequence[ExperimentConfig], groups: Sequence[Sequence[int]], size_note: str | None = None
) -> list[str]:
    """One line with each experiment's parameter count (of its supervised model), and a warning line for
    each group of experiments whose counts differ by more than 10% (with ``size_note``, why the sizes
    differ on purpose, instead)."""
    totals: list[int | None] = []
    for exp in experiments:
        try:
            totals.append(int(model_size(exp)["total"]))
        except ConfigError as err:  # a model that cannot be built: said before any stage runs
            raise ConfigError(f"{exp.label}: {err}") from None
        except LongrangeError:  # e.g. a pretrained LM's files not at hand: the stage itself will say so
            totals.append(None)
    lines = [
        "parameters: "
        + ", ".join(f"{exp.label} {'?' if total is None else f'{total:,}'}" for exp, total in zip(experiments, totals))
    ]
    for group in groups:
        warning = size_warning([experiments[i].label for i in group], [totals[i] for i in group])
        if warning:
            lines.append(f"sizes differ on purpose: {size_note}" if size_note else f"warning: {warning}")
    return lines


def match_widths(
    experiments: Sequence[ExperimentConfig], groups: Sequence[Sequence[int]]
) -> tuple[list[ExperimentConfig], list[str]]:
    """The experiments with the width of each after the first of its group matched to the first's
    parameter count (``compare --match-params``), and a line per matched experiment."""
    out, lines = list(experiments), []
    for group in groups:
        first = experiments[group[0]]
        target = int(model_size(first)["total"])
        for i in group[1:]:
            found = match_field(experiments[i], target, WIDTH)
            lines.append(f"matched to {first.label}: " + found.describe(experiments[i].label))
            if found.value != found.before:
                out[i] = with_value(experiments[i], WIDTH, found.value)
    return out, lines


def tasks_of(experiments: Sequence[ExperimentConfig]) -> list[TaskConfig]:
    """The distinct data sets the experiments' stages read (training and pretraining)."""
    found: dict[str, TaskConfig] = {}
    for exp in experiments:
        for stage in ("train", "pretrain"):
            t = exp.stage_task(stage)
            found.setdefault(json.dumps([t.name, t.options, t.data_dir, t.generate], sort_keys=True, default=str), t)
    return list(found.values())


def data_lines(experiments: Sequence[ExperimentConfig]) -> tuple[list[str], list[str]]:
    """One line per data set of the experiments (present, generated on first use, or missing with
    its first missing file and how to obtain it), and the lines of those that are missing."""
    lines, missing = [], []
    tasks = tasks_of(experiments)
    for task in tasks:
        state = data_state(task)
        lines.append(state.describe(_task_label(task, tasks)))
        if not (state.present or state.generated):
            missing.append(lines[-1])
        note = unread_files_note(task, state)  # generated data set while the task's own files are there
        if note is not None:
            lines.append(note)
    return lines, missing


def _task_label(task: TaskConfig, tasks: Sequence[TaskConfig]) -> str:
    """The task's name, and where other data sets of the list share it, the settings that tell them
    apart: ``mad-in-context-recall (n_train=800)``."""
    same = [t for t in tasks if t.name == task.name]
    if len(same) < 2:
        return task.name
    settings = lambda t: {**t.options, "data_dir": t.data_dir, "generate": t.generate}  # noqa: E731
    fields, others = settings(task), [settings(t) for t in same if t is not task]
    differ = [k for k, v in fields.items() if any(o.get(k) != v for o in others)]
    differ += sorted({k for o in others for k in o if k not in fields})  # options only the others set
    parts = [f"{k}={fields[k]}" if k in fields else f"{k} default" for k in differ]
    return f"{task.name} ({', '.join(parts)})" if parts else task.name


def raise_for_missing(missing: Sequence[str], listed: bool = False) -> None:
    """A DataMissingError naming every missing data set (``listed``: they were just printed, with
    their files and how to obtain them), before any stage runs."""
    if missing and listed:
        raise DataMissingError(f"the data of {len(missing)} task(s) is missing (see 'data:' above)")
    if missing:
        raise DataMissingError(
            f"the data of {len(missing)} task(s) is missing, nothing was run: " + " | ".join(missing)
        )


def raise_for_outcome(out_dir: Path, outcome: dict[str, Outcome]) -> None:
    """A StageFailed naming every stage that did not finish, if any."""
    failed = [i for i, o in outcome.items() if o is Outcome.FAILED]
    held = [i for i, o in outcome.items() if o is Outcome.HELD]
    skipped = [i for i, o in outcome.items() if o is Outcome.SKIPPED]
    if not (failed or held or skipped):
        return
    parts = []
    if failed:
        parts.append(
            f"{len(failed)} stage(s) failed: " + ", ".join(f"{i} (see {RunDir(out_dir / i).failure})" for i in failed)
        )
    if held:
        parts.append(f"{len(held)} stage(s) are running in another process: {', '.join(held)}")
    if skipped:
        parts.append(f"{len(skipped)} stage(s) after them did not run")
    err = StageFailed(
        "; ".join(parts) + f"; `longrange compare --status {out_dir}` shows every stage, "
        "and running compare again does only the missing work"
    )
    err.stages = (*failed, *held, *skipped)
    raise err


def compare(
    experiments: Sequence[ExperimentConfig],
    out_dir: str | Path,
    *,
    seeds: Sequence[int] | None = None,
    objectives: Sequence[str] | None = None,
    compute_matched: bool | None = None,
    train_subsets: Sequence[float | int] | None = None,
    overwrite: bool = False,
    rerun_other_versions: bool = False,
    dry_run: bool = False,
    executor: Backend | None = None,
    match_params: bool = False,
    model_groups: Sequence[Sequence[int]] | None = None,
    size_note: str | None = None,
) -> list[dict[str, Any]]:
    """Run scratch and SPT for every experiment and seed; return the final-stage summaries
    (scratch, finetuned, compute-matched), in plan order.

    ``executor`` is the backend that runs the stages (``experiment/backends/``; default: one after
    another in this process). When it only submitted them (SLURM with ``wait`` off), nothing is
    returned. ``dry_run`` prints the plan and runs nothing. ``train_subsets`` (default: each
    experiment's ``compare.train_subsets``) sweeps the training set's size: every regime and seed
    once per subset (see ``experiment/plan.py``). A finished stage made by another longrange
    version is reused (and counted in a line); ``rerun_other_versions`` runs it again.

    Data that is missing and cannot be generated stops the comparison before any stage runs (for a
    scheduler whose nodes may see other files, SLURM, it is a warning); generated data is built here
    first. Each experiment's parameter count is printed first, with a warning when the experiments of one of
    ``model_groups`` (indices; default: all in one group; the cells of one sweep value, see
    ``experiment/cells.py``) differ by more than 10%; ``match_params`` first sets the width
    (``model.d_model``) of every experiment of a group after its first to the value whose count is
    closest to the first's (``experiment/params.py``). ``size_note``: why the compared sizes differ on
    purpose (the demo's), printed instead of the warning.
    """
    out_dir = check_out_dir(out_dir, "--out")
    experiments = list(experiments)
    groups = [list(g) for g in model_groups] if model_groups is not None else [list(range(len(experiments)))]
    data = data_lines(experiments)
    missing = data[1]
    matched = []
    if match_params and not missing:
        experiments, matched = match_widths(experiments, groups)
    plan = plan_grid(
        experiments, seeds=seeds, objectives=objectives, compute_matched=compute_matched, train_subsets=train_subsets
    )
    sizes = [] if missing else matched + size_lines(experiments, groups, size_note)
    return run_grid(
        plan,
        out_dir,
        executor=executor,
        overwrite=overwrite,
        rerun_other_versions=rerun_other_versions,
        dry_run=dry_run,
        notes=sizes,
        data=data,
    )


def run_grid(
    plan: Plan,
    out_dir: str | Path,
    *,
    executor: Backend | None = None,
    overwrite: bool = False,
    rerun_other_versions: bool = False,
    dry_run: bool = False,
    notes: Sequence[str] = (),
    data: tuple[list[str], list[str]] | None = None,
    saved_plan: Plan | None = None,
) -> list[dict[str, Any]]:
    """Run ``plan``'s stages into ``out_dir`` as :func:`compare` does (its data checked and generated
    first, finished stages reused only with the same settings, the rest run in dependency order on
    ``executor``); return the final stages' summaries in plan order. ``notes``: lines printed before
    the run (the model sizes); ``data``: :func:`data_lines` of the plan's experiments where the caller
    has them already; ``saved_plan``: the plan written to ``out_dir`` where ``plan`` is a part of it
    (a grid run in parts saves the whole). Studies that build their own plan (``longrange.studies``)
    run it here; a StageFailed's ``stages`` names what did not finish."""
    out_dir = check_out_dir(out_dir, "--out")
    data, missing = data if data is not None else data_lines(plan.experiments)
    if dry_run:
        statuses = stage_statuses(out_dir, plan) if out_dir.is_dir() else None
        print(describe(plan, statuses))
        print("data:\n" + "\n".join(f"  {line}" for line in data))
        if notes:
            print("\n".join(notes))
        raise_for_missing(missing, listed=True)
        return []
    if missing and getattr(executor, "submits_ahead", False):  # a scheduler's nodes may see other files
        print(
            "warning: " + " | ".join(missing) + "; the jobs fail unless their nodes see the data",
            file=sys.stderr,
            flush=True,
        )
    else:
        raise_for_missing(missing)
    if notes:
        print("\n".join(notes), file=sys.stderr, flush=True)
    for task in tasks_of(plan.experiments):  # generated data is built once, here, before any stage starts
        prepare_generated(task)
    out_dir.mkdir(parents=True, exist_ok=True)
    check_reuse(plan, out_dir, overwrite)
    (saved_plan or plan).save(out_dir)
    intent = Intent("continue", replace_stale=overwrite, rerun_other_versions=rerun_other_versions)
    outcome = run_plan(plan, out_dir, executor or InProcess(), intent=intent)
    if Outcome.SUBMITTED in outcome.values():  # a scheduler runs them (compare --launcher slurm --no-wait)
        return []
    line = other_versions_line([RunDir(out_dir / s.id).made_by() for s in plan.stages])
    if line:
        print(f"{line}; `compare --rerun-other-versions` runs them again", file=sys.stderr)
    raise_for_outcome(out_dir, outcome)
    summaries = plan.summaries(out_dir, [s.id for s in plan.stages if s.is_final])
    return [summaries[s.id] for s in plan.stages if s.is_final]
