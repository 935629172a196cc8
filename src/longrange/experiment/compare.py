"""The fair comparison: training from scratch versus self-pretraining (SPT) then finetuning.

For each experiment (a model on a task) and each seed::

    OUT/<task>/<label>/scratch/seed<k>/                   supervised from random initialisation
    OUT/<task>/<label>/<objective>-spt/seed<k>/pretrain/  SPT on the task's own training inputs
    OUT/<task>/<label>/<objective>-spt/seed<k>/finetune/  supervised from the pretrained weights
    OUT/<task>/<label>/scratch-matched/seed<k>/           from scratch for as many steps as the
                                                          longest pretraining + finetuning

A stage whose summary.json exists is reused; one with a last checkpoint is resumed, so an
interrupted comparison continues where it stopped when run again.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Sequence

from longrange.errors import ConfigError
from longrange.experiment.config import SPT_OBJECTIVES, ExperimentConfig
from longrange.experiment.runs import pretraining_model_config, read_summary, run_stage


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", text).strip("-") or "model"


def default_objectives(exp: ExperimentConfig) -> list[str]:
    """Causal SPT for causal models, masked SPT for bidirectional ones (the SPT paper's choice)."""
    if exp.compare.objectives:
        return list(exp.compare.objectives)
    return ["masked"] if exp.model.direction == "bidirectional" else ["causal"]


def _stage(run_dir: Path, log: list[str], **kwargs: Any) -> dict[str, Any]:
    done = read_summary(run_dir)
    if done is not None:
        log.append(f"reusing {run_dir}")
        return done
    resume = (run_dir / "checkpoints" / "last.pt").is_file()
    print(f"{'resuming' if resume else 'running'} {run_dir}", file=sys.stderr, flush=True)
    return run_stage(run_dir=run_dir, resume=resume, overwrite=not resume, **kwargs)


def compare(
    experiments: Sequence[ExperimentConfig],
    out_dir: str | Path,
    *,
    seeds: Sequence[int] | None = None,
    objectives: Sequence[str] | None = None,
    compute_matched: bool | None = None,
) -> list[dict[str, Any]]:
    """Run scratch and SPT for every experiment and seed; return all final-stage summaries."""
    out_dir = Path(out_dir)
    summaries: list[dict[str, Any]] = []
    log: list[str] = []
    # Resolve every experiment's plan first, so configuration errors surface before any training.
    plans = []
    for exp in experiments:
        objs = list(objectives) if objectives else default_objectives(exp)
        unknown = [o for o in objs if o not in SPT_OBJECTIVES]
        if unknown:
            raise ConfigError(f"unknown SPT objective(s) {unknown}; expected {', '.join(SPT_OBJECTIVES)}")
        if "causal" in objs:
            pretraining_model_config(exp.stage_model("pretrain"), "causal")
        plans.append((exp, objs, list(seeds) if seeds else list(exp.compare.seeds),
                      exp.compare.compute_matched if compute_matched is None else compute_matched))
    for exp, objs, exp_seeds, matched in plans:
        base = out_dir / slug(exp.task.name) / slug(exp.label)
        for seed in exp_seeds:
            scratch = _stage(base / "scratch" / f"seed{seed}", log, exp=exp, stage="train", seed=seed, regime="scratch")
            summaries.append(scratch)
            spt_steps = 0
            for obj in objs:
                root = base / f"{obj}-spt" / f"seed{seed}"
                pre = _stage(root / "pretrain", log, exp=exp, stage="pretrain", seed=seed, objective=obj)
                fine = _stage(root / "finetune", log, exp=exp, stage="finetune", seed=seed,
                              init_from=root / "pretrain", regime=f"{obj}-spt")
                summaries.append(fine)
                spt_steps = max(spt_steps, pre["steps"] + fine["steps"])
            if matched and objs:
                run = base / "scratch-matched" / f"seed{seed}"
                summaries.append(_stage(run, log, exp=exp, stage="train", seed=seed, regime="scratch-matched",
                                        train_changes={"max_steps": spt_steps}))
    for line in log:
        print(line, file=sys.stderr)
    return summaries
