"""Run collection, confidence intervals, tables, plots and the ``longrange report`` command."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
import yaml
from PIL import Image
from scipy import stats

from longrange.cli import COMMAND_MODULES, main
from longrange.errors import DataFormatError, DataMissingError, LongrangeError
from longrange.report.collect import collect_runs, read_metrics
from longrange.report.plots import learning_curves, mean_curve, scratch_vs_spt_bars
from longrange.report.tables import (
    aggregate,
    csv_text,
    mean_ci,
    results_table,
    row_name,
    t_critical,
    t_quantile,
)

# Two-sided 95% critical values t_{0.975, df} from printed tables.
T975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 9: 2.2622, 29: 2.0452, 30: 2.0423}


def write_run(
    root: Path,
    *,
    task="listops",
    label="Transformer",
    regime="scratch",
    stage="train",
    seed=0,
    metric="accuracy",
    test=0.5,
    val=0.5,
    steps=100,
    seconds=60.0,
    params=(1000, 400),
    curve=((10, 0.3), (20, 0.4)),
    higher_is_better=True,
    name=None,
) -> Path:
    """A made-up finished run directory: config.yaml, metrics.jsonl, summary.json."""
    d = root / (name or f"{task}/{label}/{regime}/{stage}/seed{seed}")
    d.mkdir(parents=True)
    cfg = {
        "task": {"name": task, "options": {}},
        "model": {"d_model": 8},
        "objective": {"kind": "supervised"},
        "stage": stage,
        "label": label,
        "regime": regime,
        "seed": seed,
        "train": {"lr": 0.001},
    }
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    with open(d / "metrics.jsonl", "w") as f:
        for step, v in curve:
            f.write(
                json.dumps(
                    {
                        "step": step,
                        "epoch": step / 10,
                        "split": "train",
                        "metrics": {"loss": 1.0},
                        "lr": 0.001,
                        "elapsed": 1.0,
                    }
                )
                + "\n"
            )
            f.write(
                json.dumps(
                    {
                        "step": step,
                        "epoch": step / 10,
                        "split": "val",
                        "metrics": {metric: v, "loss": 1.0},
                        "lr": 0.001,
                        "elapsed": 1.0,
                    }
                )
                + "\n"
            )
    summary = {
        "task": task,
        "label": label,
        "regime": regime,
        "stage": stage,
        "seed": seed,
        "metric": metric,
        "higher_is_better": higher_is_better,
        "best_val": {"loss": 0.9, metric: val},
        "test": None if test is None else {"loss": 1.0, metric: test},
        "steps": steps,
        "params": {"total": params[0], "in_primitives": params[1]},
        "pretrain_run": None,
        "seconds": seconds,
    }
    (d / "summary.json").write_text(json.dumps(summary, indent=2))
    return d


# ---------------------------------------------------------------------- statistics
@pytest.mark.parametrize("df", sorted(T975))
def test_t_quantile_matches_printed_table(df):
    assert t_quantile(0.975, df) == pytest.approx(T975[df], abs=1e-4)
    assert t_critical(df + 1) == pytest.approx(T975[df], abs=1e-4)


def test_t_quantile_is_scipys():
    for df in (1, 2, 3, 8, 25, 60, 10**6):
        for p in (0.005, 0.2, 0.8, 0.975, 0.999):
            assert t_quantile(p, df) == stats.t.ppf(p, df)
    for n in (2, 3, 10, 31):
        assert t_critical(n) == stats.t.ppf(0.975, n - 1)
        assert t_critical(n, 0.9) == stats.t.ppf(0.95, n - 1)


def test_t_quantile_closed_forms():
    # df = 1 is the Cauchy distribution; df = 2 has t = (2p - 1) * sqrt(2 / (4 p (1 - p))).
    for p in (0.1, 0.6, 0.9, 0.995):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p))), rel=1e-10)
        assert t_quantile(1 - p, 5) == pytest.approx(-t_quantile(p, 5), rel=1e-10)
    # Far in the degrees of freedom the t distribution is the normal one.
    assert t_quantile(0.975, 10**6) == pytest.approx(1.959964, abs=1e-5)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile(0.9, 0)


def test_mean_ci_by_hand():
    s = mean_ci([1.0, 2.0, 6.0])
    sd = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + (6 - 3) ** 2) / 2)
    assert (s.n, s.mean, s.std) == (3, 3.0, pytest.approx(sd))
    assert s.half_width == pytest.approx(T975[2] * sd / math.sqrt(3), rel=1e-4)
    one = mean_ci([0.7])
    assert (one.n, one.mean, one.std, one.half_width) == (1, 0.7, None, None)
    with pytest.raises(ValueError, match="no values"):
        mean_ci([])
    with pytest.raises(ValueError, match="at least 2"):
        t_critical(1)
    with pytest.raises(ValueError, match="p must be"):
        t_quantile(1.0, 3)


# ---------------------------------------------------------------------- collection
def test_collect_runs_searches_trees_warns_about_unfinished_and_dedupes(tmp_path):
    a = write_run(tmp_path, seed=0)
    write_run(tmp_path, seed=1)
    unfinished = tmp_path / "listops/Transformer/scratch/train/seed2"
    unfinished.mkdir(parents=True)
    (unfinished / "config.yaml").write_text("seed: 2\n")
    warnings = []
    runs = collect_runs([tmp_path, a], warn=warnings.append)  # a is inside tmp_path: counted once
    assert sorted(r.seed for r in runs) == [0, 1]
    assert len(warnings) == 1 and "unfinished" in warnings[0] and str(unfinished) in warnings[0]
    r = next(r for r in runs if r.seed == 0)
    assert (r.task, r.label, r.regime, r.stage, r.metric) == ("listops", "Transformer", "scratch", "train", "accuracy")
    assert r.value("test") == 0.5 and r.params_total == 1000 and r.params_in_primitives == 400
    assert r.curve("val") == [(10, 0.3), (20, 0.4)]
    assert r.config["label"] == "Transformer"
    # A summary.json path stands for its directory.
    assert [x.seed for x in collect_runs([a / "summary.json"], warn=warnings.append)] == [0]


def test_collect_runs_errors(tmp_path):
    with pytest.raises(DataMissingError, match="no such run directory"):
        collect_runs([tmp_path / "absent"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataMissingError, match="no finished runs"):
        collect_runs([tmp_path / "empty"])


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.pop("label"), "missing field 'label'"),
        (lambda d: d.update(seed=True), "field 'seed' must be int"),
        (lambda d: d.update(seed="0"), "field 'seed' must be int"),
        (lambda d: d.update(stage="warmup"), "field 'stage' must be one of"),
        (lambda d: d.update(higher_is_better=1), "field 'higher_is_better' must be bool"),
        (lambda d: d.update(best_val={"loss": 1.0}), "'best_val' has no 'accuracy'"),
        (lambda d: d.update(test={"accuracy": "high"}), "field 'test.accuracy' must be a number"),
        (lambda d: d["params"].pop("in_primitives"), "missing field 'in_primitives'"),
    ],
)
def test_malformed_summary_names_file_and_field(tmp_path, edit, message):
    d = write_run(tmp_path)
    summary = json.loads((d / "summary.json").read_text())
    edit(summary)
    (d / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(DataFormatError, match=message) as err:
        collect_runs([tmp_path])
    assert str(d / "summary.json") in str(err.value)


def test_summary_optional_fields_may_be_absent(tmp_path):
    d = write_run(tmp_path, test=None)
    summary = json.loads((d / "summary.json").read_text())
    del summary["test"], summary["pretrain_run"]
    (d / "summary.json").write_text(json.dumps(summary))
    (r,) = collect_runs([tmp_path])
    assert r.test is None and r.pretrain_run is None and not r.has_test()
    with pytest.raises(DataFormatError, match="no test value"):
        r.value("test")


def test_invalid_json_names_file_and_line(tmp_path):
    """A summary that cannot be read is not a result (the run is not finished): the error names the
    file and line."""
    d = write_run(tmp_path)
    (d / "summary.json").write_text('{\n "task": "listops",\n "label": oops\n}')
    with pytest.raises(DataMissingError, match=r"summary.json, line 3: not valid JSON"):
        collect_runs([tmp_path])


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"step": "5", "split": "val", "metrics": {}}', "'step' must be an integer"),
        ('{"step": 5, "metrics": {}}', "'split' must be a string"),
        ('{"step": 5, "split": "val", "metrics": {"accuracy": "x"}}', "'metrics' must be an object"),
    ],
)
def test_malformed_metrics_line_names_file_and_line(tmp_path, line, message):
    d = write_run(tmp_path)
    with open(d / "metrics.jsonl", "a") as f:
        f.write("\n" + line + "\n")  # the blank line is allowed; this is line 6
    with pytest.raises(DataFormatError, match=f"metrics.jsonl, line 6: {message}"):
        read_metrics(d / "metrics.jsonl")
    (r,) = collect_runs([tmp_path])
    with pytest.raises(DataFormatError, match="line 6"):
        r.curve()


def test_malformed_config_names_file(tmp_path):
    """A run whose config cannot be read is not a result (its identity cannot be checked): the
    error names the file and line."""
    d = write_run(tmp_path)
    (d / "config.yaml").write_text("task: [unclosed\n")
    with pytest.raises(DataMissingError, match=r"config.yaml, line 2: not valid YAML"):
        collect_runs([tmp_path])


# ---------------------------------------------------------------------- aggregation and tables
def test_duplicate_seed_and_mixed_metrics_are_errors(tmp_path):
    write_run(tmp_path, seed=0, name="a")
    write_run(tmp_path, seed=0, name="b")
    with pytest.raises(DataFormatError, match="seed 0 .* appears twice"):
        aggregate(collect_runs([tmp_path]))
    other = tmp_path / "other"
    write_run(other, seed=0, name="a")
    write_run(other, seed=1, name="b", metric="r2")
    with pytest.raises(DataFormatError, match="different metrics"):
        aggregate(collect_runs([other]))


def test_row_names_follow_the_papers_layout():
    assert row_name("Transformer", "scratch") == "Transformer"
    assert row_name("Transformer", "masked-spt") == "Transformer + masked SPT"
    assert row_name("S4", "causal-spt") == "S4 + causal SPT"
    assert row_name("S4", "custom") == "S4 (custom)"


def _three_seed_tree(root: Path) -> dict[str, list[float]]:
    """listops and text, Transformer scratch and masked SPT, 3 seeds each; returns the test values."""
    values = {
        "listops/scratch": [0.40, 0.45, 0.47],
        "listops/masked-spt": [0.60, 0.61, 0.65],
        "text/scratch": [0.70, 0.71, 0.75],
        "text/masked-spt": [0.88, 0.90, 0.91],
    }
    for key, vals in values.items():
        task, regime = key.split("/")
        stage = "train" if regime == "scratch" else "finetune"
        for seed, v in enumerate(vals):
            write_run(
                root,
                task=task,
                regime=regime,
                stage=stage,
                seed=seed,
                test=v,
                val=v + 0.01,
                curve=((10, v - 0.1), (20, v - 0.05 * seed)),
                steps=100 + seed,
                seconds=30.0 * (seed + 1),
            )
    for seed in range(2):
        write_run(
            root,
            task="listops",
            regime="masked-spt",
            stage="pretrain",
            seed=seed,
            metric="loss",
            test=None,
            val=2.0 + seed,
            higher_is_better=False,
        )
    return values


def _cell_text(vals: list[float]) -> str:
    """Mean ± t_{0.975,2}·s/√3 in percent with two decimals, computed here from the definitions."""
    m = sum(vals) / 3
    s = math.sqrt(sum((v - m) ** 2 for v in vals) / 2)
    return f"{100 * m:.2f} ± {100 * T975[2] * s / math.sqrt(3):.2f}"


def test_results_table_three_seeds_by_hand(tmp_path):
    values = _three_seed_tree(tmp_path)
    cells = aggregate(collect_runs([tmp_path]))
    table = results_table(cells)
    assert "test metric" in table.title and "95%" in table.title
    assert table.headers == ["Model", "listops (accuracy (%))", "text (accuracy (%))", "Avg."]
    rows = {r[0]: r for r in table.rows}
    assert list(rows) == ["Transformer", "Transformer + masked SPT"]
    scratch, spt = rows["Transformer"], rows["Transformer + masked SPT"]
    assert scratch[1] == _cell_text(values["listops/scratch"])
    assert scratch[2] == _cell_text(values["text/scratch"])
    assert spt[1] == _cell_text(values["listops/masked-spt"])
    avg = (sum(values["listops/masked-spt"]) / 3 + sum(values["text/masked-spt"]) / 3) / 2
    assert spt[3] == f"{100 * avg:.2f}"
    assert scratch[1] == "44.00 ± 8.96"  # (0.40, 0.45, 0.47): s = 0.036056, 4.3027·s/√3 = 0.08957


def test_avg_omitted_with_reason_and_validation_marked(tmp_path):
    write_run(tmp_path, task="listops", seed=0, test=0.4)
    write_run(tmp_path, task="text", seed=0, test=None, val=0.8)
    write_run(tmp_path, task="listops", regime="causal-spt", stage="finetune", seed=0, test=0.5)
    table = results_table(aggregate(collect_runs([tmp_path])))
    assert "Avg." not in table.headers
    assert any("Avg. omitted: Transformer + causal SPT has no result for text" in n for n in table.notes)
    rows = {r[0]: r for r in table.rows}
    assert rows["Transformer"][1] == "40.00 (n=1)"
    assert rows["Transformer"][2] == "80.00 (n=1)†"
    assert rows["Transformer + causal SPT"][2] == "—"
    assert "marked †" in table.title


def test_r2_has_three_decimals_and_mixed_metrics_have_no_avg(tmp_path):
    for seed, v in enumerate([0.991, 0.995, 0.993]):
        write_run(tmp_path, task="bidmc", label="S4", metric="r2", seed=seed, test=v)
    write_run(tmp_path, task="listops", label="S4", seed=0, test=0.6)
    table = results_table(aggregate(collect_runs([tmp_path])))
    assert table.headers[1:] == ["listops (accuracy (%))", "bidmc (R²)"]
    m = 0.993
    s = math.sqrt((0.002**2 + 0.002**2 + 0) / 2)
    assert table.rows[0][2] == f"{m:.3f} ± {T975[2] * s / math.sqrt(3):.3f}"
    assert any("different metrics" in n for n in table.notes)


def test_only_validation_results_say_so(tmp_path):
    write_run(tmp_path, test=None, val=0.5)
    table = results_table(aggregate(collect_runs([tmp_path])))
    assert "best validation metric (no test results)" in table.title
    assert table.rows[0][1] == "50.00 (n=1)"


def test_csv_has_one_line_per_cell(tmp_path):
    values = _three_seed_tree(tmp_path)
    cells = aggregate(collect_runs([tmp_path]))
    rows = list(csv.DictReader(io.StringIO(csv_text(cells))))
    assert len(rows) == 5  # 4 final cells + 1 pretraining cell
    row = next(r for r in rows if r["task"] == "text" and r["regime"] == "masked-spt" and r["kind"] == "final")
    vals = values["text/masked-spt"]
    assert float(row["mean"]) == pytest.approx(sum(vals) / 3)
    assert row["n"] == "3" and row["seeds"] == "0 1 2" and row["source"] == "test"
    pre = next(r for r in rows if r["kind"] == "pretrain")
    assert (pre["metric"], pre["source"], float(pre["mean"]), pre["n"]) == ("loss", "val", 2.5, "2")


# ---------------------------------------------------------------------- plots
def test_mean_curve_by_hand():
    steps, mean, half = mean_curve([[(0, 1.0), (10, 3.0)], [(0, 3.0), (5, 4.0), (10, 5.0)], [(0, 2.0)]])
    assert steps.tolist() == [0.0, 5.0, 10.0]
    # Step 0: three curves; step 5: the first interpolated (2.0) and the second (4.0); step 10: two.
    assert mean.tolist() == pytest.approx([2.0, 3.0, 4.0])
    assert half[0] == pytest.approx(T975[2] * 1.0 / math.sqrt(3), rel=1e-4)
    assert half[1] == pytest.approx(T975[1] * math.sqrt(2) / math.sqrt(2), rel=1e-4)
    only_one = mean_curve([[(0, 1.0), (1, 2.0)]])
    assert math.isnan(only_one[2][0])


def _assert_png(path: Path) -> None:
    assert path.is_file(), path
    with Image.open(path) as im:
        assert im.format == "PNG"
        im.verify()


def test_plots_write_valid_pngs(tmp_path):
    _three_seed_tree(tmp_path / "runs")
    runs = collect_runs([tmp_path / "runs"])
    warnings = []
    _assert_png(learning_curves([r for r in runs if r.is_final], tmp_path / "curves.png", warn=warnings.append))
    assert warnings == []
    _assert_png(scratch_vs_spt_bars(aggregate(runs), tmp_path / "bars.png"))
    (runs[0].path / "metrics.jsonl").unlink()
    learning_curves(runs, tmp_path / "curves2.png", warn=warnings.append)
    assert len(warnings) == 1 and str(runs[0].path) in warnings[0]


# ---------------------------------------------------------------------- command line
def test_report_is_a_registered_command():
    assert "longrange.report.cli" in COMMAND_MODULES


def test_cli_report_tables_csv_and_pngs(tmp_path, capsys):
    values = _three_seed_tree(tmp_path / "runs")
    (tmp_path / "runs" / "unfinished").mkdir()
    (tmp_path / "runs" / "unfinished" / "config.yaml").write_text("seed: 9\n")
    out, csv_path = tmp_path / "out", tmp_path / "tables" / "cells.csv"
    rc = main(["report", str(tmp_path / "runs"), "--out", str(out), "--csv", str(csv_path)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    for key in values:
        assert _cell_text(values[key]) in captured.out
    assert "| Transformer + masked SPT |" in captured.out
    assert "Pretraining runs" in captured.out and "Runs per cell" in captured.out
    assert "unfinished" in captured.err
    report = (out / "report.md").read_text()
    assert _cell_text(values["text/masked-spt"]) in report
    assert "unfinished" in report  # the warning is in the report too
    for name in ("learning_curves.png", "pretraining_curves.png", "bars.png"):
        _assert_png(out / name)
        assert f"({name})" in report
    assert len(list(csv.DictReader(csv_path.open()))) == 5


def test_cli_default_out_no_plots_and_csv_format(tmp_path, capsys):
    _three_seed_tree(tmp_path)
    assert main(["report", str(tmp_path), "--no-plots", "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kind,task,label,regime")
    assert (tmp_path / "report.md").is_file()
    assert not list(tmp_path.glob("*.png"))


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nothing")]) == 1
    err = capsys.readouterr().err
    assert "longrange report: error:" in err and "nothing" in err
    d = write_run(tmp_path / "runs")
    (d / "summary.json").write_text("{")
    assert main(["report", str(tmp_path / "runs"), "--no-plots"]) == 1
    assert "summary.json, line 1" in capsys.readouterr().err
    f = d / "config.yaml"
    assert main(["report", str(f)]) == 1  # a file as the first path and no --out
    assert "--out" in capsys.readouterr().err


def test_errors_are_user_errors():
    assert issubclass(DataFormatError, LongrangeError) and issubclass(DataMissingError, LongrangeError)


def test_further_metrics_table_shows_what_every_seed_reports_beside_the_metric(tmp_path):
    import json as _json

    from longrange.report.tables import further_metrics_table, markdown_tables

    for seed, (acc, seq) in enumerate([(0.9, 0.5), (0.8, 0.3)]):
        d = write_run(tmp_path, task="mqar", seed=seed, test=acc)
        summary = _json.loads((d / "summary.json").read_text())
        summary["test"]["sequence_accuracy"] = seq
        (d / "summary.json").write_text(_json.dumps(summary))
    write_run(tmp_path, task="listops", seed=0, test=0.4)  # reports nothing further: no row
    cells = aggregate(collect_runs([tmp_path]))
    table = further_metrics_table(cells)
    assert table.headers == ["Model", "Task", "Source", "sequence accuracy (%)"]
    half = t_critical(2) * math.sqrt(((0.5 - 0.4) ** 2 + (0.3 - 0.4) ** 2) / 1) / math.sqrt(2) * 100
    assert table.rows == [["Transformer", "mqar", "test", f"40.00 ± {half:.2f}"]]
    assert "### Further metrics" in markdown_tables(cells)
    # a seed without it: the cell has no further metric, and runs without any give no table
    d = write_run(tmp_path, task="mqar", seed=2, test=0.7)
    assert further_metrics_table(aggregate(collect_runs([tmp_path]))) is None
    assert "Further metrics" not in markdown_tables(aggregate(collect_runs([d])))
