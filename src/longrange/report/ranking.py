"""Which architecture is best under each regime, and how sure: the ranking of a comparison, and
accuracy against the number of labelled examples.

For each task, training subset and regime (scratch, an SPT regime, matched compute), the models
(labels) are ranked seed by seed on the test metric (the best validation value for runs without a
test): seed ``k`` of every model is one ranking, ties sharing their ranks. A model's row gives its
mean, its mean rank and how often, over the seeds, it is best (a seed at which two models tie for
first counts half for each). Only seeds at which every model of the group ran are used, so that
each ranking compares the same seeds. The ranking *changes* under a regime when some pair of models
is strictly ordered one way by mean from scratch and strictly the other way under the regime
(:func:`order_reversals`; means equal as displayed are ties, written "=", and a tie is no change).

:func:`label_curves` draws, per task and model, accuracy against the number of labelled training
examples (``train_size``), one line per regime with its 95% interval over seeds, all panels on one
y axis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from longrange.report.aggregate import regime_sort_key, row_name, task_sort_key
from longrange.report.collect import Run
from longrange.report.formats import metric_format
from longrange.report.stats import mean_ci


@dataclass(frozen=True)
class ModelRank:
    label: str
    mean: float
    mean_rank: float
    best_share: float  # the share of the seeds at which the model is best
    n: int


@dataclass(frozen=True)
class Ranking:
    """The models of one task, training subset and regime, ranked over the seeds they share."""

    task: str
    subset: float | int | None
    regime: str
    metric: str
    higher_is_better: bool
    seeds: tuple[int, ...]
    models: tuple[ModelRank, ...]  # best mean rank first

    @property
    def order(self) -> tuple[str, ...]:
        """The models by mean, best first."""
        return tuple(m.label for m in sorted(self.models, key=lambda m: -m.mean if self.higher_is_better else m.mean))

    def shown_means(self) -> dict[str, float]:
        """Each model's mean as displayed (the metric's scale and decimals): equal ones are ties."""
        fmt = metric_format(self.metric)
        return {m.label: float(fmt.number(m.mean)) for m in self.models}

    def order_text(self) -> str:
        """The models by mean, best first, "=" between ties as displayed: "A = B > C"."""
        shown = self.shown_means()
        labels = list(self.order)
        return labels[0] + "".join(f" {'=' if shown[a] == shown[b] else '>'} {b}" for a, b in zip(labels, labels[1:]))


def order_reversals(
    base: Mapping[str, float], now: Mapping[str, float], higher_is_better: bool = True
) -> list[tuple[str, str]]:
    """The pairs (a, b) of models that ``base`` orders strictly a before b and ``now`` strictly b before
    a (models of both only): the order changes when there is one. Pass values as displayed (rounded),
    so that means equal on the page are ties and a tie is never a change."""
    sign = 1 if higher_is_better else -1
    common = [m for m in base if m in now]
    return [(a, b) for a in common for b in common if sign * (base[a] - base[b]) > 0 and sign * (now[b] - now[a]) > 0]


def _value(run: Run) -> float | None:
    source = run.test if run.test is not None and run.metric in run.test else run.best_val
    v = source.get(run.metric)
    return None if v is None else float(v)


def _ranks(values: dict[str, float], higher_is_better: bool) -> dict[str, float]:
    """Ranks 1 (best) .. n, ties sharing the mean of their ranks."""
    ordered = sorted(values, key=lambda k: -values[k] if higher_is_better else values[k])
    ranks: dict[str, float] = {}
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and values[ordered[j + 1]] == values[ordered[i]]:
            j += 1
        for k in ordered[i : j + 1]:
            ranks[k] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def rankings(runs: Sequence[Run]) -> list[Ranking]:
    """One :class:`Ranking` per (task, training subset, regime) with at least two models sharing a seed."""
    groups: dict[tuple, dict[str, dict[int, float]]] = {}
    info: dict[tuple, tuple[str, bool]] = {}
    for r in runs:
        if not r.is_final:
            continue
        v = _value(r)
        if v is None:
            continue
        key = (r.task, type(r.train_subset).__name__, r.train_subset, r.regime)
        groups.setdefault(key, {}).setdefault(r.label, {})[r.seed] = v
        info[key] = (r.metric, r.higher_is_better)
    out = []
    for key in sorted(
        groups, key=lambda k: (task_sort_key(k[0]), k[1], k[2] if k[2] is not None else 0, regime_sort_key(k[3]))
    ):
        by_model = groups[key]
        if len(by_model) < 2:
            continue
        seeds = sorted(set.intersection(*(set(s) for s in by_model.values())))
        if not seeds:
            continue
        metric, higher = info[key]
        rank_sum = dict.fromkeys(by_model, 0.0)
        best = dict.fromkeys(by_model, 0.0)
        for seed in seeds:
            ranks = _ranks({m: by_model[m][seed] for m in by_model}, higher)
            first = [m for m, k in ranks.items() if k == min(ranks.values())]
            for m in by_model:
                rank_sum[m] += ranks[m]
            for m in first:
                best[m] += 1 / len(first)
        models = [
            ModelRank(
                m,
                sum(by_model[m][s] for s in seeds) / len(seeds),
                rank_sum[m] / len(seeds),
                best[m] / len(seeds),
                len(seeds),
            )
            for m in by_model
        ]
        models.sort(key=lambda m: (m.mean_rank, m.label))
        out.append(Ranking(key[0], key[2], key[3], metric, higher, tuple(seeds), tuple(models)))
    return out


def ranking_section(found: Sequence[Ranking]) -> str:
    """Markdown: per task and training subset, the models' mean, mean rank and share of seeds at
    which each is best, under each regime; and whether the order changes from scratch."""
    if not found:
        return ""
    lines = [
        "## Ranking of the models under each regime",
        "",
        "Ranked seed by seed (the same seeds for every model of a row; ties share ranks): mean, mean rank "
        "(1 is best) and the share of seeds at which the model is best.",
        "",
    ]
    for (task, _, subset), group in _groups(found).items():
        fmt = metric_format(group[0].metric)
        where = task + ("" if subset is None else f", train subset {subset}")
        lines += [
            f"### {where}",
            "",
            "| Model | " + " | ".join(row_name("", g.regime).strip() or "scratch" for g in group) + " |",
            "|---|" + "---:|" * len(group),
        ]
        labels = sorted({m.label for g in group for m in g.models})
        for label in labels:
            cells = []
            for g in group:
                m = next((m for m in g.models if m.label == label), None)
                cells.append(
                    "–" if m is None else f"{fmt.number(m.mean)} (rank {m.mean_rank:.1f}, best {m.best_share:.0%})"
                )
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += [f"- {line}" for line in _order_lines(group, bold=True)]
        lines.append("")
    return "\n".join(lines)


def _groups(found: Sequence[Ranking]) -> dict[tuple, list[Ranking]]:
    by_place: dict[tuple, list[Ranking]] = {}
    for r in found:
        by_place.setdefault((r.task, type(r.subset).__name__, r.subset), []).append(r)
    return by_place


def _order_lines(group: Sequence[Ranking], bold: bool = False) -> list[str]:
    """Per regime of one task and subset: the models' order by mean, and whether it differs from scratch's."""
    lines = []
    scratch = next((g for g in group if g.regime == "scratch"), None)
    changes = "**the order changes**" if bold else "the order changes"
    for g in group:
        n = len(g.seeds)
        order = g.order_text()
        if scratch is None or g is scratch or len(g.order) < 2:
            lines.append(f"{g.regime}: {order} (by mean, {n} seed{'s' if n != 1 else ''})")
        else:
            same = not order_reversals(scratch.shown_means(), g.shown_means(), g.higher_is_better)
            lines.append(
                f"{g.regime}: {order} (by mean, {n} seed{'s' if n != 1 else ''}): "
                + ("the same order as from scratch" if same else f"{changes} from scratch's {scratch.order_text()}")
            )
    return lines


def ranking_text(found: Sequence[Ranking]) -> str:
    """Plain lines (what ``compare`` and the demo print after the verdict): per task and training
    subset with two or more models, the order of the models under each regime and whether it changes."""
    lines = []
    for (task, _, subset), group in _groups(found).items():
        if max(len(g.models) for g in group) < 2:
            continue
        where = task + ("" if subset is None else f", train subset {subset}")
        lines.append(f"Ranking of the models by mean ({where}):")
        lines += [f"  {line}" for line in _order_lines(group)]
    return "\n".join(lines)


def label_curves(runs: Sequence[Run], path: str | Path) -> Path | None:
    """Per task and model, the metric against the number of labelled training examples, one line per
    regime (mean and 95% interval over seeds); None when no task has two or more training sizes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from longrange.report.chance import common_chance
    from longrange.report.plots import (
        chance_legend,
        clip_band,
        draw_chance,
        regime_style,
        regime_words,
        thin_tick_labels,
    )

    points: dict[tuple[str, str], dict[str, dict[int, list[float]]]] = {}
    metric = {}
    members: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        v = _value(r)
        if not r.is_final or v is None or r.train_size is None:
            continue
        points.setdefault((r.task, r.label), {}).setdefault(r.regime, {}).setdefault(r.train_size, []).append(v)
        metric[r.task] = r.metric
        members.setdefault((r.task, r.label), []).append(r)
    panels = [
        (k, v)
        for k, v in sorted(points.items(), key=lambda kv: (task_sort_key(kv[0][0]), kv[0][1]))
        if len({n for per in v.values() for n in per}) >= 2
    ]
    if not panels:
        return None
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(3.6 * cols, 3.0 * rows + 0.8), sharey=True, squeeze=False, layout="constrained"
    )
    handles = {}
    chances: list[float] = []
    for ax, ((task, label), per_regime) in zip(axes.flat, panels):
        fmt = metric_format(metric[task])
        chance = common_chance(members[(task, label)]) if metric[task] == "accuracy" else None
        chance_line = draw_chance(ax, chance, fmt.scale)
        if chance_line is not None:
            chances.append(chance)
            handles.setdefault("chance", chance_line)
        for regime in sorted(per_regime, key=regime_sort_key):
            sizes = sorted(per_regime[regime])
            stats = [mean_ci(per_regime[regime][n]) for n in sizes]
            mean = np.array([s.mean for s in stats])
            half = np.array([s.half_width if s.half_width is not None else 0.0 for s in stats])
            low, high = clip_band(metric[task], mean, half)
            (line,) = ax.plot(sizes, fmt.scale * mean, **regime_style(regime))
            ax.fill_between(sizes, fmt.scale * low, fmt.scale * high, color=line.get_color(), alpha=0.15, linewidth=0)
            handles.setdefault(regime, line)
        ax.set_xscale("log")
        sizes = sorted({n for per in per_regime.values() for n in per})
        ax.set_xticks(sizes, [f"{n:,}" for n in sizes])
        ax.minorticks_off()
        ax.set_title(f"{label} ({task})", fontsize=9)
        ax.set_xlabel("labelled training examples", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel(metric_format(next(iter(metric.values()))).name, fontsize=8)
    order = [r for r in handles if r != "chance"] + (["chance"] if chances else [])
    fig.legend(
        [handles[r] for r in order],
        [chance_legend(chances) if r == "chance" else regime_words(r) for r in order],
        loc="outside lower center",
        ncol=min(4, len(order)),
        fontsize=8,
    )
    thin_tick_labels(fig, axes.flat[: len(panels)])  # close training sizes: each keeps its tick, labels that fit
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
