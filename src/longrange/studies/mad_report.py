"""A MAD study (:mod:`longrange.studies.mad`) run, and its report from its finished runs: the
scores, their tables, the plots and, for a confirmation, the verdict on its screen's claims.

    report = run_mad(MadSettings(models=("hyena", "mamba2")), "runs/mad")   # ``longrange mad``
    report = report_from_runs("runs/mad")        # ``longrange mad --report``: its runs checked, then read
    write_report(report, "runs/mad")      # mad_report.md, mad_selected.csv, the plots, the claims

**What it holds.** For each (model, task, level, regime, seed), the grid point chosen on the
validation split (:func:`~longrange.studies.mad.select`) and its reported accuracy; the MAD score
of each task (:class:`TaskScore`, the mean over the task's levels, ``mad/analysis.py``'s
``compute_model_mad_scores``) and each model's overall score (:func:`overall_scores`); each model's
parameters and recurrent state per sequence at each task's length; the stages' times.

**What it writes** (:data:`REPORT_FILES`): the markdown tables (means with Student-t intervals, the
regimes' paired differences with :mod:`longrange.report.verdict`'s intervals and p-values, the
rankings overall, per task and per level, the published scores beside this study's), every selected
cell as CSV, the scores plot and the plot of SPT minus scratch; a finished screen's claims
(:mod:`longrange.studies.mad_claims`), which its confirmation's report tests.
"""

from __future__ import annotations

import csv
import functools
import io
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from longrange.errors import ConfigError
from longrange.experiment.plan import Plan
from longrange.studies.mad import (
    PUBLISHED_SCORES,
    PUBLISHED_SOURCE,
    REGIMES,
    MadSettings,
    Selected,
    load_settings,
    mad_plan,
    save_settings,
    select,
)
from longrange.studies.tables import StageTime, group_times, time_lines

if TYPE_CHECKING:
    from longrange.studies.mad_claims import Claims


@dataclass(frozen=True)
class TaskScore:
    """A MAD score: the mean test accuracy over a task's levels (None where a level is missing)."""

    model: str
    task: str
    regime: str
    seed: int
    score: float | None
    levels: int


def task_scores(selected: Iterable[Selected], levels: Mapping[str, Sequence[str]]) -> list[TaskScore]:
    """MAD scores per (model, task, regime, seed): the mean over ``levels[task]`` of the selected
    test accuracies; missing (None) unless every level has one."""
    by: dict[tuple, dict[str, float | None]] = {}
    for s in selected:
        by.setdefault((s.model, s.task, s.regime, s.seed), {})[s.level] = s.reported
    out = []
    for (model, task, regime, seed), values in by.items():
        wanted = list(levels[task])
        have = [values.get(level) for level in wanted]
        score = None if any(v is None for v in have) else math.fsum(have) / len(have)
        out.append(TaskScore(model, task, regime, seed, score, len(wanted)))
    return out


def overall_scores(scores: Iterable[TaskScore], tasks: Sequence[str]) -> dict[tuple[str, str, int], float | None]:
    """(model, regime, seed) -> the mean of its task scores over ``tasks`` (None unless all are there)."""
    by: dict[tuple[str, str, int], dict[str, float | None]] = {}
    for s in scores:
        by.setdefault((s.model, s.regime, s.seed), {})[s.task] = s.score
    out = {}
    for key, values in by.items():
        have = [values.get(t) for t in tasks]
        out[key] = None if any(v is None for v in have) else math.fsum(have) / len(have)
    return out


def stage_times(plan: Plan, summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, StageTime]:
    """Per task (the first part of a stage's id, ``TASK/MODEL/...``), the time of its stages."""
    return group_times((stage.id.split("/")[0], summaries.get(stage.id)) for stage in plan.stages)


@dataclass
class MadReport:
    """The study's results: what was selected, the scores, and the text of its tables."""

    settings: MadSettings
    selected: list[Selected]
    scores: list[TaskScore]
    overall: dict[tuple[str, str, int], float | None]
    sizes: dict[str, dict[str, int]] = field(default_factory=dict)
    #: task -> its stages' time (:class:`StageTime`), pretraining included.
    times: dict[str, StageTime] = field(default_factory=dict)
    #: A confirmation's copy of its screen's claims (:mod:`longrange.studies.mad_claims`), which its
    #: report tests; None for a screen or a study without one.
    claims: Claims | None = None
    #: model -> task -> its recurrent state per sequence at the task's length (attention's grows with it).
    states: dict[str, dict[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._by_key = {(s.model, s.task, s.regime, s.seed): s.score for s in self.scores}
        self._by_level = {(s.model, s.task, s.level, s.regime, s.seed): s.reported for s in self.selected}
        self._screen_claims: tuple[Claims | None] | None = None  # computed once, on first use

    def markdown(self) -> str:
        from longrange.report.verdict import PAIRED_ALIGN, PAIRED_HEADER, PAIRED_NOTE, paired_cells
        from longrange.studies.mad_claims import spt_differences

        st = self.settings
        tasks = [t for t in st.tasks]
        lines = [
            "# MAD protocol: scores" + (" (screen: validation accuracy, the test split unread)" if st.screen else ""),
            "",
        ]
        what = "validation" if st.screen else "test"
        lines.append(
            f"Models {', '.join(st.models)}; tasks {', '.join(tasks)}; levels: "
            + ("every level" if not st.levels else ", ".join(st.levels))
            + (
                f"; each cell at the grid point a screen chose for it (the best mean validation accuracy over "
                f"the screen's seeds; lr {', '.join(sorted({f'{e[4]:g}' for e in st.fixed}))}), its {what} "
                "accuracy reported"
                if st.fixed
                else f"; grid lr {', '.join(f'{v:g}' for v in st.lrs)} x weight decay "
                f"{', '.join(f'{v:g}' for v in st.wds)}, the best point by validation accuracy, its {what} "
                "accuracy reported"
            )
            + "; seeds {', '.join(map(str, st.seeds))}; training targets of the recall tasks: "
            f"{st.train_targets}" + (f"; settings {' '.join(st.overrides)}" if st.overrides else "") + "."
        )
        lines.append("")
        planned = sum(t.planned for t in self.times.values())
        finished = sum(t.finished for t in self.times.values())
        if finished < planned:
            lines += [
                f"**Unfinished: {finished:,} of {planned:,} stages have finished** (per task under Time). A score "
                "whose runs have not all finished is missing, and a mean over fewer seeds says how many.",
                "",
            ]

        for regime in st.regimes:
            lines.append(f"## {regime}: MAD score ({what} accuracy %, mean over levels; mean ± 95% CI over seeds)")
            lines.append("")
            lines.append("| model | parameters | state | " + " | ".join(tasks) + " | overall |")
            lines.append("|---|---:|---:|" + "---:|" * (len(tasks) + 1))
            for model in st.models:
                row = [
                    model,
                    f"{self.sizes.get(model, {}).get('total', 0):,}",
                    self._state_cell(model),
                ]
                for task in tasks:
                    row.append(_mean_cell([self._score(model, task, regime, seed) for seed in st.seeds]))
                row.append(_mean_cell([self.overall.get((model, regime, seed)) for seed in st.seeds]))
                lines.append("| " + " | ".join(row) + " |")
            lines.append("")
            if regime == st.regimes[0]:
                lines += self._states_lines()
            lines += self._ranking(regime)
        if set(REGIMES) <= set(st.regimes):
            lines.append(f"## causal-spt minus scratch (points of {what} accuracy, paired by seed)")
            lines.append("")
            lines.append(f"| model | task | {PAIRED_HEADER} |")
            lines.append(f"|---|---|{PAIRED_ALIGN}")
            for model in st.models:
                for task in tasks + ["overall"]:
                    lines.append(f"| {model} | {task} | {paired_cells(spt_differences(self, model, task))} |")
            lines += ["", PAIRED_NOTE, ""]
        lines += self._task_rankings()
        lines += self._by_level_lines(what)
        lines += self._claims()
        lines += self._published(tasks)
        lines += self._time()
        incomplete = [s for s in self.selected if s.lr is None]
        if incomplete:
            lines.append(
                f"Missing: {len(incomplete)} (model, task, level, regime, seed) cells have an incomplete "
                "grid and are not scored, e.g. "
                + "; ".join(
                    f"{s.model} {s.task} {s.level} {s.regime} seed {s.seed} ({', '.join(s.missing)})"
                    for s in incomplete[:3]
                )
                + "."
            )
            lines.append("")
        return "\n".join(lines)

    def _score(self, model: str, task: str, regime: str, seed: int) -> float | None:
        return self._by_key.get((model, task, regime, seed))

    def _state_cell(self, model: str) -> str:
        """The model's state per sequence: one number where every task has it, else the range over
        the tasks' lengths (listed by :meth:`_states_lines`)."""
        by_task = self.states.get(model) or {}
        if not by_task:
            state = self.sizes.get(model, {}).get("state")
            return "" if state is None else f"{state:,}"
        low, high = min(by_task.values()), max(by_task.values())
        return f"{low:,}" if low == high else f"{low:,}-{high:,}"

    def _states_lines(self) -> list[str]:
        varying = {m: t for m, t in self.states.items() if len(set(t.values())) > 1}
        if not varying:
            return []
        return [
            "State per sequence at each task's length, where it grows with the length: "
            + "; ".join(
                f"{model}: " + ", ".join(f"{task.removeprefix('mad-')} {state:,}" for task, state in by_task.items())
                for model, by_task in varying.items()
            )
            + ".",
            "",
        ]

    def screen_claims(self) -> Claims | None:
        """A finished screen's claims (:func:`~longrange.studies.mad_claims.screen_claims`); None
        for a study that is not a screen or not finished."""
        from longrange.studies.mad_claims import missing_scores, screen_claims

        if self._screen_claims is None:
            finished = self.settings.screen and not missing_scores(self)
            self._screen_claims = (screen_claims(self) if finished else None,)
        return self._screen_claims[0]

    def _claims(self) -> list[str]:
        from longrange.studies import mad_claims as C

        if self.claims is not None:
            return C.tested_lines(C.check_claims(self.claims, self), self.claims)
        if not self.settings.screen:
            return []
        claims = self.screen_claims()
        if claims is not None:
            return C.claims_lines(claims)
        missing = C.missing_scores(self)
        return [
            f"Claims for a confirmation: none yet; they are taken once every score is in ({len(missing)} "
            f"missing), by the rule of {C.RULE}.",
            "",
        ]

    def _published(self, tasks: list[str]) -> list[str]:
        """The published scores of this study's models that MAD reports (:data:`PUBLISHED_SCORES`),
        over this study's tasks: its overall is their mean over those tasks."""
        models = [m for m in self.settings.models if m in PUBLISHED_SCORES]
        if not models:
            return []
        lines = [
            "## Published MAD scores (%)",
            "",
            f"From {PUBLISHED_SOURCE}; overall: the mean over this study's tasks. Below each, this study's mean "
            "score minus the published one (points; the overall as the mean over the same tasks). A study at "
            "other settings (the CPU protocol: width 64, two levels, two grid points, 500 steps) is not expected "
            "to reach them.",
            "",
            "| model | " + " | ".join(tasks) + " | overall |",
            "|---|" + "---:|" * (len(tasks) + 1),
        ]
        for model in models:
            scores = [PUBLISHED_SCORES[model][t] for t in tasks]
            cells = [f"{100 * v:.1f}" for v in scores] + [f"{100 * math.fsum(scores) / len(scores):.1f}"]
            lines.append(f"| {model} (published) | " + " | ".join(cells) + " |")
            published = [*scores, math.fsum(scores) / len(scores)]
            for regime in self.settings.regimes:  # this study's mean score minus the published one, in points
                means = [self._mean_score(model, t, regime) for t in tasks]
                means.append(None if None in means else math.fsum(means) / len(means))
                gaps = [None if m is None else 100 * (m - p) for m, p in zip(means, published)]
                lines.append(
                    f"| {model}, {regime} minus published | "
                    + " | ".join("missing" if g is None else f"{g:+.1f}" for g in gaps)
                    + " |"
                )
        return [*lines, ""]

    def _mean_score(self, model: str, task: str, regime: str) -> float | None:
        """The mean over the seeds of ``model``'s score on ``task``; None unless every seed has one."""
        values = [self._score(model, task, regime, seed) for seed in self.settings.seeds]
        return None if None in values else math.fsum(values) / len(values)

    def _time(self) -> list[str]:
        return time_lines(self.times, "task")

    def _ranking(self, regime: str) -> list[str]:
        line = self._ranking_text(lambda m, seed: self.overall.get((m, regime, seed)))
        return [f"Ranking ({regime}, overall score): {line}", ""] if line else []

    def _ranking_text(self, score: Callable[[str, int], float | None]) -> str:
        """The models by mean ``score(model, seed)`` over the seeds where every model has one, each
        with how often it is best (every model tied at the top counts); empty where no model has all."""
        st = self.settings
        means = {}
        wins = {m: 0 for m in st.models}
        for seed in st.seeds:
            vals = {m: score(m, seed) for m in st.models}
            if all(v is not None for v in vals.values()):
                best = max(vals.values())
                for m, v in vals.items():
                    wins[m] += v == best
        for m in st.models:
            vals = [score(m, seed) for seed in st.seeds]
            if all(v is not None for v in vals):
                means[m] = math.fsum(vals) / len(vals)
        if not means:
            return ""
        order = sorted(means, key=lambda m: -means[m])
        seeds_ranked = sum(all(score(m, s) is not None for m in st.models) for s in st.seeds)
        text = " > ".join(f"{m} ({100 * means[m]:.1f}; best in {wins[m]} of {seeds_ranked} seeds)" for m in order)
        unranked = [m for m in st.models if m not in means]
        return text + (f"; not ranked, a score missing: {', '.join(unranked)}" if unranked else "")

    def _task_rankings(self) -> list[str]:
        """Each task's ranking in each regime (its MAD score), for a study of several models and tasks:
        on which tasks self-pretraining changes what wins."""
        st = self.settings
        if len(st.models) < 2 or len(st.tasks) < 2:
            return []
        lines = ["## Rankings by task (its MAD score)", ""]
        for task in st.tasks:
            for regime in st.regimes:
                text = self._ranking_text(functools.partial(self._task_score, task, regime))
                lines.append(f"- {task}, {regime}: " + (text or "missing"))
        return [*lines, ""]

    def _task_score(self, task: str, regime: str, model: str, seed: int) -> float | None:
        return self._score(model, task, regime, seed)

    def _at_level(self, tasks: tuple[str, ...], level: str, regime: str, model: str, seed: int) -> float | None:
        """The mean over ``tasks`` (the study's tasks that have ``level``) of the chosen points'
        accuracies at that level (None unless every one is there): the overall score at one level."""
        values = [self._by_level.get((model, t, level, regime, seed)) for t in tasks]
        return None if not values or any(v is None for v in values) else math.fsum(values) / len(values)

    def _by_level_lines(self, what: str) -> list[str]:
        """Each level on its own (a task's score averages them): the regimes' paired difference per
        (model, task, level), and the ranking in each regime at each level over the tasks that have
        it. Only for a study where some task runs more than one level."""
        from longrange.report.verdict import PAIRED_ALIGN, PAIRED_HEADER, PAIRED_NOTE, paired_cells

        st = self.settings
        by_task = {task: list(st.task_levels(task)) for task in st.tasks}
        if not any(len(levels) > 1 for levels in by_task.values()):
            return []
        levels = list(dict.fromkeys(level for task in st.tasks for level in by_task[task]))
        lines = []
        if set(REGIMES) <= set(st.regimes):
            lines += [
                f"## By level: causal-spt minus scratch (points of {what} accuracy, paired by seed)",
                "",
                "A task's MAD score is the mean over its levels; here each level on its own (the baseline, and "
                "levels that each change one of its variables: `n_train=800` has the fewest training examples).",
                "",
                f"| model | task | level | scratch | causal-spt | {PAIRED_HEADER} |",
                f"|---|---|---|---:|---:|{PAIRED_ALIGN}",
            ]

            for model in st.models:
                for task in st.tasks:
                    for level in by_task[task]:
                        pairs = [
                            (
                                self._by_level.get((model, task, level, "causal-spt", seed)),
                                self._by_level.get((model, task, level, "scratch", seed)),
                            )
                            for seed in st.seeds
                        ]
                        diffs = [100 * (a - b) for a, b in pairs if a is not None and b is not None]
                        lines.append(
                            f"| {model} | {task} | {level} | {_mean_cell([b for _, b in pairs])} | "
                            f"{_mean_cell([a for a, _ in pairs])} | {paired_cells(diffs)} |"
                        )
            lines += ["", PAIRED_NOTE, ""]
        if len(st.models) > 1:
            lines += [
                "## Rankings by level (mean over the tasks that have the level)",
                "",
            ]
            for level in levels:
                tasks = [t for t in st.tasks if level in by_task[t]]
                for regime in st.regimes:
                    text = self._ranking_text(functools.partial(self._at_level, tuple(tasks), level, regime))
                    lines.append(f"- {level} ({', '.join(tasks)}), {regime}: " + (text or "missing"))
            lines.append("")
        return lines

    def csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(
            [
                "model",
                "task",
                "level",
                "regime",
                "seed",
                "lr",
                "weight_decay",
                "val_accuracy",
                "reported_split",
                "reported_accuracy",
                "missing",
            ]
        )
        split = "validation" if self.settings.screen else "test"
        for s in self.selected:
            writer.writerow(
                [s.model, s.task, s.level, s.regime, s.seed, s.lr, s.wd, s.val, split, s.reported, " ".join(s.missing)]
            )
        return buf.getvalue()


def _mean_cell(values: list[float | None]) -> str:
    """A table cell: the mean in % ± its 95% Student-t half-width over the values there, saying how
    many of them are there when some are missing."""
    from longrange.report.tables import mean_ci

    vals = [v for v in values if v is not None]
    if not vals:
        return "missing"
    stat = mean_ci(vals)
    text = f"{100 * stat.mean:.1f}"
    if stat.half_width is not None:
        text += f" ± {100 * stat.half_width:.1f}"
    return text + ("" if len(vals) == len(values) else f" ({len(vals)} of {len(values)} seeds)")


def build_report(settings: MadSettings, out_dir: str | Path, *, check: bool = False) -> MadReport:
    """The report of the study in ``out_dir`` from its finished runs (unfinished ones are missing);
    with ``check``, first the check that each was made with the settings its stage resolves to now
    (:func:`~longrange.experiment.compare.check_reuse`: an error naming the runs that were not)."""
    plan, points = mad_plan(settings)
    if check:
        from longrange.experiment.compare import check_reuse

        check_reuse(plan, Path(out_dir))
    every = plan.summaries(out_dir, [stage.id for stage in plan.stages])
    summaries = {i: every[i] for i in points if i in every}
    selected = select(points, summaries, settings.screen)
    levels = {task: list(settings.task_levels(task)) for task in settings.tasks}
    scores = task_scores(selected, levels)
    overall = overall_scores(scores, [t for t in settings.tasks if levels[t]])
    sizes: dict[str, dict[str, int]] = {}
    states: dict[str, dict[str, int]] = {}
    for stage_id, p in points.items():  # each model's sizes from its first finished run of each task
        params = (summaries.get(stage_id) or {}).get("params")
        if params and p.task not in states.setdefault(p.model, {}):
            sizes.setdefault(p.model, dict(params))
            if params.get("state") is not None:
                states[p.model][p.task] = params["state"]
    from longrange.studies.mad_claims import load_claims

    claims = None if settings.screen else load_claims(out_dir)
    return MadReport(settings, selected, scores, overall, sizes, stage_times(plan, every), claims, states)


REPORT_FILES = {
    "markdown": "mad_report.md",
    "csv": "mad_selected.csv",
    "plot": "mad_scores.png",
    "differences": "mad_spt_minus_scratch.png",
    "claims": "mad_claims.json",
}


def write_report(report: MadReport, out_dir: str | Path) -> dict[str, Path]:
    """``mad_report.md``, ``mad_selected.csv``, ``mad_scores.png`` and ``mad_spt_minus_scratch.png``
    in ``out_dir``, and a finished screen's claims, ``mad_claims.json``."""
    from longrange.fileio import atomic_write
    from longrange.studies.mad_claims import save_claims

    out = Path(out_dir)
    claims = report.screen_claims()
    paths = {
        "markdown": atomic_write(out / REPORT_FILES["markdown"], report.markdown().encode()),
        "csv": atomic_write(out / REPORT_FILES["csv"], report.csv().encode()),
    }
    if claims is not None:
        paths["claims"] = save_claims(claims, out)
    plot = scores_plot(report, out / REPORT_FILES["plot"])
    if plot is not None:
        paths["plot"] = plot
    differences = differences_plot(report, out / REPORT_FILES["differences"])
    if differences is not None:
        paths["differences"] = differences
    return paths


def differences_plot(report: MadReport, path: Path) -> Path | None:
    """SPT minus scratch per model, one panel per task and one for the overall score: each seed a
    dot, the mean a bar with its 95% Student-t interval (clipped to the axis of +-100 points, where
    an interval can pass what accuracies allow); None unless the study runs both regimes and some
    model has a paired seed."""
    import matplotlib.pyplot as plt

    from longrange.report.plots import save_figure
    from longrange.report.verdict import paired_stat
    from longrange.studies.mad_claims import spt_differences

    st = report.settings
    if not set(REGIMES) <= set(st.regimes):
        return None
    columns = list(st.tasks) + ["overall"]
    diffs = {(m, c): spt_differences(report, m, c) for m in st.models for c in columns}
    if not any(diffs.values()):
        return None
    fig, axes = plt.subplots(
        1, len(columns), figsize=(2.2 * len(columns) + 1.5, 0.35 * len(st.models) + 1.4), squeeze=False, sharey=True
    )
    ys = list(range(len(st.models)))[::-1]
    for ax, column in zip(axes[0], columns):
        ax.axvline(0.0, color="0.6", linewidth=0.8)
        for y, model in zip(ys, st.models):
            d = diffs[(model, column)]
            if not d:
                continue
            stat = paired_stat(d)
            if stat.low is not None:
                ax.plot([max(stat.low, -100.0), min(stat.high, 100.0)], [y, y], color="C0", linewidth=2)
            ax.plot([stat.mean], [y], "|", color="C0", markersize=12, markeredgewidth=2)
            ax.plot(d, [y] * len(d), "o", color="k", markersize=3, alpha=0.6)
        ax.set_xlim(-100, 100)
        ax.set_title(column.removeprefix("mad-"), fontsize=9)
        ax.set_xlabel("points", fontsize=8)
    axes[0][0].set_yticks(ys)
    axes[0][0].set_yticklabels(st.models, fontsize=8)
    what = "validation" if st.screen else "test"
    fig.suptitle(
        f"causal SPT minus scratch ({what} accuracy, paired by seed: dots; mean and 95% t interval)", fontsize=9
    )
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def scores_plot(report: MadReport, path: Path) -> Path | None:
    """Bars of each model's MAD score per task and overall, one panel per regime (mean over seeds,
    95% CI); None when nothing is scored."""
    import matplotlib.pyplot as plt

    from longrange.report.plots import regime_colour, save_figure
    from longrange.report.tables import mean_ci

    st = report.settings
    columns = list(st.tasks) + ["overall"]
    if not any(s.score is not None for s in report.scores):
        return None
    fig, axes = plt.subplots(1, len(st.regimes), figsize=(4.8 * len(st.regimes), 3.6), squeeze=False, sharey=True)
    width = 0.8 / len(st.models)
    for ax, regime in zip(axes[0], st.regimes):
        for k, model in enumerate(st.models):
            means, halves = [], []
            for column in columns:
                vals = [
                    report.overall.get((model, regime, seed))
                    if column == "overall"
                    else report._score(model, column, regime, seed)
                    for seed in st.seeds
                ]
                vals = [100 * v for v in vals if v is not None]
                stat = mean_ci(vals) if vals else None
                means.append(stat.mean if stat else math.nan)
                halves.append(stat.half_width or 0.0 if stat else 0.0)
            xs = [i + (k - (len(st.models) - 1) / 2) * width for i in range(len(columns))]
            ax.bar(xs, means, width, yerr=halves, label=model, capsize=2)
            if model in PUBLISHED_SCORES:
                published = [PUBLISHED_SCORES[model][t] for t in st.tasks]
                ys = [100 * v for v in published] + [100 * math.fsum(published) / len(published)]
                ax.plot(xs, ys, "k_", markersize=9, markeredgewidth=2, label=f"{model}: published (MAD, Figure 1)")
        ax.set_xticks(range(len(columns)))
        ax.set_xticklabels([c.removeprefix("mad-") for c in columns], rotation=30, ha="right", fontsize=8)
        ax.set_title(regime, color=regime_colour(regime))
        ax.set_ylim(0, 100)
        ax.set_ylabel(f"MAD score ({'validation' if st.screen else 'test'} accuracy %)")
    axes[0][-1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def report_from_runs(out_dir: str | Path) -> MadReport:
    """The report of the study in ``out_dir`` from its finished runs alone (``longrange mad
    --report``), after the check that each was made with the settings its stage resolves to now: a
    preset or default changed since the runs is an error naming them (rebuild the report on the
    revision that ran them), never a report of other settings than its runs'."""
    return build_report(load_settings(out_dir), out_dir, check=True)


def screen_claims_of(screen_dir: str | Path) -> Claims | None:
    """The claims of the screen in ``screen_dir`` as its finished runs make them now (None while it
    is not finished), for a confirmation to test."""
    return build_report(load_settings(screen_dir), screen_dir).screen_claims()


def run_mad(
    settings: MadSettings,
    out_dir: str | Path,
    *,
    executor=None,
    dry_run: bool = False,
    overwrite: bool = False,
    claims: Claims | None = None,
) -> MadReport | None:
    """Run the study into ``out_dir`` (resumable: finished runs are reused, run again it does only
    the missing work) and write its report; ``dry_run`` prints the plan and runs nothing. A
    confirmation's ``claims`` (its screen's) are kept in ``out_dir`` before any run starts, and its
    report tests them."""
    from longrange.experiment.compare import StageFailed, run_grid
    from longrange.studies.mad_claims import save_claims

    plan, _ = mad_plan(settings)
    if claims is not None and not settings.fixed:
        raise ConfigError("claims are tested by a confirmation (--grid-from SCREEN), not by a study that chooses")
    if not dry_run:
        save_settings(settings, out_dir)
        if claims is not None:
            save_claims(claims, out_dir)
    try:
        run_grid(
            plan,
            out_dir,
            executor=executor,
            overwrite=overwrite,
            dry_run=dry_run,
            notes=[
                f"MAD protocol: {len(plan.stages)} runs ({sum(s.stage == 'pretrain' for s in plan.stages)} "
                "pretrainings)"
            ],
        )
    except StageFailed:  # the report marks their cells missing; the error still ends the command
        write_report(build_report(settings, out_dir), out_dir)
        raise
    if dry_run:
        return None
    report = build_report(settings, out_dir)
    write_report(report, out_dir)
    return report


__all__ = [
    "REPORT_FILES",
    "MadReport",
    "TaskScore",
    "build_report",
    "differences_plot",
    "overall_scores",
    "report_from_runs",
    "run_mad",
    "scores_plot",
    "screen_claims_of",
    "stage_times",
    "task_scores",
    "write_report",
]
