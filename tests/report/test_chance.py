"""Chance level: each task's (1 / the possible answers of the generated recall tasks, 1 / classes
of a classification, none for regression), drawn as a dashed line in the learning curves, the
labels plot and the sweep plot, and marked in the tables on the cells that cannot be told from it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from test_report import write_run

from longrange.data.batch import IGNORE_INDEX
from longrange.data.synthetic import generator_of
from longrange.data.tasks import chance_level, get_spec
from longrange.report import plots as P
from longrange.report.chance import CHANCE_MARK, at_chance, run_chance
from longrange.report.collect import collect_runs
from longrange.report.sweep import split_by_subset, sweep_plot, sweep_table
from longrange.report.tables import aggregate, results_table

RECALL = {"vocab_size": 32, "seq_len": 24, "n_pairs": 4}  # the demo's setting: 16 values, chance 6.25%


@pytest.mark.parametrize(
    "task, options, chance",
    [
        ("associative-recall", RECALL, 1 / 16),
        ("associative-recall", {}, 1 / 4096),
        ("induction-heads", {"vocab_size": 16}, 1 / 15),  # data tokens 0..14: the trigger is never the answer
        ("selective-copying", {"vocab_size": 16}, 1 / 14),  # data tokens 1..14: not noise, not the marker
        ("mqar", {}, 1 / 4096),
        ("listops", {}, 1 / 10),
        ("pathfinder", {}, 1 / 2),
        ("bidmc", {}, None),  # regression: no chance level
    ],
)
def test_each_task_has_its_chance_level(task, options, chance):
    level = chance_level(get_spec(task, **options))
    assert level == chance if chance is None else level == pytest.approx(chance)


@pytest.mark.parametrize(
    "task, options",
    [
        ("induction-heads", {"vocab_size": 6, "seq_len": 12}),
        ("selective-copying", {"vocab_size": 6, "seq_len": 16, "n_tokens": 4}),
        ("mqar", {"vocab_size": 10, "seq_len": 16, "n_pairs": 2}),
        ("associative-recall", {"vocab_size": 10, "seq_len": 10, "n_pairs": 2}),
    ],
)
def test_the_answers_counted_are_those_the_generator_draws(task, options):
    gen = generator_of(task, options)
    rng = np.random.default_rng(0)
    answers = set()
    for _ in range(400):
        ex = gen.draw(rng)
        answers |= {ex.label} if ex.label is not None else set(ex.targets[ex.targets != IGNORE_INDEX].tolist())
    assert len(answers) == gen.n_answers == round(1 / chance_level(get_spec(task, **options)))


def test_induction_heads_chance_loss_is_ln_15_at_vocabulary_16():
    gen = generator_of("induction-heads", {"vocab_size": 16})
    assert gen.n_answers == 15 and math.log(gen.n_answers) == pytest.approx(2.70805, abs=1e-5)


def test_a_cell_is_at_chance_when_its_interval_holds_it_or_its_mean_is_below():
    assert at_chance(0.07, 0.01, 0.0625) and not at_chance(0.2, 0.05, 0.0625)
    assert at_chance(0.06, None, 0.0625) and not at_chance(0.07, None, 0.0625)  # one seed: at or below only
    assert not at_chance(0.05, 0.01, None)


def recall_runs(root, cells: dict[tuple[str, str], list[float]], subset=None, options=RECALL):
    """Made-up associative-recall runs (config with the task's options): one per value, seeds 0, 1, ..."""
    for (label, regime), values in cells.items():
        for seed, v in enumerate(values):
            d = write_run(
                root,
                task="associative-recall",
                label=label,
                regime=regime,
                seed=seed,
                test=v,
                val=v,
                curve=((10, v / 2), (20, v)),
                name=f"{label}/{subset}/{regime}/seed{seed}" if subset is not None else None,
                stage="finetune" if regime.endswith("spt") else "train",
            )
            cfg = yaml.safe_load((d / "config.yaml").read_text())
            cfg["task"]["options"] = dict(options)
            (d / "config.yaml").write_text(yaml.safe_dump(cfg))
            if subset is not None:
                import json

                summary = json.loads((d / "summary.json").read_text())
                summary.update(train_subset=subset, train_size=subset)
                (d / "summary.json").write_text(json.dumps(summary))


def test_the_table_marks_a_cell_at_chance_and_not_one_above_it(tmp_path):
    recall_runs(
        tmp_path,
        {
            ("DLR", "scratch"): [0.05, 0.07, 0.065],
            ("DLR", "causal-spt"): [0.9, 0.95, 0.97],
            ("S4D", "scratch"): [0.070],
            ("S4D", "causal-spt"): [0.055],
        },
    )
    runs = collect_runs([tmp_path])
    assert {run_chance(r) for r in runs} == {1 / 16}
    table = results_table(aggregate(runs))
    rows = {row[0]: row[1] for row in table.rows}
    assert rows["DLR"].endswith(CHANCE_MARK) and rows["DLR"].startswith("6.17 ± ")
    assert CHANCE_MARK not in rows["DLR + causal SPT"]
    assert CHANCE_MARK not in rows["S4D"] and rows["S4D + causal SPT"] == f"5.50 (n=1) {CHANCE_MARK}"
    note = next(n for n in table.notes if n.startswith("Chance level"))
    assert (
        "associative-recall 6.25% (1 in 16)" in note and f"{CHANCE_MARK}: the cell's 95% interval contains it" in note
    )


def test_no_mark_and_no_line_without_a_chance_level(tmp_path):
    write_run(tmp_path, task="bidmc", metric="r2", test=0.0, val=0.0)  # regression
    write_run(
        tmp_path,
        task="listops",
        stage="pretrain",
        regime="masked-spt",
        metric="loss",
        test=2.3,
        val=2.3,
        higher_is_better=False,
    )
    runs = collect_runs([tmp_path])
    assert [run_chance(r) for r in runs] == [None, None]
    assert not any(n.startswith("Chance level") for n in results_table(aggregate(runs)).notes)
    panels, _ = P.curve_panels(runs)
    assert [p.chance for p in panels] == [None, None]
    fig = P.curves_figure(panels)
    assert not [line for ax in fig.axes for line in ax.get_lines() if line.get_label() == "chance"]


def chance_lines(fig) -> list:
    return [line for ax in fig.axes if ax.get_visible() for line in ax.get_lines() if line.get_label() == "chance"]


def assert_chance_line(fig, level_percent: float, axes: int) -> None:
    lines = chance_lines(fig)
    assert len(lines) == axes
    for line in lines:
        assert line.get_linestyle() == "--"
        assert list(line.get_ydata()) == [pytest.approx(level_percent)] * 2
    legend = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert legend[-1] == f"chance level {level_percent:g}% (1 in 16)"


def test_the_learning_curves_draw_the_chance_line(tmp_path, monkeypatch):
    recall_runs(tmp_path, {("DLR", "scratch"): [0.05, 0.07], ("S4D", "scratch"): [0.5, 0.6]})
    runs = collect_runs([tmp_path])
    panels, _ = P.curve_panels(runs)
    assert [p.chance for p in panels] == [1 / 16, 1 / 16]
    seen = {}
    monkeypatch.setattr(P, "_save", lambda fig, path: seen.setdefault("fig", fig) and path)
    P.learning_curves(runs, tmp_path / "curves.png")
    assert_chance_line(seen["fig"], 6.25, axes=2)


def test_the_labels_and_sweep_plots_draw_the_chance_line(tmp_path, monkeypatch):
    from longrange.report.ranking import label_curves

    for subset in (250, 1000):
        recall_runs(tmp_path, {("DLR", "scratch"): [0.06, 0.07], ("DLR", "causal-spt"): [0.9, 0.92]}, subset=subset)
    runs = collect_runs([tmp_path])
    closed = []
    monkeypatch.setattr(P.plt, "close", lambda fig=None: closed.append(fig))
    assert label_curves(runs, tmp_path / "labels.png").is_file()
    assert_chance_line(closed[-1], 6.25, axes=1)
    groups = split_by_subset(runs)
    assert sweep_plot(groups, tmp_path / "sweep.png").is_file()
    assert_chance_line(closed[-1], 6.25, axes=1)
    # and the labels table marks the cells at chance
    table = sweep_table(groups, "associative-recall")
    rows = {row[0]: row[1:] for row in table.rows}
    assert all(cell.endswith(CHANCE_MARK) for cell in rows["DLR"])
    assert not any(CHANCE_MARK in cell for cell in rows["DLR + causal SPT"])
    assert any(n.startswith("Chance level") for n in table.notes)
