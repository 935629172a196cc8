"""Running a stage: in its run directory, from its resolved settings to its ``summary.json``.

    resolve (stage.py) -> open the run directory (train/rundir/decide.py: fresh, resume or reuse)
        -> load the data, build the model and objective -> load pretrained weights (finetuning)
        -> the training loop -> summary.json

:func:`run_stage` is one stage of the command line (``longrange train|pretrain|finetune``), with its
``--resume`` and ``--overwrite``; :func:`execute_stage` is one stage of a comparison's plan, which
every backend (in process, local workers, SLURM) runs the same way, so that a stage's outcome
depends only on its settings and seed. Both go through :func:`train_stage`.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrange.errors import DiskWriteError, LongrangeError, Preempted
from longrange.experiment.config import ExperimentConfig
from longrange.experiment.plan import Plan
from longrange.experiment.record import finish_record, run_record, stage_summary
from longrange.experiment.stage import ResolvedStage, resolve_stage
from longrange.experiment.taskdata import load_data
from longrange.experiment.weights import load_pretrained
from longrange.faults import kill_point
from longrange.fileio import check_out_dir, finite_or_none
from longrange.models.model import SequenceModel, parameter_report
from longrange.models.record import HeadRecord
from longrange.objectives.factory import make_objective, supervised_head
from longrange.train import distributed as D
from longrange.train.entry import train
from longrange.train.rundir import Decision, Intent, OpenRun, RunDir, RunLockedError, RunMismatchError
from longrange.train.rundir.record import RunRecord

#: A comparison's default intent: reuse finished stages, resume interrupted ones, start the others.
CONTINUE = Intent("continue")
#: What stops a whole comparison rather than fail one stage (none is recorded as the stage's failure):
#: Ctrl-C, a preemption signal, a stage holding a run made with other settings.
STOPS_THE_GRID = (KeyboardInterrupt, Preempted, RunMismatchError)


class StageFailed(LongrangeError):
    """Stages of a comparison failed or could not run; the message names them."""


class StageNotReady(StageFailed):
    """A stage that this one needs is not finished."""


@dataclass
class BuiltStage:
    """The model, objective and head of a stage, built on its data."""

    model: SequenceModel
    objective: Any
    head: HeadRecord


def build_stage(stage: ResolvedStage, data: Any) -> BuiltStage:
    """The stage's objective and a freshly initialised model (seeded by the stage's seed)."""
    import torch

    spec = data.spec
    objective, token_head = make_objective(stage.objective, data, stage.exp.objective, reverse=stage.reverse)
    head_kind, n_out = supervised_head(spec) if token_head is None else ("tokens", token_head)
    head = HeadRecord(
        kind=head_kind,
        n_out=n_out,
        input_kind=spec.input_kind,
        vocab_size=data.vocab_size,
        d_input=spec.d_input,
        mask_channel=stage.objective == "masked" and spec.input_kind == "numeric",
        # block hf: the task's tokens, mapped to a pretrained LM's
        vocab=tuple(data.vocab.tokens) if stage.model.block == "hf" and data.vocab is not None else None,
    )
    torch.manual_seed(stage.seed)
    model = head.build(stage.model.to_dict())
    if hasattr(model, "rebuild_info"):  # rebuilds the LM without its snapshot
        head = dataclasses.replace(head, hf_resolved=model.rebuild_info())
    return BuiltStage(model, objective, head)


def train_stage(
    stage: ResolvedStage, run: OpenRun, *, run_name: str | None = None, run_group: str | None = None
) -> dict[str, Any]:
    """Train ``stage`` in its opened run directory (fresh or resumed, as decided) and write its
    ``summary.json``; returns the summary. ``run_name`` and ``run_group`` name the run in W&B."""
    earlier = RunRecord.from_json((run.dir.read_config() or {}).get("record"), run.dir.config) if run.resumes else None
    data = load_data(stage.task)
    built = build_stage(stage, data)
    transfer = load_pretrained(built.model, stage.init_from, stage.reverse_from) if stage.stage == "finetune" else None
    record = run_record(stage, data, transfer)
    if run.took_over is not None:  # a stale lock of a process that died was taken over
        record = dataclasses.replace(record, lock_taken_over=run.took_over)
    config = {k: v for k, v in stage.config().items() if k != "train"}
    result = train(
        built.model,
        built.objective,
        data,
        stage.train,
        run,
        extra_config={**config, "head": built.head.to_json(), "record": record.to_json()},
        evaluate_test=stage.stage != "pretrain" and stage.train.test_split,
        run_name=run_name,
        run_group=run_group,
    )
    record = finish_record(record, result, earlier)
    if D.is_main_process():  # the record is not part of the fingerprint: config.yaml is rewritten with it
        run.dir.write_config({**(run.dir.read_config() or {}), "record": record.to_json()})
        kill_point("after-record")
    params = {
        k: v
        for k, v in parameter_report(built.model, seq_len=data.spec.seq_len).items()
        if k in ("total", "in_primitives", "state")
    }
    summary = finite_or_none(stage_summary(stage, built.objective, params, result, record, run.dir.root).to_json())
    if D.is_main_process():
        try:
            run.dir.write_summary(summary)
            kill_point("after-summary")
        except DiskWriteError as err:
            raise err.adding(
                f"training finished at step {result['step']}, its last checkpoint {run.dir.last} holds "
                "it: run again with --resume to write the summary"
            ) from None
    return summary


def open_run(run: RunDir, stage: ResolvedStage, intent: Intent) -> OpenRun:
    """``run.open`` for ``stage``; a run made with other settings is an error naming each field as the
    experiment sets it for this stage (``pretrain.epochs``, not the resolved ``train.epochs``)."""
    try:
        return run.open(stage.config(), intent)
    except RunMismatchError as err:
        raise RunMismatchError(stage.name_fields(str(err))) from None


def run_stage(
    exp: ExperimentConfig,
    stage: str,
    run_dir: str | Path,
    *,
    seed: int = 0,
    objective: str | None = None,
    reverse: bool = False,
    init_from: str | Path | None = None,
    reverse_from: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    continue_: bool = False,
) -> dict[str, Any]:
    """Run one stage in ``run_dir`` and write its ``summary.json``; returns the summary.

    stage "train": supervised from scratch; "pretrain": SPT with ``objective`` causal or masked;
    "finetune": supervised from the pretrained run ``init_from`` (and, for F1R1, the reverse-
    pretrained run ``reverse_from``).

    ``resume`` continues the run in ``run_dir`` from its last checkpoint, only if it was made with
    the same settings (its fingerprint); a finished run is returned as it is, never rewritten.
    ``overwrite`` replaces whatever ``run_dir`` holds; ``continue_`` resumes the run if there is one
    made with the same settings (returning it if finished) and starts it otherwise, as a comparison
    does (for scripts that may be requeued); without any, a directory that holds a run is an error.
    The run directory is locked while the stage runs.
    """
    intent = Intent.from_flags(resume, overwrite, continue_)
    resolved = resolve_stage(
        exp, stage, seed=seed, objective=objective, reverse=reverse, init_from=init_from, reverse_from=reverse_from
    )
    with D.process_group():
        with open_run(RunDir(check_out_dir(run_dir)), resolved, intent) as run:
            if run.decision is Decision.REUSE:
                print(f"{run.dir.root} already finished; its summary is unchanged", file=sys.stderr)
                return run.dir.read_summary()
            return train_stage(resolved, run)


def execute_stage(
    plan: Plan, stage_id: str, out_dir: str | Path, *, intent: Intent = CONTINUE
) -> dict[str, Any] | None:
    """Run, resume or reuse one stage of ``plan`` under its lock; returns its summary.

    Returns None when another live process holds the stage (it is running there). A stage whose
    finished run was made with other settings is an error, unless ``intent.replace_stale``
    (``compare --overwrite``) starts it afresh; ``intent.rerun_other_versions`` starts afresh a
    stage finished by another longrange version. When the
    stage fails, the failure is recorded in its ``failed.json`` and the error raised (opening the run
    directory removes an earlier attempt's).

    Under ``torchrun`` every rank calls this: rank 0 takes the lock and decides, the other ranks
    follow its decision, and only rank 0 writes.
    """
    out_dir = Path(out_dir)
    stage = plan.by_id[stage_id]
    run = RunDir(out_dir / stage.id)
    deps = plan.summaries(out_dir, stage.after)
    missing = [a for a in stage.after if a not in deps]
    if missing:
        raise StageNotReady(f"stage {stage.id} needs {', '.join(missing)} finished first")
    resolved = plan.resolve(stage, out_dir, deps)
    with D.process_group():
        try:
            opened = open_run(run, resolved, intent)
        except RunLockedError:
            return None
        with opened:
            if opened.decision is Decision.REUSE:
                return run.read_summary()
            main = D.is_main_process()
            if main:
                print(
                    f"{'resuming' if opened.decision is Decision.RESUME else 'running'} {run.root}",
                    file=sys.stderr,
                    flush=True,
                )
            try:
                summary = train_stage(resolved, opened, run_name=stage.id, run_group=out_dir.resolve().name)
            except BaseException as err:
                if main and not isinstance(err, (SystemExit, *STOPS_THE_GRID)):
                    run.record_exception(err, stage.id)
                raise
            return summary
