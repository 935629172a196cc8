"""The Triton selective scan against the sequential reference: values, last states and every gradient.

CPU tensors run the kernels in Triton's interpreter (``TRITON_INTERPRET=1``, set per test: the
module picks the interpreter when a kernel is launched, not when it is imported); CUDA tensors
run the compiled kernels when a GPU is present. The interpreter is slow, so the shapes are tiny
and the chunks and channel blocks small, so that every test still crosses chunk and block edges.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from longrange.ops import _lazy_kernels as lazy_kernels  # noqa: E402
from longrange.ops._lazy_kernels import interpreter_problem  # noqa: E402
from longrange.ops.scan import selective_scan_ref  # noqa: E402
from longrange.ops.scan import triton as scan_triton  # noqa: E402
from longrange.ops.scan.triton import _selective_scan_triton, selective_scan_triton, triton_available  # noqa: E402

F64 = dict(dtype=torch.float64)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
ALL = ("D", "z", "delta_bias", "initial_state")


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


def make_inputs(b=2, d=4, n=3, l=13, layout="shared", groups=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, **F64)  # noqa: E731
    bc_shape = {"time_invariant": (d, n), "shared": (b, n, l), "grouped": (b, groups, n, l)}[layout]
    return dict(
        u=r(b, d, l),
        delta=r(b, d, l),
        A=-(torch.rand(d, n, generator=g, **F64) + 0.1),
        B=r(*bc_shape),
        C=r(*bc_shape),
        D=r(d),
        z=r(b, d, l),
        delta_bias=r(d),
        initial_state=r(b, d, n),
    )


def compare(inp, use, softplus, device, rtol=1e-10, atol=1e-10, grad_tol=None, cast=None, **kw):
    """Output, last state and the gradients of a random projection of both, Triton against the
    reference in float64 (on the inputs as the kernel sees them, after ``cast``)."""
    base = dict(inp)
    if not softplus:  # keep delta positive so that exp(delta * A) decays as in a real model
        base["delta"] = inp["delta"].abs() + 0.05
    names = ["u", "delta", "A", "B", "C"] + [k for k in ALL if k in use]
    cast = cast or {}
    kernel_in = {k: base[k].to(cast.get(k, base[k].dtype)) for k in names}
    g = torch.Generator().manual_seed(123)
    b, d, l = inp["u"].shape
    proj = torch.randn(b, d, l, generator=g, **F64)
    proj_last = torch.randn(b, d, inp["A"].shape[1], generator=g, **F64)

    def run(fn, leaves, **kw2):
        y, s = fn(**leaves, delta_softplus=softplus, return_last_state=True, **kw2)
        loss = (y.double() * proj.to(y.device)).sum() + (s.double() * proj_last.to(s.device)).sum()
        return y, s, torch.autograd.grad(loss, list(leaves.values()))

    ref_leaves = {k: v.detach().double().requires_grad_() for k, v in kernel_in.items()}
    y_ref, s_ref, g_ref = run(selective_scan_ref, ref_leaves)
    leaves = {k: v.detach().to(device).requires_grad_() for k, v in kernel_in.items()}
    y, s, grads = run(_selective_scan_triton, leaves, **kw)
    assert y.dtype == kernel_in["u"].dtype and y.shape == inp["u"].shape and y.device.type == device.type
    assert s.dtype == (torch.float64 if kernel_in["u"].dtype == torch.float64 else torch.float32)
    torch.testing.assert_close(y.cpu().double(), y_ref, rtol=rtol, atol=atol, msg="output")
    torch.testing.assert_close(s.cpu().double(), s_ref, rtol=rtol, atol=atol, msg="last state")
    grad_tol = grad_tol or (rtol, atol)
    for name, a, r in zip(names, grads, g_ref):
        assert a.dtype == kernel_in[name].dtype and a.shape == kernel_in[name].shape, name
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(
            a.cpu().double(), r, rtol=grad_tol[0], atol=grad_tol[1], msg=f"gradient w.r.t. {name}"
        )


@pytest.mark.parametrize("layout", ["time_invariant", "shared", "grouped"])
def test_every_option_matches_ref(layout, device):
    # d=4 in blocks of 2 channels: two channel blocks; l=13 in chunks of 4: a partial last chunk.
    compare(make_inputs(layout=layout), ALL, True, device, block_d=2, chunk=4)


@pytest.mark.parametrize("layout", ["time_invariant", "grouped"])
def test_no_options_matches_ref(layout, device):
    compare(make_inputs(layout=layout, seed=1), (), False, device, block_d=2, chunk=4)


@pytest.mark.parametrize("use", [("D",), ("z", "delta_bias")])
def test_some_options_match_ref(use, device):
    compare(make_inputs(seed=2, l=9), use, "delta_bias" in use, device, block_d=4, chunk=4)


@pytest.mark.parametrize("layout", ["time_invariant", "shared", "grouped"])
def test_padded_channel_blocks_and_groups_straddling_blocks(layout, device):
    # d=6 in blocks of 4: the second block is half empty; groups of 2 channels: a block spans
    # several groups, so its dB/dC are added per channel; n=5 pads the state to 8.
    inp = make_inputs(d=6, n=5, l=7, layout=layout, groups=3, seed=3)
    compare(inp, ALL, True, device, block_d=4, chunk=4)


@pytest.mark.parametrize("length,chunk", [(1, 4), (8, 4), (3, 8)])
def test_lengths_and_chunks(length, chunk, device):
    compare(make_inputs(b=1, l=length, seed=length), ALL, True, device, block_d=4, chunk=chunk)


def test_non_contiguous_inputs(device):
    inp = make_inputs(l=6, seed=4)
    inp["B"] = inp["B"].transpose(1, 2).contiguous().transpose(1, 2)  # (b, n, l) with length stride n
    inp["u"] = inp["u"].transpose(0, 1).contiguous().transpose(0, 1)
    assert not inp["B"].is_contiguous() and not inp["u"].is_contiguous()
    compare(inp, ("D", "z"), True, device, block_d=2, chunk=4)


def test_float32_inputs_against_float64_ref(device):
    # Stiff decays (delta * A down to about -40) stay finite: the scan multiplies decays only.
    inp = make_inputs(l=11, seed=5)
    inp["A"] = inp["A"] * 10
    f32 = {k: torch.float32 for k in inp}
    compare(inp, ALL, True, device, rtol=1e-4, atol=1e-4, grad_tol=(1e-3, 1e-3), cast=f32, block_d=2, chunk=4)


def test_bfloat16_inputs_use_a_float32_state(device):
    # Activations in bfloat16 (parameters A, D, delta_bias in float32, as in a mixed-precision
    # model): the reference runs in float64 on the same rounded inputs; only the bfloat16 outputs
    # and gradients are rounded.
    inp = make_inputs(l=10, seed=6)
    bf16 = {k: torch.bfloat16 for k in ("u", "delta", "B", "C", "z")}
    bf16.update({k: torch.float32 for k in ("A", "D", "delta_bias", "initial_state")})
    compare(inp, ALL, True, device, rtol=2e-2, atol=2e-2, cast=bf16, block_d=2, chunk=4)


def test_default_settings_and_inference_path(device):
    # The public function with the default kernel settings; without gradients, no states are stored.
    inp = {k: v.to(device) for k, v in make_inputs(l=20, layout="grouped", seed=7).items()}
    args = [inp[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")]
    y_ref, s_ref = selective_scan_ref(*args, True, True, inp["initial_state"])
    with torch.no_grad():
        y, s = selective_scan_triton(
            *args, delta_softplus=True, return_last_state=True, initial_state=inp["initial_state"]
        )
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-10)
    y_only = selective_scan_triton(*args[:5])
    torch.testing.assert_close(y_only, selective_scan_ref(*args[:5]), rtol=1e-10, atol=1e-10)


def test_continuing_from_last_state_equals_one_scan(device):
    inp = {k: v.to(device) for k, v in make_inputs(l=11, seed=8).items()}
    keys = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
    full, last = _selective_scan_triton(*[inp[k] for k in keys], True, True, chunk=4)
    parts, state = [], None
    for sl in (slice(0, 5), slice(5, None)):
        part = [inp[k][..., sl] if k in ("u", "delta", "B", "C", "z") else inp[k] for k in keys]
        y, state = _selective_scan_triton(*part, True, True, state, chunk=4)
        parts.append(y)
    torch.testing.assert_close(torch.cat(parts, -1), full, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state, last, rtol=1e-10, atol=1e-10)


def test_zero_length(device):
    inp = {k: v.to(device) for k, v in make_inputs(l=0).items()}
    y, s = selective_scan_triton(
        inp["u"], inp["delta"], inp["A"], inp["B"], inp["C"], return_last_state=True, initial_state=inp["initial_state"]
    )
    assert y.shape == (2, 4, 0) and torch.equal(s, inp["initial_state"])


def test_availability_and_errors(monkeypatch):
    inp = make_inputs(l=3)
    args = (inp["u"], inp["delta"], inp["A"], inp["B"], inp["C"])
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not triton_available("cpu")
    assert triton_available("cuda") == torch.cuda.is_available()
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        selective_scan_triton(*args)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(lazy_kernels, "_interpreter", [None])  # as where the interpreter runs the kernels
    assert triton_available("cpu") and triton_available(torch.device("cpu"))
    with pytest.raises(ValueError, match="B must have shape"):
        selective_scan_triton(*args[:3], torch.randn(2, 5, 3, **F64), args[4])
    with pytest.raises(ValueError, match="initial_state must have shape"):
        selective_scan_triton(*args, initial_state=torch.randn(2, 4, 4, **F64))
    with pytest.raises(ValueError, match="chunk must be a power of two"):
        _selective_scan_triton(*args, chunk=6)
    monkeypatch.setattr(scan_triton._KERNELS, "module", None)  # as without triton
    monkeypatch.setattr(scan_triton._KERNELS, "error", "ImportError: No module named 'triton'")
    assert not triton_available("cpu")
    with pytest.raises(RuntimeError, match="triton is not installed"):
        selective_scan_triton(*args)


def test_an_interpreter_that_cannot_run_the_kernels_makes_them_cuda_only_saying_why(monkeypatch):
    """Triton 3.6's interpreter with NumPy >= 2.4 cannot loop over a scalar argument (seen on a GPU
    machine): there the kernels are not offered on CPU tensors, and a call says why."""
    from longrange.ops.ssm_kernels import triton as ssm_triton

    inp = make_inputs(l=3)
    why = "Triton's interpreter cannot run these kernels here (triton 3.6.0, numpy 2.5.2): TypeError: ..."
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(lazy_kernels, "_interpreter", [why])
    assert not triton_available("cpu") and not ssm_triton.triton_available("cpu")
    assert ssm_triton.unavailable_reason("cpu") == why
    with pytest.raises(RuntimeError, match="interpreter cannot run these kernels here .*; use CUDA tensors"):
        selective_scan_triton(inp["u"], inp["delta"], inp["A"], inp["B"], inp["C"])


def test_the_interpreter_probe_runs_a_loop_over_a_scalar_argument(monkeypatch):
    from longrange.ops import _triton_probe

    monkeypatch.setattr(lazy_kernels, "_interpreter", [])  # probed afresh
    if lazy_kernels.interpreter_problem() is None:  # this environment's interpreter works: the probe counts
        assert _triton_probe.run(5) == 5.0
    monkeypatch.setattr(lazy_kernels, "_interpreter", [])
    monkeypatch.setattr(_triton_probe, "run", lambda n=3: 1.0)
    assert lazy_kernels.interpreter_problem().endswith("a loop of 3 counted 1.0")


def _compile_variants():
    # (kernel settings, pointer dtype, B/C time-varying, a block within one group, options on)
    yield dict(BLOCK_D=4, BLOCK_N=16, CHUNK=32), "bf16", True, True, True  # the default, as in an S6 layer
    yield dict(BLOCK_D=4, BLOCK_N=4, CHUNK=8), "fp64", True, False, False
    yield dict(BLOCK_D=4, BLOCK_N=4, CHUNK=8), "fp32", False, False, True


@pytest.mark.parametrize("variant", list(_compile_variants()), ids=["default-bf16", "grouped-fp64", "invariant-fp32"])
def test_kernels_compile_for_a_cuda_gpu(variant, compile_for_cuda):
    """Compile both kernels to a CUDA binary (sm_90), which needs Triton's bundled CUDA toolchain but
    no GPU: the interpreter accepts code that the compiler may not."""
    from longrange.ops.scan import _triton_kernels as K

    sizes, dtype, varies, one_group, options = variant
    acc = K.tl.float64 if dtype == "fp64" else K.tl.float32
    flags = dict(
        B_VARIES=varies,
        C_VARIES=varies,
        B_ONE_GROUP=one_group,
        C_ONE_GROUP=one_group,
        HAS_D=options,
        HAS_Z=options,
        HAS_BIAS=options,
        SOFTPLUS=options,
        ACC=acc,
    )
    state_ptrs = (
        "A_ptr",
        "D_ptr",
        "bias_ptr",
        "h0_ptr",
        "last_ptr",
        "states_ptr",
        "dlast_ptr",
        "dA_ptr",
        "dB_ptr",
        "dC_ptr",
        "dD_ptr",
        "dbias_ptr",
        "dh0_ptr",
    )
    pointer = lambda name: "fp32" if dtype != "fp64" and name in state_ptrs else dtype  # noqa: E731
    for fn, extra in ((K._fwd, dict(HAS_H0=options, STORE_STATES=options)), (K._bwd, {})):
        assert compile_for_cuda(K.JITFunction(fn), dict(sizes, **flags, **extra), pointer, 4)
