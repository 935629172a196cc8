"""Accuracy of the fused Vandermonde and Cauchy kernels on inputs drawn as the S4 repository's kernel
tests draw them (``benchmarks/ssm_kernel_accuracy.py``, at lengths short enough for the suite): the
largest and the mean elementwise relative error of the output and of the gradients, against float64,
no larger than those of the float32 direct sum (the S4 tests' PyTorch formula in complex64).

The numba kernels compute in float64 and round once (the Cauchy product) or keep the powers in
float64 (the Vandermonde product); the Triton kernels (in the interpreter, with the GPU's tiles)
compute in float32 by default (the Cauchy kernels with compensated arithmetic), in float64 with
``DEFAULT_CONFIG[...]["float64"]``."""

from __future__ import annotations

from pathlib import Path

import interpreter
import pytest
import repo_scripts
import torch

from longrange.ops.ssm_kernels import numba as ssm_numba

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "ssm_kernel_accuracy.py"
ERRORS = {"cauchy": ("out", "dv", "dw", "dz"), "vandermonde": ("out", "dv", "dx")}


@pytest.fixture(scope="module")
def script():
    return repo_scripts.load(SCRIPT)


def _rows(script, case: str, impls: list[str], N: int, L: int) -> dict[str, dict]:
    return {r["impl"]: r for r in script.measure_case(case, impls, N, L)}


def _assert_as_accurate(rows: dict[str, dict], impl: str, op: str, factor: float = 1.0) -> None:
    direct = rows["float32 direct sum"]
    for name in ERRORS[op]:
        for stat in ("max", "mean"):
            key = f"{name}_{stat}"
            assert rows[impl][key] <= factor * direct[key], (
                f"{impl} {key}: {rows[impl][key]:.3g} > {factor} x {direct[key]:.3g}"
            )


@pytest.mark.skipif(not ssm_numba.numba_available(), reason="numba does not import")
@pytest.mark.parametrize(
    "case, N, L", [("cauchy", 128, 8192), ("vandermonde", 256, 4096), ("vandermonde-long", 64, 16384)]
)
def test_numba_kernels_are_at_least_as_accurate_as_the_direct_sum(script, case, N, L):
    rows = _rows(script, case, ["numba"], N, L)
    op = "cauchy" if case == "cauchy" else "vandermonde"
    _assert_as_accurate(rows, "numba", op)
    if (
        op == "cauchy"
    ):  # float64 throughout, rounded once: the output and the gradients of v and w to float32's rounding
        for key in ("out_max", "dv_max", "dw_max"):
            assert rows["numba"][key] < 1.2e-7, (key, rows["numba"][key])


@pytest.fixture
def triton_gpu_tiles(monkeypatch):
    """Triton's interpreter with the tiles the GPU runs (so the order of the sums is the GPU's)."""
    pytest.importorskip("triton")
    import longrange.ops.ssm_kernels._triton_kernels  # noqa: F401 - Triton imported compiled (numpy's sums in the interpreter)
    from longrange.ops.ssm_kernels import triton as ssm_triton

    interpreter.use(monkeypatch)
    monkeypatch.setitem(ssm_triton.DEFAULT_CONFIG, "interpret", dict(ssm_triton.DEFAULT_CONFIG["gpu"]))
    return ssm_triton


def test_triton_vandermonde_is_at_least_as_accurate_as_the_direct_sum(script, triton_gpu_tiles):
    """In float32 too: the powers' phases are reduced modulo 2π in float64 before the float32
    cosine and sine (errors of a few ulp, not of the phase's magnitude)."""
    rows = _rows(script, "vandermonde", ["triton", "triton-float64"], 64, 1024)
    _assert_as_accurate(rows, "triton", "vandermonde")
    _assert_as_accurate(rows, "triton-float64", "vandermonde")
    assert rows["triton"]["out_mean"] < 1e-6 and rows["triton-float64"]["out_max"] < 1.2e-7


def test_triton_cauchy_is_at_least_as_accurate_as_the_direct_sum(script, triton_gpu_tiles):
    """In float32 (the default) too: the resolvents are carried to about twice float32's precision
    and every sum is compensated, in float32 arithmetic. At this size the direct sum loses 50 times
    float32's rounding where the sum over the poles cancels; float32 resolvents and tile sums gave
    0.7 to 3.2 times its errors. The means, steadier than the largest errors, stay well below. The
    float64 mode rounds once (checked on fewer points: the interpreter is slow)."""
    rows = _rows(script, "cauchy", ["triton"], 64, 1024)
    direct = rows["float32 direct sum"]
    assert direct["out_max"] > 1e-6, direct  # a point of cancellation, far above float32's rounding
    _assert_as_accurate(rows, "triton", "cauchy")
    for name in ERRORS["cauchy"]:
        assert rows["triton"][f"{name}_mean"] <= 0.7 * direct[f"{name}_mean"], (name, rows["triton"], direct)
    _assert_as_accurate(_rows(script, "cauchy", ["triton-float64"], 64, 512), "triton-float64", "cauchy")


def test_the_script_prints_its_tables(script, capsys, tmp_path):
    if not ssm_numba.numba_available():
        pytest.skip("numba does not import")
    out = tmp_path / "accuracy.json"
    threads = torch.get_num_threads()
    try:
        result = script.main(
            [
                "--cases",
                "cauchy,vandermonde",
                "--impls",
                "numba",
                "--N",
                "16",
                "--L",
                "512",
                "--threads",
                "1",
                "--json",
                str(out),
            ]
        )
    finally:
        torch.set_num_threads(threads)
    assert {(r["case"], r["impl"]) for r in result["rows"]} >= {
        ("cauchy", "numba"),
        ("vandermonde", "float32 direct sum"),
    }
    printed = capsys.readouterr().out
    assert "**cauchy** (N=16 L=512)" in printed and "| numba |" in printed and out.exists()
