"""The verdict of a comparison, computed from its runs: is self-pretraining better than scratch?

For each model (label), task and training subset, and each SPT regime (``<objective>-spt``,
``f1-spt``, ...) against ``scratch`` (and, separately, against ``scratch-matched`` when present):

* the per-seed difference ``d_k = SPT_k - scratch_k`` of the metric, paired by seed: only seeds
  with both runs count; the others are left out and counted;
* its mean and 95% confidence interval, Student t with n - 1 degrees of freedom
  (``mean ± t_{0.975, n-1} · s_d / √n``, the interval of ``scipy.stats.ttest_rel``);
* one sentence derived from those numbers: "SPT better by X points (95% CI [a, b], n seeds)" when
  the interval lies on SPT's side of 0, "scratch better by ..." when it lies on the other side,
  "no difference detectable at this scale (95% CI [a, b] contains 0, n seeds)" when it contains 0,
  and "cannot tell from one seed" with fewer than two paired seeds.

"Better" follows the metric's ``higher_is_better`` (for an MSE, SPT is better when the difference
is negative). The interval is always of SPT minus scratch in the metric's display units
(accuracy in percent, so X is in percentage points). The value of a run is its test metric; when
some run of a comparison has none, the comparison uses the best validation metric and says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from longrange.errors import DataFormatError
from longrange.report.collect import Run
from longrange.report.tables import CONFIDENCE, Table, metric_format, regime_sort_key, render_markdown, row_name, task_sort_key

BASELINES = ("scratch", "scratch-matched")
BASELINE_WORDS = {"scratch": "scratch", "scratch-matched": "scratch with matched compute"}


@dataclass(frozen=True)
class PairedStat:
    """Mean of paired differences with its Student-t confidence interval (None for n < 2)."""

    n: int
    mean: float
    low: float | None
    high: float | None
    confidence: float = CONFIDENCE


def paired_stat(differences: Sequence[float], confidence: float = CONFIDENCE) -> PairedStat:
    """Mean and two-sided ``confidence`` interval of ``differences`` (n - 1 degrees of freedom)."""
    from scipy import stats

    d = [float(x) for x in differences]
    n = len(d)
    if n == 0:
        return PairedStat(0, math.nan, None, None, confidence)
    mean = math.fsum(d) / n
    if n == 1:
        return PairedStat(1, mean, None, None, confidence)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2.0, n - 1)) * sd / math.sqrt(n)
    return PairedStat(n, mean, mean - half, mean + half, confidence)


@dataclass
class Comparison:
    """One SPT regime against one scratch baseline, for one model, task and training subset."""

    task: str
    label: str
    subset: float | int | None
    regime: str          # the SPT regime
    baseline: str        # scratch or scratch-matched
    metric: str
    higher_is_better: bool
    source: str          # test or val
    seeds: list[int]
    differences: list[float]   # SPT - baseline per paired seed, in the metric's own units
    #: Seeds left out, each with the reason (no SPT run, no baseline run, no finite value).
    unpaired: dict[int, str] = field(default_factory=dict)

    @property
    def stat(self) -> PairedStat:
        return paired_stat(self.differences)

    @property
    def outcome(self) -> str:
        """``spt``, ``baseline`` (the better one), ``none`` (the interval contains 0) or ``unknown``."""
        s = self.stat
        if s.n < 2:
            return "unknown"
        if s.low > 0:
            return "spt" if self.higher_is_better else "baseline"
        if s.high < 0:
            return "baseline" if self.higher_is_better else "spt"
        return "none"

    @property
    def title(self) -> str:
        subset = "" if self.subset is None else f", train subset {self.subset!r}"
        return f"{row_name(self.label, self.regime)} vs {row_name(self.label, self.baseline)} on {self.task}{subset}"

    def sentence(self) -> str:
        s, fmt = self.stat, metric_format(self.metric)
        unit = " points" if self.metric == "accuracy" else f" in {fmt.name}"
        base = BASELINE_WORDS.get(self.baseline, self.baseline)
        seeds = f"{s.n} seed{'s' if s.n != 1 else ''}"
        ci = f"95% CI [{fmt.number(s.low)}, {fmt.number(s.high)}]" if s.n >= 2 else ""
        outcome = self.outcome
        if outcome == "spt":
            text = f"SPT better by {fmt.number(abs(s.mean))}{unit} ({ci}, {seeds})"
        elif outcome == "baseline":
            text = f"{base} better by {fmt.number(abs(s.mean))}{unit} ({ci}, {seeds})"
        elif outcome == "none":
            text = f"no difference detectable at this scale ({ci} contains 0, {seeds})"
        elif s.n == 1:
            text = (f"cannot tell from one seed (SPT − {base} = {fmt.number(s.mean)}{unit} on seed {self.seeds[0]}; "
                    "at least 2 seeds with both runs are needed)")
        else:
            text = f"cannot tell: no seed has both the SPT and the {base} run"
        if self.unpaired:
            left = ", ".join(f"seed {k}: {why}" for k, why in sorted(self.unpaired.items()))
            n = len(self.unpaired)
            text += f"; {n} unpaired seed{'s' if n != 1 else ''} left out ({left})"
        if self.source == "val":
            text += "; on the best validation metric (no test results)"
        return text


def comparisons(runs: Sequence[Run]) -> list[Comparison]:
    """Every SPT-vs-scratch comparison the final-stage ``runs`` allow, paired by seed."""
    cells: dict[tuple, dict[int, Run]] = {}
    for r in runs:
        if not r.is_final:
            continue
        key = (r.task, r.label, type(r.train_subset).__name__, r.train_subset, r.regime)
        seeds = cells.setdefault(key, {})
        if r.seed in seeds:
            raise DataFormatError(f"seed {r.seed} of (task {r.task!r}, label {r.label!r}, regime {r.regime!r}) "
                                  f"appears twice: {seeds[r.seed].path} and {r.path}", r.summary_file)
        seeds[r.seed] = r
    out = []
    groups = sorted({k[:4] for k in cells}, key=lambda k: (task_sort_key(k[0]), k[1], k[2], _subset_order(k[3])))
    for group in groups:
        regimes = sorted({k[4] for k in cells if k[:4] == group}, key=regime_sort_key)
        for baseline in BASELINES:
            if baseline not in regimes:
                continue
            for regime in (r for r in regimes if is_spt(r)):
                out.append(_compare(group, cells[(*group, regime)], cells[(*group, baseline)], regime, baseline))
    return out


def is_spt(regime: str) -> bool:
    """Whether a regime is self-pretraining then finetuning (``masked-spt``, ``f1-spt``, ``causal-spt-all``)."""
    return regime.endswith("-spt") or regime.endswith("-spt-all")


def _subset_order(subset: float | int | None) -> tuple:
    if subset is None:
        return (2, 0.0)
    return (0, float(subset)) if isinstance(subset, float) else (1, float(subset))


def _compare(group: tuple, spt: dict[int, Run], base: dict[int, Run], regime: str, baseline: str) -> Comparison:
    task, label, _, subset = group
    both = list(spt.values()) + list(base.values())
    metrics = {(r.metric, r.higher_is_better) for r in both}
    if len(metrics) > 1:
        raise DataFormatError(f"the runs of {label} on {task} ({regime} and {baseline}) use different metrics "
                              f"{sorted(metrics)}", both[0].summary_file)
    metric, hib = metrics.pop()
    source = "test" if all(r.has_test() for r in both) else "val"
    seeds, diffs, unpaired = [], [], {}
    for seed in sorted(set(spt) | set(base)):
        if seed not in base:
            unpaired[seed] = f"no {baseline} run"
            continue
        if seed not in spt:
            unpaired[seed] = f"no {regime} run"
            continue
        a, b = spt[seed].value(source), base[seed].value(source)
        if not (math.isfinite(a) and math.isfinite(b)):
            unpaired[seed] = "no finite value"
            continue
        seeds.append(seed)
        diffs.append(a - b)
    return Comparison(task, label, subset, regime, baseline, metric, hib, source, seeds, diffs, unpaired)


def verdict_text(runs: Sequence[Run]) -> str:
    """The verdicts as plain lines (what ``longrange compare`` prints after the table)."""
    found = comparisons(runs)
    if not found:
        return "Verdict: no SPT and scratch runs of the same model to compare."
    lines = ["Verdict (SPT minus scratch, paired by seed, 95% CI Student t):"]
    lines += [f"  {c.title}: {c.sentence()}" for c in found]
    return "\n".join(lines)


def verdict_table(found: Sequence[Comparison]) -> Table:
    subsets = any(c.subset is not None for c in found)
    headers = ["SPT", "Baseline", "Task"] + (["Train subset"] if subsets else []) + [
        "Paired seeds", "Mean difference", "95% CI", "Verdict"]
    rows = []
    for c in found:
        s, fmt = c.stat, metric_format(c.metric)
        rows.append([row_name(c.label, c.regime), row_name(c.label, c.baseline), c.task]
                    + (["all" if c.subset is None else repr(c.subset)] if subsets else [])
                    + [str(s.n), "—" if s.n == 0 else fmt.number(s.mean),
                       f"[{fmt.number(s.low)}, {fmt.number(s.high)}]" if s.n >= 2 else "—", c.sentence()])
    return Table("SPT minus scratch, paired by seed: mean and 95% confidence interval (Student t, n−1 d.o.f.)",
                 headers, rows, ["Differences are SPT − baseline in the tables' units (accuracy in percentage "
                                 "points); “better” follows whether the metric is higher or lower is better."])


def verdict_markdown(runs: Sequence[Run]) -> str:
    """The report's verdict section (empty when there is nothing to compare)."""
    found = comparisons(runs)
    if not found:
        return ""
    return "## Verdict\n\n" + render_markdown(verdict_table(found))
