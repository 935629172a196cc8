"""A grid of single training runs: presets with overrides, each under a label of its own, trained
from scratch at given seeds on the comparison's scheduler (resumable, on local workers).

The synthetic tables (``benchmarks/synthetic_tables.py``) are such grids: every cell of a published
table is a preset with a few settings changed (a length, a width), trained once per seed, then read
back and set beside the paper's number. ::

    runs = [GridRun("s6", "mamba/induction-heads/cpu/mamba-s6", "Mamba-S6 L=64", ["task.options.seq_len=64"])]
    unfinished = run_grid(runs, runs, Path("runs/induction"), jobs=2)
    summary_dir = run_dir(Path("runs/induction"), runs[0])
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The seed of a run that names none.
SEED = 0


def lengths_follow(model: dict[str, Any], seq_len: int) -> dict[str, Any]:
    """A model's settings with every ``l_max`` (the length a layer's long filter is built for:
    Hyena's, BaseConv's long convolutions) set to ``seq_len``, the task's, in ``primitive_options``
    and in each entry of ``layers``: a study that puts a preset on another task's length."""
    out = dict(model)
    if "l_max" in out.get("primitive_options", {}):
        out["primitive_options"] = {**out["primitive_options"], "l_max": seq_len}
    layers = []
    for entry in out.get("layers") or []:
        if isinstance(entry, dict) and "l_max" in (entry.get("options") or {}):
            entry = {**entry, "options": {**entry["options"], "l_max": seq_len}}
        layers.append(entry)
    if layers:
        out["layers"] = layers
    return out


def sets_l_max(overrides: Sequence[str]) -> bool:
    """Whether ``overrides`` set an ``l_max`` themselves: then a study leaves the long filters as
    given instead of building them for the task's length (:func:`lengths_follow`)."""
    return any(o.split("=", 1)[0].strip().endswith("l_max") for o in overrides)


@dataclass
class GridRun:
    """One training run of a grid: a preset with overrides, under its own label, from one seed (the
    runs of one label with different seeds are one experiment of the plan). ``model`` names it in
    the study's tables; ``info`` holds what the study records beside its result (a length, a width)."""

    model: str
    preset: str
    label: str
    overrides: list[str]
    info: dict[str, Any] = field(default_factory=dict)
    seed: int = SEED
    #: Build every long filter of the model (an ``l_max``: Hyena's, BaseConv's, in a stack's layers
    #: too) for the run's task length (:func:`lengths_follow`), which overrides cannot reach inside a
    #: stack: for a grid that puts presets on other lengths than their own. An override that sets an
    #: ``l_max`` itself wins (:func:`sets_l_max`), as in the Zoology study.
    follow_length: bool = False

    def experiment(self):
        """The run's experiment: the preset with its overrides and its label (its long filters built
        for its task's length with ``follow_length``)."""
        from longrange.experiment.config import experiment_from_dict, resolve

        exp = resolve(self.preset, overrides=[*self.overrides, f"label={self.label}"])
        if not self.follow_length or sets_l_max(self.overrides):
            return exp
        from longrange.data.tasks import task_options
        from longrange.errors import ConfigError

        length = {**task_options(exp.task.name), **exp.task.options}.get("seq_len")
        if not isinstance(length, int):
            raise ConfigError(f"{self.label}: follow_length needs the task's seq_len, and {exp.task.name} has none")
        data = exp.to_dict()
        data["model"] = lengths_follow(data["model"], length)
        return experiment_from_dict(data)


def grid_plan(runs: Sequence[GridRun]):
    """The grid's plan: each run's training from scratch at its seed, no self-pretraining."""
    from longrange.errors import ConfigError
    from longrange.experiment.plan import Plan, plan_grid

    experiments = list({r.label: r for r in runs}.values())  # one experiment per label, in grid order
    resolved = [r.experiment() for r in experiments]
    for run, exp in zip(experiments, resolved):
        if exp.compare.train_subsets:
            raise ConfigError(
                f"{run.label}: {run.preset} sweeps compare.train_subsets ({exp.compare.train_subsets}); a grid run "
                "is one training run: set one task.train_subset and compare.train_subsets=[] in its overrides"
            )
    plan = plan_grid(resolved, seeds=sorted({r.seed for r in runs}), compute_matched=False)
    wanted = {(r.label, r.seed) for r in runs}
    return Plan(
        plan.experiments,
        [s for s in plan.stages if s.regime == "scratch" and (plan.experiments[s.experiment].label, s.seed) in wanted],
    )


def run_fingerprint(run: GridRun) -> str:
    """The fingerprint of ``run``'s stage (:func:`longrange.identity.fingerprint` of its resolved
    settings, as its run directory records it): a study keeps a result from an earlier results file
    only under the same fingerprint, never by the preset's name alone, whose settings may have changed."""
    plan = grid_plan([run])
    return plan.resolve(plan.stages[0], Path("unused")).fingerprint()  # a scratch stage needs no other run


def run_grid(runs: Sequence[GridRun], grid: Sequence[GridRun], out_dir: Path, jobs: int) -> list[str]:
    """Train ``runs`` (a part of ``grid``, whose whole plan is saved in ``out_dir``) with ``jobs``
    local workers of one thread each, as ``compare`` runs a plan (:func:`longrange.experiment.compare.run_grid`:
    its data checked and generated first, finished runs reused, interrupted ones resumed; a run made
    with other settings stops the grid, naming it); returns the ids of the stages that did not finish."""
    from longrange.experiment.backends import LocalWorkers
    from longrange.experiment.compare import StageFailed
    from longrange.experiment.compare import run_grid as run_plan
    from longrange.experiment.plan import Plan

    plan = grid_plan(grid)
    chosen = {(r.label, r.seed) for r in runs}
    part = Plan(plan.experiments, [s for s in plan.stages if (plan.experiments[s.experiment].label, s.seed) in chosen])
    start = time.time()
    try:
        run_plan(part, out_dir, executor=LocalWorkers(jobs=jobs, threads_per_job=1), saved_plan=plan)
        unfinished: list[str] = []
    except StageFailed as err:
        unfinished = list(err.stages)
        if not unfinished:
            raise
    print(f"== {out_dir}: {len(part.stages)} stages, {(time.time() - start) / 60:.1f} min", file=sys.stderr, flush=True)
    return unfinished


def run_dir(out_dir: Path, run: GridRun) -> Path:
    """Where ``run`` trains under the grid's ``out_dir`` (the plan's stage directory)."""
    from longrange.experiment.plan import slug

    exp = run.experiment()
    return out_dir / slug(exp.task.name) / slug(exp.label) / "scratch" / f"seed{run.seed}"
