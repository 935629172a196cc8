"""The comparison as a plan: every stage of the grid, its run directory and its dependencies.

For each experiment (a model on a task) and each seed::

    <task>/<label>/scratch/seed<k>                    train         supervised from random initialisation
    <task>/<label>/<objective>-spt/seed<k>/pretrain   pretrain      SPT on the task's own training inputs
    <task>/<label>/<objective>-spt/seed<k>/finetune   finetune      after its pretrain
    <task>/<label>/scratch-matched/seed<k>            train         as many steps as the longest
                                                                    pretrain + finetune: after them

With a data-fraction sweep (``compare.train_subsets`` or ``--train-subsets``) every id gains a
level after the label, ``subset<value>`` (``listops/S4/subset0.1/scratch/seed0``), and every
stage under it, pretraining included, trains on that ``task.train_subset`` (the same examples:
the subset is drawn with the task's data seed, see ``data.tasks.subset_indices``).

With ``compare.pretrain_data: all`` (labels scarce, inputs plentiful) pretraining reads the inputs of
the whole training split instead: one pretraining stage per seed and objective,
``<task>/<label>/<objective>-spt-all/seed<k>/pretrain``, which the finetuning stages of every subset
start from (``.../subset<value>/<objective>-spt-all/seed<k>/finetune``); their regime is
``<objective>-spt-all``.

A stage's id is its run directory relative to the comparison's output directory. The plan is
plain data (``to_dict``/``from_dict``), saved as ``OUT/plan.json`` so that any executor (in
process, local workers, a cluster scheduler) runs the same stages with the same settings.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from longrange import smoke
from longrange.errors import ConfigError, LongrangeError
from longrange.experiment.config import SPT_OBJECTIVES, ExperimentConfig, check_train_subsets, experiment_from_dict
from longrange.experiment.stage import ResolvedStage, pretraining_model_config, resolve_stage
from longrange.fileio import atomic_write
from longrange.objectives.factory import natural_objective
from longrange.train.rundir import RunDir, RunState

PLAN_FILE = "plan.json"


class StageFailed(LongrangeError):
    """Stages of a comparison failed or could not run; the message names them, and ``stages`` holds
    their ids where the whole grid's outcome raised it (``compare.raise_for_outcome``)."""

    stages: tuple[str, ...] = ()


class StageNotReady(StageFailed):
    """A stage that this one needs is not finished."""


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", text).strip("-") or "model"


def default_objectives(exp: ExperimentConfig) -> list[str]:
    """Causal SPT for causal models, masked SPT for bidirectional ones (the SPT paper's choice)."""
    if exp.compare.objectives:
        return list(exp.compare.objectives)
    return [natural_objective(exp.model.direction)]


@dataclass
class Stage:
    """One run of the grid."""

    id: str  # the run directory relative to the output directory
    experiment: int  # index into Plan.experiments
    stage: str  # train, pretrain or finetune
    seed: int
    regime: str  # scratch, <objective>-spt, scratch-matched
    objective: str | None = None  # the SPT objective of a pretrain stage
    init_from: str | None = None  # the id of the pretrain stage a finetune starts from
    #: Ids of the stages this one needs finished first.
    after: list[str] = field(default_factory=list)
    #: scratch-matched: pairs of (pretrain id, finetune id) whose summed steps set max_steps.
    matched_to: list[list[str]] = field(default_factory=list)
    #: The ``task.train_subset`` of a data-fraction sweep (None: no sweep, the task's own).
    train_subset: float | int | None = None
    #: A pretraining stage on the whole training split (``compare.pretrain_data: all``).
    whole_train: bool = False

    @property
    def is_final(self) -> bool:
        """Whether the stage's result is a row of the comparison (pretrain stages are not)."""
        return self.stage != "pretrain"


@dataclass
class Plan:
    experiments: list[ExperimentConfig]
    stages: list[Stage]

    def __post_init__(self) -> None:
        self.by_id = {s.id: s for s in self.stages}
        if len(self.by_id) != len(self.stages):
            seen: set[str] = set()
            dup = next(s.id for s in self.stages if s.id in seen or seen.add(s.id))
            raise ConfigError(
                f"two stages of the comparison share the run directory {dup}: give the experiments distinct labels"
            )

    def levels(self) -> list[list[Stage]]:
        """The stages grouped by dependency depth: each level needs only earlier levels."""
        depth: dict[str, int] = {}
        for s in self.stages:  # stages are listed after their dependencies
            depth[s.id] = 1 + max((depth[a] for a in s.after), default=-1)
        out: list[list[Stage]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
        for s in self.stages:
            out[depth[s.id]].append(s)
        return out

    def dependents(self, stage_id: str) -> list[Stage]:
        """Every stage that needs ``stage_id``, directly or not."""
        out, frontier = [], {stage_id}
        for s in self.stages:
            if frontier.intersection(s.after):
                out.append(s)
                frontier.add(s.id)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"experiments": [e.to_dict() for e in self.experiments], "stages": [asdict(s) for s in self.stages]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        return cls([experiment_from_dict(e) for e in data["experiments"]], [Stage(**s) for s in data["stages"]])

    def summaries(self, out_dir: str | Path, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The summaries of the finished stages among ``ids`` (:meth:`RunDir.state`)."""
        out = {}
        for i in ids:
            state = RunDir(Path(out_dir) / i).state()
            if state.kind is RunState.FINISHED:
                out[i] = state.summary
        return out

    def resolve(
        self, stage: Stage, out_dir: str | Path, summaries: Mapping[str, Mapping[str, Any]] | None = None
    ) -> ResolvedStage:
        """The resolved settings of ``stage``, whose run directory is ``out_dir / stage.id``; a
        :class:`StageNotReady` error when a stage it needs is not finished (a compute-matched stage's
        steps and a finetuning's starting point come from them). ``summaries``: those stages'
        summaries by id (default: read from their run directories in ``out_dir``)."""
        if summaries is None:
            summaries = self.summaries(out_dir, stage.after)
        missing = [a for a in stage.after if a not in summaries]
        if missing:
            raise StageNotReady(f"stage {stage.id} needs {', '.join(missing)} finished first")
        exp = with_subset(self.experiments[stage.experiment], stage.train_subset)
        if stage.whole_train:
            exp = dataclasses.replace(exp, task=dataclasses.replace(exp.task, train_subset=None))
        return resolve_stage(
            exp,
            stage.stage,
            seed=stage.seed,
            regime=stage.regime,
            objective=stage.objective,
            init_from=Path(out_dir) / stage.init_from if stage.init_from else None,
            max_steps=matched_steps(stage, summaries) if stage.matched_to else None,
        )

    def save(self, out_dir: str | Path) -> Path:
        text = json.dumps(self.to_dict(), indent=1).encode()
        return atomic_write(Path(out_dir) / PLAN_FILE, text)

    @classmethod
    def load(cls, out_dir: str | Path) -> Plan:
        path = Path(out_dir) / PLAN_FILE
        if not path.is_file():
            raise ConfigError(f"{out_dir} holds no comparison ({PLAN_FILE} is missing)")
        return cls.from_dict(json.loads(path.read_text()))


def subset_name(subset: float | int) -> str:
    """The id level of a sweep's subset: ``subset0.1`` (a fraction), ``subset500`` (a count)."""
    return f"subset{subset!r}" if isinstance(subset, float) else f"subset{int(subset)}"


def with_subset(exp: ExperimentConfig, subset: float | int | None) -> ExperimentConfig:
    """``exp`` training (and pretraining) on ``subset`` of its training set; ``exp`` itself for None."""
    if subset is None:
        return exp
    return dataclasses.replace(exp, task=dataclasses.replace(exp.task, train_subset=subset))


def sweep_subsets(exp: ExperimentConfig, train_subsets: Sequence[float | int] | None) -> list[float | int | None]:
    """The subsets of ``exp``'s sweep ([None] without one), checked; pretraining must be able to
    follow them (its ``pretrain_task`` may not set its own train_subset or data seed)."""
    where = "--train-subsets" if train_subsets else "compare.train_subsets"
    subsets = check_train_subsets(list(train_subsets) if train_subsets else exp.compare.train_subsets, where)
    if not subsets:
        return [None]
    fixed = [
        k
        for k in ("train_subset", "seed")
        if k in exp.pretrain_task and (k == "train_subset" or exp.pretrain_task[k] != exp.task.seed)
    ]
    if fixed:
        raise ConfigError(
            f"{exp.label}: pretrain_task.{fixed[0]} is set, so pretraining would not use the examples of each "
            f"subset of {where}; remove pretrain_task.{fixed[0]} or the sweep"
        )
    return list(subsets)


def plan_grid(
    experiments: Sequence[ExperimentConfig],
    *,
    seeds: Sequence[int] | None = None,
    objectives: Sequence[str] | None = None,
    compute_matched: bool | None = None,
    train_subsets: Sequence[float | int] | None = None,
) -> Plan:
    """Expand experiments x train subsets x seeds x regimes into stages with their dependencies.

    ``train_subsets`` (default: each experiment's ``compare.train_subsets``) makes a data-fraction
    sweep: each subset is a level of the stage ids and the ``task.train_subset`` of its stages.

    Every configuration error (an unknown objective, causal pretraining of a model that cannot be
    morphed) surfaces here, before any training.
    """
    stages: list[Stage] = []
    for index, exp in enumerate(experiments):
        objs = list(objectives) if objectives else default_objectives(exp)
        unknown = [o for o in objs if o not in SPT_OBJECTIVES]
        if unknown:
            raise ConfigError(f"unknown SPT objective(s) {unknown}; expected {', '.join(SPT_OBJECTIVES)}")
        if "causal" in objs:
            pretraining_model_config(exp.stage_model("pretrain"), "causal")
        matched = exp.compare.compute_matched if compute_matched is None else compute_matched
        seed_list = smoke.seeds(list(seeds) if seeds else list(exp.compare.seeds))  # LONGRANGE_SMOKE=1: fewer
        shared: dict[tuple[int, str], Stage] = {}  # pretrain_data all: (seed, objective) -> its one pretraining
        if exp.compare.pretrain_data == "all":
            for seed in seed_list:
                for obj in objs:
                    pre = Stage(
                        f"{slug(exp.task.name)}/{slug(exp.label)}/{obj}-spt-all/seed{seed}/pretrain",
                        index,
                        "pretrain",
                        seed,
                        f"{obj}-spt-all",
                        objective=obj,
                        whole_train=True,
                    )
                    shared[seed, obj] = pre
                    stages.append(pre)
        for subset in sweep_subsets(exp, train_subsets):
            base = f"{slug(exp.task.name)}/{slug(exp.label)}" + ("" if subset is None else f"/{subset_name(subset)}")
            sub = {"train_subset": subset}
            for seed in seed_list:
                stages.append(Stage(f"{base}/scratch/seed{seed}", index, "train", seed, "scratch", **sub))
                pairs = []
                for obj in objs:
                    if (seed, obj) in shared:
                        pre = shared[seed, obj]
                        fine = Stage(
                            f"{base}/{obj}-spt-all/seed{seed}/finetune",
                            index,
                            "finetune",
                            seed,
                            f"{obj}-spt-all",
                            init_from=pre.id,
                            after=[pre.id],
                            **sub,
                        )
                        stages.append(fine)
                    else:
                        root = f"{base}/{obj}-spt/seed{seed}"
                        pre = Stage(f"{root}/pretrain", index, "pretrain", seed, f"{obj}-spt", objective=obj, **sub)
                        fine = Stage(
                            f"{root}/finetune",
                            index,
                            "finetune",
                            seed,
                            f"{obj}-spt",
                            init_from=pre.id,
                            after=[pre.id],
                            **sub,
                        )
                        stages += [pre, fine]
                    pairs.append([pre.id, fine.id])
                if matched and pairs:
                    stages.append(
                        Stage(
                            f"{base}/scratch-matched/seed{seed}",
                            index,
                            "train",
                            seed,
                            "scratch-matched",
                            after=[i for pair in pairs for i in pair],
                            matched_to=pairs,
                            **sub,
                        )
                    )
    return Plan(list(experiments), stages)


def matched_steps(stage: Stage, summaries: Mapping[str, Mapping[str, Any]]) -> int:
    """max over the SPT chains of pretraining + finetuning steps (the compute-matched budget)."""
    return max(int(summaries[pre]["steps"]) + int(summaries[fine]["steps"]) for pre, fine in stage.matched_to)


def budget(plan: Plan, stage: Stage) -> str:
    """The stage's training budget as resolved: its steps (or epochs), learning rate, batch and the
    schedule; a compute-matched stage's steps are set once the stages it matches have run."""
    cfg = plan.experiments[stage.experiment].train_config(stage.stage)
    if stage.matched_to:
        length = "steps matched to its SPT chain"
    elif cfg.max_steps:
        length = f"{cfg.max_steps:,} steps"
    else:
        length = f"{cfg.epochs} epochs"
    return f"{length}, lr {cfg.lr:g} ({cfg.schedule}), batch {cfg.batch_size}"


def describe(plan: Plan, statuses: Mapping[str, str] | None = None) -> str:
    """The plan as text: one line per stage with its budget and dependencies (and status, when given)."""
    lines = [f"{len(plan.stages)} stages in {len(plan.levels())} dependency levels"]
    for s in plan.stages:
        status = f"{statuses[s.id]:8s} " if statuses else ""
        after = f"  after {', '.join(s.after)}" if s.after else ""
        subset = "" if s.train_subset is None else f" train_subset={s.train_subset!r}"
        lines.append(
            f"  {status}{s.id}  [{s.stage}{' ' + s.objective if s.objective else ''}{subset}; {budget(plan, s)}]{after}"
        )
    return "\n".join(lines)
