"""``benchmarks/ssm_kernels.py`` runs end to end on tiny problems, in this process and in fresh
ones, writes its JSON and prints its Markdown tables (no timings asserted)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from longrange.ops.ssm_kernels import cpu

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "ssm_kernels.py"


def _module():
    spec = importlib.util.spec_from_file_location("ssm_kernels_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("isolate", [False, True])
@pytest.mark.skipif(not cpu.numba_available(), reason="numba does not import")
def test_ssm_kernels_script_runs(tmp_path, capsys, isolate):
    module = _module()
    out = tmp_path / "ssm.json"
    cases = "s4d-kernel,s4-layer" if isolate else ",".join(module.CASES)
    threads = torch.get_num_threads()
    try:
        result = module.main(["--lengths", "16", "--cases", cases, "--d-model", "4", "--d-state", "4", "--repeats", "2",
                              "--threads", "1", "--json", str(out)] + ([] if isolate else ["--no-isolate"]))
    finally:
        torch.set_num_threads(threads)
    rows = result["rows"]
    assert {(r["case"], r["impl"]) for r in rows} == {(c, i) for c in cases.split(",") for i in ("chunked", "numba")}
    for r in rows:
        assert r["forward_backward_min_s"] > 0 and r["speedup_forward_backward"] > 0 and r["max_rel_diff_vs_chunked"] < 1e-4
    assert json.loads(out.read_text())["settings"]["lengths"] == [16]
    capsys.readouterr()
    module.main(["--markdown", str(out)])
    text = capsys.readouterr().out
    assert "| length | batch | chunked fwd+bwd s | numba fwd+bwd s |" in text and "**s4d-kernel**" in text


def test_unknown_case_is_named():
    with pytest.raises(SystemExit, match="unknown cases"):
        _module().main(["--cases", "s5-kernel"])
