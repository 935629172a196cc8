"""MAD's protocol (Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid Architectures",
arXiv 2403.17844; athms/mad-lab ``benchmark.py``, ``mad/analysis.py``) on the toolkit's scheduler,
from scratch and after causal self-pretraining.

    longrange mad --models hyena,mamba,mh-attention,gated-deltanet --out runs/mad --jobs auto
    longrange mad --out runs/mad --report          # the tables again from finished runs (checked)

**The grid.** For every model, MAD task (``mad-in-context-recall``, ``mad-fuzzy-recall``,
``mad-noisy-recall``, ``mad-selective-copying``, ``mad-memorization``, ``mad-compression``, whose
answers the ``decode-last`` head gives from the last position, as mad-lab's autoencoder) and
level of that task (MAD's
baseline, then each of ``configs/tasks/<task>.yml``'s changes alone: :func:`~longrange.data.mad.mad_levels`),
MAD's learning rates 1e-4, 5e-4, 1e-3 by weight decays 0, 0.1 (``mad/configs.py:160-161``), each
seed, in each regime:

* ``scratch``: trained on the task's labels from a fresh initialisation, as MAD trains;
* ``causal-spt``: pretrained on the task's own training inputs with the next-token objective, once
  per (model, task, level, seed) at ``pretrain_lr`` and ``pretrain_wd`` (MAD's default 5e-4 and 0),
  then finetuned at each point of the grid from those weights.

**A model** is a MAD layer (a fragment ``presets/mad/layers/_<name>.yaml``: ``attention``,
``mh-attention``, ``sliding-attention``, ``mh-sliding-attention``, ``gated-linear-attention``,
``mh-gated-linear-attention``, ``linear-attention``, ``mh-linear-attention``, ``hyena``,
``mh-hyena``, ``mamba``, MAD's settings for each), or any sequence
primitive of the toolkit (``gated-deltanet``, ``mamba2``, ``lru``, ...) in MAD's stack: every model
is ``X swiglu X swiglu`` at width 128 on MAD's backbone (``presets/mad/_base.yaml``) with MAD's
training defaults (``presets/mad/_train.yaml``). A layer whose filters are built for a length
(Hyena's, BaseConv's long ones: their ``l_max``) is built for each level's length.

**Selection and scores.** For each (model, task, level, regime, seed) the grid point with the best
validation accuracy (the split MAD does not have: it selects on its test set) is chosen, and only
its test accuracy is reported; the MAD score of a task is the mean of those over the task's levels
(``mad/analysis.py``'s ``compute_model_mad_scores``), and a model's overall score the mean over
tasks. A cell whose grid is incomplete (a run failed or is missing) is reported as missing, never
chosen among fewer points. Across seeds: means with Student-t intervals; the regimes' paired
difference per model and task with its Student-t interval, the paired bootstrap's percentile
interval and a sign-flip permutation p-value (both respect that accuracies are bounded) and how
many seeds agree in sign; the ranking of the models
in each regime with how often each is best over seeds.

**A confirmation** (:func:`fix_from_screen`, ``--grid-from SCREEN``) trains each (model, task,
level, regime) once per seed at the grid point with the best mean validation accuracy over a
screen's seeds (:func:`screen_choice`; the screen reads no test split), on fresh seeds and a fresh
data seed, with the screen's settings otherwise, and each cell's model and training as the screen
recorded them in its ``plan.json`` (a preset or default changed since is an error). A finished
screen's report makes claims by a fixed rule, and a confirmation's report tests them
(:mod:`longrange.studies.mad_claims`). The report, its tables and plots, and :func:`run_mad`, which
runs the grid and writes the report, are in :mod:`longrange.studies.mad_report`.

**Matching.** MAD compares layers at its fixed width (128) and stack, not at equal parameter count
or state size; its state-optimal scaling matches state sizes at scale. The report lists each
model's parameters and recurrent state per sequence (``longrange.models.layer_report``) beside its
scores, so that a reader compares at equal size explicitly; the Zoology axis (accuracy against state
size over widths) is the tool for a matched comparison.

**Training targets.** MAD's recall tasks train on every next token of the training sequences
(``train_targets: next-token``, MAD's ``is_training`` instances), which is itself causal language
modelling of the inputs: there, causal SPT adds a stage of the same objective before the same
training. ``train_targets="answers"`` trains on the answers alone, which separates the two.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from longrange.errors import ConfigError
from longrange.experiment.config import (
    ExperimentConfig,
    apply_overrides,
    deep_merge,
    experiment_from_dict,
    load_preset,
)
from longrange.experiment.plan import Plan, Stage, slug
from longrange.identity import differences
from longrange.studies.grid import lengths_follow

#: MAD's six tasks.
MAD_TASKS = (
    "mad-in-context-recall",
    "mad-fuzzy-recall",
    "mad-noisy-recall",
    "mad-selective-copying",
    "mad-memorization",
    "mad-compression",
)
#: MAD's learning rates and weight decays (athms/mad-lab ``mad/configs.py:160-161``).
MAD_LRS = (1e-4, 5e-4, 1e-3)
MAD_WDS = (0.0, 0.1)
#: MAD's final learning rate of the cosine (``eta_min``, ``mad/configs.py:52-62``).
MAD_MIN_LR = 1e-6
REGIMES = ("scratch", "causal-spt")
#: MAD's channel mixers: layers of the stack, not models of the comparison.
CHANNEL_MIXERS = ("swiglu", "mlp")
TRAIN_TARGETS = ("next-token", "answers")
#: The recall tasks, which take ``train_targets``.
RECALL_TASKS = ("mad-in-context-recall", "mad-fuzzy-recall", "mad-noisy-recall")
#: MAD's published scores of the models here that it reports (Hyena + SwiGLU: MAD's ``hyena`` stack),
#: under its full protocol (width 128, every level, the 3 x 2 grid, on GPUs): MAD gives them in
#: figures only, and these are read off its Figure 1 (athms/mad-lab ``assets/mad_to_scale.png``) by
#: ``benchmarks/mad_published_scores.py``, to about 0.001; the six tasks' mean, 0.661, is the
#: figure's own mean for the model to 0.0001.
PUBLISHED_SCORES: dict[str, dict[str, float]] = {
    "hyena": {
        "mad-in-context-recall": 0.818,
        "mad-fuzzy-recall": 0.079,
        "mad-noisy-recall": 0.789,
        "mad-selective-copying": 0.931,
        "mad-memorization": 0.895,
        "mad-compression": 0.452,
    },
    "mh-hyena": {
        "mad-in-context-recall": 0.991,
        "mad-fuzzy-recall": 0.145,
        "mad-noisy-recall": 0.986,
        "mad-selective-copying": 0.930,
        "mad-memorization": 0.894,
        "mad-compression": 0.449,
    },
}
PUBLISHED_SOURCE = (
    "MAD (Poli et al. 2024), Figure 1 (athms/mad-lab assets/mad_to_scale.png), read off the figure to about 0.001 "
    "by benchmarks/mad_published_scores.py; MAD's full protocol (width 128, every level, the 3 x 2 grid, on GPUs)"
)


def mad_layers() -> list[str]:
    """MAD's sequence layers with fragments here (``presets/mad/layers/_<name>.yaml``)."""
    from importlib import resources

    root = resources.files("longrange") / "presets" / "mad" / "layers"
    names = sorted(p.name[1:-5] for p in root.iterdir() if p.name.startswith("_") and p.name.endswith(".yaml"))
    return [n for n in names if n not in CHANNEL_MIXERS]


def model_names() -> list[str]:
    """Every name ``--models`` takes: MAD's layers, then the toolkit's primitives that are not one."""
    from longrange.layers.registry import PRIMITIVES

    layers = mad_layers()
    return layers + sorted(p for p in PRIMITIVES if p not in layers)


#: The CPU protocol (``longrange mad --cpu``), fixed before any accuracy was seen. Rule: MAD's five
#: tasks at two levels, the baseline and the fewest training examples (``n_train=800``, where
#: self-pretraining should pay most; memorization has its baseline of 256 only); MAD's stack at half
#: its width (64) and a quarter of its batch (32); two of MAD's six grid points (learning rates 5e-4
#: and 1e-3, weight decay 0); the same number of steps for pretraining and for every training run,
#: the largest multiple of 250 for which the suite of :data:`CPU_MODELS` at one seed, both regimes
#: (360 runs), fits six hours of this project's 2-core machine at the step times that
#: ``benchmarks/mad_cpu.py --width 64 --batch-size 32`` measured (61.7 s for one step of every run,
#: times 1.2 for evaluation, over two workers: 500 steps, 5.2 hours); validation every 100 steps.
CPU_PROTOCOL: dict[str, Any] = {
    # The five tasks the protocol's budget was fixed for; compression was registered after the rule
    # and a study under it had started, so it runs on its own: --cpu --tasks mad-compression.
    "tasks": MAD_TASKS[:5],
    "levels": ("baseline", "n_train=800"),
    "lrs": (5e-4, 1e-3),
    "wds": (0.0,),
    "overrides": (
        "model.d_model=64",
        "train.batch_size=32",
        "pretrain.batch_size=32",
        "train.max_steps=500",
        "pretrain.max_steps=500",
        "train.eval_every=100",
        "pretrain.eval_every=100",
    ),
}
#: The models the CPU protocol's budget was fixed for: MAD's attention, Hyena, Mamba and gated linear
#: attention, and Mamba-2, Gated DeltaNet, the LRU and H3 in MAD's stack.
CPU_MODELS = ("mh-attention", "hyena", "mamba", "mh-gated-linear-attention", "mamba2", "gated-deltanet", "lru", "h3")


@dataclass(frozen=True)
class MadSettings:
    """What ``longrange mad`` runs (see the module docstring)."""

    models: tuple[str, ...]
    tasks: tuple[str, ...] = MAD_TASKS
    #: Level names to run where a task has them (``baseline``, ``n_train=800``, ...); empty: every level.
    levels: tuple[str, ...] = ()
    lrs: tuple[float, ...] = MAD_LRS
    wds: tuple[float, ...] = MAD_WDS
    seeds: tuple[int, ...] = (0,)
    regimes: tuple[str, ...] = REGIMES
    pretrain_lr: float = 5e-4
    pretrain_wd: float = 0.0
    #: The recall tasks' training targets (MAD's: every next token).
    train_targets: str = "next-token"
    #: ``FIELD=VALUE`` settings applied to every run after MAD's (a CPU protocol's budget).
    overrides: tuple[str, ...] = ()
    #: A screen: no run reads the test split (``train.test_split: false``); the scores are the chosen
    #: points' validation accuracies, for choosing what a confirmation on fresh seeds tests.
    screen: bool = False
    #: Grid points fixed by a screen (``--grid-from``, :func:`fix_from_screen`): one (model, task,
    #: level, regime, lr, weight decay) for every cell of the study, trained at that point alone;
    #: empty: every cell trains at every point of the grid and selects on validation.
    fixed: tuple[tuple[str, str, str, str, float, float], ...] = ()

    def __post_init__(self) -> None:
        known = model_names()
        if not self.models:
            raise ConfigError("--models: name at least one model; known: " + ", ".join(known))
        for name in self.models:
            if name not in known:
                from longrange.typed import did_you_mean

                raise ConfigError(
                    f"--models: unknown model {name!r}{did_you_mean(name, known)}; known: " + ", ".join(known)
                )
        _no_repeats("--models", self.models)
        for task in self.tasks:
            if task not in MAD_TASKS:
                raise ConfigError(f"--tasks: {task!r} is not one of MAD's tasks here ({', '.join(MAD_TASKS)})")
        _no_repeats("--tasks", self.tasks)
        if self.levels:
            from longrange.data.mad import mad_levels

            every = {name for task in self.tasks for name in mad_levels(task)}
            unknown = [name for name in self.levels if name not in every]
            if unknown:
                raise ConfigError(
                    f"--levels: {', '.join(map(repr, unknown))} is no level of "
                    f"{', '.join(self.tasks)}; their levels: {', '.join(sorted(every))}"
                )
            if not any(self.task_levels(task) for task in self.tasks):
                raise ConfigError("--levels: none of the levels belongs to the tasks chosen")
        for name, values in (("--lrs", self.lrs), ("--wds", self.wds)):
            if not values or any(not (isinstance(v, (int, float)) and math.isfinite(v)) for v in values):
                raise ConfigError(f"{name}: give one or more finite numbers, got {list(values)}")
            _no_repeats(name, values)
        if any(v <= 0 for v in self.lrs) or self.pretrain_lr <= 0:
            raise ConfigError("learning rates must be positive")
        if any(v < 0 for v in self.wds) or self.pretrain_wd < 0:
            raise ConfigError("weight decays must be >= 0")
        if not self.seeds:
            raise ConfigError("--seeds: give one or more seeds")
        _no_repeats("--seeds", self.seeds)
        for regime in self.regimes:
            if regime not in REGIMES:
                raise ConfigError(f"--regimes: {regime!r} is not one of {', '.join(REGIMES)}")
        if not self.regimes:
            raise ConfigError(f"--regimes: give one or more of {', '.join(REGIMES)}")
        _no_repeats("--regimes", self.regimes)
        if self.train_targets not in TRAIN_TARGETS:
            raise ConfigError(f"--train-targets must be one of {', '.join(TRAIN_TARGETS)}, got {self.train_targets!r}")
        if self.fixed:
            self._check_fixed()

    def cells(self) -> list[tuple[str, str, str, str]]:
        """Every (model, task, level, regime) of the study, in the plan's order."""
        return [
            (model, task, level, regime)
            for task in self.tasks
            for level in self.task_levels(task)
            for model in self.models
            for regime in self.regimes
        ]

    def points(self, model: str, task: str, level: str, regime: str) -> list[tuple[float, float]]:
        """The (lr, weight decay) points a cell trains at: its fixed point, or the whole grid."""
        if not self.fixed:
            return self.grid()
        return [(lr, wd) for *cell, lr, wd in self.fixed if tuple(cell) == (model, task, level, regime)]

    def _check_fixed(self) -> None:
        seen: set[tuple] = set()
        for entry in self.fixed:
            if len(entry) != 6:
                raise ConfigError(f"fixed: each entry is (model, task, level, regime, lr, weight decay), got {entry!r}")
            *cell, lr, wd = entry
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (lr, wd)) or lr <= 0 or wd < 0:
                raise ConfigError(f"fixed: {entry!r} needs a positive learning rate and a weight decay >= 0")
            if tuple(cell) in seen:
                raise ConfigError(f"fixed: the cell {' '.join(cell)} is given twice")
            seen.add(tuple(cell))
        wanted = set(self.cells())
        missing, extra = sorted(wanted - seen), sorted(seen - wanted)
        if missing or extra:
            what = [f"no point for {len(missing)} of the study's cells, e.g. {' '.join(missing[0])}"] if missing else []
            what += [f"{len(extra)} points for cells outside the study, e.g. {' '.join(extra[0])}"] if extra else []
            raise ConfigError("fixed: " + "; ".join(what))

    def task_levels(self, task: str) -> dict[str, dict[str, Any]]:
        """The levels of ``task`` this study runs: name -> the task options that differ from MAD's baseline."""
        from longrange.data.mad import mad_levels

        levels = mad_levels(task)
        return {k: v for k, v in levels.items() if not self.levels or k in self.levels}

    def grid(self) -> list[tuple[float, float]]:
        return list(itertools.product(self.lrs, self.wds))

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MadSettings:
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        if "fixed" in values:
            values["fixed"] = tuple(tuple(entry) for entry in values["fixed"])
        return cls(**values)


def _no_repeats(name: str, values: Sequence[Any]) -> None:
    seen = [v for i, v in enumerate(values) if v in values[:i]]
    if seen:
        raise ConfigError(f"{name}: {seen[0]!r} is given twice")


def model_preset(name: str) -> dict[str, Any]:
    """The settings of model ``name`` on MAD's backbone with MAD's training defaults, without a task."""
    stack = deep_merge(load_preset("mad/_train"), load_preset("mad/_base"))
    if name in mad_layers():
        return deep_merge(stack, load_preset(f"mad/layers/_{name}"))
    # A toolkit primitive in MAD's stack X swiglu X swiglu (its channel mixer's width from the fragment).
    stack = deep_merge(stack, load_preset("mad/layers/_swiglu"))
    return deep_merge(
        stack,
        {
            "source": "MAD's stack (athms/mad-lab README.md: --layers X swiglu X swiglu) with the toolkit's "
            f"{name} at its defaults",
            "description": f"{name} in MAD's stack {name}, swiglu, {name}, swiglu at width 128",
            "model": {"layers": [{"primitive": name}, "swiglu", {"primitive": name}, "swiglu"]},
        },
    )


def cell_experiment(settings: MadSettings, model: str, task: str, level: str, lr: float, wd: float) -> ExperimentConfig:
    """One run's experiment: ``model`` on ``task`` at ``level``, trained at ``lr`` and ``wd``."""
    from longrange.data.tasks import task_options

    options = {**settings.task_levels(task)[level]}
    for override in settings.overrides:
        name = override.split("=", 1)[0].strip()
        if name.startswith("task.options.") and name.removeprefix("task.options.") in options:
            raise ConfigError(
                f"the setting {override!r} changes {name.removeprefix('task.options.')}, which the "
                f"level {level!r} of {task} varies; run that level without it, or leave it out"
            )
    if task in RECALL_TASKS and settings.train_targets != "next-token":
        options["train_targets"] = settings.train_targets
    seq_len = int(options.get("seq_len", task_options(task)["seq_len"]))
    preset = model_preset(model)
    data = deep_merge(
        preset,
        {
            "label": model,
            "task": {"name": task, "options": options},
            "train": _optimiser(lr, wd),
            "pretrain": _optimiser(settings.pretrain_lr, settings.pretrain_wd),
            "compare": {"objectives": ["causal"], "compute_matched": False, "seeds": list(settings.seeds)},
        },
    )
    data["model"] = lengths_follow(data["model"], seq_len)
    if settings.screen:
        data["train"]["test_split"] = False
    data = apply_overrides(data, settings.overrides)
    return experiment_from_dict(data)


def _optimiser(lr: float, wd: float) -> dict[str, Any]:
    """MAD's AdamW settings at ``lr`` and ``wd``: every parameter decayed alike, the cosine to 1e-6."""
    return {"lr": lr, "weight_decay": wd, "ssm_weight_decay": wd, "min_lr_ratio": MAD_MIN_LR / lr}


def grid_name(lr: float, wd: float) -> str:
    return f"lr{lr:g}-wd{wd:g}"


@dataclass(frozen=True)
class Point:
    """Where a final stage sits in the study: its model, task, level, regime, seed and grid point."""

    model: str
    task: str
    level: str
    regime: str
    seed: int
    lr: float
    wd: float


def mad_plan(settings: MadSettings) -> tuple[Plan, dict[str, Point]]:
    """The study's stages (and where each final stage sits). Stage ids:
    ``TASK/MODEL/LEVEL/lrX-wdY/scratch/seedS``, ``TASK/MODEL/LEVEL/causal-spt/seedS/pretrain`` (one
    per model, task, level and seed) and ``TASK/MODEL/LEVEL/lrX-wdY/causal-spt/seedS/finetune``."""
    experiments: list[ExperimentConfig] = []
    stages: list[Stage] = []
    points: dict[str, Point] = {}
    for task in settings.tasks:
        for level in settings.task_levels(task):
            for model in settings.models:
                base = f"{slug(task)}/{slug(model)}/{slug(level)}"
                at = {regime: settings.points(model, task, level, regime) for regime in settings.regimes}
                index = {}
                for lr, wd in dict.fromkeys(p for regime in settings.regimes for p in at[regime]):
                    index[lr, wd] = len(experiments)
                    experiments.append(cell_experiment(settings, model, task, level, lr, wd))
                for seed in settings.seeds:
                    pre = None
                    if "causal-spt" in settings.regimes:
                        pre = Stage(
                            f"{base}/causal-spt/seed{seed}/pretrain",
                            next(iter(index.values())),
                            "pretrain",
                            seed,
                            "causal-spt",
                            objective="causal",
                        )
                        stages.append(pre)
                    for lr, wd in index:
                        cell = f"{base}/{grid_name(lr, wd)}"
                        if "scratch" in settings.regimes and (lr, wd) in at["scratch"]:
                            stage = Stage(f"{cell}/scratch/seed{seed}", index[lr, wd], "train", seed, "scratch")
                            stages.append(stage)
                            points[stage.id] = Point(model, task, level, "scratch", seed, lr, wd)
                        if pre is not None and (lr, wd) in at["causal-spt"]:
                            stage = Stage(
                                f"{cell}/causal-spt/seed{seed}/finetune",
                                index[lr, wd],
                                "finetune",
                                seed,
                                "causal-spt",
                                init_from=pre.id,
                                after=[pre.id],
                            )
                            stages.append(stage)
                            points[stage.id] = Point(model, task, level, "causal-spt", seed, lr, wd)
    return Plan(experiments, stages), points


# ----------------------------------------------------------------------------------------------
# Selection and scores
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selected:
    """The grid point chosen on validation for one (model, task, level, regime, seed)."""

    model: str
    task: str
    level: str
    regime: str
    seed: int
    lr: float | None  # None: the grid is incomplete (nothing chosen)
    wd: float | None
    val: float | None
    reported: float | None  # its test accuracy (a screen: its validation accuracy)
    missing: tuple[str, ...] = ()  # the grid points without a finished result


def _value(summary: Mapping[str, Any], split: str) -> float | None:
    metrics = summary.get("best_val") if split == "val" else summary.get("test")
    if not metrics:
        return None
    value = metrics.get(summary.get("metric", "accuracy"))
    return None if value is None or not math.isfinite(float(value)) else float(value)


def select(
    points: Mapping[str, Point], summaries: Mapping[str, Mapping[str, Any]], screen: bool = False
) -> list[Selected]:
    """The best grid point of every (model, task, level, regime, seed) by validation accuracy (the
    first in grid order on a tie), with its test accuracy (``screen``: its validation accuracy in
    that place, the test split unread); an incomplete grid (a point without a finished run, or
    whose validation or test value is missing or not finite) selects nothing."""
    reported = "val" if screen else "test"
    groups: dict[tuple, list[tuple[str, Point]]] = {}
    for stage_id, p in points.items():
        groups.setdefault((p.model, p.task, p.level, p.regime, p.seed), []).append((stage_id, p))
    out = []
    for key, members in groups.items():
        missing = tuple(
            grid_name(p.lr, p.wd)
            for i, p in members
            if i not in summaries or _value(summaries[i], "val") is None or _value(summaries[i], reported) is None
        )
        if missing:
            out.append(Selected(*key, None, None, None, None, missing))
            continue
        sign = 1.0 if summaries[members[0][0]].get("higher_is_better", True) else -1.0
        best_id, best = max(members, key=lambda m: sign * _value(summaries[m[0]], "val"))  # the first of ties
        out.append(
            Selected(*key, best.lr, best.wd, _value(summaries[best_id], "val"), _value(summaries[best_id], reported))
        )
    return out


def screen_choice(
    points: Mapping[str, Point], summaries: Mapping[str, Mapping[str, Any]]
) -> tuple[dict[tuple[str, str, str, str], tuple[float, float]], dict[tuple[str, str, str, str], tuple[str, ...]]]:
    """The grid point of every (model, task, level, regime) with the best *mean* validation accuracy
    over the seeds (the first in grid order on a tie), and the cells that cannot choose: those with a
    (grid point, seed) run unfinished or without a finite validation value (listed as ``lrX-wdY
    seedS``). Test values are never read."""
    vals: dict[tuple, dict[tuple[float, float], list[float | None]]] = {}
    sign: dict[tuple, float] = {}
    missing: dict[tuple, list[str]] = {}
    for stage_id, p in points.items():
        cell = (p.model, p.task, p.level, p.regime)
        value = _value(summaries[stage_id], "val") if stage_id in summaries else None
        vals.setdefault(cell, {}).setdefault((p.lr, p.wd), []).append(value)
        if value is None:
            missing.setdefault(cell, []).append(f"{grid_name(p.lr, p.wd)} seed{p.seed}")
        else:
            sign[cell] = 1.0 if summaries[stage_id].get("higher_is_better", True) else -1.0
    chosen = {}
    for cell, by_point in vals.items():
        if cell in missing:
            continue
        means = {point: math.fsum(v) / len(v) for point, v in by_point.items()}
        chosen[cell] = max(means, key=lambda point: sign[cell] * means[point])  # the first of ties
    return chosen, {cell: tuple(m) for cell, m in missing.items()}


#: What may differ between a confirmation and the screen it takes its grid points from.
CONFIRMATION_MAY_CHANGE = ("models", "tasks", "levels", "regimes", "seeds", "screen", "fixed")


def fix_from_screen(settings: MadSettings, screen_dir: str | Path) -> MadSettings:
    """``settings`` with every cell fixed at the grid point that the screen in ``screen_dir`` chose
    for it (:func:`screen_choice` over the screen's seeds): a confirmation trains each cell once per
    seed at that point. It must run fresh seeds on a fresh data seed (``task.seed=...``) with the
    screen's settings otherwise (a subset of its models, tasks, levels and regimes may be chosen),
    and every cell it needs must be complete in the screen: each is an error otherwise."""
    screen = load_settings(screen_dir)
    reused = sorted(set(settings.seeds) & set(screen.seeds))
    if reused:
        raise ConfigError(
            f"--grid-from {screen_dir}: seeds {', '.join(map(str, reused))} were screened there; a confirmation "
            "runs fresh seeds"
        )
    mine, theirs = _without_data_seed(settings.overrides), _without_data_seed(screen.overrides)
    differ = [
        k
        for k, v in settings.to_dict().items()
        if k not in CONFIRMATION_MAY_CHANGE and k != "overrides" and v != screen.to_dict()[k]
    ]
    differ += ["overrides"] if mine != theirs else []
    if differ:
        raise ConfigError(
            f"--grid-from {screen_dir}: the screen ran other settings ({', '.join(differ)} differ); a confirmation "
            "runs the screen's, changing only the seeds, the data seed (task.seed=...) and which models, "
            "tasks, levels and regimes it confirms"
        )
    cells, screened = settings.cells(), set(screen.cells())
    outside = [cell for cell in cells if cell not in screened]
    if outside:
        raise ConfigError(
            f"--grid-from {screen_dir}: the screen did not run {len(outside)} of the cells asked for, e.g. "
            + " ".join(outside[0])
        )
    first = cells[0]
    data_seed = cell_experiment(settings, *first[:3], *settings.grid()[0]).task.seed
    if data_seed == cell_experiment(screen, *first[:3], *screen.grid()[0]).task.seed:
        raise ConfigError(
            f"--grid-from {screen_dir}: the confirmation draws the screen's data (task.seed={data_seed}); "
            "give it a fresh data seed, e.g. task.seed=" + str(data_seed + 1)
        )
    plan, points = mad_plan(screen)
    wanted = set(cells)
    points = {i: p for i, p in points.items() if (p.model, p.task, p.level, p.regime) in wanted}
    chosen, incomplete = screen_choice(points, plan.summaries(screen_dir, list(points)))
    if incomplete:
        cell, runs = next(iter(incomplete.items()))
        raise ConfigError(
            f"--grid-from {screen_dir}: the screen has not finished {len(incomplete)} of the cells asked for, "
            f"e.g. {' '.join(cell)} ({', '.join(runs[:4])}{', ...' if len(runs) > 4 else ''}); finish it first, "
            "or confirm fewer tasks, levels or models"
        )
    _check_same_runs(settings, screen_dir, plan, points, chosen)
    fixed = tuple((*cell, *chosen[cell]) for cell in cells)
    return MadSettings.from_dict({**settings.to_dict(), "fixed": [list(entry) for entry in fixed]})


#: The experiment's sections that make its runs, compared between a confirmation and its screen.
_RUN_SECTIONS = ("task", "model", "objective", "train", "pretrain", "finetune", "pretrain_model", "pretrain_task")
#: The fields in them that a confirmation changes on purpose (its data seed; a screen reads no test split).
_CONFIRMATION_CHANGES = ("task.seed:", "train.test_split:")


def _check_same_runs(
    settings: MadSettings,
    screen_dir: str | Path,
    plan: Plan,
    points: Mapping[str, Point],
    chosen: Mapping[tuple[str, str, str, str], tuple[float, float]],
) -> None:
    """An error unless each cell's runs in the confirmation would be the screen's runs at the point
    chosen for it (model, task, objective and training, as the screen recorded them in its
    ``plan.json``), but for the data seed and the test split: the code of the confirmation's day must
    build the models and runs that the screen chose among, whatever changed in the presets since."""
    recorded = Plan.load(screen_dir)
    at = {(p.model, p.task, p.level, p.regime, p.lr, p.wd): i for i, p in points.items()}
    for cell, (lr, wd) in chosen.items():
        stage = plan.by_id[at[(*cell, lr, wd)]]
        if stage.id not in recorded.by_id:
            raise ConfigError(f"--grid-from {screen_dir}: its plan.json has no stage {stage.id}")
        theirs = recorded.experiments[recorded.by_id[stage.id].experiment].to_dict()
        mine = cell_experiment(settings, *cell[:3], lr, wd).to_dict()
        diff = [
            d
            for d in differences({k: theirs.get(k) for k in _RUN_SECTIONS}, {k: mine.get(k) for k in _RUN_SECTIONS})
            if not d.startswith(_CONFIRMATION_CHANGES)
        ]
        if diff:
            shown = "; ".join(diff[:4]) + (f"; and {len(diff) - 4} more" if len(diff) > 4 else "")
            raise ConfigError(
                f"--grid-from {screen_dir}: {' '.join(cell)} would not run the screen's model and training "
                f"({shown}): the presets or defaults changed since the screen ran; a confirmation runs what "
                "the screen chose among"
            )


def _without_data_seed(overrides: Sequence[str]) -> list[str]:
    return [o for o in overrides if o.split("=", 1)[0].strip() != "task.seed"]


SETTINGS_FILE = "mad.json"


def save_settings(settings: MadSettings, out_dir: str | Path) -> Path:
    """The study's settings as ``OUT/mad.json`` (``longrange mad --report`` reads them back); a
    different study already in ``out_dir`` is an error, never mixed into one report."""
    from longrange.fileio import atomic_write

    path = Path(out_dir) / SETTINGS_FILE
    if path.is_file():
        earlier = load_settings(out_dir)
        if earlier != settings:
            changed = [k for k in settings.to_dict() if settings.to_dict()[k] != earlier.to_dict()[k]]
            raise ConfigError(
                f"{path} holds a MAD study with other settings ({', '.join(changed)} differ); "
                "use another --out, or the same settings"
            )
        return path
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return atomic_write(path, json.dumps(settings.to_dict(), indent=1).encode())


def load_settings(out_dir: str | Path) -> MadSettings:
    path = Path(out_dir) / SETTINGS_FILE
    if not path.is_file():
        raise ConfigError(
            f"{out_dir} holds no MAD study ({SETTINGS_FILE} is missing); run `longrange mad` into it first"
        )
    try:
        return MadSettings.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{path}: not a MAD study's settings ({err})") from err


__all__ = [
    "CPU_MODELS",
    "CPU_PROTOCOL",
    "MAD_LRS",
    "MAD_TASKS",
    "MAD_WDS",
    "PUBLISHED_SCORES",
    "MadSettings",
    "Point",
    "Selected",
    "cell_experiment",
    "fix_from_screen",
    "load_settings",
    "mad_layers",
    "mad_plan",
    "model_names",
    "model_preset",
    "save_settings",
    "screen_choice",
    "select",
]
