"""Zoology's axis (Arora et al. 2023, "Zoology: Measuring and Improving Recall in Efficient Language
Models", arXiv 2312.04927; HazyResearch/zoology): MQAR accuracy against the size of each model's
recurrent state, from scratch and after causal self-pretraining.

    longrange zoology --models transformer,mamba-s6,gated-deltanet,lru --widths 16,32,64,128 --out runs/zoo

Each model (a ``demo/recall/<name>`` preset: the recall study's 2-layer models, causal, or any preset
name) is trained at each width (``model.d_model``; ``--field d_state`` sweeps the state's own size,
for a layer whose state does not grow with its width, as the LRU's) on one MQAR task, by ``compare`` (scratch, and
causal SPT then finetuning, over seeds). The default task is the recall study's MQAR with a small
vocabulary (64 tokens, length 40, 8 key-value pairs, answers in the inputs: ``mqar-text`` of
``benchmarks/recall_spt.py``), where models separate on a CPU, unlike Zoology's vocabulary of 8,192
(docs/synthetic-tasks.md); ``--task-option`` changes it. Each (model, width) is a point at its state
size: the numbers a causal model keeps per sequence to go on (``longrange params``: a recurrence's
state, attention's cache of keys and values at the task's length); each model is two curves, test
accuracy against state size from scratch and after SPT (mean over seeds with a 95% interval), and
the report gives each point's paired difference (SPT minus scratch by seed, with its Student-t
interval, the paired bootstrap's percentile interval, the exact sign-flip p-value and how many
seeds agree in sign).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrange.errors import ConfigError
from longrange.experiment.config import ExperimentConfig, apply_overrides, deep_merge, experiment_from_dict, load_preset
from longrange.studies.grid import lengths_follow, sets_l_max

#: The recall study's MQAR with a small vocabulary (``mqar-text``): per-position answers, each value
#: also after its query in the input.
DEFAULT_TASK = {
    "name": "mqar",
    "options": {
        "vocab_size": 64,
        "seq_len": 40,
        "n_pairs": 8,
        "answers_in_input": True,
        "n_train": 20000,
        "n_val": 1000,
        "n_test": 2000,
    },
}
DEFAULT_WIDTHS = (16, 32, 64, 128)
REGIMES = ("scratch", "causal-spt")


def model_preset(name: str) -> str:
    """The preset of model ``name``: ``demo/recall/<name>`` where there is one, else ``name`` itself."""
    from longrange.experiment.config import list_presets

    names = list_presets()
    if f"demo/recall/{name}" in names:
        return f"demo/recall/{name}"
    if name in names:
        return name
    from longrange.typed import did_you_mean

    recall = [n.removeprefix("demo/recall/") for n in names if n.startswith("demo/recall/")]
    raise ConfigError(
        f"--models: unknown model {name!r}{did_you_mean(name, recall)}; the recall study's: "
        + ", ".join(recall)
        + " (or any preset name)"
    )


#: The model fields a sweep may set (``--field``): the width, or the state's own size.
FIELDS = ("d_model", "d_state")


def label(model: str, width: int, field: str = "d_model") -> str:
    return f"{model} w{width}" if field == "d_model" else f"{model} {field}{width}"


def experiments(
    models: Sequence[str],
    widths: Sequence[int],
    seeds: Sequence[int],
    task_options: Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    field: str = "d_model",
) -> list[ExperimentConfig]:
    """One experiment per (model, width): its preset at ``model.<field> = width`` (the width by
    default; ``d_state`` for a model whose state does not grow with its width, as the LRU's) on the
    MQAR task, compared from scratch and after causal SPT over ``seeds``, without a compute-matched run."""
    if field not in FIELDS:
        raise ConfigError(f"--field must be one of {', '.join(FIELDS)}, got {field!r}")
    if not models:
        raise ConfigError("--models: name at least one model")
    if not widths or any(not isinstance(w, int) or w < 1 for w in widths):
        raise ConfigError(f"--widths: give one or more positive integers, got {list(widths)}")
    for name, values in (("--models", models), ("--widths", widths)):
        repeated = [v for i, v in enumerate(values) if v in values[:i]]
        if repeated:
            raise ConfigError(f"{name}: {repeated[0]!r} is given twice")
    task = deep_merge(DEFAULT_TASK, {"options": dict(task_options or {})})
    out = []
    for model in models:
        preset = load_preset(model_preset(model))
        for width in widths:
            data = deep_merge(
                preset,
                {
                    "label": label(model, width, field),
                    "task": task,
                    "model": {field: width},
                    "compare": {
                        "objectives": ["causal"],
                        "compute_matched": False,
                        "seeds": list(seeds),
                        "train_subsets": [],
                        "pretrain_data": "all",
                    },
                },
            )
            data["task"] = task  # the MQAR task replaces the preset's, options and all
            data.pop("base", None)
            data = apply_overrides(data, overrides)
            if not sets_l_max(overrides):
                # long filters (Hyena's, BaseConv's) are built for the MQAR's length, not the preset's
                data["model"] = lengths_follow(data["model"], int(data["task"]["options"]["seq_len"]))
            out.append(experiment_from_dict(data))
    return out


@dataclass(frozen=True)
class Point:
    """One (model, width, regime) over seeds: its state size and test accuracies."""

    model: str
    width: int
    regime: str
    state: int
    parameters: int
    accuracies: tuple[float, ...]
    #: The seed of each accuracy (paired with the other regime's by seed).
    seeds: tuple[int, ...] = ()

    def mean(self) -> float | None:
        return math.fsum(self.accuracies) / len(self.accuracies) if self.accuracies else None


def points(
    summaries: Sequence[Mapping[str, Any]], models: Sequence[str], widths: Sequence[int], field: str = "d_model"
) -> list[Point]:
    """The points of the finished summaries (``compare``'s), by model, width and regime; a diverged
    run (no finite test accuracy) adds no accuracy."""
    by: dict[tuple[str, int, str], dict[str, Any]] = {}
    names = {label(m, w, field): (m, w) for m in models for w in widths}
    for s in summaries:
        if s.get("label") not in names:
            continue
        regime = (
            "scratch"
            if s.get("regime") == "scratch"
            else "causal-spt"
            if s.get("regime", "").startswith("causal")
            else None
        )
        if regime is None:
            continue
        model, width = names[s["label"]]
        entry = by.setdefault((model, width, regime), {"accs": [], "seeds": [], "params": s.get("params") or {}})
        value = (s.get("test") or {}).get(s.get("metric", "accuracy"))
        if value is not None and math.isfinite(float(value)):
            entry["accs"].append(float(value))
            entry["seeds"].append(int(s.get("seed", len(entry["seeds"]))))
    return [
        Point(
            m,
            w,
            r,
            int(v["params"].get("state", 0)),
            int(v["params"].get("total", 0)),
            tuple(v["accs"]),
            tuple(v["seeds"]),
        )
        for (m, w, r), v in by.items()
    ]


def paired_lines(pts: Sequence[Point], models: Sequence[str], widths: Sequence[int]) -> list[str]:
    """The table of causal SPT minus scratch per (model, width), in points of test accuracy, paired
    by seed: the mean difference with its 95% Student-t interval, the paired bootstrap's percentile
    interval, the exact sign-flip p-value and how many seeds agree in sign ("missing" where no seed has both)."""
    from longrange.report.verdict import PAIRED_ALIGN, PAIRED_HEADER, PAIRED_NOTE, paired_cells

    by = {(p.model, p.width, p.regime): dict(zip(p.seeds, p.accuracies)) for p in pts}
    lines = [
        "## Causal SPT minus scratch (points of test accuracy, paired by seed)",
        "",
        f"| model | width | {PAIRED_HEADER} |",
        f"|---|---:|{PAIRED_ALIGN}",
    ]
    for model in models:
        for width in widths:
            spt, scratch = by.get((model, width, "causal-spt"), {}), by.get((model, width, "scratch"), {})
            diffs = [100 * (spt[seed] - scratch[seed]) for seed in sorted(set(spt) & set(scratch))]
            lines.append(f"| {model} | {width} | {paired_cells(diffs)} |")
    return [*lines, "", PAIRED_NOTE]


def times(out_dir: str | Path, models: Sequence[str], widths: Sequence[int], field: str = "d_model"):
    """Each model's stage time (:class:`~longrange.studies.tables.StageTime`) over every stage of the
    grid saved in ``out_dir`` (its ``plan.json``), pretraining included."""
    from longrange.experiment.plan import Plan
    from longrange.studies.tables import group_times

    plan = Plan.load(out_dir)
    summaries = plan.summaries(out_dir, [stage.id for stage in plan.stages])
    names = {label(m, w, field): m for m in models for w in widths}
    model_of = {stage.id: names.get(plan.experiments[stage.experiment].label) for stage in plan.stages}
    found = group_times((model_of[i], summaries.get(i)) for i in model_of if model_of[i] is not None)
    return {m: found[m] for m in models if m in found}


def markdown(
    pts: Sequence[Point],
    models: Sequence[str],
    widths: Sequence[int],
    field: str = "d_model",
    stage_times: Mapping[str, Any] | None = None,
) -> str:
    from longrange.report.tables import mean_ci

    lines = [
        "# MQAR accuracy against state size",
        "",
        "Test accuracy (%, mean ± 95% CI over seeds) of each model at each width; state: the numbers a "
        "model keeps per sequence to go on (attention: its keys and values at the task's length).",
        "",
        f"| model | {'width' if field == 'd_model' else field} | parameters | state | scratch | causal SPT |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    by = {(p.model, p.width, p.regime): p for p in pts}

    def cell(p: Point | None) -> str:
        if p is None or not p.accuracies:
            return "missing"
        stat = mean_ci([100 * a for a in p.accuracies])
        return f"{stat.mean:.1f}" + (f" ± {stat.half_width:.1f}" if stat.half_width is not None else "")

    for model in models:
        for width in widths:
            any_point = by.get((model, width, "scratch")) or by.get((model, width, "causal-spt"))
            if any_point is None:
                lines.append(f"| {model} | {width} | | | missing | missing |")
                continue
            lines.append(
                f"| {model} | {width} | {any_point.parameters:,} | {any_point.state:,} | "
                f"{cell(by.get((model, width, 'scratch')))} | {cell(by.get((model, width, 'causal-spt')))} |"
            )
    lines += ["", *paired_lines(pts, models, widths)]
    if stage_times:
        from longrange.studies.tables import time_lines

        lines += ["", *time_lines(stage_times, "model")]
    return "\n".join(lines) + "\n"


def csv_text(pts: Sequence[Point]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["model", "width", "regime", "parameters", "state", "seeds", "mean_test_accuracy"])
    for p in pts:
        writer.writerow([p.model, p.width, p.regime, p.parameters, p.state, len(p.accuracies), p.mean()])
    return buf.getvalue()


def plot(pts: Sequence[Point], models: Sequence[str], path: Path) -> Path | None:
    """Accuracy against state size (log scale): per model one colour, scratch solid, SPT dashed."""
    import matplotlib.pyplot as plt

    from longrange.report.plots import save_figure
    from longrange.report.tables import mean_ci

    if not any(p.accuracies for p in pts):
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, model in enumerate(models):
        for regime, style in (("scratch", "-"), ("causal-spt", "--")):
            curve = sorted(
                (p for p in pts if p.model == model and p.regime == regime and p.accuracies), key=lambda p: p.state
            )
            if not curve:
                continue
            stats = [mean_ci([100 * a for a in p.accuracies]) for p in curve]
            xs = [max(p.state, 1) for p in curve]
            ax.errorbar(
                xs,
                [s.mean for s in stats],
                yerr=[s.half_width or 0.0 for s in stats],
                fmt="o" + style,
                color=colours[i % len(colours)],
                capsize=2,
                label=f"{model} ({regime})",
            )
    ax.set_xscale("log")
    ax.set_xlabel("state size (numbers per sequence)")
    ax.set_ylabel("MQAR test accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


FILES = {"markdown": "zoology_report.md", "csv": "zoology_points.csv", "plot": "zoology_state.png"}


def run_zoology(
    models: Sequence[str],
    widths: Sequence[int],
    out_dir: str | Path,
    *,
    seeds: Sequence[int] = (0,),
    task_options: Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    executor=None,
    dry_run: bool = False,
    field: str = "d_model",
    report_only: bool = False,
) -> str:
    """Train every (model, width) from scratch and with causal SPT into ``out_dir`` (resumable) and
    write the report; returns its Markdown (empty for a dry run). ``report_only``: write the report
    from the study's finished runs, running nothing; a finished run made with other settings than
    these options give is an error there too (the report would be another study's), and so is a
    folder without a finished run of the study."""
    exps = experiments(models, widths, seeds, task_options, overrides, field)
    if report_only:
        summaries = _finished(exps, seeds, out_dir)
    else:
        from longrange.experiment.compare import compare

        summaries = compare(
            exps,
            out_dir,
            seeds=list(seeds),
            executor=executor,
            dry_run=dry_run,
            size_note="each model is a curve over its state size at several widths",
        )
    if dry_run:
        return ""
    from longrange.fileio import atomic_write

    pts = points(summaries, models, widths, field)
    text = markdown(pts, models, widths, field, times(out_dir, models, widths, field))
    out = Path(out_dir)
    atomic_write(out / FILES["markdown"], text.encode())
    atomic_write(out / FILES["csv"], csv_text(pts).encode())
    plot(pts, models, out / FILES["plot"])
    return text


def _finished(exps: Sequence[ExperimentConfig], seeds: Sequence[int], out_dir: str | Path) -> list[dict[str, Any]]:
    """The final stages' summaries of the finished runs of this study in ``out_dir``, in plan order,
    after the check that they were made with these settings."""
    from longrange.experiment.compare import check_reuse
    from longrange.experiment.plan import plan_grid

    out = Path(out_dir)
    if not out.is_dir():
        raise ConfigError(f"--out {out}: no such directory (--report reads a study's finished runs)")
    plan = plan_grid(exps, seeds=list(seeds))
    check_reuse(plan, out)
    found = plan.summaries(out, [s.id for s in plan.stages if s.is_final])
    if not found:
        raise ConfigError(f"--out {out}: no finished run of this study (its models, widths, seeds and settings)")
    return [found[s.id] for s in plan.stages if s.id in found]


__all__ = [
    "DEFAULT_TASK",
    "DEFAULT_WIDTHS",
    "Point",
    "csv_text",
    "experiments",
    "markdown",
    "model_preset",
    "paired_lines",
    "plot",
    "points",
    "run_zoology",
    "times",
]
