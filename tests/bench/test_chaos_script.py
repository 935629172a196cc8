"""The chaos benchmark (benchmarks/chaos.py) runs end to end at a tiny size and finds nothing lost,
extra, duplicated or differing (slow: CI's default run skips it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "chaos.py"


@pytest.mark.slow
@pytest.mark.parametrize(
    "launcher, reference", [("local", "local"), ("slurm-local", "slurm-local"), ("slurm-local", "local")]
)
def test_chaos_script_finishes_a_killed_grid_with_nothing_lost(tmp_path, launcher, reference):
    out = tmp_path / "chaos.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--stages",
            "9",
            "--schedules",
            "1",
            "--launcher",
            launcher,
            "--reference-launcher",
            reference,
            "--every",
            "2",
            "--dir",
            str(tmp_path / "runs"),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = json.loads(out.read_text())
    assert row["stages"] == 9 and row["coordinator_cpu_ms_per_stage"] > 0
    assert (row["launcher"], row["reference_launcher"]) == (launcher, reference)
    (schedule,) = row["schedules"]
    assert schedule["lost"] == schedule["extra"] == schedule["duplicated"] == schedule["differing"] == 0
