"""The Triton Vandermonde and Cauchy kernels against the float64 references: values and every
gradient, float64 and float32, both directions, conjugate pairs, the S4D and S4 kernels on them.

CPU tensors run the kernels in Triton's interpreter (``TRITON_INTERPRET=1``, set per test: the
module picks the interpreter when a kernel is launched, not when it is imported); CUDA tensors run
the compiled kernels when a GPU is present. The interpreter is slow, so the shapes are tiny and
its tiles small (``DEFAULT_CONFIG["interpret"]``), so that every test still crosses tile edges.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import ssm_kernel_cases as cases  # noqa: E402 - a helper module next to this file

from longrange.ops._lazy_kernels import interpreter_problem  # noqa: E402
from longrange.ops.ssm_kernels import diag_ssm_kernel, diag_ssm_kernel_ref, dplr_ssm_kernel, dplr_ssm_kernel_ref  # noqa: E402
from longrange.ops.ssm_kernels import triton as ssm_triton  # noqa: E402
from longrange.ops.ssm_kernels.dispatch import vandermonde_kernel  # noqa: E402

F64, F32 = torch.float64, torch.float32
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@pytest.fixture(params=DEVICES)
def device(request, monkeypatch):
    """The device under test, with the interpreter on for CPU and off for CUDA (compiled kernels)."""
    if request.param == "cpu":
        if (why := interpreter_problem()) is not None:  # e.g. Triton 3.6's interpreter with NumPy >= 2.4
            pytest.skip(why)
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return torch.device(request.param)


def _tol(dtype, device):
    return 1e-10 if dtype == F64 else (1e-4 if device.type == "cuda" else 2e-5)


@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize(
    "H, M, lead, shared, L",
    [
        (3, 5, (), False, 13),  # M not a multiple of the tile, odd length
        (2, 6, (2,), False, 21),  # two output channels (bidirectional)
        (3, 3, (2,), True, 10),  # modes shared by the channels: 6 weight rows
    ],
)
def test_vandermonde_matches_reference(device, H, M, lead, shared, L, dtype):
    inputs = cases.vandermonde_inputs(H, M, lead, shared, seed=H + M + L)
    cases.assert_matches_reference(
        cases.vandermonde("triton", L),
        cases.vandermonde_ref(L),
        inputs,
        dtype,
        device,
        tol=_tol(dtype, device),
        what="vandermonde triton",
    )


@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize("conj_pairs", [False, True])
@pytest.mark.parametrize(
    "v_shape, z_shape, w_shape",
    [
        ((3, 2, 5), (2, 11), (2, 5)),  # three vectors sharing each row's points and poles, odd N and K
        ((3, 1, 5), (1, 7), (2, 5)),  # broadcasting in every argument
    ],
)
def test_cauchy_matches_reference(device, v_shape, z_shape, w_shape, conj_pairs, dtype):
    inputs = cases.cauchy_inputs(v_shape, z_shape, w_shape, seed=z_shape[-1])
    cases.assert_matches_reference(
        cases.cauchy_with("triton", conj_pairs),
        cases.cauchy_reference(conj_pairs),
        inputs,
        dtype,
        device,
        tol=1e-10 if dtype == F64 else 1e-4,
        what="cauchy triton",
    )


@pytest.mark.parametrize("channels", [1, 2], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("method", ["zoh", "bilinear"])
def test_diag_ssm_kernel_triton(device, method, channels):
    g = torch.Generator().manual_seed(1)
    H, M, L = 2, 3, 9
    dt = torch.rand(H, generator=g, dtype=F64) * 0.3 + 0.01
    A = torch.complex(-torch.rand(H, M, generator=g, dtype=F64) - 0.05, torch.randn(H, M, generator=g, dtype=F64) * 4)
    cases.assert_matches_reference(
        lambda *a: diag_ssm_kernel(*a, L, method, impl="triton"),
        lambda *a: diag_ssm_kernel_ref(*a, L, method),
        [dt, A, cases.cplx(g, H, M), cases.cplx(g, channels, H, M)],
        F32,
        device,
        tol=_tol(F32, device),
        what=f"diag {method}",
    )


@pytest.mark.parametrize("channels", [1, 2], ids=["causal", "bidirectional"])
def test_dplr_ssm_kernel_triton(device, channels):
    g = torch.Generator().manual_seed(2)
    H, N, L = 2, 3, 10
    dt = torch.rand(H, generator=g, dtype=F64) * 0.4 + 0.05
    Lam = torch.complex(-torch.rand(H, N, generator=g, dtype=F64) - 0.1, torch.randn(H, N, generator=g, dtype=F64) * 3)
    params = [
        dt,
        Lam,
        cases.cplx(g, 1, H, N, scale=0.4),
        cases.cplx(g, 1, H, N, scale=0.4),
        cases.cplx(g, H, N),
        cases.cplx(g, channels, H, N),
    ]
    cases.assert_matches_reference(
        lambda *a: dplr_ssm_kernel(*a, L, conj_pairs=True, impl="triton"),
        lambda *a: dplr_ssm_kernel_ref(*a, L, conj_pairs=True),
        params,
        F32,
        device,
        tol=1e-4,
        what="dplr",
    )


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not ssm_triton.triton_available("cpu")
    a, W = cases.vandermonde_inputs(2, 3)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        vandermonde_kernel(a, W, 4, impl="triton")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        ssm_triton.cauchy_triton(*cases.cauchy_inputs((2, 3), (2, 4), (2, 3)))


@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
@pytest.mark.parametrize("conj", [False, True])
def test_kernels_compile_for_a_cuda_gpu(dtype, conj, compile_for_cuda):
    """Compile every kernel to a CUDA binary (sm_90) with the GPU tile sizes, which needs Triton's
    bundled CUDA toolchain but no GPU: the interpreter accepts code that the compiler may not."""
    from longrange.ops.ssm_kernels import _triton_kernels as K

    acc = K.tl.float64 if dtype == "fp64" else K.tl.float32
    cfg = ssm_triton.DEFAULT_CONFIG["gpu"]
    bj, bm, bl = ssm_triton._blocks(4, 32, cfg)
    pointer = lambda arg: "fp64" if arg.startswith("a_") else dtype  # noqa: E731
    for name, jit in K.kernels(interpret=False).items():
        if name.startswith("vandermonde"):
            constants = dict(BLOCK_J=bj, BLOCK_L=bl, BLOCK_M=bm, BLOCK_S=min(16, bl), ACC=acc)
            assert compile_for_cuda(jit, constants, pointer, cfg["num_warps"]), name
            continue
        for J in (1, 4):  # the Cauchy kernels' tiles depend on the number of vectors
            constants = dict(CONJ=conj, ACC=acc, **ssm_triton._cauchy_constants(J, 32, cfg)[name])
            assert compile_for_cuda(jit, constants, pointer, cfg["num_warps"], ssm_triton.CAUCHY_OPTIONS), (name, J)


@pytest.mark.parametrize("module", ["longrange.ops.ssm_kernels._triton_kernels", "longrange.ops.scan._triton_kernels"])
def test_the_compiled_kernels_keep_their_constexpr_parameters(module):
    """The kernels built for the GPU (JITFunction) declare as compile-time constants exactly the
    parameters annotated ``tl.constexpr``, helpers included. The interpreter does not check this,
    and a kernel rebuilt without its annotations took its compute dtype as a run-time argument,
    which the compiler refuses ("failed to specialize argument of type: dtype", seen on an H100
    with Triton 3.6)."""
    import importlib
    import inspect

    from triton.runtime.jit import JITFunction

    mod = importlib.import_module(module)
    built = mod.kernels(False)
    kernels = list(built.values()) if isinstance(built, dict) else list(built)
    helpers = [v for k in kernels for v in k.fn.__globals__.values() if isinstance(v, JITFunction)]
    assert kernels
    for k in kernels + helpers:
        declared = [name for name, p in inspect.signature(k.fn).parameters.items() if "constexpr" in str(p.annotation)]
        compiled = [p.name for p in k.params if p.is_constexpr]
        assert compiled == declared, k.fn.__name__
        if k in kernels:
            assert "ACC" in compiled, k.fn.__name__
