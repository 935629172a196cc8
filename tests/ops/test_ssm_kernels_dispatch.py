"""The choice of implementation of the Vandermonde and Cauchy products: auto per device, forcing one,
the errors, the deterministic rule, the record in ``longrange.ops.used``, the package layout."""

from __future__ import annotations

import ast
from pathlib import Path

import interpreter
import pytest
import torch
from ssm_kernel_cases import cauchy_inputs, vandermonde_inputs  # noqa: E402 - a helper module next to this file

from longrange.layers.dlr import DLR
from longrange.layers.s4 import S4
from longrange.layers.s4d import S4D
from longrange.ops import fftconv, ssm_kernels, used
from longrange.ops.ssm_kernels import dispatch, keops
from longrange.ops.ssm_kernels import numba as ssm_numba
from longrange.ops.ssm_kernels import triton as ssm_triton

OPS = ("vandermonde", "cauchy")


def _call(op: str, impl: str | None = None, device="cpu"):
    if op == "vandermonde":
        a, W = vandermonde_inputs(2, 3)
        return ssm_kernels.vandermonde_kernel(a.to(device), W.to(device), 5, impl=impl)
    v, z, w = cauchy_inputs((2, 3), (2, 4), (2, 3))
    return ssm_kernels.cauchy(v.to(device), z.to(device), w.to(device), impl=impl)


@pytest.fixture
def no_numba(monkeypatch):
    monkeypatch.setattr(ssm_numba._KERNELS, "module", None)
    monkeypatch.setattr(ssm_numba._KERNELS, "error", "ImportError: No module named 'numba'")


@pytest.fixture
def no_triton(monkeypatch):
    monkeypatch.setattr(ssm_triton._KERNELS, "module", None)
    monkeypatch.setattr(ssm_triton._KERNELS, "error", "ImportError: No module named 'triton'")


# --------------------------------------------------------------------------------------------
# auto per device, available_impls
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_auto_on_cpu_is_numba_else_chunked(op, monkeypatch):
    interpreter.use(monkeypatch)  # the interpreter is never chosen automatically
    if ssm_numba.numba_available():
        assert ssm_kernels.auto_impl(op, "cpu") == "numba"
    monkeypatch.setattr(ssm_numba._KERNELS, "module", None)
    monkeypatch.setattr(ssm_numba._KERNELS, "error", "ImportError: no numba")
    assert ssm_kernels.auto_impl(op, "cpu") == "chunked"
    assert "numba" not in ssm_kernels.available_impls(op, "cpu")


def test_auto_on_cuda_prefers_triton_then_pykeops_then_chunked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # asks the ops only; needs no GPU
    if ssm_triton._kernel_module() is not None:
        assert ssm_kernels.auto_impl("vandermonde", "cuda") == ssm_kernels.auto_impl("cauchy", "cuda") == "triton"
    monkeypatch.setattr(ssm_triton._KERNELS, "module", None)
    monkeypatch.setattr(ssm_triton._KERNELS, "error", "ImportError: no triton")
    assert ssm_kernels.auto_impl("vandermonde", "cuda") == "chunked"
    assert ssm_kernels.auto_impl("cauchy", "cuda") == "chunked"
    monkeypatch.setattr(keops._optional, "pykeops", object())
    assert ssm_kernels.auto_impl("cauchy", "cuda") == "pykeops"
    assert ssm_kernels.available_impls("cauchy", "cuda") == ["pykeops", "chunked", "ref"]
    assert ssm_kernels.available_impls("cauchy", "cpu")[-2:] == ["chunked", "ref"]  # pykeops is CUDA only


def test_auto_on_meta_is_the_gpus_kernel_by_its_fake_implementation(no_triton):
    """On the meta device (dry runs) the dispatcher traces the kernel a GPU runs, Triton's, whose
    operator's fake implementation needs neither a GPU nor triton; the outputs have the real shapes."""
    for op in OPS:
        assert ssm_kernels.auto_impl(op, "meta") == "triton"
        assert ssm_kernels.available_impls(op, "meta") == ["triton", "chunked", "ref"]
        used.reset()
        out = _call(op, device="meta")
        assert used.kernels() == {op: "triton"}
        real = _call(op, "chunked")
        assert out.device.type == "meta" and out.shape == real.shape and out.dtype == real.dtype


def test_available_impls_on_the_functions_and_in_the_table(monkeypatch):
    interpreter.use(monkeypatch)
    expected = (
        ["triton"] * (ssm_triton._kernel_module() is not None)
        + ["numba"] * ssm_numba.numba_available()
        + ["chunked", "ref"]
    )
    assert ssm_kernels.vandermonde_kernel.available_impls("cpu") == expected
    assert ssm_kernels.available_impls("vandermonde", "cpu") == expected
    assert ssm_kernels.cauchy.available_impls("cpu") == expected
    assert ssm_kernels.cauchy.auto_impl("cpu") == ssm_kernels.cauchy_impl("cpu")
    assert set(ssm_kernels.vandermonde_kernel.deterministic_backward) == set(ssm_kernels.IMPLS["vandermonde"])
    for op in OPS:
        for impl in ssm_kernels.available_impls(op, "cpu"):  # every listed one runs
            assert torch.isfinite(_call(op, impl)).all(), (op, impl)


# --------------------------------------------------------------------------------------------
# forcing an implementation, errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_unknown_impl_is_a_value_error(op):
    with pytest.raises(ValueError, match="unknown impl 'cuda'"):
        _call(op, "cuda")
    with pytest.raises(ValueError, match="unknown impl"):
        ssm_kernels.set_default_impl(op, "fast")


def test_pykeops_is_not_a_vandermonde_impl():
    with pytest.raises(ValueError, match="unknown impl 'pykeops'"):
        _call("vandermonde", "pykeops")


@pytest.mark.parametrize("op", OPS)
def test_forced_impl_that_cannot_run_here_says_why(op, monkeypatch, no_numba, no_triton):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(
        RuntimeError,
        match=r"impl='numba' needs the numba package, which does not import .*available here: chunked, ref",
    ):
        _call(op, "numba")
    with pytest.raises(RuntimeError, match="impl='triton' needs the triton package, which does not import"):
        _call(op, "triton")
    with pytest.raises(RuntimeError, match="impl='numba' cannot run on meta: it runs on CPU tensors only"):
        _call(op, "numba", device="meta")


def test_forced_triton_on_cpu_without_the_interpreter(monkeypatch):
    if ssm_triton._kernel_module() is None:
        pytest.skip("triton does not import")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        _call("cauchy", "triton")


def test_forced_pykeops_on_cpu():
    with pytest.raises(RuntimeError, match="impl='pykeops' cannot run on cpu: it needs CUDA tensors"):
        _call("cauchy", "pykeops")


def test_bad_arguments_name_the_argument():
    a, W = vandermonde_inputs(2, 3)
    with pytest.raises(ValueError, match=r"vandermonde_kernel: log_dA \(2, 2\) must be \(H, M\) or \(1, M\)"):
        ssm_kernels.vandermonde_kernel(a[:, :2], W, 4)
    with pytest.raises(ValueError, match="L must be a positive int, got 0"):
        ssm_kernels.vandermonde_kernel(a, W, 0)
    v, z, w = cauchy_inputs((2, 3), (2, 4), (2, 3))
    with pytest.raises(ValueError, match="differ in their last dimension"):
        ssm_kernels.cauchy(v, z, w[:, :2])
    with pytest.raises(ValueError, match="do not broadcast"):
        ssm_kernels.cauchy(v, z[:1].expand(3, 4), w)


@pytest.mark.parametrize("op", OPS)
def test_default_impl_and_its_context_manager(op):
    used.reset()
    with ssm_kernels.default_impl(op, "ref"):
        _call(op)
    _call(op)
    assert used.calls()[op] == {"ref": 1, ssm_kernels.auto_impl(op, "cpu"): 1}
    previous = ssm_kernels.set_default_impl(op, "chunked")
    try:
        assert previous == "auto"
        used.reset()
        _call(op)
        _call(op, "ref")  # an explicit impl wins over the default
        assert used.calls()[op] == {"chunked": 1, "ref": 1}
    finally:
        ssm_kernels.set_default_impl(op, previous)


def test_default_impl_of_both_ops():
    used.reset()
    with ssm_kernels.default_impl(ssm_kernels.OPS, "chunked"):
        _call("vandermonde")
        _call("cauchy")
    assert used.kernels() == {"cauchy": "chunked", "vandermonde": "chunked"}


# --------------------------------------------------------------------------------------------
# determinism
# --------------------------------------------------------------------------------------------


@pytest.fixture
def deterministic():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous)


def test_every_implementation_states_its_backward():
    for op in OPS:
        assert set(ssm_kernels.DETERMINISTIC_BACKWARD[op]) == set(ssm_kernels.IMPLS[op])
        assert all(isinstance(v, bool) for v in ssm_kernels.DETERMINISTIC_BACKWARD[op].values())


@pytest.mark.parametrize("op", OPS)
def test_deterministic_mode_keeps_auto_off_non_deterministic_backwards(op, monkeypatch, deterministic):
    if not ssm_numba.numba_available():
        pytest.skip("numba does not import")
    assert ssm_kernels.auto_impl(op, "cpu") == "numba"  # deterministic: allowed
    monkeypatch.setitem(ssm_kernels.DETERMINISTIC_BACKWARD[op], "numba", False)
    assert ssm_kernels.auto_impl(op, "cpu") == "chunked"
    used.reset()
    _call(op)
    assert used.kernels() == {op: "chunked"}
    with pytest.raises(
        RuntimeError,
        match=r"impl='numba' has a non-deterministic backward .* deterministic implementations 'chunked', 'ref'",
    ):
        _call(op, "numba")


@pytest.mark.parametrize("op", OPS)
def test_non_deterministic_backward_is_fine_outside_deterministic_mode(op, monkeypatch):
    if not ssm_numba.numba_available():
        pytest.skip("numba does not import")
    assert not torch.are_deterministic_algorithms_enabled()
    monkeypatch.setitem(ssm_kernels.DETERMINISTIC_BACKWARD[op], "numba", False)
    assert ssm_kernels.auto_impl(op, "cpu") == "numba"
    _call(op, "numba")


# --------------------------------------------------------------------------------------------
# the record of what ran
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_each_call_notes_the_implementation_it_runs(op):
    for impl in ["auto", *ssm_kernels.available_impls(op, "cpu")]:
        if impl == "triton":
            continue  # only with the interpreter on, see the Triton tests
        used.reset()
        _call(op, impl)
        expected = ssm_kernels.auto_impl(op, "cpu") if impl == "auto" else impl
        assert used.calls() == {op: {expected: 1}}


def test_triton_is_noted(monkeypatch):
    if ssm_triton._kernel_module() is None:
        pytest.skip("triton does not import")
    interpreter.use(monkeypatch)
    used.reset()
    _call("vandermonde", "triton")
    _call("cauchy", "triton")
    assert used.kernels() == {"cauchy": "triton", "vandermonde": "triton"}


def test_layers_record_their_products():
    x = torch.randn(2, 16, 4)
    used.reset()
    S4D(4, d_state=4)(x)
    DLR(4, d_state=4)(x)
    conv = fftconv.DISPATCHER.auto_impl("cpu", length=16)  # the convolution with the kernel
    assert used.calls() == {"vandermonde": {ssm_kernels.auto_impl("vandermonde", "cpu"): 2}, "fft_conv": {conv: 2}}
    used.reset()
    S4(4, d_state=4, l_max=16, bidirectional=True)(x).sum().backward()
    # one call for all sums
    assert used.calls() == {"cauchy": {ssm_kernels.auto_impl("cauchy", "cpu"): 1}, "fft_conv": {conv: 1}}


# --------------------------------------------------------------------------------------------
# the package
# --------------------------------------------------------------------------------------------

#: The public names of the former module ``longrange.ops.ssm_kernels``, which the package keeps.
FORMER_NAMES = [
    "CAUCHY_CHUNK_ELEMENTS",
    "DISCRETIZATIONS",
    "bilinear_dense",
    "c_tilde_to_c",
    "c_to_c_tilde",
    "cauchy",
    "cauchy_impl",
    "cauchy_ref",
    "complete_conj",
    "dense_ssm_kernel_ref",
    "diag_ssm_kernel",
    "diag_ssm_kernel_ref",
    "discretize_diag",
    "dplr_dense",
    "dplr_generating_kernel",
    "dplr_ssm_kernel",
    "dplr_ssm_kernel_ref",
    "vandermonde_kernel",
    "vandermonde_kernel_ref",
]


def test_the_package_keeps_every_former_public_name():
    for name in FORMER_NAMES:
        assert hasattr(ssm_kernels, name), name
        assert name in ssm_kernels.__all__, name


def test_implementations_import_the_shared_module_not_each_other():
    """reference, chunked, numba, triton and keops import only common (and reference for the chunked
    Cauchy sum); none imports another's private names."""
    package = Path(ssm_kernels.__file__).parent
    variants = {"reference", "chunked", "numba", "triton", "keops"}
    for name in variants:
        tree = ast.parse((package / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("longrange.ops.ssm_kernels"):
                target = node.module.rsplit(".", 1)[-1]
                if target in ("ssm_kernels", f"_{name}_kernels", "_numba_kernels", "_triton_kernels"):
                    continue  # the module's own compiled kernels (imported lazily)
                assert target in ("common", "reference") and not (target == "reference" and name != "chunked"), (
                    name,
                    target,
                )
                assert not any(alias.name.startswith("_") for alias in node.names), (name, target)
    assert dispatch.vandermonde_kernel is ssm_kernels.vandermonde_kernel
