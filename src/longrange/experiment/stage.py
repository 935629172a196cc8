"""A stage resolved: its task, model, training settings and identity, decided before any data is loaded.

A stage is one of

* ``train``: supervised from scratch;
* ``pretrain``: self-pretraining (SPT) with objective causal or masked;
* ``finetune``: supervised from a pretrained run (``init_from``; with ``reverse_from``, F1R1).

:func:`resolve_stage` checks a stage's settings and returns a :class:`ResolvedStage`, whose
:meth:`~ResolvedStage.config` is what its run directory's ``config.yaml`` holds (without the
``head``, which comes from the data, and the ``record``, written by the run) and whose identity is
the stage's fingerprint (``train/rundir/decide.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrange import smoke
from longrange.errors import ConfigError, DataMissingError
from longrange.experiment.config import OBJECTIVES, ExperimentConfig, TaskConfig
from longrange.experiment.taskdata import data_identity
from longrange.identity import declare_defaults, fingerprint
from longrange.models.config import ModelConfig
from longrange.train.config import TrainConfig
from longrange.train.rundir import RunDir

STAGES = ("train", "pretrain", "finetune")
declare_defaults("init", lambda: {"from": None, "reverse_from": None})


@dataclass
class ResolvedStage:
    """Everything a stage is, decided before any data is loaded (:func:`resolve_stage`)."""

    exp: ExperimentConfig
    stage: str  # train, pretrain or finetune
    seed: int
    objective: str  # supervised, causal or masked
    reverse: bool
    regime: str
    task: TaskConfig
    model: ModelConfig
    train: TrainConfig
    init_from: Path | None = None
    reverse_from: Path | None = None

    def config(self) -> dict[str, Any]:
        """The stage's resolved configuration as saved in config.yaml (without ``head`` and ``record``;
        the longrange version is in the record, not in the identity)."""
        t = self.task
        return {
            "label": self.exp.label,
            "regime": self.regime,
            "stage": self.stage,
            "seed": self.seed,
            "task": {
                "name": t.name,
                "options": t.options,
                "data_dir": t.data_dir,
                "train_subset": t.train_subset,
                "skip_bad": t.skip_bad,
                "seed": t.seed,
                "generate": t.generate,
            },
            "data": data_identity(t),
            "model": self.model.to_dict(),
            "objective": {"kind": self.objective, "reverse": self.reverse, **vars(self.exp.objective)},
            "init": {"from": _run_fingerprint(self.init_from), "reverse_from": _run_fingerprint(self.reverse_from)},
            "train": self.train.to_dict(),
        }

    def fingerprint(self) -> str:
        return fingerprint(self.config())

    def name_fields(self, text: str) -> str:
        """``text`` (differences of :func:`~longrange.identity.differences`) with each field named as
        the experiment sets it for this stage: a pretraining stage's ``train.epochs`` is
        ``pretrain.epochs`` where the ``pretrain`` section sets it, its ``model.dropout`` is
        ``pretrain_model.dropout`` where ``pretrain_model`` does, and likewise ``finetune.*`` and
        ``pretrain_task.*``; fields the stage takes from ``train``, ``model`` or ``task`` keep their names."""
        sections = {"train": {"pretrain": self.exp.pretrain, "finetune": self.exp.finetune}.get(self.stage) or {}}
        if self.stage == "pretrain":
            sections["model"] = self.exp.pretrain_model
            sections["task"] = self.exp.pretrain_task
        names = {"train": self.stage, "model": "pretrain_model", "task": "pretrain_task"}

        def rename(match: re.Match) -> str:
            section, name = match.group(1), match.group(2)
            return f"{names[section]}.{name}" if name in (sections.get(section) or {}) else match.group(0)

        return re.sub(r"(?<![\w.])(train|model|task)\.(\w+)(?=[.:])", rename, text)


def _run_fingerprint(run_dir: Path | None) -> str | None:
    if run_dir is None:
        return None
    try:
        config = RunDir(run_dir).read_config(required=True)
    except DataMissingError:
        config = None
    if config is None or "fingerprint" not in config:
        raise DataMissingError(f"{run_dir} is not a finished longrange run (no fingerprint in its config)")
    return str(config["fingerprint"])


def pretraining_model_config(cfg: ModelConfig, objective: str) -> ModelConfig:
    """Next-token pretraining needs a causal backbone. A bidirectional Mamba model is pretrained
    causally and morphed (F1) when finetuned; other bidirectional models cannot be."""
    if objective != "causal" or cfg.direction != "bidirectional":
        return cfg
    if cfg.block == "mamba" and not cfg.layers:
        return cfg.replace(direction="causal")
    raise ConfigError(
        f"causal pretraining of a bidirectional {cfg.name} model would leave its reverse "
        "parameters untrained; use objective masked, or model.direction=causal (only Mamba blocks can be "
        "morphed from causal to bidirectional, by F1)"
    )


def check_direction(task: TaskConfig, model: ModelConfig) -> None:
    """A ConfigError when the task's answers are next-token predictions (``TaskSpec.causal``) and
    the model sees the whole sequence."""
    from longrange.data.tasks import get_spec

    if model.bidirectional and get_spec(task.name, **task.options).causal:
        raise ConfigError(
            f"task {task.name}'s answers are next-token predictions from what precedes them; a bidirectional "
            "model also reads what follows: set model.direction=causal"
        )


def _stage_seed(exp: ExperimentConfig, stage: str, seed: int | None) -> int:
    """The seed a stage runs with: ``seed`` if given, else the experiment's for the stage, else 0;
    a ConfigError when both are given and differ."""
    section = {"pretrain": exp.pretrain, "finetune": exp.finetune}.get(stage) or {}
    where, written = (stage, section["seed"]) if "seed" in section else ("train", exp.train.get("seed"))
    if written is None:
        return 0 if seed is None else seed
    if seed is not None and seed != written:
        raise ConfigError(
            f"{where}.seed is {written} in the experiment, but the stage was asked to run with seed {seed} "
            "(--seed, or a comparison's compare.seeds): give the seed in one place"
        )
    return int(written)


def resolve_stage(
    exp: ExperimentConfig,
    stage: str,
    *,
    seed: int | None = None,
    regime: str | None = None,
    objective: str | None = None,
    reverse: bool = False,
    init_from: str | Path | None = None,
    reverse_from: str | Path | None = None,
    max_steps: int | None = None,
) -> ResolvedStage:
    """Check a stage's settings and resolve its task, model and training configs (no data loaded).

    ``objective`` defaults to causal for pretraining and supervised otherwise; ``regime`` to the
    stage's (scratch, <objective>-spt, or for finetuning the pretraining's, f1-spt / f1r1-spt when
    morphed); ``max_steps`` fixes the length of training (the compute-matched baseline).

    ``seed`` (``--seed``, a comparison's seed) defaults to the stage's ``seed`` in the experiment
    (``train.seed``, or the stage's own section's), else 0; given as well, it must agree with it, so
    that a seed written in an experiment is never silently replaced.
    """
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r}; expected {', '.join(STAGES)}")
    if stage == "finetune" and init_from is None:
        raise ConfigError("finetuning needs a pretrained run (--from RUN_DIR)")
    if stage != "finetune" and (init_from is not None or reverse_from is not None):
        raise ConfigError(f"stage {stage} starts from scratch; use finetune to start from a pretrained run")
    kind = objective or ("causal" if stage == "pretrain" else "supervised")
    if kind not in OBJECTIVES:
        raise ConfigError(f"unknown objective {kind!r}; expected {', '.join(OBJECTIVES)}")
    if stage == "pretrain" and kind == "supervised":
        raise ConfigError("pretraining uses objective causal or masked")
    if stage != "pretrain" and kind != "supervised":
        raise ConfigError(f"stage {stage} trains on the task's labels; objective {kind!r} is for pretraining")
    if reverse and kind != "causal":
        raise ConfigError("reverse sequences are an option of causal pretraining (for F1R1)")
    seed = _stage_seed(exp, stage, seed)
    model_cfg = exp.stage_model(stage)
    if stage == "pretrain":
        model_cfg = pretraining_model_config(model_cfg, kind)
    else:
        check_direction(exp.stage_task(stage), model_cfg)
    changes: dict[str, Any] = {"seed": seed}
    if max_steps is not None:
        changes["max_steps"] = max_steps
    if stage == "pretrain" and model_cfg.pooling == "cls":
        changes["find_unused_parameters"] = True  # the CLS vector is not used by a token head
    init_from = Path(init_from) if init_from is not None else None
    reverse_from = Path(reverse_from) if reverse_from is not None else None
    for source in (init_from, reverse_from):  # finetuning starts only from a finished pretraining run
        if source is not None:
            RunDir(source).require_finished(
                "the pretraining run",
                f"finish it with `longrange pretrain ... --resume --out {source}` "
                "(with the settings it was started with), then finetune from it",
            )
    if regime is None:
        regime = _regime(stage, kind, model_cfg, init_from, reverse_from)
    train = exp.train_config(stage, **changes)
    shrink = smoke.train_changes(vars(train))  # LONGRANGE_SMOKE=1: a few small steps
    if max_steps is not None:  # the compute-matched length stays that of the (shrunk) SPT chain
        shrink.pop("max_steps", None)
    if shrink:
        train = exp.train_config(stage, **changes, **shrink)
    return ResolvedStage(
        exp=exp,
        stage=stage,
        seed=seed,
        objective=kind,
        reverse=reverse,
        regime=regime,
        task=exp.stage_task(stage),
        model=model_cfg,
        train=train,
        init_from=init_from,
        reverse_from=reverse_from,
    )


def _regime(stage: str, kind: str, model: ModelConfig, init_from: Path | None, reverse_from: Path | None) -> str:
    if stage != "finetune":
        return "scratch" if stage == "train" else f"{kind}-spt"
    source = RunDir(init_from).read_config(required=True)
    if reverse_from is not None:
        return "f1r1-spt"
    if source.get("model", {}).get("direction") == "causal" and model.direction == "bidirectional":
        return "f1-spt"
    return f"{source['objective']['kind']}-spt"
