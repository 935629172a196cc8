"""longrange.studies.tables: a study's runs as rows, the paired table, the per-regime differences,
the ranking with its reversals, pooling of settings and the complete-seed filter."""

from __future__ import annotations

from pathlib import Path

import pytest
import repo_scripts

from longrange.studies import tables

HERE = Path(__file__).resolve().parent


def _write_run():
    return repo_scripts.load(HERE.parent / "report" / "test_report.py", "report_fixtures").write_run


def row(model, regime, seed, acc, setting="s", labels=250, stage="finetune", run=None):
    return {
        "setting": setting,
        "model": model,
        "regime": regime,
        "stage": stage,
        "labels": labels,
        "seed": seed,
        "params": 2000,
        "steps": 10,
        "seconds": 1.0,
        "val": {"accuracy": acc},
        "test": {"accuracy": acc / 2},
        "metric": "accuracy",
        "run": run or f"{setting}/{model}/{regime}/{stage}/seed{seed}",
    }


def test_study_rows_reads_every_finished_run_of_each_setting(tmp_path):
    write_run = _write_run()
    write_run(tmp_path / "first", label="DLR", regime="scratch", seed=0, val=0.25, test=0.5)
    write_run(tmp_path / "first", label="DLR", regime="causal-spt", stage="finetune", seed=0, val=0.75, test=1.0)
    write_run(tmp_path / "second", label="S4D", seed=1)
    rows = tables.study_rows(tmp_path, ["first", "second", "not-run-yet"], warn=pytest.fail)
    assert sorted((r["setting"], r["model"], r["regime"], r["seed"]) for r in rows) == [
        ("first", "DLR", "causal-spt", 0),
        ("first", "DLR", "scratch", 0),
        ("second", "S4D", "scratch", 1),
    ]
    assert all(set(r) == set(tables.ROW_KEYS) for r in rows)
    spt = next(r for r in rows if r["regime"] == "causal-spt")
    assert tables.percent(spt, "test") == 100.0 and spt["run"].startswith("first/")
    with pytest.raises(ValueError, match="split 'train'"):
        tables.percent(spt, "train")


def test_the_paired_table_pairs_by_seed_and_orders_the_models():
    rows = []
    for seed, (scratch, spt) in enumerate([(0.10, 0.90), (0.20, 0.90), (0.30, 0.90)]):
        for model in ("Zeta", "Alpha"):
            rows += [
                row(model, "scratch", seed, scratch),
                row(model, "scratch-matched", seed, scratch),
                row(model, "causal-spt", seed, spt),
                row(model, "causal-spt", seed, 0.5, stage="pretrain"),  # pretraining is not a result
            ]
    lines = tables.paired_table(rows, "val", model_order=["Zeta"]).splitlines()
    assert [line.split("|")[2].strip() for line in lines[2:]] == ["Zeta (2k)", "Alpha (2k)"]
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    # differences 80, 70, 60: mean +70.0, 95% interval 70 +- t(0.975, 2) * 10 / sqrt(3)
    assert cells[3:7] == ["20.0", "20.0", "90.0", "–"]
    assert cells[7] == "+70.0 [+45.2, +94.8]" and cells[8] == "–" and cells[-1] == "3"
    one_seed = tables.paired_table(rows, "test", seeds=[0]).splitlines()[2]
    assert "| 5.0 | 5.0 | 45.0 |" in one_seed and "| – | – |" in one_seed  # one seed: no interval


def test_paired_rows_give_each_regime_against_scratch_over_the_seeds_both_have():
    rows = [row("A", "scratch", s, 0.5) for s in (0, 1, 2)]
    rows += [row("A", "masked-spt", s, 0.6 + 0.1 * s) for s in (0, 1)]
    rows += [dict(row("A", "masked-spt", 2, 0.0), val={"accuracy": None})]  # no value: left out of the pairs
    (got,) = tables.paired_rows(rows, "val")
    assert got["regime"] == "masked-spt" and got["n"] == 2
    assert got["scratch"] == [50.0, 50.0] and got["spt"] == pytest.approx([60.0, 70.0])
    assert got["mean"] == pytest.approx(15.0) and got["low"] < 15.0 < got["high"]


def test_the_ranking_says_when_the_order_changes_and_ranks_settings_together():
    rows = []
    for seed in (0, 1):
        rows += [
            row("A", "scratch", seed, 0.9),
            row("B", "scratch", seed, 0.5, setting="s-confirm"),
            row("A", "causal-spt-all", seed, 0.6),
            row("B", "causal-spt-all", seed, 1.0, setting="s-confirm"),
            row("A", "scratch-matched", seed, 1.0),
            row("B", "scratch-matched", seed, 1.0, setting="s-confirm"),
        ]
    same = {"s-confirm": "s"}.get
    lines = tables.ranking_table(rows, "val", same_as=lambda s: same(s, s)).splitlines()[2:]
    assert lines == [
        "| s | 250 | scratch | A 90.0 > B 50.0 | – |",
        "| s | 250 | scratch-matched | A 100.0 = B 100.0 | same |",  # a tie is no change
        "| s | 250 | causal-spt-all | B 100.0 > A 60.0 | **changes** |",
    ]
    apart = tables.ranking_table(rows, "val").splitlines()[2:]
    assert len(apart) == 6 and all(line.endswith("| – |") for line in apart)  # one model per setting


def test_pooling_names_settings_as_one_and_refuses_a_run_found_twice():
    rows = [row("A", "scratch", 0, 0.5, setting="s"), row("A", "scratch", 1, 0.5, setting="s-confirm")]
    same = {"s-confirm": "s"}.get
    assert {r["setting"] for r in tables.pooled(rows, lambda s: same(s, s))} == {"s"}
    twice = rows + [row("A", "scratch", 1, 0.5, setting="s-other", run="elsewhere")]
    with pytest.raises(ValueError, match="elsewhere and s-confirm/A/scratch/finetune/seed1 are the same run of s"):
        tables.pooled(twice, lambda s: "s")


def test_complete_keeps_the_groups_run_at_every_seed_and_drops_pretraining():
    rows = [row("A", regime, seed, 0.5) for regime in ("scratch", "causal-spt") for seed in range(3)]
    rows += [row("B", "scratch", seed, 0.5) for seed in range(3)] + [row("B", "causal-spt", 0, 0.5)]
    rows += [row("A", "causal-spt", 0, 0.5, stage="pretrain")]
    kept = tables.complete(rows, [0, 1, 2])
    assert {r["model"] for r in kept} == {"A"} and len(kept) == 6


def test_texts_of_fractions_minutes_and_seeds():
    assert tables.percent_text(0.1234) == "12.3" and tables.percent_text(None) == "—"
    assert tables.minutes_text(90) == "1.5" and tables.minutes_text(None) == "—"
    assert tables.seeds_text([0.992, 1.0]) == "99.6 (99.2, 100.0)"
    assert tables.seeds_text([0.5, None], star=True) == "50.0* (50.0, —)"  # the mean of the seeds that ran
    assert tables.seeds_text([0.5]) == "50.0" and tables.seeds_text([None, None]) == "—"


def test_results_are_written_whole_and_side_by_side(tmp_path):
    raw, text = tables.write_results(tmp_path / "results", "study_x", {"runs": [1, 2]}, "| a |")
    assert raw == tmp_path / "results" / "study_x.json" and text.read_text() == "| a |\n"
    assert raw.read_text() == '{\n "runs": [\n  1,\n  2\n ]\n}\n'
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["study_x.json", "study_x.md"]  # no temporaries
