"""benchmarks/recall_spt.py: every setting is a valid comparison, and the paired table computes
what it says (known differences on planted results)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import repo_scripts

from longrange.experiment.params import model_size

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "recall_spt.py"


@pytest.fixture(scope="module")
def harness():
    return repo_scripts.load(SCRIPT)


def test_every_setting_is_a_valid_comparison_of_its_models(harness):
    for name, s in harness.SETTINGS.items():
        exps = harness.experiments(name, [0, 1])
        assert [e.label.split(" ")[0] for e in exps] == s["models"], name
        for e in exps:
            assert e.compare.train_subsets == s["labels"] and e.compare.objectives == s["objectives"], name
            assert e.compare.pretrain_data == s["pretrain_data"] and e.compare.seeds == [0, 1]
            assert e.compare.compute_matched == s["matched"], name
            assert e.model.n_layers == 2 and e.model.direction == "causal"
            assert e.task.name == harness.TASKS[s["task"]]["name"]


def test_parameter_matched_rows_are_within_two_percent_of_the_transformer(harness):
    transformer = model_size(harness.experiments("ar-small-recall3", [0])[0])["total"]
    matched = harness.experiments("ar-small-recall3-pmatch", [0])
    assert [e.label for e in matched] == ["S4D (width 132)", "DLR (width 139)"]
    for e in matched:
        assert abs(model_size(e)["total"] / transformer - 1) < 0.02, e.label


def test_the_confirmation_is_the_screened_setting_restricted(harness):
    """The confirmation runs ar-small-recall3 field by field, only fewer models and label counts."""
    screened = harness.SETTINGS["ar-small-recall3"]
    by_label = {e.label: e for e in harness.experiments("ar-small-recall3", [5])}
    for name in ("ar-small-recall3-confirm", "ar-small-recall3-confirm-dlr"):
        confirm = harness.SETTINGS[name]
        differ = {k for k in screened if screened[k] != confirm[k]}
        assert differ == {"models", "labels", "note"}, name
        assert set(confirm["models"]) < set(screened["models"]) and set(confirm["labels"]) < set(screened["labels"])
        for e in harness.experiments(name, [5]):
            want = by_label[e.label]
            assert (e.model, e.task, e.train, e.pretrain) == (want.model, want.task, want.train, want.pretrain)


def test_each_claim_setting_changes_one_thing_of_the_screened_setting(harness):
    """-pmatch, -pre1000, -subset and mqar-small-text test the screened claim (causal SPT against scratch
    at 250 and 1,000 labels) under one change each, and nothing else differs."""
    screened = harness.SETTINGS["ar-small-recall3"]
    changes = {
        "ar-small-recall3-pmatch": {"models", "widths"},
        "ar-small-recall3-pre1000": {"models", "pre_steps"},
        "ar-small-recall3-subset": {"pretrain_data"},
        "mqar-small-text": {"task"},
    }
    for name, changed in changes.items():
        s = harness.SETTINGS[name]
        assert (s["objectives"], s["labels"], s["matched"]) == (["causal"], [250, 1000], False), name
        differ = {k for k in screened if screened[k] != s[k]} - {"objectives", "labels", "matched", "note"}
        assert differ == changed, name
        exps = harness.experiments(name, [0])
        assert not exps[0].compare.compute_matched and exps[0].compare.objectives == ["causal"]


def test_confirmation_seeds_are_kept_out_of_the_screen(harness, capsys):
    with pytest.raises(SystemExit):
        harness.main(["screen", "ar-small-recall3", "--seeds", "0,5"])
    assert "kept for the confirmation" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        harness.main(["screen", "no-such-setting"])


def _row(model, regime, seed, acc, labels=250, stage="final"):
    return {
        "setting": "s",
        "model": model,
        "regime": regime,
        "stage": stage,
        "labels": labels,
        "seed": seed,
        "run": f"{model}/{regime}/{labels}/seed{seed}/{stage}",
        "params": 1000,
        "val": {"accuracy": acc},
        "test": {"accuracy": acc / 2},
        "metric": "accuracy",
    }


def test_paired_table_on_planted_results(harness):
    rows = []
    for seed, (scratch, spt) in enumerate([(0.10, 0.90), (0.20, 0.90), (0.30, 0.90)]):
        rows += [
            _row("Transformer", "scratch", seed, scratch),
            _row("Transformer", "scratch-matched", seed, scratch),
            _row("Transformer", "causal-spt-all", seed, spt),
            _row("Transformer", "masked-spt-all", seed, scratch),
            _row("Transformer", "causal-spt-all", seed, 0.5, stage="pretrain"),
        ]
    table = harness.paired_table(rows, "val").splitlines()
    assert len(table) == 3
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    # scratch mean 20.0, SPT 90.0; differences 80, 70, 60: mean +70.0, t(2) 95% interval 70 +- 4.303 * 10 / sqrt(3)
    assert cells[3:7] == ["20.0", "20.0", "90.0", "20.0"]
    assert cells[7] == "+70.0 [+45.2, +94.8]"
    assert cells[8] == "+0.0 [+0.0, +0.0]"
    assert cells[-1] == "3"
    test = harness.paired_table(rows, "test", seeds=[0, 1]).splitlines()[2]
    # the test split (planted as half the validation accuracy), seeds 0 and 1 only: scratch (5 + 10) / 2
    assert "| 7.5 | 7.5 | 45.0 | 7.5 | +37.5 [+5.7, +69.3] |" in test and test.strip().endswith("| 2 |")


def test_the_probe_reads_recall_accuracy_of_every_pretraining_run(harness, tmp_path):
    """probe_points: per model and objective, each seed's validation recall accuracy (%) by step; plots draws it."""
    import json

    for model, regime, seed, accs in (
        ("Transformer", "causal-spt-all", 0, [0.1, 1.0]),
        ("Transformer", "causal-spt-all", 1, [0.2, 0.9]),
        ("Mamba-S6", "masked-spt-all", 0, [0.05, 0.3]),
    ):
        d = tmp_path / "s" / "associative-recall" / model / regime / f"seed{seed}" / "pretrain"
        d.mkdir(parents=True)
        (d / "config.yaml").write_text("task: {name: associative-recall}\n")
        (d / "summary.json").write_text(
            json.dumps(
                {
                    "task": "associative-recall",
                    "label": model,
                    "regime": regime,
                    "stage": "pretrain",
                    "seed": seed,
                    "metric": "loss",
                    "higher_is_better": False,
                    "best_val": {"loss": 1.0},
                    "test": None,
                    "steps": 500,
                    "params": {"total": 10, "in_primitives": 5},
                    "seconds": 1.0,
                }
            )
        )
        lines = [
            {
                "step": 250 * (i + 1),
                "epoch": 1.0,
                "split": split,
                "lr": 0.001,
                "elapsed": 1.0,
                "metrics": {"loss": 1.0, "recall_accuracy": a},
            }
            for i, a in enumerate(accs)
            for split in ("train", "val")
        ]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    found = harness.probe_points(tmp_path, ["s"])
    assert found == {
        ("Transformer", "causal-spt-all"): {0: {250: 10.0, 500: 100.0}, 1: {250: 20.0, 500: 90.0}},
        ("Mamba-S6", "masked-spt-all"): {0: {250: 5.0, 500: 30.0}},
    }
    written = harness.plots(tmp_path, ["s"], tmp_path / "img")
    assert [p.name for p in written] == ["recall_pretraining.png"] and written[0].stat().st_size > 0


def test_ranking_table_orders_models_and_says_when_the_order_changes(harness):
    rows = []
    for seed in (0, 1):
        rows += [
            _row("A", "scratch", seed, 0.9),
            _row("B", "scratch", seed, 0.5),
            _row("C", "scratch", seed, 0.1),
            _row("A", "causal-spt-all", seed, 0.6),
            _row("B", "causal-spt-all", seed, 1.0),
            _row("C", "causal-spt-all", seed, 0.2),
            _row("A", "scratch-matched", seed, 1.0),
            _row("B", "scratch-matched", seed, 1.0),
            _row("C", "scratch-matched", seed, 0.3),
        ]
    lines = harness.ranking_table(rows, "val").splitlines()[2:]
    assert lines == [
        "| s | 250 | scratch | A 90.0 > B 50.0 > C 10.0 | – |",
        "| s | 250 | scratch-matched | A 100.0 = B 100.0 > C 30.0 | same |",  # a tie is no change
        "| s | 250 | causal-spt-all | B 100.0 > A 60.0 > C 20.0 | **changes** |",
    ]
    assert "A 45.0 > B 25.0" in harness.ranking_table(rows, "test")  # the test split: halves in _row


def test_the_confirmations_are_ranked_together_as_the_setting_they_restrict(harness):
    rows = [
        dict(_row(m, "scratch", seed, acc), setting=setting)
        for seed in (5, 6)
        for m, acc, setting in (
            ("Transformer", 0.6, "ar-small-recall3-confirm"),
            ("DLR", 0.9, "ar-small-recall3-confirm-dlr"),
        )
    ]
    (line,) = harness.ranking_table(rows, "val").splitlines()[2:]
    assert line == "| ar-small-recall3 | 250 | scratch | DLR 90.0 > Transformer 60.0 | – |"


def test_the_screen_extended_pools_the_confirmations_seeds_3_and_4(harness):
    """Seeds 0-2 of the screen and seeds 3-4 of a confirmation setting are one table of five seeds;
    the same run found under two settings is an error, not a doubled seed."""
    rows = [
        dict(_row("Transformer", regime, seed, acc + 0.01 * seed), setting=setting)
        for regime, acc in (("scratch", 0.5), ("causal-spt-all", 0.9))
        for seed, setting in (
            (0, "ar-small-recall3"),
            (1, "ar-small-recall3"),
            (2, "ar-small-recall3"),
            (3, "ar-small-recall3-confirm"),
            (4, "ar-small-recall3-confirm"),
            (5, "ar-small-recall3-confirm"),
        )
    ]
    table = harness.paired_table(harness.pooled(rows), "val", seeds=[0, 1, 2, 3, 4])
    (line,) = table.splitlines()[2:]
    assert line.startswith("| ar-small-recall3 | Transformer") and line.endswith("| 5 |")
    assert "+40.0 [+40.0, +40.0]" in line
    with pytest.raises(ValueError, match="same run of ar-small-recall3"):
        harness.pooled(rows + [dict(rows[0], setting="ar-small-recall3-confirm-dlr", run="elsewhere")])


def test_accuracy_against_the_number_of_pairs(harness, monkeypatch, tmp_path):
    """The pairs sweep reads the three settings at 1,000 labels, seeds 0-2, scratch and causal SPT only."""
    rows = []
    for setting, acc in (("ar-small-recall3", 0.9), ("ar-small-recall3-pairs6", 0.6), ("ar-small-recall3-pairs8", 0.3)):
        for seed in (0, 1, 2, 5):  # seed 5 is a confirmation seed: left out
            rows += [
                dict(_row("DLR", "scratch", seed, acc + 0.01 * seed, labels=1000), setting=setting),
                dict(_row("DLR", "causal-spt-all", seed, 1.0, labels=1000), setting=setting),
                dict(_row("DLR", "causal-spt-all", seed, 0.1, labels=250), setting=setting),  # other label count
                dict(_row("DLR", "scratch-matched", seed, 0.0, labels=1000), setting=setting),
            ]
    other = [
        dict(_row("DLR", "scratch", 0, 0.0, labels=1000), setting="ar-small-recall3-pre1000")
    ]  # not a pairs setting
    points = harness.pairs_points(rows + other)
    assert points["DLR", "scratch"] == {
        4: {0: 90.0, 1: 91.0, 2: 92.0},
        6: {0: 60.0, 1: 61.0, 2: 62.0},
        8: {0: 30.0, 1: 31.0, 2: 32.0},
    }
    assert set(points) == {("DLR", "scratch"), ("DLR", "causal-spt-all")}
    table = harness.pairs_markdown(points).splitlines()
    assert table[0] == "| model | regime | 4 pairs | 6 pairs | 8 pairs |"
    assert table[2] == "| DLR | scratch | 91.0 (90–92, 3) | 61.0 (60–62, 3) | 31.0 (30–32, 3) |"
    assert table[3] == "| DLR | causal SPT | 100.0 (100–100, 3) | 100.0 (100–100, 3) | 100.0 (100–100, 3) |"
    png = harness.pairs_plot(points, tmp_path / "img" / "pairs.png")
    assert png.stat().st_size > 1000
    assert harness.pairs_plot({}, tmp_path / "none.png") is None


def test_all_runs_every_part_in_order_and_writes_each_parts_results(harness, monkeypatch, tmp_path, capsys):
    calls = []
    rows = [
        dict(_row(name, regime, seed, 0.5 + 0.1 * (regime != "scratch")), setting=name)
        for _, names, seeds, _ in harness.PARTS
        for name in names
        for seed in (*seeds, 11)
        for regime in ("scratch", "causal-spt-all")
    ]
    monkeypatch.setattr(harness, "run", lambda names, out, jobs, seeds: calls.append((names, seeds)))
    monkeypatch.setattr(harness, "results", lambda out, names: [r for r in rows if r["setting"] in names])
    monkeypatch.setattr(harness, "plots", lambda out, names, directory: [])
    monkeypatch.setattr(harness, "pretraining_curves", lambda out, names: "")
    monkeypatch.setattr(harness, "pairs_plot", lambda points, path: path)
    assert harness.main(["all", "--results", str(tmp_path / "res"), "--plots", str(tmp_path / "img")]) == 0
    assert calls == [(names, seeds) for _, names, seeds, _ in harness.PARTS]
    assert calls[0] == (["ar-small-recall3"], [0, 1, 2]) and [3, 4] in [seeds for _, seeds in calls]
    for _, names, seeds, filename in harness.PARTS:
        got = json.loads((tmp_path / "res" / filename).read_text())
        assert {r["setting"] for r in got} == set(names) and {r["seed"] for r in got} == set(seeds), filename
    out = capsys.readouterr().out
    assert "## confirm: ar-small-recall3-confirm (seeds 5, 6, 7, 8, 9; test)" in out
    assert "## the screen extended to seeds 0-4" in out
    with pytest.raises(SystemExit):
        harness.main(["all", "ar-small-recall3"])


def test_pooled_tables_keep_only_groups_run_at_every_seed(harness):
    rows = [_row("A", regime, seed, 0.5) for regime in ("scratch", "causal-spt-all") for seed in range(5)]
    rows += [_row("B", regime, seed, 0.5) for regime in ("scratch", "causal-spt-all") for seed in range(3)]
    rows += [_row("C", "scratch", seed, 0.5) for seed in range(5)] + [_row("C", "causal-spt-all", 0, 0.5)]
    rows += [_row("A", "causal-spt-all", 0, 0.5, stage="pretrain")]
    kept = harness.complete(rows, [0, 1, 2, 3, 4])
    assert {r["model"] for r in kept} == {"A"} and len(kept) == 10
