"""The verdict computed from the runs (paired by seed, Student t) and the data-fraction sweep in reports."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from PIL import Image
from scipy import stats

from longrange.errors import DataFormatError
from longrange.report import write_report
from longrange.report.collect import collect_runs
from longrange.report.sweep import confidence_band, split_by_subset, sweep_csv_text, sweep_plot, sweep_tables
from longrange.report.verdict import (
    bootstrap_interval,
    comparisons,
    paired_cells,
    paired_stat,
    verdict_markdown,
    verdict_text,
)


def put_run(
    root: Path,
    *,
    regime="scratch",
    seed=0,
    test=0.5,
    label="S4",
    task="listops",
    metric="accuracy",
    higher_is_better=True,
    subset=None,
    size=None,
    stage=None,
) -> Path:
    """A made-up finished run: summary.json (and a config.yaml, as every run directory has)."""
    stage = stage or ("finetune" if regime.endswith("-spt") else "train")
    part = "" if subset is None else f"/subset{subset!r}"
    d = root / f"{task}/{label}{part}/{regime}/seed{seed}/{stage}"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(f"task: {{name: {task}}}\n")
    summary = {
        "task": task,
        "label": label,
        "regime": regime,
        "stage": stage,
        "seed": seed,
        "metric": metric,
        "higher_is_better": higher_is_better,
        "best_val": {metric: test},
        "test": {metric: test},
        "steps": 10,
        "params": {"total": 100, "in_primitives": 40},
        "seconds": 1.0,
    }
    if subset is not None:
        summary.update(train_subset=subset, train_size=size)
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def runs_of(root: Path, scratch: dict[int, float], spt: dict[int, float], **kw):
    for seed, v in scratch.items():
        put_run(root, regime="scratch", seed=seed, test=v, **kw)
    for seed, v in spt.items():
        put_run(root, regime="masked-spt", seed=seed, test=v, **kw)
    return collect_runs([root], warn=lambda m: None)


# ---------------------------------------------------------------------- statistics
@pytest.mark.parametrize(
    "a, b", [([0.61, 0.64, 0.59, 0.66], [0.55, 0.60, 0.58, 0.57]), ([1.0, 2.5, 2.0], [1.5, 2.0, 2.2])]
)
def test_paired_stat_matches_scipy(a, b):
    d = [x - y for x, y in zip(a, b)]
    s = paired_stat(d)
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert s.n == len(a) and s.mean == pytest.approx(sum(d) / len(d))
    assert (s.low, s.high) == pytest.approx((ci.low, ci.high), rel=1e-10)
    half = stats.t.ppf(0.975, len(d) - 1) * stats.tstd(d) / math.sqrt(len(d))
    assert s.high - s.mean == pytest.approx(half, rel=1e-10)


def test_paired_stat_small_samples():
    assert paired_stat([]).n == 0 and math.isnan(paired_stat([]).mean)
    one = paired_stat([0.3])
    assert (one.n, one.mean, one.low, one.high) == (1, 0.3, None, None)
    same = paired_stat([0.2, 0.2, 0.2])  # no spread: the interval is the point
    assert same.low == pytest.approx(0.2) and same.high == pytest.approx(0.2)


# ---------------------------------------------------------------------- wording
def test_an_effect_is_spt_better_with_its_interval(tmp_path):
    runs = runs_of(tmp_path, {0: 0.50, 1: 0.52, 2: 0.51}, {0: 0.60, 1: 0.61, 2: 0.63})
    (c,) = comparisons(runs)
    assert (c.regime, c.baseline, c.seeds, c.outcome) == ("masked-spt", "scratch", [0, 1, 2], "spt")
    ci = stats.ttest_rel([0.60, 0.61, 0.63], [0.50, 0.52, 0.51]).confidence_interval(0.95)
    assert c.sentence() == f"SPT better by 10.33 points (95% CI [{ci.low * 100:.2f}, {ci.high * 100:.2f}], 3 seeds)"
    assert "S4 + masked SPT vs S4 on listops: SPT better by 10.33 points" in verdict_text(runs)


def test_no_effect_says_the_interval_contains_zero(tmp_path):
    runs = runs_of(tmp_path, {0: 0.50, 1: 0.60}, {0: 0.55, 1: 0.56})
    (c,) = comparisons(runs)
    assert c.outcome == "none"
    assert c.sentence().startswith("no difference detectable at this scale (95% CI [")
    assert "contains 0, 2 seeds); with 2 seeds the interval is unreliable" in c.sentence()


def test_a_reversed_effect_is_scratch_better(tmp_path):
    runs = runs_of(tmp_path, {0: 0.70, 1: 0.72, 2: 0.71}, {0: 0.60, 1: 0.61, 2: 0.63})
    (c,) = comparisons(runs)
    assert c.outcome == "baseline" and c.sentence().startswith("scratch better by 9.67 points (95% CI [-")


def test_lower_is_better_follows_the_metric(tmp_path):
    kw = dict(metric="mse", higher_is_better=False)
    runs = runs_of(tmp_path, {0: 0.50, 1: 0.52, 2: 0.51}, {0: 0.40, 1: 0.41, 2: 0.42}, **kw)
    (c,) = comparisons(runs)
    assert c.outcome == "spt" and c.sentence().startswith("SPT better by 0.100 in mse (95% CI [-0.1")


def test_one_seed_cannot_tell(tmp_path):
    runs = runs_of(tmp_path, {0: 0.50}, {0: 0.60})
    (c,) = comparisons(runs)
    assert c.outcome == "unknown"
    assert c.sentence().startswith("cannot tell from one seed (SPT − scratch = 10.00 points on seed 0")


def test_unpaired_seeds_are_dropped_and_counted(tmp_path):
    runs = runs_of(tmp_path, {0: 0.50, 1: 0.52, 2: 0.51, 3: 0.9}, {0: 0.60, 1: 0.61, 2: 0.63, 4: 0.1})
    (c,) = comparisons(runs)
    assert c.seeds == [0, 1, 2] and c.unpaired == {3: "no masked-spt run", 4: "no scratch run"}
    assert c.stat.mean == pytest.approx((0.10 + 0.09 + 0.12) / 3)
    assert c.sentence().endswith("; 2 unpaired seeds left out (seed 3: no masked-spt run, seed 4: no scratch run)")
    only_spt = runs_of(tmp_path / "b", {}, {0: 0.6})
    assert comparisons(only_spt) == []
    disjoint = runs_of(tmp_path / "c", {0: 0.5}, {1: 0.6})
    assert comparisons(disjoint)[0].sentence().startswith("cannot tell: no seed has both")


def test_each_spt_regime_against_scratch_and_matched_scratch(tmp_path):
    runs_of(tmp_path, {0: 0.5, 1: 0.5}, {0: 0.6, 1: 0.6})
    for seed in (0, 1):
        put_run(tmp_path, regime="causal-spt", seed=seed, test=0.55)
        put_run(tmp_path, regime="scratch-matched", seed=seed, test=0.7 + seed / 100)
    found = comparisons(collect_runs([tmp_path], warn=lambda m: None))
    assert [(c.regime, c.baseline) for c in found] == [
        ("causal-spt", "scratch"),
        ("masked-spt", "scratch"),
        ("causal-spt", "scratch-matched"),
        ("masked-spt", "scratch-matched"),
    ]
    assert found[3].sentence().startswith("scratch with matched compute better by")
    md = verdict_markdown(collect_runs([tmp_path], warn=lambda m: None))
    assert md.startswith("## Verdict") and "| S4 + masked SPT | S4 (scratch, matched compute) | listops | 2 |" in md


# ---------------------------------------------------------------------- few seeds, several tests
def test_paired_stat_gives_the_p_value_of_the_paired_t_test():
    a, b = [0.61, 0.64, 0.59, 0.66], [0.55, 0.60, 0.58, 0.57]
    s = paired_stat([x - y for x, y in zip(a, b)])
    assert s.p == pytest.approx(stats.ttest_rel(a, b).pvalue, rel=1e-10)
    assert paired_stat([1.0, 2.0, 3.0]).p == pytest.approx(stats.ttest_1samp([1, 2, 3], 0).pvalue, rel=1e-10)
    assert paired_stat([0.2, 0.2]).p == 0.0 and paired_stat([0.0, 0.0]).p == 1.0 and paired_stat([0.3]).p is None
    # the interval excludes 0 exactly when p < 0.05
    for d in ([0.1, 0.2, 0.15], [0.1, -0.05, 0.2], [-0.3, -0.2, -0.25, -0.1]):
        t = paired_stat(d)
        assert (t.p < 0.05) == (t.low > 0 or t.high < 0)


def test_holm_adjusts_known_p_values():
    from longrange.report.verdict import holm

    # m = 4: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 -> 0.02, 0.03, 0.06, 0.04 -> monotone 0.06
    out = holm([0.01, 0.04, 0.03, 0.005])
    assert [a for a, _ in out] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [ok for _, ok in out] == [True, False, False, True]
    assert holm([0.5, 0.9]) == [(1.0, False), (1.0, False)] and holm([0.001]) == [(0.001, True)]


def test_two_seeds_say_the_interval_is_unreliable(tmp_path):
    """The issue's case: an interval that excludes 0 at 2 seeds is reported, with the caution."""
    runs = runs_of(tmp_path, {0: 0.50, 1: 0.60}, {0: 0.48, 1: 0.5805})
    (c,) = comparisons(runs)
    assert c.outcome == "baseline" and c.stat.n == 2
    assert c.sentence().endswith(
        "2 seeds); with 2 seeds the interval is unreliable (its width rests on 1 degree "
        "of freedom): run 3 or more seeds"
    )
    three = comparisons(runs_of(tmp_path / "three", {0: 0.50, 1: 0.52, 2: 0.51}, {0: 0.60, 1: 0.61, 2: 0.63}))[0]
    assert "unreliable" not in three.sentence()


def test_several_tests_get_holm_adjusted_decisions(tmp_path):
    """Four comparisons with known p-values: the verdict says how many, and which survive Holm."""
    strong = ({0: 0.50, 1: 0.52, 2: 0.51, 3: 0.50}, {0: 0.60, 1: 0.61, 2: 0.63, 3: 0.60})  # p < 0.001
    weak = ({0: 0.50, 1: 0.52, 2: 0.51, 3: 0.50}, {0: 0.53, 1: 0.54, 2: 0.55, 3: 0.51})  # p = 0.030 alone
    none = ({0: 0.50, 1: 0.60, 2: 0.55, 3: 0.50}, {0: 0.55, 1: 0.56, 2: 0.50, 3: 0.52})  # p > 0.5
    for label, (scratch, spt) in {"A": strong, "B": weak, "C": none, "D": strong}.items():
        runs_of(tmp_path, scratch, spt, label=label)
    runs = collect_runs([tmp_path], warn=lambda m: None)
    found = comparisons(runs)
    assert len(found) == 4
    ps = [c.stat.p for c in found]
    expected = [
        stats.ttest_rel(list(spt.values()), list(scratch.values())).pvalue
        for scratch, spt in (strong, weak, none, strong)
    ]
    assert ps == pytest.approx(expected, rel=1e-9)
    assert found[1].outcome == "spt" and 0.01 < ps[1] < 0.05  # significant alone ...
    from longrange.report.verdict import holm

    decisions = [ok for _, ok in holm(ps)]
    assert decisions == [True, False, False, True]  # ... but not over 4 tests
    text = verdict_text(runs)
    assert "Holm-adjusted over the 4 comparisons above (family-wise error 5%): 2 of 4 significant" in text
    assert (
        f"B + masked SPT vs B on listops: p = {ps[1]:.3f}, adjusted p = {min(1, ps[1] * 2):.3f}: not significant"
        in text
    )
    md = verdict_markdown(runs)
    assert "| Holm-adjusted p (4 tests) |" in md and "2 of 4 remain significant" in md
    single = verdict_text(runs_of(tmp_path / "one", *strong))
    assert "Holm" not in single  # one test: nothing to adjust


def test_duplicate_seed_is_an_error(tmp_path):
    runs = runs_of(tmp_path, {0: 0.5}, {0: 0.6})
    with pytest.raises(DataFormatError, match="appears twice"):
        comparisons(runs + runs[:1])


# ---------------------------------------------------------------------- sweep
def sweep_tree(root: Path) -> None:
    for subset, size, base in ((0.1, 10, 0.3), (1.0, 100, 0.6)):
        for seed in (0, 1):
            put_run(root, regime="scratch", seed=seed, test=base + seed / 100, subset=subset, size=size)
            put_run(root, regime="masked-spt", seed=seed, test=base + 0.1 + seed / 50, subset=subset, size=size)
            put_run(
                root,
                regime="masked-spt",
                stage="pretrain",
                seed=seed,
                test=1.0,
                subset=subset,
                size=size,
                metric="loss",
                higher_is_better=False,
            )


def test_sweep_groups_tables_and_csv(tmp_path):
    sweep_tree(tmp_path)
    runs = collect_runs([tmp_path], warn=lambda m: None)
    groups = split_by_subset(runs)
    assert [g.subset for g in groups] == [0.1, 1.0] and [g.train_size() for g in groups] == [10, 100]
    text = sweep_tables(groups)
    assert (
        "## Train subset 0.1 (10 training examples)" in text and "## Train subset 1.0 (100 training examples)" in text
    )
    assert "| Model | 0.1 (n_train=10) | 1.0 (n_train=100) |" in text
    assert "| S4 + masked SPT | 41.00 ± 12.71 | 71.00 ± 12.71 |" in text
    rows = list(csv.DictReader(io.StringIO(sweep_csv_text(groups))))
    assert [(r["train_subset"], r["train_size"], r["regime"], r["kind"]) for r in rows if r["kind"] == "final"] == [
        ("0.1", "10", "scratch", "final"),
        ("0.1", "10", "masked-spt", "final"),
        ("1.0", "100", "scratch", "final"),
        ("1.0", "100", "masked-spt", "final"),
    ]
    found = comparisons(runs)
    assert [(c.subset, c.seeds) for c in found] == [(0.1, [0, 1]), (1.0, [0, 1])]


def test_no_sweep_keeps_the_report_as_it_was(tmp_path):
    runs = runs_of(tmp_path, {0: 0.5, 1: 0.52}, {0: 0.6, 1: 0.61})
    groups = split_by_subset(runs)
    assert len(groups) == 1 and groups[0].subset is None
    from longrange.report.tables import aggregate, csv_text, markdown_tables

    assert sweep_tables(groups) == markdown_tables(aggregate(runs))
    assert sweep_csv_text(groups) == csv_text(aggregate(runs))
    assert sweep_plot(groups, tmp_path / "sweep.png") is None


def test_confidence_band_is_clipped_to_the_metric_range():
    assert confidence_band(0.98, 0.05, "accuracy") == (pytest.approx(0.93), 1.0)
    assert confidence_band(0.02, 0.05, "mse") == (0.0, pytest.approx(0.07))
    assert confidence_band(0.5, 2.0, "r2") == (pytest.approx(-1.5), 1.0)
    assert confidence_band(0.5, 2.0, "something") == (pytest.approx(-1.5), pytest.approx(2.5))
    assert all(math.isnan(v) for v in confidence_band(0.5, None, "accuracy"))


def test_report_of_a_sweep_has_the_plot_table_and_verdict(tmp_path):
    sweep_tree(tmp_path)
    text = write_report([tmp_path], out_dir=tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "## Metric against the training subset" in text and "## Verdict" in md
    assert "| S4 + masked SPT | S4 | listops | 0.1 | 2 |" in md
    assert "![metric against the training subset](sweep.png)" in md
    for name in ("sweep.png", "bars_subset0.1.png", "learning_curves_subset1.0.png"):
        assert name in md or name == "learning_curves_subset1.0.png"
    with Image.open(tmp_path / "sweep.png") as im:
        assert im.size[0] > 100
    assert (tmp_path / "bars_subset0.1.png").is_file() and (tmp_path / "bars_subset1.0.png").is_file()


def test_mixed_fractions_and_counts_plot_against_the_train_size(tmp_path):
    put_run(tmp_path, subset=0.5, size=50, seed=0)
    put_run(tmp_path, subset=20, size=20, seed=0)
    put_run(tmp_path, subset=5, size=None, seed=0)
    notes = []
    groups = split_by_subset(collect_runs([tmp_path], warn=lambda m: None))
    assert [g.subset for g in groups] == [20, 0.5, 5]  # by size; unknown sizes last
    assert sweep_plot(groups, tmp_path / "sweep.png", warn=notes.append).is_file()
    assert notes == ["listops: the training set size of subset(s) 5 examples is not recorded; not plotted"]


def test_one_labelled_subset_with_pretraining_on_all_inputs_is_no_sweep(tmp_path):
    """Pretraining on all inputs (a group without final runs) beside one labelled subset: no table or plot
    against the subset, no empty results table, and the pretraining under a heading that says what it is."""
    for seed in (0, 1):
        put_run(tmp_path, regime="scratch", seed=seed, subset=250, size=250)
        put_run(tmp_path, regime="causal-spt-all", seed=seed, subset=250, size=250, stage="finetune")
        put_run(tmp_path, regime="causal-spt-all", seed=seed, stage="pretrain")
    groups = split_by_subset(collect_runs([tmp_path]))
    text = sweep_tables(groups)
    assert "Metric against the training subset" not in text and "No final-stage" not in text
    assert "## Train subset 250 examples (250 training examples)" in text
    assert "## Pretraining on all training inputs" in text
    assert sweep_plot(groups, tmp_path / "sweep.png") is None and not (tmp_path / "sweep.png").exists()
    put_run(tmp_path, regime="scratch", seed=0, subset=1000, size=1000)  # a second labelled subset: a sweep
    assert "Metric against the training subset" in sweep_tables(split_by_subset(collect_runs([tmp_path])))


def _bootstrap_by_every_ordered_resample(d, confidence=0.95):
    """The percentile interval written out: every one of the n^n ordered resamples, equally likely."""
    import itertools

    means = sorted(math.fsum(pick) / len(d) for pick in itertools.product(d, repeat=len(d)))

    def quantile(q):
        for i, value in enumerate(means, start=1):
            if i / len(means) >= q - 1e-12:
                return value

    return quantile((1 - confidence) / 2), quantile((1 + confidence) / 2)


@pytest.mark.parametrize(
    "d", [[0.0, 10.0], [1.0, 2.0, 3.0], [5.0, -3.0, 80.0, 2.5], [99.0, 100.0, 100.0, -100.0, 40.0], [7.0] * 5]
)
def test_the_bootstrap_interval_is_the_percentiles_of_every_resample(d):
    low, high = bootstrap_interval(d)
    exp_low, exp_high = _bootstrap_by_every_ordered_resample(d)
    assert low == pytest.approx(exp_low, abs=1e-9) and high == pytest.approx(exp_high, abs=1e-9)
    assert min(d) <= low <= high <= max(d)


def test_the_bootstrap_interval_respects_the_scale_where_the_t_interval_does_not():
    d = [100.0, 100.0, 100.0, 100.0, -20.0]  # four seeds solve the task with SPT, one loses 20 points
    stat = paired_stat(d)
    low, high = bootstrap_interval(d)
    assert stat.high > 140  # Student-t: beyond +100 points, a gain no accuracy can have
    assert (low, high) == (pytest.approx(28.0), 100.0)  # the resampled means: within [-20, 100]
    assert bootstrap_interval([]) is None and bootstrap_interval([3.0]) == (3.0, 3.0)


def test_the_sampled_bootstrap_beyond_the_exact_size_is_repeatable_and_close_to_exact():
    d = [3.0, -1.0, 8.0, 0.5, 12.0, -4.0, 6.0, 2.0, 9.0]
    exact = bootstrap_interval(d, exact_max=len(d))
    sampled = bootstrap_interval(d)  # beyond EXACT_BOOTSTRAP_MAX: sampled
    assert sampled == bootstrap_interval(d)  # a fixed seed: the same interval each time
    assert sampled == pytest.approx(exact, abs=0.3)


def test_paired_cells_are_four_cells_each_way():
    assert paired_cells([]).count("|") == 3 and paired_cells([5.0, 7.0]).count("|") == 3
    assert paired_cells([4.0]) == "+4.0 |  | 1.000 | 1 of 1"  # one seed: no interval of either kind
    assert paired_cells([0.0, 10.0]).startswith("+5.0 [") and "| [+0.0, +10.0] | 1.000 | 1 of 2" in paired_cells(
        [0.0, 10.0]
    )
