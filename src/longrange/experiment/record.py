"""What a stage's run directory records beside its settings (``config.yaml``'s ``record``), and its
``summary.json``: the result, how long it took, and what it was made from.

The record is written twice: when training starts (:func:`run_record`: data, versions, host,
transfer) and when it ends (:func:`finish_record`: with the device, precision, deterministic mode
and the kernels that actually ran, known only after training; see ``train/environment.py``)."""

from __future__ import annotations

import os
import platform
import socket
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from longrange.experiment.stage import ResolvedStage
from longrange.experiment.taskdata import data_identity
from longrange.train.environment import library_versions, merge_kernels
from longrange.train.rundir import RunDir
from longrange.train.rundir.record import RAN, RunRecord
from longrange.train.rundir.summary import ParamCounts, RunSummary

if TYPE_CHECKING:
    from longrange.train.loop import FitResult


def run_record(stage: ResolvedStage, data: Any, transfer: dict[str, Any] | None) -> RunRecord:
    """Where the data came from, what was skipped, software versions, what was transferred, the
    vocabulary of token tasks. Not part of the fingerprint."""
    import torch

    from longrange import __version__

    skipped = {str(k): int(v) for k, v in (getattr(data, "skipped", None) or {}).items()}
    return RunRecord(
        data_dir=data_identity(stage.task)["dir"],
        skip_bad=stage.task.skip_bad,
        skipped=skipped,
        train_size=len(data.train),
        versions={
            "longrange": __version__,
            "torch": str(torch.__version__),
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
            **library_versions(),
        },
        host=socket.gethostname(),
        init={
            "from": str(stage.init_from) if stage.init_from else None,
            "reverse_from": str(stage.reverse_from) if stage.reverse_from else None,
        },
        transfer=transfer,
        vocabulary=data.vocab.to_dict() if getattr(data, "vocab", None) is not None else None,
    )


def _source(run_dir: Path | None, relative_to: Path) -> dict[str, Any] | None:
    """A finetuning run's pretraining run: where it is, its fingerprint and its steps."""
    if run_dir is None:
        return None
    run = RunDir(run_dir)
    summary, config = run.read_summary() or {}, run.read_config() or {}
    return {
        "run": os.path.relpath(run_dir, relative_to),
        "fingerprint": config.get("fingerprint"),
        "steps": summary.get("steps"),
    }


def finish_record(record: RunRecord, result: FitResult, earlier: RunRecord | None = None) -> RunRecord:
    """``record`` with how the run ran (:data:`RAN`, from fit's ``result``); a resumed run's kernels
    also include those of ``earlier``, the record saved by an earlier segment that finished training."""
    ran = {k: result[k] for k in RAN if k in result}
    ran["kernels"] = merge_kernels(earlier.kernels if earlier is not None else None, result.get("kernels"))
    return replace(record, **ran)


def stage_summary(
    stage: ResolvedStage,
    objective: Any,
    params: dict[str, int],
    result: FitResult,
    record: RunRecord,
    run_dir: Path,
) -> RunSummary:
    """The stage's ``summary.json`` (:class:`~longrange.train.rundir.summary.RunSummary`)."""
    return RunSummary(
        task=stage.exp.task.name,
        label=stage.exp.label,
        regime=stage.regime,
        stage=stage.stage,
        seed=stage.seed,
        metric=result["metric"],
        higher_is_better=objective.higher_is_better,
        best_val=result["best"]["metrics"],
        test=result["test"],
        steps=result["step"],
        epochs=result["epochs"],
        stopped_early=result["stopped_early"],
        params=ParamCounts(**params),
        pretrain_run=os.path.relpath(stage.init_from, run_dir) if stage.init_from else None,
        pretrain=_source(stage.init_from, run_dir),
        pretrain_reverse=_source(stage.reverse_from, run_dir),
        train_subset=stage.task.train_subset,
        train_size=record.train_size,
        seconds=result["seconds"],
        cpu_seconds=result.get("cpu_seconds"),
        fingerprint=stage.fingerprint(),
        data_dir=record.data_dir,
        skip_bad=record.skip_bad,
        skipped=record.skipped,
        versions=record.versions,
        **{k: getattr(record, k) for k in RAN},
    )
