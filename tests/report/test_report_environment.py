"""The device and kernels of each cell's runs in the report, and the warning when a cell mixes them."""

from __future__ import annotations

import json

from test_report import write_run

from longrange.cli import main
from longrange.report.collect import collect_runs
from longrange.report.tables import aggregate, details_table, mixing_warnings

CPU = {"type": "cpu", "name": "AMD EPYC", "count": 1, "threads": 2, "denormals": "flushed"}
A100 = {"type": "cuda", "name": "NVIDIA A100-SXM4-80GB", "count": 4, "capability": "8.0"}


def _run(root, seed, device=None, kernels=None, **kw):
    d = write_run(root, seed=seed, **kw)
    summary = json.loads((d / "summary.json").read_text())
    if device is not None:
        summary["device"] = device
    if kernels is not None:
        summary["kernels"] = kernels
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def test_cells_show_device_and_kernels_and_a_mixed_cell_is_named(tmp_path, capsys):
    numba = {"selective_scan": "numba", "causal_conv1d": "torch"}
    for seed in (0, 1):
        _run(tmp_path, seed, CPU, numba, label="Mamba")
    _run(tmp_path, 2, A100, {"selective_scan": "triton", "causal_conv1d": "torch"}, label="Mamba")
    for seed in (0, 1):  # same device and kernels: no warning
        _run(tmp_path, seed, CPU, {}, label="S4D")
    cells = aggregate(collect_runs([tmp_path]))
    rows = {row[0]: dict(zip(details_table(cells).headers, row)) for row in details_table(cells).rows}
    assert rows["S4D"]["Device"] == "cpu: AMD EPYC" and rows["S4D"]["Kernels"] == "-"
    assert rows["Mamba"]["Device"] == "cpu: AMD EPYC (seeds 0, 1); cuda: NVIDIA A100-SXM4-80GB ×4 (seed 2)"
    assert rows["Mamba"]["Kernels"] == (
        "causal_conv1d=torch, selective_scan=numba (seeds 0, 1); causal_conv1d=torch, selective_scan=triton (seed 2)"
    )
    warnings = mixing_warnings(cells)
    assert warnings == [
        "Mamba on listops (final stage) mixes devices: cpu: AMD EPYC (seeds 0, 1); cuda: NVIDIA A100-SXM4-80GB ×4 (seed 2)",
        "Mamba on listops (final stage) mixes kernels: causal_conv1d=torch, selective_scan=numba (seeds 0, 1); "
        "causal_conv1d=torch, selective_scan=triton (seed 2)",
    ]
    # in report.md and on the terminal
    assert main(["report", str(tmp_path), "--no-plots"]) == 0
    err = capsys.readouterr().err
    report = (tmp_path / "report.md").read_text()
    for line in warnings:
        assert f"warning: {line}" in err and f"- {line}" in report


def test_a_cell_mixing_flushed_and_kept_subnormals_is_named(tmp_path):
    _run(tmp_path, 0, {**CPU, "denormals": "flushed"}, {}, label="LRU")
    _run(tmp_path, 1, {**CPU, "denormals": "kept"}, {}, label="LRU")
    assert mixing_warnings(aggregate(collect_runs([tmp_path]))) == [
        "LRU on listops (final stage) mixes devices: cpu: AMD EPYC (seed 0); cpu: AMD EPYC, subnormals kept (seed 1)"
    ]


def test_cpu_runs_recorded_before_the_mode_kept_subnormals_and_a_mixed_resume_is_named(tmp_path):
    """A CPU record without ``denormals`` was written before anything flushed subnormals: it kept them,
    and a cell mixing it with flushed runs is named; a run resumed in the other mode kept them in part;
    a GPU record never mentions them."""
    _run(tmp_path, 0, {**CPU, "denormals": "flushed"}, {}, label="LRU")
    _run(tmp_path, 1, {k: v for k, v in CPU.items() if k != "denormals"}, {}, label="LRU")
    _run(tmp_path, 2, {**CPU, "denormals": "mixed"}, {}, label="LRU")
    _run(tmp_path, 0, A100, {}, label="S4D")
    cells = aggregate(collect_runs([tmp_path]))
    rows = {row[0]: dict(zip(details_table(cells).headers, row)) for row in details_table(cells).rows}
    assert rows["S4D"]["Device"] == "cuda: NVIDIA A100-SXM4-80GB ×4"
    assert mixing_warnings(cells) == [
        "LRU on listops (final stage) mixes devices: cpu: AMD EPYC (seed 0); cpu: AMD EPYC, subnormals kept "
        "(seed 1); cpu: AMD EPYC, subnormals kept in part (seed 2)"
    ]


def test_summaries_without_device_or_kernels_still_load_and_mix_with_nothing(tmp_path, capsys):
    _run(tmp_path, 0)  # written before runs recorded them
    _run(tmp_path, 1, CPU, {"selective_scan": "numba"})
    cells = aggregate(collect_runs([tmp_path]))
    (row,) = details_table(cells).rows
    assert row[-2:] == ["unknown (seed 0); cpu: AMD EPYC (seed 1)", "unknown (seed 0); selective_scan=numba (seed 1)"]
    assert mixing_warnings(cells) == []
    assert main(["report", str(tmp_path), "--no-plots"]) == 0
    assert "mixes" not in capsys.readouterr().err
