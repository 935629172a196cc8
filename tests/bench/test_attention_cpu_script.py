"""benchmarks/attention_cpu.py: both implementations timed at the shapes asked for, the rows
written, the thread count and the subnormal mode left as found, bad shapes refused."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from longrange.ops.attention import numba as attention_numba
from longrange.train.denormals import flushing

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "attention_cpu.py"


def _module():
    spec = importlib.util.spec_from_file_location("attention_cpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not attention_numba.numba_available(), reason="numba does not import")
def test_a_tiny_run_times_both_and_leaves_the_process_as_found(tmp_path):
    threads, mode = torch.get_num_threads(), flushing()
    rows = _module().main(["--shapes", "2x2x9x4", "--repeats", "1", "--json", str(tmp_path / "a.json")])
    assert [(r["shape"], r["causal"]) for r in rows] == [([2, 2, 9, 4], True), ([2, 2, 9, 4], False)]
    assert all(r["numba_ms"] > 0 and r["sdpa_ms"] > 0 for r in rows)
    saved = json.loads((tmp_path / "a.json").read_text())
    assert saved["rows"] == rows and saved["environment"]["threads"] == 1
    assert torch.get_num_threads() == threads and flushing() == mode


def test_bad_shapes_are_refused():
    with pytest.raises(SystemExit):
        _module().main(["--shapes", "2x2x9"])
