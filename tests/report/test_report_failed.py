"""A failed run is never shown as a result: failed.json, config without summary, diverged runs and
summaries with null or non-finite metrics are listed apart with their reason, never in the tables."""

from __future__ import annotations

import json
import math

import pytest
from test_report import write_run

from longrange.cli import main
from longrange.errors import DataMissingError
from longrange.report.collect import collect, collect_runs
from longrange.report.tables import aggregate


def _tree(root):
    """listops Transformer scratch: seeds 0 and 1 good; seeds 2..6 failed in five different ways."""
    good = [write_run(root, seed=s, test=v, val=v) for s, v in ((0, 0.40), (1, 0.50))]
    # a stage that raised (compare writes failed.json), here a diverged one
    diverged = write_run(root, seed=2, test=0.99, val=0.99)
    (diverged / "summary.json").unlink()
    (diverged / "failed.json").write_text(
        json.dumps(
            {
                "stage": "x",
                "error": "TrainingDivergedError: training diverged at step 7 of 100: the training loss is nan",
                "traceback": "...",
                "log": None,
                "time": 0.0,
            }
        )
    )
    # interrupted: config and metrics, no summary
    interrupted = write_run(root, seed=3, test=0.99, val=0.99)
    (interrupted / "summary.json").unlink()
    # diverged by `longrange train` (no failed.json): the last validation logged a null metric
    nan_val = write_run(root, seed=4, test=0.99, val=0.99)
    (nan_val / "summary.json").unlink()
    with open(nan_val / "metrics.jsonl", "a") as f:
        f.write(
            json.dumps(
                {
                    "step": 30,
                    "epoch": 3,
                    "split": "val",
                    "metrics": {"accuracy": None, "loss": None},
                    "lr": 0.001,
                    "elapsed": 1.0,
                }
            )
            + "\n"
        )
    # summaries whose metric is null, or NaN (json.loads accepts NaN)
    null_val = write_run(root, seed=5, test=0.99, val=0.99)
    summary = json.loads((null_val / "summary.json").read_text())
    summary["best_val"]["accuracy"] = None
    (null_val / "summary.json").write_text(json.dumps(summary))
    nan_test = write_run(root, seed=6, test=0.99, val=0.99)
    text = (
        (nan_test / "summary.json")
        .read_text()
        .replace('"accuracy": 0.99\n  },\n  "steps"', '"accuracy": NaN\n  },\n  "steps"')
    )
    assert "NaN" in text
    (nan_test / "summary.json").write_text(text)
    # a failure recorded beside a finished run (a worker reported dead after its summary): the
    # summary is the commit point, so this run is a result (seed 7)
    finished = write_run(root, seed=7, test=0.60, val=0.60)
    (finished / "failed.json").write_text(json.dumps({"error": "the worker was killed by SIGKILL"}))
    # a damaged summary (cut off): not a result, listed with the file and line
    damaged = write_run(root, seed=8, test=0.99, val=0.99)
    (damaged / "summary.json").write_text('{\n "task": "listops",\n "label": ')
    return good + [finished], {
        "diverged": diverged,
        "interrupted": interrupted,
        "nan_val": nan_val,
        "null_val": null_val,
        "nan_test": nan_test,
        "damaged": damaged,
    }


def test_collect_separates_failed_runs_with_reasons(tmp_path):
    good, bad = _tree(tmp_path)
    found = collect([tmp_path])
    assert sorted(r.path for r in found.runs) == sorted(good)
    reasons = {f.path: f.reason for f in found.failed}
    assert set(reasons) == set(bad.values())
    assert reasons[bad["diverged"]].startswith("failed: TrainingDivergedError: training diverged at step 7")
    assert "unfinished or interrupted" in reasons[bad["interrupted"]] and "step 20" in reasons[bad["interrupted"]]
    assert reasons[bad["nan_val"]].startswith("diverged: val accuracy, loss non-finite at step 30")
    assert reasons[bad["null_val"]] == "non-finite result: best_val.accuracy is None"
    assert reasons[bad["nan_test"]] == "non-finite result: test.accuracy is nan"
    assert "summary.json, line 3: not valid JSON" in reasons[bad["damaged"]]
    # the table cell holds the three good seeds only
    (cell,) = aggregate(found.runs)
    assert cell.seeds == [0, 1, 7] and math.isclose(cell.stat.mean, 0.5)
    warnings = []
    assert len(collect_runs([tmp_path], warn=warnings.append)) == 3
    assert len(warnings) == 1 and all(str(p) in warnings[0] for p in bad.values())


def test_report_lists_failed_runs_apart_never_in_the_tables(tmp_path, capsys):
    _, bad = _tree(tmp_path / "runs")
    out = tmp_path / "out"
    assert main(["report", str(tmp_path / "runs"), "--out", str(out), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    report = (out / "report.md").read_text()
    for text in (printed, report):
        tables, _, failed = text.partition("## Failed or unfinished runs")
        assert failed, text
        assert "50.00" in tables and "| 3 (0, 1, 7) |" in tables and "99.00" not in tables  # 0.99 is never a result
        for path in bad.values():
            assert str(path) not in tables and str(path) in failed
        assert "TrainingDivergedError" in failed and "non-finite result" in failed


def test_only_failed_runs_is_an_error_naming_them(tmp_path):
    d = write_run(tmp_path, seed=0)
    (d / "summary.json").unlink()
    with pytest.raises(DataMissingError, match=r"no finished runs with a result .*seed0: unfinished"):
        collect([tmp_path])
