"""benchmarks/grid_jobs.py: its placements (JOBSxTHREADS) and their errors."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "grid_jobs.py"


def _module():
    spec = importlib.util.spec_from_file_location("grid_jobs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_placements_are_jobs_by_threads():
    assert _module().placements("16x1, 8x2,4x4") == [(16, 1), (8, 2), (4, 4)]


@pytest.mark.parametrize("text", ["16", "8x", "x2", "0x4", "4x0", "ax2"])
def test_a_bad_placement_is_an_error_naming_it(text):
    with pytest.raises(argparse.ArgumentTypeError, match=f"JOBSxTHREADS with both at least 1, e.g. 8x2; got '{text}'"):
        _module().placements(text)
