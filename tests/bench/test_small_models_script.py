"""benchmarks/small_models.py with ``--plan``: a grid's own models (the MAD screen's committed plan)
measured at their planned batch and their tasks' lengths, and a label the plan lacks refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import repo_scripts

REPO = Path(__file__).resolve().parents[2]
PLAN = REPO / "benchmarks" / "results" / "studies" / "mad-cpu-screen" / "plan.json"


def test_a_grids_models_are_measured_at_their_planned_sizes(tmp_path):
    script = repo_scripts.load("benchmarks/small_models.py")
    experiments = script.plan_experiments(PLAN)
    assert {"mh-attention", "mamba2", "lru"} <= set(experiments)
    out = tmp_path / "rows.json"
    script.main(["--plan", str(PLAN), "--models", "lru", "--steps", "1", "--rounds", "1", "--json", str(out)])
    saved = json.loads(out.read_text())
    row = saved["results"]["step"]["lru"]
    assert "error" not in row, row
    assert saved["settings"]["plan"] == str(PLAN) and row["step_s"] > 0 and row["flops"] > 0
    lru = experiments["lru"]
    assert lru.model.d_model == 64  # the screen's width (the recall preset's is 64 too: the sizes below tell)
    assert row["batch_size"] == lru.train_config("train").batch_size == 32  # the planned batch, not 64
    assert row["seq_len"] != 256  # the task's own length, not the presets' default
    env = saved["environment"]  # the machine, without which the bound ratios cannot be compared
    assert env["cpu"] and env["cpu_count"] >= 1 and env["torch"]


def test_a_label_the_plan_lacks_is_refused_naming_its_labels():
    script = repo_scripts.load("benchmarks/small_models.py")
    with pytest.raises(SystemExit, match="no experiment labelled 'nope'; its labels: mh-attention"):
        script.measure("nope", None, 0, 1, 1, False, PLAN)
