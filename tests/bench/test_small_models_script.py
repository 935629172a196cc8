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


def test_the_breakdown_groups_every_operator_and_counts_the_products(tmp_path):
    """--breakdown: each profiler event in one group; the groups of a measured step add up to the
    profiled step; the products' FLOPs are those of the matrix products alone."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    script = repo_scripts.load("benchmarks/small_models.py")
    assert script.category("aten::mm") == script.category("longrange::mm_onednn") == "matrix products"
    assert script.category("longrange::selective_scan_numba_cl_backward") == "fused kernels"
    assert script.category("GeneratedBackwardFor_longrange_gla_numba_default") == "fused kernels"
    assert script.category("aten::_fft_r2c") == "FFTs"
    assert script.category("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention kernel"
    assert script.category("aten::copy_") == "copies and layout" and script.category("aten::gelu") == "the rest"
    a = torch.randn(8, 4, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        (a @ torch.randn(4, 3)).relu().sum().backward()  # 2 * 8 * 4 * 3 forward, twice that backward
        torch.fft.rfft(torch.randn(16))
    assert script._product_flops(counter.get_flop_counts()) == 3 * 2 * 8 * 4 * 3 - 2 * 8 * 4 * 3  # no input grad of b
    out = tmp_path / "rows.json"
    table = tmp_path / "table.md"
    args = ["--plan", str(PLAN), "--models", "lru", "--steps", "1", "--rounds", "1", "--breakdown"]
    script.main([*args, "--json", str(out), "--markdown", str(table)])
    text = table.read_text()
    assert "Where a step's time goes" in text and "| lru | " in text.split("Where a step's time goes")[1]
    row = json.loads(out.read_text())["results"]["step"]["lru"]
    parts = row["breakdown_s"]
    assert list(parts) == list(script.CATEGORIES) and parts["matrix products"] > 0 and parts["FFTs"] == 0
    assert sum(parts.values()) == pytest.approx(row["profiled_step_s"])
    assert 0 < row["product_flops"] < row["flops"]
