"""``benchmarks/cpu_scan.py`` runs end to end on a tiny problem and writes its JSON (no timings asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import repo_scripts
import torch

from longrange.ops.scan.numba import numba_available

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_scan.py"


@pytest.mark.skipif(not numba_available(), reason="numba does not import")
def test_cpu_scan_script_runs(tmp_path, capsys):
    module = repo_scripts.load(SCRIPT)
    out = tmp_path / "scan.json"
    threads = torch.get_num_threads()
    try:
        result = module.main(
            [
                "--batch",
                "1",
                "--d",
                "4",
                "--n",
                "2",
                "--length",
                "16",
                "--repeats",
                "2",
                "--threads",
                "1",
                "--json",
                str(out),
            ]
        )
    finally:
        torch.set_num_threads(threads)
    assert set(result["rows"]) == {"chunked", "numba-states", "numba"} and result["speedup"] > 0
    assert result["speedup_over_states_inner"] > 0
    assert json.loads(out.read_text())["settings"]["length"] == 16
    assert "faster than chunked" in capsys.readouterr().out
