"""The ranking of the models under each regime and accuracy against labelled examples, on made-up
results whose answers are known."""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_report import write_run

from longrange.report.collect import collect_runs
from longrange.report.ranking import label_curves, ranking_section, ranking_text, rankings


def _runs(root, table):
    """``table``: {(label, regime): [value per seed]}; subsets set in the summaries when given."""
    for (label, regime, subset), values in table.items():
        for seed, v in enumerate(values):
            d = write_run(
                root, label=label, regime=regime, seed=seed, test=v, val=v, name=f"{label}/{subset}/{regime}/seed{seed}"
            )
            summary = json.loads((d / "summary.json").read_text())
            summary.update(train_subset=subset, train_size=subset)
            (d / "summary.json").write_text(json.dumps(summary))
    return collect_runs([root])


def test_ranks_means_and_share_of_seeds_best(tmp_path):
    runs = _runs(
        tmp_path,
        {
            ("A", "scratch", 100): [0.50, 0.60, 0.70, 0.40],
            ("B", "scratch", 100): [0.55, 0.50, 0.70, 0.30],  # tie with A at seed 2
            ("C", "scratch", 100): [0.10, 0.10, 0.10, 0.90],
            ("A", "masked-spt", 100): [0.40, 0.40, 0.40, 0.40],
            ("B", "masked-spt", 100): [0.90, 0.90, 0.90],  # seed 3 missing: rankings use seeds 0-2
            ("C", "masked-spt", 100): [0.20, 0.20, 0.20, 0.20],
        },
    )
    found = {r.regime: r for r in rankings(runs)}
    scratch = {m.label: m for m in found["scratch"].models}
    assert found["scratch"].seeds == (0, 1, 2, 3)
    # seed 0: B A C; seed 1: A B C; seed 2: A=B (1.5 each) C; seed 3: C A B
    assert scratch["A"].mean_rank == pytest.approx((2 + 1 + 1.5 + 2) / 4)
    assert scratch["B"].mean_rank == pytest.approx((1 + 2 + 1.5 + 3) / 4)
    assert scratch["C"].mean_rank == pytest.approx((3 + 3 + 3 + 1) / 4)
    assert scratch["A"].best_share == pytest.approx((0 + 1 + 0.5 + 0) / 4)
    assert scratch["B"].best_share == pytest.approx((1 + 0 + 0.5 + 0) / 4)
    assert scratch["C"].best_share == pytest.approx(0.25)
    assert sum(m.best_share for m in scratch.values()) == pytest.approx(1.0)
    assert scratch["A"].mean == pytest.approx(0.55)
    assert [m.label for m in found["scratch"].models] == ["A", "B", "C"]  # by mean rank
    assert found["scratch"].order == ("A", "B", "C")  # by mean: 0.55, 0.5125, 0.3
    spt = found["masked-spt"]
    assert spt.seeds == (0, 1, 2) and spt.order == ("B", "A", "C")
    assert {m.label: m.best_share for m in spt.models} == {"B": 1.0, "A": 0.0, "C": 0.0}
    text = ranking_section(list(found.values()))
    assert "masked-spt: B > A > C (by mean, 3 seeds): **the order changes** from scratch's A > B > C" in text
    assert "| B | 51.25 (rank 1.9, best 38%) | 90.00 (rank 1.0, best 100%) |" in text
    plain = ranking_text(list(found.values())).splitlines()
    assert plain[0].startswith("Ranking of the models by mean (") and plain[0].endswith(", train subset 100):")
    assert plain[1:] == [
        "  scratch: A > B > C (by mean, 4 seeds)",
        "  masked-spt: B > A > C (by mean, 3 seeds): the order changes from scratch's A > B > C",
    ]
    same = [r for r in found.values() if r.regime == "scratch"] + [
        dataclasses.replace(found["masked-spt"], regime="causal-spt", models=found["scratch"].models)
    ]
    assert ranking_text(same).splitlines()[-1].endswith("the same order as from scratch")


def test_lower_is_better_metrics_rank_the_other_way(tmp_path):
    for label, values in (("A", [1.0, 2.0]), ("B", [3.0, 0.5])):
        for seed, v in enumerate(values):
            write_run(tmp_path, label=label, seed=seed, metric="mse", test=v, val=v, higher_is_better=False)
    (r,) = rankings(collect_runs([tmp_path]))
    assert {m.label: m.best_share for m in r.models} == {"A": 0.5, "B": 0.5}
    assert r.order == ("A", "B")  # means 1.5 and 1.75


def test_accuracy_against_labelled_examples_has_a_panel_per_model(tmp_path):
    from PIL import Image

    table = {}
    for label in ("A", "B"):
        for regime in ("scratch", "masked-spt-all"):
            for n in (250, 1000, 4000):
                table[label, regime, n] = [0.2 + 0.1 * (n / 4000) + (0.1 if regime != "scratch" else 0), 0.25, 0.3]
    runs = _runs(tmp_path / "runs", table)
    path = label_curves(runs, tmp_path / "labels.png")
    assert path is not None and Image.open(path).size[0] > 400
    # one training size only: nothing to draw
    assert label_curves([r for r in runs if r.train_size == 250], tmp_path / "none.png") is None


def test_ties_as_displayed_are_written_equal_and_are_no_change(tmp_path):
    """Means equal to the displayed precision (0.01 point of accuracy) are ties: "A = B", and a tie
    that resolves under a regime does not change the order; a strict reversal does."""
    from longrange.report.ranking import order_reversals

    runs = _runs(
        tmp_path,
        {
            ("A", "scratch", 100): [1.0, 1.0],
            ("B", "scratch", 100): [1.0, 0.99999],
            ("C", "scratch", 100): [0.5, 0.5],
            ("A", "causal-spt", 100): [0.9, 0.9],
            ("B", "causal-spt", 100): [1.0, 1.0],
            ("C", "causal-spt", 100): [0.5, 0.5],
            ("A", "masked-spt", 100): [0.4, 0.4],
            ("B", "masked-spt", 100): [0.3, 0.3],
            ("C", "masked-spt", 100): [0.6, 0.6],
        },
    )
    lines = ranking_text(rankings(runs)).splitlines()[1:]
    assert lines[0] == "  scratch: A = B > C (by mean, 2 seeds)"
    assert lines[1].endswith("B > A > C (by mean, 2 seeds): the same order as from scratch")
    assert lines[2].endswith("C > A > B (by mean, 2 seeds): the order changes from scratch's A = B > C")
    assert order_reversals({"A": 2, "B": 1}, {"A": 1, "B": 2}) == [("A", "B")]
    assert order_reversals({"A": 2, "B": 1}, {"A": 1, "B": 2}, higher_is_better=False) == [("B", "A")]
    assert order_reversals({"A": 1, "B": 1}, {"A": 1, "B": 2}) == []
    assert order_reversals({"A": 2, "B": 1}, {"A": 2, "C": 3}) == []  # models of both only
