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
  and "cannot tell from one seed" with fewer than two paired seeds; with two seeds the sentence adds
  that the interval is unreliable (one degree of freedom: its half-width is 12.7 standard errors,
  and the standard error itself rests on one difference of differences).

Where a report holds several such tests, each decision at 95% alone would find some effect by chance
more often than 5% of the time; the verdict then also gives each test's p-value (the paired t-test
that the interval inverts) adjusted by Holm's step-down method over all K tests of the report, and
which decisions survive it at a family-wise error of 5%.

"Better" follows the metric's ``higher_is_better`` (for an MSE, SPT is better when the difference
is negative). The interval is always of SPT minus scratch in the metric's display units
(accuracy in percent, so X is in percentage points). The value of a run is its test metric; when
some run of a comparison has none, the comparison uses the best validation metric and says so.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from longrange.errors import DataFormatError
from longrange.report.aggregate import regime_sort_key, row_name, task_sort_key
from longrange.report.collect import Run
from longrange.report.formats import metric_format
from longrange.report.render import Table, render_markdown
from longrange.report.stats import CONFIDENCE

BASELINES = ("scratch", "scratch-matched")
BASELINE_WORDS = {"scratch": "scratch", "scratch-matched": "scratch with matched compute"}


#: Below this many paired seeds an interval is computed but said to be unreliable.
RELIABLE_SEEDS = 3
#: The family-wise error rate of the Holm-adjusted decisions.
FAMILY_ALPHA = 0.05


@dataclass(frozen=True)
class PairedStat:
    """Mean of paired differences with its Student-t confidence interval and the two-sided p-value of
    the paired t-test (None for n < 2)."""

    n: int
    mean: float
    low: float | None
    high: float | None
    confidence: float = CONFIDENCE
    p: float | None = None


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
    if sd > 0:
        p = float(2.0 * stats.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))
    else:  # no spread: a difference is certain, no difference is none
        p = 0.0 if mean != 0 else 1.0
    return PairedStat(n, mean, mean - half, mean + half, confidence, p)


def sign_flip_p(differences: Sequence[float]) -> float | None:
    """Two-sided p-value of the mean of paired ``differences`` under the sign-flip permutation
    test: every assignment of signs is equally likely under no difference (exact over the 2^n
    assignments for n <= 16). With five seeds the smallest p it can give is 2/32 = 0.0625."""
    d = [float(x) for x in differences]
    n = len(d)
    if n == 0 or n > 16:
        return None
    observed = abs(math.fsum(d))
    count = 0
    for signs in itertools.product((1.0, -1.0), repeat=n):
        if abs(math.fsum(s * x for s, x in zip(signs, d))) >= observed - 1e-12:
            count += 1
    return count / 2**n


#: Up to this many paired values the bootstrap is enumerated exactly (6,435 distinct resamples at 8,
#: a few hundredths of a second; 92,378 at 10 took over a second a cell).
EXACT_BOOTSTRAP_MAX = 8
#: Beyond it, this many resamples drawn from a fixed seed (the same interval on every call).
BOOTSTRAP_RESAMPLES = 20_000


def bootstrap_interval(
    differences: Sequence[float], confidence: float = CONFIDENCE, exact_max: int = EXACT_BOOTSTRAP_MAX
) -> tuple[float, float] | None:
    """The paired bootstrap's percentile interval of the mean of ``differences``: the
    ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles (the smallest resampled mean
    whose cumulative weight reaches each) of the means of all resamples with replacement. It lies
    within the values' range, so it respects a bounded scale (an accuracy's) where the Student-t
    interval can pass it; at few values it is too narrow, so it is read beside that interval and the
    count of signs, not instead of them. Exact (every resample weighed by its multinomial
    probability) up to ``exact_max`` values, else :data:`BOOTSTRAP_RESAMPLES` drawn from seed 0.
    None for no values."""
    d = [float(x) for x in differences]
    n = len(d)
    if n == 0:
        return None
    if n <= exact_max:
        means = []
        for picks in itertools.combinations_with_replacement(range(n), n):
            counts = [picks.count(i) for i in set(picks)]
            weight = math.factorial(n) / math.prod(math.factorial(c) for c in counts) / n**n
            means.append((math.fsum(d[i] for i in picks) / n, weight))
    else:
        import numpy as np

        draws = np.random.default_rng(0).integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))
        values = np.asarray(d)[draws].mean(axis=1)
        means = [(float(v), 1.0 / BOOTSTRAP_RESAMPLES) for v in values]
    means.sort()

    def quantile(q: float) -> float:
        total = 0.0
        for value, weight in means:
            total += weight
            if total >= q - 1e-12:
                return value
        return means[-1][0]

    return quantile((1.0 - confidence) / 2.0), quantile((1.0 + confidence) / 2.0)


def paired_cells(differences: Sequence[float]) -> str:
    """Four Markdown table cells for paired ``differences`` (points): the mean with its 95%
    Student-t interval, the paired bootstrap's 95% percentile interval (:func:`bootstrap_interval`,
    within the values' range), the exact sign-flip p-value, and how many agree in sign (``missing``
    and three empty cells when there are none)."""
    d = [float(x) for x in differences]
    if not d:
        return "missing | | |"
    stat = paired_stat(d)
    ci = f" [{stat.low:+.1f}, {stat.high:+.1f}]" if stat.low is not None else ""
    low, high = bootstrap_interval(d)
    boot = f"[{low:+.1f}, {high:+.1f}]" if len(d) > 1 else ""
    p = sign_flip_p(d)
    agree = max(sum(x > 0 for x in d), sum(x < 0 for x in d))
    return f"{stat.mean:+.1f}{ci} | {boot} | {'' if p is None else f'{p:.3f}'} | {agree} of {len(d)}"


#: The header cells of :func:`paired_cells`' four columns.
PAIRED_HEADER = "difference [95% CI] | bootstrap 95% | sign-flip p | seeds agreeing in sign"
PAIRED_ALIGN = "---:|---:|---:|---:|"
#: What a reader of those columns needs to know, said under each such table.
PAIRED_NOTE = (
    "The bootstrap's interval (the paired bootstrap's 95% percentile interval) lies within the seeds' "
    "own range, so it respects the accuracy scale where Student's t can pass it, but at a few seeds it "
    "is too narrow: read it beside the t interval, the sign-flip p and the count of signs, not as a test."
)


def holm(pvalues: Sequence[float], alpha: float = FAMILY_ALPHA) -> list[tuple[float, bool]]:
    """Holm's step-down adjustment: (adjusted p-value, rejected at family-wise error ``alpha``) for each
    p-value, in the order given. The k-th smallest of m p-values is multiplied by m - k + 1, made
    non-decreasing in that order and capped at 1; a test is rejected when its adjusted p <= alpha
    (the same decisions as comparing the k-th smallest p with alpha / (m - k + 1) until one fails)."""
    m = len(pvalues)
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return [(a, a <= alpha) for a in adjusted]


@dataclass
class Comparison:
    """One SPT regime against one scratch baseline, for one model, task and training subset."""

    task: str
    label: str
    subset: float | int | None
    regime: str  # the SPT regime
    baseline: str  # scratch or scratch-matched
    metric: str
    higher_is_better: bool
    source: str  # test or val
    seeds: list[int]
    differences: list[float]  # SPT - baseline per paired seed, in the metric's own units
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
            text = (
                f"cannot tell from one seed (SPT − {base} = {fmt.number(s.mean)}{unit} on seed {self.seeds[0]}; "
                "at least 2 seeds with both runs are needed)"
            )
        else:
            text = f"cannot tell: no seed has both the SPT and the {base} run"
        if 2 <= s.n < RELIABLE_SEEDS:
            text += (
                f"; with {s.n} seeds the interval is unreliable (its width rests on {s.n - 1} degree of freedom): "
                f"run {RELIABLE_SEEDS} or more seeds"
            )
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
            raise DataFormatError(
                f"seed {r.seed} of (task {r.task!r}, label {r.label!r}, regime {r.regime!r}) "
                f"appears twice: {seeds[r.seed].path} and {r.path}",
                r.summary_file,
            )
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
        raise DataFormatError(
            f"the runs of {label} on {task} ({regime} and {baseline}) use different metrics {sorted(metrics)}",
            both[0].summary_file,
        )
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


def adjusted(found: Sequence[Comparison]) -> dict[int, tuple[float, bool]]:
    """Holm's (adjusted p, significant) of the comparisons that have a test (2 or more paired seeds),
    by their index in ``found``; empty when there are fewer than two such tests."""
    tested = [i for i, c in enumerate(found) if c.stat.p is not None]
    if len(tested) < 2:
        return {}
    return dict(zip(tested, holm([found[i].stat.p for i in tested])))


def holm_lines(found: Sequence[Comparison]) -> list[str]:
    """The Holm-adjusted decisions as lines (none when the report holds fewer than two tests)."""
    holm_of = adjusted(found)
    if not holm_of:
        return []
    kept = sum(ok for _, ok in holm_of.values())
    lines = [
        f"Holm-adjusted over the {len(holm_of)} comparisons above (family-wise error {FAMILY_ALPHA:.0%}): "
        f"{kept} of {len(holm_of)} significant"
    ]
    for i, (p_adj, ok) in holm_of.items():
        c = found[i]
        lines.append(
            f"  {c.title}: p = {_p(c.stat.p)}, adjusted p = {_p(p_adj)}: "
            + ("significant" if ok else "not significant")
        )
    return lines


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def verdict_text(runs: Sequence[Run]) -> str:
    """The verdicts as plain lines (what ``longrange compare`` prints after the table), then the
    Holm-adjusted decisions when there are several tests."""
    found = comparisons(runs)
    if not found:
        return "Verdict: no SPT and scratch runs of the same model to compare."
    lines = ["Verdict (SPT minus scratch, paired by seed, 95% CI Student t):"]
    lines += [f"  {c.title}: {c.sentence()}" for c in found]
    return "\n".join(lines + holm_lines(found))


def verdict_table(found: Sequence[Comparison]) -> Table:
    subsets = any(c.subset is not None for c in found)
    holm_of = adjusted(found)
    headers = (
        ["SPT", "Baseline", "Task"]
        + (["Train subset"] if subsets else [])
        + ["Paired seeds", "Mean difference", "95% CI", "p"]
        + ([f"Holm-adjusted p ({len(holm_of)} tests)"] if holm_of else [])
        + ["Verdict"]
    )
    rows = []
    for i, c in enumerate(found):
        s, fmt = c.stat, metric_format(c.metric)
        holm_cell = []
        if holm_of:
            holm_cell = [
                f"{_p(holm_of[i][0])} ({'significant' if holm_of[i][1] else 'not significant'})"
                if i in holm_of
                else "—"
            ]
        rows.append(
            [row_name(c.label, c.regime), row_name(c.label, c.baseline), c.task]
            + (["all" if c.subset is None else repr(c.subset)] if subsets else [])
            + [
                str(s.n),
                "—" if s.n == 0 else fmt.number(s.mean),
                f"[{fmt.number(s.low)}, {fmt.number(s.high)}]" if s.n >= 2 else "—",
                _p(s.p) if s.p is not None else "—",
            ]
            + holm_cell
            + [c.sentence()]
        )
    notes = [
        "Differences are SPT − baseline in the tables' units (accuracy in percentage points); “better” follows "
        "whether the metric is higher or lower is better. p: the two-sided paired t-test (p < 0.05 exactly when "
        f"the 95% CI excludes 0). Fewer than {RELIABLE_SEEDS} seeds give an unreliable interval."
    ]
    if holm_of:
        kept = sum(ok for _, ok in holm_of.values())
        notes.append(
            f"This report holds {len(holm_of)} tests: each decision alone errs 5% of the time, so some "
            f"effect is found by chance more often; Holm's adjustment keeps the chance of any false finding "
            f"at {FAMILY_ALPHA:.0%}: {kept} of {len(holm_of)} remain significant."
        )
    return Table(
        "SPT minus scratch, paired by seed: mean and 95% confidence interval (Student t, n−1 d.o.f.)",
        headers,
        rows,
        notes,
    )


def verdict_markdown(runs: Sequence[Run]) -> str:
    """The report's verdict section (empty when there is nothing to compare)."""
    found = comparisons(runs)
    if not found:
        return ""
    return "## Verdict\n\n" + render_markdown(verdict_table(found))
