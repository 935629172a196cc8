"""``longrange check``: passes on the CPU, reports a wrong or crashing kernel as FAIL with the
setting that avoids it, leaves the environment as it was, and refuses bad arguments."""

from __future__ import annotations

import math
import os

import pytest
import torch

from longrange import check
from longrange.cli import COMMAND_MODULES, main
from longrange.info import format_info, info_table
from longrange.ops import check_cases, scan
from longrange.ops._lazy_kernels import interpreter_problem
from longrange.ops.checking import Case, compare, random_inputs
from longrange.ops.scan import dispatch
from longrange.ops.scan import numba as scan_numba
from longrange.ops.scan import triton as scan_triton

COLUMNS = ("op", "implementation", "device", "dtype", "max rel. error", "tolerance", "result")


def _rows(text: str) -> dict[tuple[str, str, str], str]:
    """(op, implementation, dtype) -> result, from the printed table."""
    lines = text.split("\n\n")[0].splitlines()[2:]
    rows = {}
    for line in lines:
        cells = [c for c in line.split("  ") if c.strip()]
        rows[(cells[0].strip(), cells[1].strip(), cells[3].strip())] = cells[-1].strip()
    return rows


@pytest.fixture
def scan_only(monkeypatch):
    """Only the selective scan's cases, to keep the failure tests short."""
    monkeypatch.setattr(check, "FAMILIES", [check_cases.scan_cases])


def test_check_passes_on_the_cpu_and_prints_the_table(capsys):
    assert "longrange.check" in COMMAND_MODULES
    before = os.environ.get("TRITON_INTERPRET")
    assert main(["check", "--quick", "--device", "cpu"]) == 0
    assert os.environ.get("TRITON_INTERPRET") == before  # set only while the Triton cases ran
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert all(column in header for column in COLUMNS)
    rows = _rows(out)
    assert set(rows.values()) == {"pass"}
    for impl in scan.available_impls("cpu"):
        if impl != "ref":
            assert rows[("selective_scan", impl, "float32")] == "pass"
            assert ("selective_scan", impl, "bfloat16") in rows
    if scan_triton.unavailable_reason() is None and interpreter_problem() is None:
        assert rows[("selective_scan", "triton (interpreter)", "float32")] == "pass"
    for op in (
        "causal_conv1d",
        "fft_conv",
        "masked_attention",
        "cauchy",
        "vandermonde_kernel",
        "diag_ssm_kernel",
        "dplr_ssm_kernel",
        "complex_diag_scan",
    ):
        assert any(key[0] == op for key in rows), op
    for impl in ("chunk", "loop"):  # the reference aside; complex, so float32 only
        assert rows[("complex_diag_scan", impl, "float32")] == "pass"
        assert ("complex_diag_scan", impl, "bfloat16") not in rows
    for layer in ("S4", "S4D", "S6", "DLR"):
        assert rows[(f"{layer} step == forward", "causal", "float32")] == "pass"
        assert rows[(f"{layer} step == forward", "both directions", "float32")] == "pass"
    assert rows[("attention step == forward", "causal", "float32")] == "pass"
    assert "checks passed" in out


def _wrong(real):
    def wrong(*args, **kwargs):
        out = real(*args, **kwargs)
        return (out[0] * 1.01, out[1]) if isinstance(out, tuple) else out * 1.01

    return wrong


def test_a_wrong_kernel_is_a_failure_with_the_setting_that_avoids_it(monkeypatch, capsys, scan_only):
    if scan_numba.numba_available():
        monkeypatch.setattr(scan_numba, "selective_scan_numba", _wrong(scan_numba.selective_scan_numba))
        broken, other = "numba", "chunked"
    else:
        monkeypatch.setattr(dispatch, "selective_scan_chunked", _wrong(dispatch.selective_scan_chunked))
        broken, other = "chunked", "ref"
    assert main(["check", "--quick", "--device", "cpu", "--dtype", "float32"]) == 1
    out = capsys.readouterr().out
    rows = _rows(out)
    assert rows[("selective_scan", broken, "float32")] == "FAIL"
    assert all(result == "pass" for key, result in rows.items() if key[1] != broken)
    assert f"FAIL selective_scan {broken} on cpu in float32" in out and "> tolerance" in out
    assert f"avoid it with impl='{other}'" in out and f"model.primitive_options.scan_impl={other}" in out
    assert "1 of" in out and "FAILED" in out


def test_a_kernel_that_raises_is_a_failure(monkeypatch, capsys, scan_only):
    def crash(*args, **kwargs):
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(scan_numba, "selective_scan_numba", crash)
    monkeypatch.setattr(scan_numba, "numba_available", lambda: True)
    rows = check.run_cases(check.cases(["cpu"], [torch.float32], quick=True))
    row = next(r for r in rows if r.impl == "numba")
    assert not row.passed and math.isinf(row.error) and "raised RuntimeError: no kernel image" in row.failures[0]
    assert "FAIL" in check.format_table(rows)


def test_a_dispatcher_that_runs_another_implementation_is_a_failure(monkeypatch, scan_only):
    monkeypatch.setattr(dispatch, "_ran", lambda impl, out: dispatch.used.note("selective_scan", "ref") or out)
    rows = check.run_cases(check.cases(["cpu"], [torch.float32], quick=True))
    assert rows and all(not r.passed for r in rows)
    assert "the dispatcher reports ['ref']" in rows[0].failures[0]


def test_a_new_family_is_one_function(monkeypatch):
    def family(device, dtype):
        inputs = random_inputs(0, x=(3, 4))
        return [
            Case(
                "double",
                "torch",
                device,
                dtype,
                "3x4",
                lambda: compare(lambda x: 2 * x, lambda x: x + x, inputs, dtype, device),
                1e-6,
            )
        ]

    monkeypatch.setattr(check, "FAMILIES", [family])
    rows = check.run_cases(check.cases(["cpu"], [torch.float32, torch.bfloat16]))
    assert [(r.op, r.passed, r.error) for r in rows] == [("double", True, 0.0), ("double", True, 0.0)]


def test_the_interpreter_setting_does_not_leak(monkeypatch, scan_only):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    seen = []
    real = scan_triton.selective_scan_triton
    monkeypatch.setattr(
        scan_triton,
        "selective_scan_triton",
        lambda *a, **k: seen.append(os.environ.get("TRITON_INTERPRET")) or real(*a, **k),
    )
    rows = check.run_cases(check.cases(["cpu"], [torch.float32], quick=True))
    assert all(r.passed for r in rows)
    if scan_triton.unavailable_reason() is None and interpreter_problem() is None:
        assert seen == ["1"]
    assert os.environ["TRITON_INTERPRET"] == "0"


def test_compare_measures_the_error_of_outputs_and_gradients():
    inputs = random_inputs(0, x=(5,))
    assert compare(lambda x: x.sin(), lambda x: x.sin(), inputs, torch.float32, "cpu") < 1e-6
    assert compare(lambda x: 1.1 * x, lambda x: x, inputs, torch.float32, "cpu") == pytest.approx(0.1, rel=1e-5)
    # right values, wrong gradients
    assert compare(lambda x: x + (x - x.detach()), lambda x: x, inputs, torch.float32, "cpu") == pytest.approx(1.0)
    assert math.isinf(compare(lambda x: x * math.nan, lambda x: x, inputs, torch.float32, "cpu"))


def test_bad_arguments_are_refused(capsys):
    if not torch.cuda.is_available():
        assert main(["check", "--device", "cuda"]) == 2
        err = capsys.readouterr().err
        assert "--device cuda: CUDA is not available" in err and "--device cpu" in err
    with pytest.raises(SystemExit) as exc:
        main(["check", "--dtype", "float16"])
    assert exc.value.code == 2
    assert "invalid choice: 'float16'" in capsys.readouterr().err


def test_info_ends_by_pointing_to_check():
    assert format_info(info_table()).rstrip().splitlines()[-1].startswith("longrange check")


def test_a_failing_long_convolution_names_the_implementation_that_passed():
    from longrange.ops.check_cases import _INTERPRETER, _use_instead
    from longrange.ops.checking import REPORT

    avoid = _use_instead("fft_conv", "cpu", "fftconv", "Hyena layers model.primitive_options.conv_impl")
    assert avoid(["fft"]) == (
        "avoid it with impl='fft': fft_conv(..., impl='fft'), longrange.ops.fftconv.set_default_impl('fft'), "
        "or for Hyena layers model.primitive_options.conv_impl=fft"
    )
    assert avoid([]) == REPORT
    assert _use_instead("selective_scan", "cpu", "scan", "S6 layers", interpreted=True)(["chunked"]) == _INTERPRETER
