"""A study's runs as rows, and the tables that compare its regimes over seeds.

A study (the recall study ``benchmarks/recall_spt.py``, the LRA-like study
``benchmarks/small_scale_spt.py``) runs each of its settings as one comparison grid under
``<runs>/<setting>``. Its results are **rows**: one JSON-ready mapping per finished run, the format
of the raw results files the studies commit (:data:`ROW_KEYS`), read from the runs by
:func:`study_rows`. The tables here take rows and a split (``"val"`` while settings are screened,
``"test"`` once for a confirmation) and compute everything they print from the runs paired by seed
(:func:`~longrange.report.verdict.paired_stat`, Student's t): never a number written by hand.

* :func:`paired_table`: per setting, model and label count, each regime's mean and SPT minus
  scratch (and minus compute-matched scratch), paired by seed;
* :func:`paired_rows`: per setting, model and regime, the paired difference from scratch;
* :func:`ranking_table`: the models in order of their mean under each regime, and whether the
  order changes from scratch's (:func:`~longrange.report.ranking.order_reversals`);
* :func:`pooled` and :func:`complete`: settings that run the same experiments read as one, and only
  the groups run at every seed asked for (a pooled mean never mixes seed sets);
* :func:`pretraining_losses`: the last validation losses of every pretraining run;
* :class:`StageTime`, :func:`group_times`, :func:`time_lines`: the stages' time per part of a
  study (wall hours, and CPU hours where the runs recorded them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The keys of a row (a run's result). ``val`` and ``test`` are the metrics of the best validation
#: point and of the test split (``None`` where not evaluated); ``labels`` the training subset.
ROW_KEYS = (
    "setting",
    "model",
    "regime",
    "stage",
    "labels",
    "seed",
    "params",
    "steps",
    "seconds",
    "val",
    "test",
    "metric",
    "run",
)
#: The order regimes are listed in.
REGIMES = ("scratch", "scratch-matched", "causal-spt-all", "causal-spt", "masked-spt-all", "masked-spt")
Row = Mapping[str, Any]


def study_rows(root: Path, settings: Iterable[str], warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every finished run of the settings run under ``root`` (``root/<setting>``), one row each; a
    setting not run yet has no rows. ``warn`` receives what the report's reader warns of."""
    from longrange.report.collect import collect_runs

    rows = []
    for name in settings:
        if not (root / name).is_dir():
            continue
        for r in collect_runs([root / name], warn=warn):
            rows.append(
                {
                    "setting": name,
                    "model": r.label,
                    "regime": r.regime,
                    "stage": r.stage,
                    "labels": r.train_subset,
                    "seed": r.seed,
                    "params": r.params_total,
                    "steps": r.steps,
                    "seconds": round(r.seconds, 1),
                    "val": r.best_val,
                    "test": r.test,
                    "metric": r.metric,
                    "run": str(r.path.relative_to(root)),
                }
            )
    return rows


def percent(row: Row, split: str) -> float | None:
    """The row's metric on ``split`` ("val" or "test") in percent, ``None`` where it has none."""
    if split not in ("val", "test"):
        raise ValueError(f"split {split!r}: expected 'val' or 'test'")
    values = row[split] or {}
    value = values.get(row["metric"])
    return None if value is None else 100 * value


def final(rows: Iterable[Row], seeds: Sequence[int] | None = None) -> list[Row]:
    """The rows of final runs (not pretraining), at ``seeds`` if given."""
    return [r for r in rows if r["stage"] != "pretrain" and (seeds is None or r["seed"] in seeds)]


def paired_text(a: Mapping[int, float], b: Mapping[int, float]) -> str:
    """``a - b`` paired by the seeds both have, as ``+70.0 [+45.2, +94.8]`` (95% CI); "–" below 2 seeds."""
    from longrange.report.verdict import paired_stat

    common = sorted(set(a) & set(b))
    if len(common) < 2:
        return "–"
    st = paired_stat([a[s] - b[s] for s in common])
    return f"{st.mean:+.1f} [{st.low:+.1f}, {st.high:+.1f}]"


def _mean_text(values: Mapping[int, float]) -> str:
    return f"{sum(values.values()) / len(values):.1f}" if values else "–"


def paired_table(
    rows: Iterable[Row], split: str, seeds: Sequence[int] | None = None, model_order: Sequence[str] = ()
) -> str:
    """Per setting, model and label count: each regime's mean, and causal and masked SPT minus scratch
    and minus compute-matched scratch (paired by seed, 95% CI), in points. Models are listed in
    ``model_order`` (by the first word of their label), others after them. A regime pretrained on all
    inputs (``*-spt-all``) stands for its objective where the setting has it."""
    by: dict[tuple, dict[int, float]] = {}
    params: dict[tuple, int] = {}
    for r in final(rows, seeds):
        v = percent(r, split)
        if v is not None:
            by.setdefault((r["setting"], r["model"], r["labels"], r["regime"]), {})[r["seed"]] = v
            params[r["setting"], r["model"]] = r["params"]
    lines = [
        "| setting | model (params) | labels | scratch | matched | causal SPT | masked SPT | causal − scratch | "
        "masked − scratch | causal − matched | masked − matched | n |",
        "|---|---|---:|---:|---:|---:|---:|---|---|---|---|---:|",
    ]
    order = list(model_order)

    def position(model: str) -> int:
        first = model.split(" ")[0]
        return order.index(first) if first in order else len(order)

    for setting, model, labels in sorted({k[:3] for k in by}, key=lambda k: (k[0], position(k[1]), k[2] or 0)):

        def cell(regime: str, key=(setting, model, labels)) -> dict[int, float]:
            return by.get((*key, regime), {})

        def spt(objective: str) -> dict[int, float]:
            return cell(f"{objective}-spt-all") or cell(f"{objective}-spt")

        lines.append(
            f"| {setting} | {model} ({params[setting, model] / 1000:.0f}k) | {labels} | {_mean_text(cell('scratch'))} | "
            f"{_mean_text(cell('scratch-matched'))} | {_mean_text(spt('causal'))} | {_mean_text(spt('masked'))} | "
            f"{paired_text(spt('causal'), cell('scratch'))} | {paired_text(spt('masked'), cell('scratch'))} | "
            f"{paired_text(spt('causal'), cell('scratch-matched'))} | "
            f"{paired_text(spt('masked'), cell('scratch-matched'))} | {len(cell('scratch'))} |"
        )
    return "\n".join(lines)


def paired_rows(rows: Iterable[Row], split: str) -> list[dict[str, Any]]:
    """Per setting, model and regime other than scratch: its difference from scratch paired over the
    seeds where both have a value (``n``, each side's values in percent, mean and 95% CI)."""
    from longrange.report.verdict import paired_stat

    by: dict[tuple[str, str, str], dict[int, float | None]] = {}
    for r in final(rows):
        by.setdefault((r["setting"], r["model"], r["regime"]), {})[r["seed"]] = percent(r, split)
    out = []
    for setting, model, regime in sorted(k for k in by if k[2] != "scratch"):
        base, other = by.get((setting, model, "scratch"), {}), by[setting, model, regime]
        seeds = sorted(s for s in other if s in base and other[s] is not None and base[s] is not None)
        stat = paired_stat([other[s] - base[s] for s in seeds])
        out.append(
            {
                "setting": setting,
                "label": model,
                "regime": regime,
                "n": stat.n,
                "scratch": [base[s] for s in seeds],
                "spt": [other[s] for s in seeds],
                "mean": stat.mean,
                "low": stat.low,
                "high": stat.high,
            }
        )
    return out


def ranking_table(
    rows: Iterable[Row],
    split: str,
    seeds: Sequence[int] | None = None,
    same_as: Callable[[str], str] = lambda setting: setting,
) -> str:
    """Per setting and label count, the models in order of their mean under each regime (best first),
    and whether the order differs from scratch's. Settings that ``same_as`` maps to one name are
    ranked together under it. Means equal to 0.1 point are ties, written "=", and a tie is no change."""
    from longrange.report.ranking import order_reversals

    means: dict[tuple, dict[str, list[float]]] = {}
    for r in final(rows, seeds):
        v = percent(r, split)
        if v is not None:
            means.setdefault((same_as(r["setting"]), r["labels"], r["regime"]), {}).setdefault(r["model"], []).append(v)
    lines = ["| setting | labels | regime | order by mean (best first) | vs scratch |", "|---|---:|---|---|---|"]

    def regime_position(regime: str) -> int:
        return REGIMES.index(regime) if regime in REGIMES else len(REGIMES)

    for setting, labels, regime in sorted(means, key=lambda k: (k[0], k[1] or 0, regime_position(k[2]))):

        def order(regime_: str, key=(setting, labels)) -> list[tuple[str, float]]:
            got = means.get((*key, regime_), {})
            return sorted(((m, round(sum(v) / len(v), 1)) for m, v in got.items()), key=lambda mv: -mv[1])

        now = order(regime)
        flipped = order_reversals(dict(order("scratch")), dict(now))
        same = "–" if regime == "scratch" or len(now) < 2 else ("**changes**" if flipped else "same")
        text = f"{now[0][0]} {now[0][1]:.1f}"
        for (_, prev), (m, v) in zip(now, now[1:]):
            text += f" {'=' if prev == v else '>'} {m} {v:.1f}"
        lines.append(f"| {setting} | {labels} | {regime} | {text} | {same} |")
    return "\n".join(lines)


def pooled(rows: Iterable[Row], same_as: Callable[[str], str]) -> list[dict[str, Any]]:
    """The rows with each setting named as ``same_as`` names it (settings that run the same
    experiments, read as one); a (model, regime, stage, labels, seed) found under two such settings is
    an error naming both runs, never a doubled seed."""
    out, seen = [], {}
    for r in rows:
        name = same_as(r["setting"])
        key = (name, r["model"], r["regime"], r["stage"], r["labels"], r["seed"])
        if key in seen:
            raise ValueError(f"{r['run']} and {seen[key]} are the same run of {name} (seed {r['seed']})")
        seen[key] = r["run"]
        out.append({**r, "setting": name})
    return out


def complete(rows: Iterable[Row], seeds: Sequence[int]) -> list[Row]:
    """The final rows of the (setting, model, labels) groups whose every regime ran at all of
    ``seeds``: a pooled table or ranking never compares means over different seeds."""
    rows = final(rows)
    have: dict[tuple, dict[str, set[int]]] = {}
    for r in rows:
        have.setdefault((r["setting"], r["model"], r["labels"]), {}).setdefault(r["regime"], set()).add(r["seed"])
    full = {k for k, regimes in have.items() if all(set(seeds) <= got for got in regimes.values())}
    return [r for r in rows if (r["setting"], r["model"], r["labels"]) in full]


def pretraining_losses(root: Path, settings: Iterable[str], last: int = 3) -> str:
    """The last ``last`` validation losses of every pretraining run of the settings (has it flattened?)."""
    from longrange.train.logging import read_metrics
    from longrange.train.rundir import RunDir
    from longrange.train.rundir.layout import SUMMARY_FILE

    lines = ["| setting | pretraining run | steps | last validation losses |", "|---|---|---:|---|"]
    for name in settings:
        for summary in sorted((root / name).rglob(f"pretrain/{SUMMARY_FILE}")):
            run = RunDir(summary.parent)
            vals = [r for r in read_metrics(run.metrics) if r["split"] == "val"]
            tail = ", ".join(f"{r['metrics']['loss']:.3f}@{r['step']}" for r in vals[-last:])
            lines.append(
                f"| {name} | {summary.parent.relative_to(root / name)} | {vals[-1]['step'] if vals else 0} | {tail} |"
            )
    return "\n".join(lines)


def percent_text(x: float | None) -> str:
    """A fraction in percent to 0.1 ("—" for None)."""
    return "—" if x is None else f"{100 * x:.1f}"


def minutes_text(seconds: float | None) -> str:
    """Seconds in minutes to 0.1 ("—" for None)."""
    return "—" if seconds is None else f"{seconds / 60:.1f}"


def seeds_text(values: Sequence[float | None], star: bool = False) -> str:
    """The mean over seeds of the fractions that exist, in percent, then each seed's ("—" where
    missing): ``99.6 (99.2, 100.0)``; one seed is its value alone. ``star`` marks the mean."""
    have = [v for v in values if v is not None]
    if not have:
        return "—"
    mean = percent_text(sum(have) / len(have)) + ("*" if star else "")
    return mean if len(values) == 1 else f"{mean} ({', '.join(percent_text(v) for v in values)})"


def write_results(directory: Path, stem: str, data: Any, markdown: str) -> tuple[Path, Path]:
    """A study's raw results (``stem.json``) and its tables (``stem.md``), each written atomically
    (a reader never sees half a file); returns both paths."""
    import json

    from longrange.fileio import atomic_write

    directory.mkdir(parents=True, exist_ok=True)
    raw = atomic_write(directory / f"{stem}.json", (json.dumps(data, indent=1) + "\n").encode())
    text = atomic_write(directory / f"{stem}.md", (markdown + "\n").encode())
    return raw, text


# ----------------------------------------------------------------------------------------------
# Time
# ----------------------------------------------------------------------------------------------


@dataclass
class StageTime:
    """The time of a part of a study: how many stages it plans and how many finished, their
    ``seconds`` summed (wall time: a worker paused or waiting for a busy machine counts) and their
    ``cpu_seconds`` summed over the ``with_cpu`` finished stages that recorded it."""

    planned: int = 0
    finished: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    with_cpu: int = 0

    def add(self, summary: Mapping[str, Any] | None) -> None:
        """One planned stage, finished with ``summary`` (None: not finished)."""
        self.planned += 1
        if summary is None:
            return
        self.finished += 1
        self.seconds += float(summary.get("seconds") or 0.0)
        if summary.get("cpu_seconds") is not None:
            self.cpu_seconds += float(summary["cpu_seconds"])
            self.with_cpu += 1

    def cpu_hours(self) -> str:
        """The CPU hours as a table shows them: with how many stages recorded them where not all did."""
        if self.finished == 0:
            return ""
        if not self.with_cpu:
            return "not recorded"
        hours = f"{self.cpu_seconds / 3600:.2f}"
        return (
            hours
            if self.with_cpu == self.finished
            else f"{hours} ({self.with_cpu} of {self.finished} stages recorded it)"
        )


def group_times(stages: Iterable[tuple[str, Mapping[str, Any] | None]]) -> dict[str, StageTime]:
    """``(part, summary or None)`` per planned stage -> each part's :class:`StageTime`, in first-seen order."""
    times: dict[str, StageTime] = {}
    for part, summary in stages:
        times.setdefault(part, StageTime()).add(summary)
    return times


def time_lines(times: Mapping[str, StageTime], part: str) -> list[str]:
    """A Markdown section: each part's finished stages, wall hours and CPU hours, and their sum."""
    if not times:
        return []
    lines = [
        "## Time",
        "",
        "The finished stages' own time (training, evaluation and checkpoints; pretraining included), summed: "
        "wall time, which also counts a worker paused or waiting for a busy machine, and the training "
        "processes' CPU time where the runs recorded it.",
        "",
        f"| {part} | stages finished | wall hours | CPU hours |",
        "|---|---:|---:|---:|",
    ]
    total = StageTime()
    for name, t in times.items():
        lines.append(f"| {name} | {t.finished} of {t.planned} | {t.seconds / 3600:.2f} | {t.cpu_hours()} |")
        for f in ("planned", "finished", "seconds", "cpu_seconds", "with_cpu"):
            setattr(total, f, getattr(total, f) + getattr(t, f))
    lines.append(f"| all | {total.finished} of {total.planned} | {total.seconds / 3600:.2f} | {total.cpu_hours()} |")
    return [*lines, ""]
