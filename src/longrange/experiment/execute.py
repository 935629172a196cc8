"""The three steps of a stage: resolve, build, run.

    resolve_stage (stage.py; Plan.resolve for a stage of a comparison): the settings, checked, no data
    build_stage: the objective and a freshly initialised model (and its head) on the task's data
    run_stage: open the run directory (train/rundir: fresh, resume or reuse, under its lock), load
        the data, build, load pretrained weights (finetuning), train, write summary.json

The command line (``longrange train|pretrain|finetune``) resolves a stage from its experiment and
runs it; every backend of a comparison (in process, local workers, SLURM) resolves a stage from the
plan and runs it the same way, so that a stage's outcome depends only on its settings and seed::

    from longrange.experiment import resolve, resolve_stage, run_stage
    summary = run_stage(resolve_stage(resolve("demo/s4d"), "train", seed=0), "runs/s4d")
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrange.errors import DiskWriteError, Preempted
from longrange.experiment.record import finish_record, run_record, stage_summary
from longrange.experiment.stage import ResolvedStage
from longrange.experiment.taskdata import load_data
from longrange.experiment.weights import load_pretrained
from longrange.faults import kill_point
from longrange.fileio import check_out_dir, finite_or_none
from longrange.models.model import SequenceModel, parameter_report
from longrange.models.record import HeadRecord
from longrange.objectives.factory import make_objective, supervised_head
from longrange.train import distributed as D
from longrange.train.entry import train
from longrange.train.rundir import Decision, Intent, OpenRun, RunDir, RunMismatchError
from longrange.train.rundir.record import RunRecord

#: What stops a whole comparison rather than fail one stage (none is recorded as the stage's failure):
#: Ctrl-C, a preemption signal, a stage holding a run made with other settings.
STOPS_THE_GRID = (KeyboardInterrupt, Preempted, RunMismatchError)


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


def _train(
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


def run_stage(
    stage: ResolvedStage,
    run_dir: str | Path,
    intent: Intent = Intent("new"),
    *,
    plan_id: str | None = None,
) -> dict[str, Any]:
    """Run ``stage`` (:func:`~longrange.experiment.stage.resolve_stage`) in ``run_dir`` and write its
    ``summary.json``; returns the summary. The one way a stage runs: the command line
    (``longrange train|pretrain|finetune``) and every backend of a comparison call it.

    ``intent`` says what to do with what ``run_dir`` holds (:class:`~longrange.train.rundir.Intent`):
    ``new`` (the default) starts a run and is an error if the directory holds one; ``resume``
    continues it from its last checkpoint, only if it was made with the same settings (its
    fingerprint), and returns a finished run as it is, never rewritten; ``overwrite`` replaces it;
    ``continue`` reuses, resumes or starts, as a comparison does. A run made with other settings is
    an error naming each field as the experiment sets it for this stage (``pretrain.epochs``, not
    the resolved ``train.epochs``). The directory is locked while the stage runs: a directory
    another live process holds raises :class:`~longrange.train.rundir.RunLockedError`.

    ``plan_id``: the stage's id in a comparison's plan (resolved by
    :meth:`~longrange.experiment.plan.Plan.resolve`), whose run directory is ``OUT/<plan_id>``.
    Then the comparison's walk announces a reuse, not this, and this says whether the stage runs or
    resumes (a worker's ``stage.log`` holds every attempt); a failure is recorded in the run's ``failed.json`` (opening the directory again
    removes it), except what stops the whole comparison (:data:`STOPS_THE_GRID`); and in W&B the
    run is named by its id and grouped by the comparison's folder.

    Under ``torchrun`` every rank calls this: rank 0 takes the lock and decides, the other ranks
    follow its decision, and only rank 0 writes.
    """
    run = RunDir(check_out_dir(run_dir))
    group = run.root.resolve().parents[len(Path(plan_id).parts) - 1].name if plan_id else None
    with D.process_group():
        try:
            opened = run.open(stage.config(), intent)
        except RunMismatchError as err:
            raise RunMismatchError(stage.name_fields(str(err))) from None
        with opened:
            main = D.is_main_process()
            if opened.decision is Decision.REUSE:
                if main and plan_id is None:
                    print(f"{run.root} already finished; its summary is unchanged", file=sys.stderr)
                return run.read_summary()
            if main and plan_id is not None:  # in a worker's stage.log: which attempt this is
                doing = "resuming" if opened.decision is Decision.RESUME else "running"
                print(f"{doing} {run.root}", file=sys.stderr, flush=True)
            try:
                return _train(stage, opened, run_name=plan_id, run_group=group)
            except BaseException as err:
                if plan_id and main and not isinstance(err, (SystemExit, *STOPS_THE_GRID)):
                    run.record_exception(err, plan_id)
                raise
