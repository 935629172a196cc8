"""benchmarks/grid_jobs.py: its placements (JOBSxTHREADS) and their errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import repo_scripts

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "grid_jobs.py"


def _module():
    return repo_scripts.load(SCRIPT)


def test_placements_are_jobs_by_threads():
    assert _module().placements("16x1, 8x2,4x4") == [(16, 1), (8, 2), (4, 4)]


@pytest.mark.parametrize("text", ["16", "8x", "x2", "0x4", "4x0", "ax2"])
def test_a_bad_placement_is_an_error_naming_it(text):
    with pytest.raises(argparse.ArgumentTypeError, match=f"JOBSxTHREADS with both at least 1, e.g. 8x2; got '{text}'"):
        _module().placements(text)
