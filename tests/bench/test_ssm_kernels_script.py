"""``benchmarks/ssm_kernels.py`` runs end to end on tiny problems, in this process and in fresh
ones, writes its JSON and prints its Markdown tables (no timings asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import interpreter
import pytest
import repo_scripts
import torch

from longrange.ops.ssm_kernels import numba as ssm_numba

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "ssm_kernels.py"


def _module():
    return repo_scripts.load(SCRIPT, "ssm_kernels_bench")


@pytest.mark.parametrize("isolate", [False, True])
@pytest.mark.skipif(not ssm_numba.numba_available(), reason="numba does not import")
def test_ssm_kernels_script_runs(tmp_path, capsys, isolate):
    module = _module()
    out = tmp_path / "ssm.json"
    cases = "s4d-kernel,s4-layer" if isolate else ",".join(module.CASES)
    threads = torch.get_num_threads()
    try:
        result = module.main(
            [
                "--lengths",
                "16",
                "--cases",
                cases,
                "--d-model",
                "4",
                "--d-state",
                "4",
                "--repeats",
                "2",
                "--threads",
                "1",
                "--json",
                str(out),
            ]
            + ([] if isolate else ["--no-isolate"])
        )
    finally:
        torch.set_num_threads(threads)
    rows = result["rows"]
    assert {(r["case"], r["impl"]) for r in rows} == {(c, i) for c in cases.split(",") for i in ("chunked", "numba")}
    for r in rows:
        assert (
            r["forward_backward_min_s"] > 0
            and r["speedup_forward_backward"] > 0
            and r["max_rel_diff_vs_chunked"] < 1e-4
        )
    assert json.loads(out.read_text())["settings"]["lengths"] == [16]
    capsys.readouterr()
    module.main(["--markdown", str(out)])
    text = capsys.readouterr().out
    assert "| length | batch | chunked fwd+bwd s | numba fwd+bwd s |" in text and "**s4d-kernel**" in text


def test_unknown_case_is_named():
    with pytest.raises(SystemExit, match="unknown cases"):
        _module().main(["--cases", "s5-kernel"])


def test_the_triton_kernels_are_timed_in_float32_and_float64_where_triton_runs(monkeypatch):
    module = _module()
    monkeypatch.setattr(module.ssm_kernels, "available_impls", lambda op, device: ["chunked", "keops", "triton", "ref"])
    cuda = torch.device("cuda")
    assert module.impls_for("s4-layer", cuda, None) == ["chunked", "keops", "triton", "triton-float64"]
    assert module.impls_for("s4d-kernel", cuda, ["chunked", "triton-float64"]) == ["chunked", "triton-float64"]
    # On a CPU Triton would run in its interpreter: neither mode is timed.
    assert module.impls_for("s4-layer", torch.device("cpu"), None) == ["chunked", "keops"]


def test_triton_float64_runs_the_triton_kernels_computing_in_float64(monkeypatch):
    """In Triton's interpreter: the kernels' compute dtype inside the block, the previous mode after it."""
    pytest.importorskip("triton")
    from longrange.ops.ssm_kernels import triton as ssm_triton

    module = _module()
    interpreter.use(monkeypatch)
    seen = []
    acc = ssm_triton._acc
    monkeypatch.setattr(ssm_triton, "_acc", lambda dtype, cfg: seen.append(cfg["float64"]) or acc(dtype, cfg))
    layer, _, _ = module.build("s4-kernel", 16, 4, 4, torch.float32, torch.device("cpu"))
    outputs = {}
    for impl in ("chunked", "triton", "triton-float64"):
        seen.clear()
        with module.implementation("cauchy", impl):
            outputs[impl] = layer.kernel(16).detach()
        assert set(seen) == {"chunked": set(), "triton": {False}, "triton-float64": {True}}[impl], impl
    assert all(not cfg["float64"] for cfg in ssm_triton.DEFAULT_CONFIG.values())
    for impl in ("triton", "triton-float64"):
        torch.testing.assert_close(outputs[impl], outputs["chunked"], rtol=1e-4, atol=1e-5)
