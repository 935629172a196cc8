"""The fused kernels as PyTorch operators (``torch.ops.longrange``): ``torch.library.opcheck`` (schema,
autograd registration, fake implementation, AOTAutograd with dynamic shapes) for each, the fake
implementations' shapes under ``FakeTensorMode`` and on the ``meta`` device, the FLOP counts against
counts derived by hand, and the public functions under ``torch.compile(fullgraph=True)`` against eager
mode (values and gradients). The Triton operators run in Triton's interpreter (``TRITON_INTERPRET=1``)."""

from __future__ import annotations

import interpreter as triton_interpreter
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from longrange.ops import custom_ops, used
from longrange.ops.conv import numba as conv_numba
from longrange.ops.scan import numba as scan_numba
from longrange.ops.scan import selective_scan
from longrange.ops.ssm_kernels import cauchy, vandermonde_kernel
from longrange.ops.ssm_kernels import numba as ssm_numba

numba_only = pytest.mark.skipif(not ssm_numba.numba_available(), reason="numba does not import")
F32, F64 = torch.float32, torch.float64


@pytest.fixture
def interpreter(monkeypatch):
    """Triton's interpreter for CPU tensors (skips where triton does not import or its interpreter
    cannot run the kernels)."""
    triton_interpreter.use(monkeypatch)


def _rand(g: torch.Generator, *shape: int, dtype=F64) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=dtype)


def _grad(*tensors):
    return [t.requires_grad_() if isinstance(t, torch.Tensor) else t for t in tensors]


# --------------------------------------------------------------------------------------------
# Arguments of each operator (the canonical layouts the implementations pass them in)
# --------------------------------------------------------------------------------------------


def scan_numba_args(layout: str, optional: bool, seed: int = 0) -> list:
    """(u, dt, A, B4, C4, D, z, h0) of ``selective_scan_numba``: b 2, d 4, n 3, l 7."""
    g = torch.Generator().manual_seed(seed)
    b, d, n, l = 2, 4, 3, 7
    bc = {"time-invariant": (d, n), "shared": (b, n, l), "grouped": (b, 2, n, l)}[layout]
    B4, C4 = (scan_numba._as_4d(_rand(g, *bc), d) for _ in range(2))
    extra = [_rand(g, d), _rand(g, b, d, l), _rand(g, b, d, n)] if optional else [None, None, None]
    return _grad(_rand(g, b, d, l), _rand(g, b, d, l).abs() + 0.1, -_rand(g, d, n).abs() - 0.2, B4, C4, *extra)


def scan_numba_cl_args(layout: str, optional: bool, seed: int = 0) -> list:
    """(u, raw, A, B4, C4, D, z, h0, bias, softplus, chunk) of ``selective_scan_numba_cl``: b 2, l 7,
    d 4, n 3, chunks of 4 positions (blocks of 2 channels: the caller lowers ``CL_MIN_WIDTH``); with
    ``optional`` D, z, h0, the step's bias and its softplus, else none of them."""
    g = torch.Generator().manual_seed(seed)
    b, d, n, l = 2, 4, 3, 7
    bc = {"shared": (b, n, l), "grouped": (b, 2, n, l)}[layout]
    B4, C4 = (scan_numba._as_4d(_rand(g, *bc), d) for _ in range(2))
    extra = [_rand(g, d), _rand(g, b, l, d), _rand(g, b, d, n), _rand(g, d)] if optional else [None] * 4
    raw = _rand(g, b, l, d) if optional else _rand(g, b, l, d).abs() + 0.1  # a positive step without softplus
    return [*_grad(_rand(g, b, l, d), raw, -_rand(g, d, n).abs() - 0.2, B4, C4, *extra), optional, 4]


def conv_numba_args(silu: bool, with_bias: bool, seed: int = 0) -> list:
    """(x, weight, bias, silu) of ``causal_conv1d_numba``: x (2, 7, 5) channels last, width 4."""
    g = torch.Generator().manual_seed(seed)
    return [*_grad(_rand(g, 2, 7, 5), _rand(g, 4, 5), _rand(g, 5) if with_bias else None), silu]


def scan_triton_args(layout: str, optional: bool, seed: int = 0) -> list:
    """The arguments of ``selective_scan_triton`` (b 2, d 4, n 3, l 7; chunks of 4 positions)."""
    g = torch.Generator().manual_seed(seed)
    b, d, n, l = 2, 4, 3, 7
    bc = {"time-invariant": (d, n), "shared": (b, n, l), "grouped": (b, 2, n, l)}[layout]
    extra = [_rand(g, d), _rand(g, b, d, l), _rand(g, d), _rand(g, b, d, n)] if optional else [None] * 4
    tensors = _grad(
        _rand(g, b, d, l), _rand(g, b, d, l), -_rand(g, d, n).abs() - 0.2, _rand(g, *bc), _rand(g, *bc), *extra
    )
    return [*tensors, optional, 2, 4, 1, True]  # softplus, block_d, chunk, num_warps, store_states


def vandermonde_args(seed: int = 0) -> list:
    """(a_re, a_im, w_re, w_im, L): modes (3, 5), weights (2, 3, 5), length 20."""
    g = torch.Generator().manual_seed(seed)
    return [*_grad(-_rand(g, 3, 5).abs() * 0.1, _rand(g, 3, 5), _rand(g, 2, 3, 5), _rand(g, 2, 3, 5)), 20]


def cauchy_args(conj_pairs: bool, seed: int = 0) -> list:
    """(v_re, v_im, z_re, z_im, w_re, w_im, conj_pairs): v (4, 3, 6), z (3, 10), w (3, 6)."""
    g = torch.Generator().manual_seed(seed)
    return [
        *_grad(
            _rand(g, 4, 3, 6),
            _rand(g, 4, 3, 6),
            _rand(g, 3, 10),
            _rand(g, 3, 10) + 3,
            -_rand(g, 3, 6).abs(),
            _rand(g, 3, 6),
        ),
        conj_pairs,
    ]


# --------------------------------------------------------------------------------------------
# opcheck
# --------------------------------------------------------------------------------------------


def _opcheck(op, args) -> None:
    result = torch.library.opcheck(op, args)
    assert set(result.values()) == {"SUCCESS"}, result


def test_every_kernel_is_a_registered_operator():
    ops = custom_ops.operators()
    from torch.utils.flop_counter import flop_registry

    for name in (
        "selective_scan_numba",
        "selective_scan_numba_cl",
        "selective_scan_triton",
        "causal_conv1d_numba",
        "rms_norm_numba",
        "vandermonde_numba",
        "cauchy_numba",
        "vandermonde_triton",
        "cauchy_triton",
    ):
        for op in (ops[name], ops[name + "_backward"]):
            assert op in flop_registry, op
            assert torch._C._dispatch_has_kernel_for_dispatch_key(op.default.name(), "Meta"), (
                f"{op}: no fake implementation"
            )


@numba_only
@pytest.mark.parametrize("layout, optional", [("shared", True), ("time-invariant", False), ("grouped", True)])
def test_opcheck_scan_numba(layout, optional):
    _opcheck(scan_numba._scan_op, scan_numba_args(layout, optional))


@numba_only
@pytest.mark.parametrize("layout, optional", [("shared", True), ("grouped", False)])
def test_opcheck_scan_numba_channels_last(monkeypatch, layout, optional):
    monkeypatch.setattr(scan_numba, "CL_MIN_WIDTH", 2)
    _opcheck(scan_numba._scan_cl_op, scan_numba_cl_args(layout, optional))


@numba_only
@pytest.mark.parametrize("silu, with_bias", [(True, True), (False, False)])
def test_opcheck_conv_numba(silu, with_bias):
    _opcheck(conv_numba._conv_op, conv_numba_args(silu, with_bias))
    x, w, bias, _ = [a.detach() if isinstance(a, torch.Tensor) else a for a in conv_numba_args(silu, with_bias)]
    _opcheck(conv_numba._conv_backward_op, [x, w, bias, silu, torch.ones_like(x)])


@numba_only
def test_opcheck_vandermonde_and_cauchy_numba():
    _opcheck(ssm_numba._vandermonde_op, vandermonde_args())
    for conj_pairs in (False, True):
        _opcheck(ssm_numba._cauchy_op, cauchy_args(conj_pairs))


@pytest.mark.parametrize("layout, optional", [("shared", True), ("time-invariant", False)])
def test_opcheck_scan_triton(interpreter, layout, optional):
    from longrange.ops.scan import triton as scan_triton

    _opcheck(scan_triton._scan_op, scan_triton_args(layout, optional))


def test_opcheck_vandermonde_and_cauchy_triton(interpreter):
    from longrange.ops.ssm_kernels import triton as ssm_triton

    _opcheck(ssm_triton._vandermonde_op, vandermonde_args())
    for conj_pairs in (False, True):
        _opcheck(ssm_triton._cauchy_op, cauchy_args(conj_pairs))


def _backward_args(op, args: list, *extra) -> list:
    """The arguments of ``op``'s backward operator: its tensor inputs (detached), output gradients
    of ones, and ``extra``."""
    outputs = op(*args)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    tensors = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    return tensors, [torch.ones_like(o) for o in outputs], list(extra)


@numba_only
def test_opcheck_numba_backward_operators(monkeypatch):
    monkeypatch.setattr(scan_numba, "CL_MIN_WIDTH", 2)
    tensors, grads, _ = _backward_args(scan_numba._scan_op, scan_numba_args("grouped", True))
    _opcheck(scan_numba._scan_backward_op, tensors + grads)
    args = scan_numba_cl_args("grouped", True)
    tensors = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    out, last, states = scan_numba._scan_cl_op(*tensors)
    _opcheck(
        scan_numba._scan_cl_backward_op,
        [*tensors[:7], *tensors[8:10], states, torch.ones_like(out), torch.ones_like(last), tensors[10]],
    )
    tensors, grads, _ = _backward_args(ssm_numba._vandermonde_op, vandermonde_args())
    _opcheck(ssm_numba._vandermonde_backward_op, tensors[:4] + grads + tensors[4:])
    tensors, grads, _ = _backward_args(ssm_numba._cauchy_op, cauchy_args(True))
    _opcheck(ssm_numba._cauchy_backward_op, tensors[:6] + grads + tensors[6:])


def test_opcheck_triton_backward_operators(interpreter):
    from longrange.ops.scan import triton as scan_triton
    from longrange.ops.ssm_kernels import triton as ssm_triton

    args = scan_triton_args("shared", True)
    out, last, states = scan_triton._scan_op(*args)
    tensors = [a.detach() for a in args[:9]]
    _opcheck(
        scan_triton._scan_backward_op,
        tensors + [states.detach(), torch.ones_like(out), torch.ones_like(last), *args[9:13]],
    )
    tensors, grads, _ = _backward_args(ssm_triton._vandermonde_op, vandermonde_args())
    _opcheck(ssm_triton._vandermonde_backward_op, tensors[:4] + grads + tensors[4:])
    tensors, grads, _ = _backward_args(ssm_triton._cauchy_op, cauchy_args(True))
    for need_vw, need_z in ((True, True), (False, True)):
        _opcheck(ssm_triton._cauchy_backward_op, tensors[:6] + grads + [True, need_vw, need_z])


# --------------------------------------------------------------------------------------------
# Fake implementations: FakeTensorMode and the meta device
# --------------------------------------------------------------------------------------------


def _meta(args: list) -> list:
    return [a.detach().to("meta") if isinstance(a, torch.Tensor) else a for a in args]


def _assert_like(fake, real) -> None:
    fake, real = (x if isinstance(x, (tuple, list)) else (x,) for x in (fake, real))
    assert len(fake) == len(real)
    for f, r in zip(fake, real):
        assert (f.shape, f.dtype, f.stride()) == (r.shape, r.dtype, r.stride())
        assert f.device.type == "meta"


@numba_only
def test_numba_operators_on_the_meta_device_give_the_real_shapes(monkeypatch):
    monkeypatch.setattr(scan_numba, "CL_MIN_WIDTH", 2)
    ops = custom_ops.operators()
    for args in (scan_numba_args("grouped", True), scan_numba_args("time-invariant", False)):
        real = ops["selective_scan_numba"](*args)
        _assert_like(ops["selective_scan_numba"](*_meta(args)), real)
        grads = [torch.ones_like(real[0]), torch.ones_like(real[1])]
        back = [*args, *grads]
        _assert_like(ops["selective_scan_numba_backward"](*_meta(back)), ops["selective_scan_numba_backward"](*back))
    args = scan_numba_cl_args("grouped", True)
    real = ops["selective_scan_numba_cl"](*args)
    _assert_like(ops["selective_scan_numba_cl"](*_meta(args)), real)
    back = [*args[:7], *args[8:10], real[2], torch.ones_like(real[0]), torch.ones_like(real[1]), args[10]]
    _assert_like(ops["selective_scan_numba_cl_backward"](*_meta(back)), ops["selective_scan_numba_cl_backward"](*back))
    args = conv_numba_args(True, True)
    real = ops["causal_conv1d_numba"](*args)
    _assert_like(ops["causal_conv1d_numba"](*_meta(args)), real)
    back = [*args, torch.ones_like(real)]
    _assert_like(ops["causal_conv1d_numba_backward"](*_meta(back)), ops["causal_conv1d_numba_backward"](*back))
    args = vandermonde_args()
    real = ops["vandermonde_numba"](*args)
    _assert_like(ops["vandermonde_numba"](*_meta(args)), real)
    back = [*args[:4], torch.ones_like(real), args[4]]
    _assert_like(ops["vandermonde_numba_backward"](*_meta(back)), ops["vandermonde_numba_backward"](*back))
    args = cauchy_args(True)
    real = ops["cauchy_numba"](*args)
    _assert_like(ops["cauchy_numba"](*_meta(args)), real)
    back = [*args[:6], torch.ones_like(real[0]), torch.ones_like(real[1]), True]
    _assert_like(ops["cauchy_numba_backward"](*_meta(back)), ops["cauchy_numba_backward"](*back))


def test_triton_operators_on_the_meta_device_give_the_real_shapes(interpreter):
    ops = custom_ops.operators()
    args = scan_triton_args("shared", True)
    args[6] = args[6].detach().float()  # z in float32: the output and gradients follow each input's dtype
    real = ops["selective_scan_triton"](*args)
    _assert_like(ops["selective_scan_triton"](*_meta(args)), real)
    back = [*args[:9], real[2], torch.ones_like(real[0]), torch.ones_like(real[1]), *args[9:13]]
    _assert_like(ops["selective_scan_triton_backward"](*_meta(back)), ops["selective_scan_triton_backward"](*back))
    args = vandermonde_args()
    real = ops["vandermonde_triton"](*args)
    _assert_like(ops["vandermonde_triton"](*_meta(args)), real)
    back = [*args[:4], torch.ones_like(real), args[4]]
    _assert_like(ops["vandermonde_triton_backward"](*_meta(back)), ops["vandermonde_triton_backward"](*back))
    args = cauchy_args(True)
    real = ops["cauchy_triton"](*args)
    _assert_like(ops["cauchy_triton"](*_meta(args)), real)
    for need_vw, need_z in ((True, False), (False, True)):
        back = [*args[:6], torch.ones_like(real[0]), torch.ones_like(real[1]), True, need_vw, need_z]
        _assert_like(ops["cauchy_triton_backward"](*_meta(back)), ops["cauchy_triton_backward"](*back))


@numba_only
def test_public_functions_trace_under_fake_tensors_with_the_kernel_they_would_run():
    """Under FakeTensorMode (CPU fake tensors) the dispatchers choose the numba kernels, as for real
    CPU tensors, record them, and the fake implementations give the output and gradient shapes."""
    with FakeTensorMode():
        u = torch.randn(2, 64, 1024, requires_grad=True)
        A = -torch.rand(64, 16)
        B = torch.randn(2, 16, 1024)
        a = torch.complex(-torch.rand(8, 16), torch.randn(8, 16)).requires_grad_()
        W = torch.complex(torch.randn(2, 8, 16), torch.randn(2, 8, 16)).requires_grad_()
        z = torch.complex(torch.rand(513), torch.randn(513))
        used.reset()
        y = selective_scan(u, u.abs(), A, B, B)
        K = vandermonde_kernel(a, W, 1024)
        c = cauchy(W, z, a, conj_pairs=True)
        (y.sum() + K.sum() + c.real.sum()).backward()
        assert y.shape == u.shape and u.grad.shape == u.shape
        assert K.shape == (2, 8, 1024) and K.dtype == F32
        assert c.shape == (2, 8, 513) and c.dtype == torch.complex64
        assert a.grad.shape == a.shape and W.grad.shape == W.shape
    assert used.kernels() == {"cauchy": "numba", "selective_scan": "numba", "vandermonde": "numba"}


# --------------------------------------------------------------------------------------------
# FLOP counts
# --------------------------------------------------------------------------------------------


def _flops(fn) -> dict[str, int]:
    with FlopCounterMode(display=False) as counter:
        fn()
    return {str(op).split(".")[-1]: n for op, n in counter.get_flop_counts()["Global"].items()}


def _scan_counts(call):
    """The FLOPs of a forward and backward of ``call(leaves)`` (b 2, d 4, n 3, l 7, with D and z)."""
    g = torch.Generator().manual_seed(0)
    b, d, n, l = 2, 4, 3, 7
    leaves = _grad(
        _rand(g, b, d, l),
        _rand(g, b, d, l),
        -_rand(g, d, n).abs() - 0.2,
        _rand(g, b, n, l),
        _rand(g, b, n, l),
        _rand(g, d),
        _rand(g, b, d, l),
        _rand(g, d),
    )
    return _flops(lambda: call(leaves).sum().backward())


@numba_only
def test_flops_of_the_numba_scan():
    counts = _scan_counts(lambda t: selective_scan(*t[:7], impl="numba"))
    positions = 2 * 4 * 7  # b d l; n = 3
    # forward: per state element exp(ΔA) 2 + āh + ΔuB 3 + y += Ch 2; per position Δu 1, D 2, gate 5
    assert counts["selective_scan_numba"] == positions * (3 * 7 + 1 + 2 + 5)
    # backward: per state element states 5 + output 2 (gated) + adjoint 15; per position 6 + D 2 + gate 11
    assert counts["selective_scan_numba_backward"] == positions * (3 * 22 + 6 + 2 + 11)


@numba_only
def test_flops_of_the_numba_conv():
    from longrange.ops.conv import causal_conv1d

    g = torch.Generator().manual_seed(0)
    x, w, bias = _grad(_rand(g, 2, 5, 7), _rand(g, 5, 4), _rand(g, 5))
    counts = _flops(lambda: causal_conv1d(x, w, bias, activation="silu", impl="numba").sum().backward())
    elements = 2 * 5 * 7
    # forward: per output 4 multiply-adds, the bias, SiLU 3; backward: that again, SiLU's derivative 8,
    # the bias' gradient 1, per tap the input's and the weight's gradients 4
    assert counts["causal_conv1d_numba"] == elements * (8 + 1 + 3)
    assert counts["causal_conv1d_numba_backward"] == elements * (12 + 8 + 1 + 16)


@numba_only
def test_flops_of_the_channels_last_numba_scan(monkeypatch):
    monkeypatch.setattr(scan_numba, "CL_MIN_WIDTH", 2)
    counts = _scan_counts(lambda t: selective_scan(*t[:7], impl="numba"))
    positions = 2 * 4 * 7
    assert counts["selective_scan_numba_cl"] == positions * (3 * 7 + 1 + 2 + 5)
    assert counts["selective_scan_numba_cl_backward"] == positions * (3 * 22 + 6 + 2 + 11)


def test_flops_of_the_triton_scan(interpreter):
    counts = _scan_counts(lambda t: selective_scan(*t, delta_softplus=True, impl="triton"))
    positions = 2 * 4 * 7
    # as the numba scan's, plus the bias (1) and softplus (2) the kernel applies; backward 1 and 4
    assert counts["selective_scan_triton"] == positions * (3 * 7 + 1 + 2 + 5 + 1 + 2)
    assert counts["selective_scan_triton_backward"] == positions * (3 * 22 + 6 + 2 + 11 + 1 + 4)


def _ssm_counts(impl: str) -> dict[str, int]:
    g = torch.Generator().manual_seed(0)
    cplx = lambda *s: torch.complex(_rand(g, *s), _rand(g, *s))  # noqa: E731
    a = torch.complex(-_rand(g, 3, 5).abs(), _rand(g, 3, 5)).requires_grad_()
    W = cplx(2, 3, 5).requires_grad_()
    v, z, w = cplx(4, 3, 6).requires_grad_(), cplx(3, 10), cplx(3, 6).requires_grad_()
    counts = _flops(lambda: vandermonde_kernel(a, W, 20, impl=impl).sum().backward())
    counts.update(_flops(lambda: cauchy(v, z, w, conj_pairs=True, impl=impl).real.sum().backward()))
    return counts


def _vandermonde_and_cauchy_forward(counts: dict[str, int], impl: str) -> None:
    J, R, M, L = 2, 3, 5, 20
    # powers: a complex multiplication (6) per (r, l, m); per term Re(w p) 3 and its sum 1
    assert counts[f"vandermonde_{impl}"] == 6 * R * L * M + 4 * J * R * L * M == 4200
    # backward: powers 6; per term g conj(p), l g conj(p) and their sums 8; l g per (j, r, l); conj(w) S per (j, r, m)
    assert counts[f"vandermonde_{impl}_backward"] == 6 * R * L * M + 8 * J * R * L * M + J * R * L + 8 * J * R * M
    J, R, N, K = 4, 3, 6, 10
    # resolvents of a conjugate pair per (r, k, n): ρ 8, σ 6, combined 4; per term a complex multiply-add 8
    assert counts[f"cauchy_{impl}"] == 18 * R * K * N + 8 * J * R * K * N == 9000


@numba_only
def test_flops_of_the_numba_vandermonde_and_cauchy_products():
    counts = _ssm_counts("numba")
    _vandermonde_and_cauchy_forward(counts, "numba")
    J, R, N, K = 4, 3, 6, 10
    # one pass: resolvents and their squares 32 per (r, k, n); per term 24; conj(v) yw per (j, r, n); g conj(t) per (j, r, k)
    assert counts["cauchy_numba_backward"] == 32 * R * K * N + 24 * J * R * K * N + 8 * J * R * N + 8 * J * R * K


def test_flops_of_the_triton_vandermonde_and_cauchy_products(interpreter):
    counts = _ssm_counts("triton")
    _vandermonde_and_cauchy_forward(counts, "triton")
    J, R, N, K = 4, 3, 6, 10
    # z needs no gradient: only the pass for v and w runs (resolvents 32, per term 16, per (j, r, n) 8)
    assert counts["cauchy_triton_backward"] == 32 * R * K * N + 16 * J * R * K * N + 8 * J * R * N


# --------------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------------


@numba_only
@pytest.mark.usefixtures("inductor_cpu")
def test_compiled_equals_eager(monkeypatch):
    """The scan, the Vandermonde and the Cauchy products (numba) in one function compiled with
    ``fullgraph=True`` (no graph break): the values and gradients of eager mode, and the record of
    which kernel ran."""
    g = torch.Generator().manual_seed(0)
    b, d, n, l = 2, 4, 3, 9
    cplx = lambda *s: torch.complex(_rand(g, *s, dtype=F32), _rand(g, *s, dtype=F32))  # noqa: E731
    inputs = [
        _rand(g, b, d, l, dtype=F32),
        _rand(g, b, d, l, dtype=F32),
        -_rand(g, d, n, dtype=F32).abs() - 0.2,
        _rand(g, b, n, l, dtype=F32),
        _rand(g, b, n, l, dtype=F32),
        _rand(g, d, dtype=F32),
        torch.complex(-_rand(g, d, 3, dtype=F32).abs() * 0.1, _rand(g, d, 3, dtype=F32)),
        cplx(2, d, 3),
        cplx(d, 5) + 2,
    ]

    def step(u, delta, A, B, C, D, a, W, zs):
        y = selective_scan(u, delta, A, B, C, D, delta_softplus=True)
        K = vandermonde_kernel(a, W, l)
        c = cauchy(W, zs, a, conj_pairs=True)
        return y * K.sum(0) + c.abs().sum(-1).sum(0)[:, None]

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in inputs]
        used.reset()
        out = fn(*leaves)
        out.square().sum().backward()
        return out.detach(), [t.grad for t in leaves], used.kernels()

    eager = run(step)
    compiled = run(torch.compile(step, fullgraph=True))
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-5)
    for c, e in zip(compiled[1], eager[1]):
        torch.testing.assert_close(c, e, rtol=1e-4, atol=1e-5)
    assert compiled[2] == eager[2] == {"cauchy": "numba", "selective_scan": "numba", "vandermonde": "numba"}


def test_compiled_code_is_keyed_by_the_operators_source(monkeypatch):
    """Inductor's and AOTAutograd's disk caches do not see a custom operator's Python definition: a
    changed fake implementation could be served code compiled for the old one. The operators' source
    is in the cache key's tag, after any tag the user set, once."""
    from pathlib import Path

    from longrange.ops import custom_ops

    package = Path(custom_ops.__file__).resolve().parents[1]
    for name in custom_ops.DEFINING_MODULES:  # every module named is a file here (none drops out unseen)
        path = package.joinpath(*name.split(".")[1:])
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), name
    ours = f"longrange-ops-{custom_ops.operators_digest()}"
    assert ours in torch.compiler.config.cache_key_tag.split("|")  # set on import
    # PyTorch's config modules keep their settings outside the module's __dict__, so pytest's
    # monkeypatch (9.2 and later) would undo this by deleting the setting, which hides it from every
    # later compile ("cache_key_tag does not exist"): patch it with the config's own context instead.
    with torch.compiler.config.patch(cache_key_tag="mine"):
        assert custom_ops.tag_compile_caches() == f"mine|{ours}"
        assert custom_ops.tag_compile_caches() == f"mine|{ours}"  # once
    assert torch.compiler.config.cache_key_tag.split("|").count(ours) == 1  # restored, still tagged
    assert custom_ops.operators_digest(custom_ops.DEFINING_MODULES[:-1]) != custom_ops.operators_digest()
    monkeypatch.delattr(torch.compiler, "config")  # a PyTorch before 2.6: nothing to tag, no error
    assert custom_ops.tag_compile_caches() is None


def test_the_kernel_loaders_constant_mark_is_dynamos_own_and_imports_no_dynamo():
    """The kernel loaders are marked as constant results for torch.compile without importing Dynamo
    (seconds at every command's start): the mark is the attribute Dynamo's own decorator sets (should
    PyTorch change it, this fails; ``test_compiled_equals_eager`` then finds the graph break), and
    importing the layers leaves Dynamo unimported."""
    import subprocess
    import sys

    import torch._dynamo

    from longrange.ops._lazy_kernels import LazyKernels, mark_constant

    def official():
        return None

    def ours():
        return None

    marked = set(vars(torch._dynamo.assume_constant_result(official)))
    assert marked and marked == set(vars(mark_constant(ours)))
    assert vars(LazyKernels("longrange.ops.scan._numba_kernels").load) == vars(ours)
    code = "import sys, longrange.models, longrange.layers; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------------------------
# Direct calls in plain eager code
# --------------------------------------------------------------------------------------------


def _public_calls():
    """(name, a function of fresh float64 leaves, the leaves) for each operator with a direct path."""
    from longrange.ops.attention.numba import attention_numba
    from longrange.ops.conv import causal_conv1d
    from longrange.ops.glu import swiglu
    from longrange.ops.matrix_state.dispatch import gated_delta_rule, gla
    from longrange.ops.norm import rms_norm
    from longrange.ops.scan import selective_scan
    from longrange.ops.ssm_kernels import cauchy, vandermonde_kernel

    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    b, l, d, n = 2, 7, 16, 3
    calls = [
        ("rms_norm", lambda x, w, z: rms_norm(x, w, gate=z, impl="numba"), [r(b, l, d), r(d), r(b, l, d)]),
        ("swiglu", lambda h: swiglu(h, impl="numba"), [r(b, l, 2 * d)]),
        ("causal_conv1d", lambda x, w: causal_conv1d(x, w, activation="silu", impl="numba"), [r(b, d, l), r(d, 4)]),
        (
            "selective_scan (channels last)",
            lambda u, dt, A, B, C: selective_scan(u, dt, A, B, C, delta_softplus=True, impl="numba"),
            [r(b, d, l), r(b, d, l), -r(d, n).abs(), r(b, n, l), r(b, n, l)],
        ),
        (
            "selective_scan (states inner)",
            lambda u, dt, A, B, C: selective_scan(u, dt, A, B, C, delta_softplus=True, impl="numba"),
            [r(b, d, l), r(b, d, l), -r(d, n).abs(), r(d, n), r(d, n)],
        ),
        ("attention", lambda q, k, v: attention_numba(q, k, v, causal=True), [r(b, 2, l, 4) for _ in range(3)]),
        (
            "gated_delta_rule",
            lambda q, k, v, a, beta: gated_delta_rule(
                q, k, v, -a.abs(), beta.sigmoid(), normalize_qk=True, impl="numba"
            )[0],
            [r(b, l, 2, 4), r(b, l, 2, 4), r(b, l, 2, 8), r(b, l, 2), r(b, l, 2)],
        ),
        (
            "gla",
            lambda q, k, v, a: gla(q, k, v, -a.abs(), impl="numba")[0],
            [r(b, l, 2, 4), r(b, l, 2, 4), r(b, l, 2, 8), r(b, l, 2, 4)],
        ),
        (
            "vandermonde",
            lambda a, w: vandermonde_kernel(torch.view_as_complex(a), torch.view_as_complex(w), l, impl="numba"),
            [-r(3, 4, 2).abs(), r(3, 4, 2)],
        ),
        (
            "cauchy",
            lambda v, z, w: torch.view_as_real(
                cauchy(torch.view_as_complex(v), torch.view_as_complex(z), torch.view_as_complex(w), impl="numba")
            ),
            [r(3, 4, 2), r(5, 2), r(3, 4, 2)],
        ),
    ]
    return calls


def _graph_nodes(y: torch.Tensor) -> set[str]:
    """The names of the autograd nodes behind ``y``."""
    seen, todo = set(), [y.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return {type(node).__name__ for node in seen}


@numba_only
def test_direct_calls_give_the_operators_values_and_gradients(monkeypatch):
    """Each operator's plain eager call runs its implementation directly (its autograd node is the
    direct one), and gives the values and gradients of the call through the dispatcher bit for bit."""
    for name, fn, leaves in _public_calls():
        out = {}
        for direct in (True, False):
            monkeypatch.setattr(custom_ops, "EAGER_CALLS", direct)
            xs = [t.clone().requires_grad_() for t in leaves]
            y = fn(*xs)
            nodes = _graph_nodes(y)
            assert any("_directBackward" in n for n in nodes) == direct, (name, nodes)
            assert any("GeneratedBackwardFor_longrange" in n for n in nodes) == (not direct), (name, nodes)
            weights = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)
            out[direct] = (y.detach(), *torch.autograd.grad((y * weights).sum(), xs, allow_unused=True))
        for a, b in zip(out[True], out[False]):
            assert (a is None and b is None) or torch.equal(a, b), name
        with torch.no_grad():  # without a gradient: the implementation alone, no node
            monkeypatch.setattr(custom_ops, "EAGER_CALLS", True)
            assert torch.equal(fn(*leaves), out[True][0]) and fn(*leaves).grad_fn is None


@numba_only
def test_the_dispatcher_still_sees_calls_under_modes_the_profiler_and_other_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.randn(2, 3)
    assert custom_ops.direct_call_allowed((x, None, 1.5, torch.nn.Parameter(x)))
    assert not custom_ops.direct_call_allowed((x.to("meta"),))
    with FlopCounterMode(display=False):
        assert not custom_ops.direct_call_allowed((x,))
    with FakeTensorMode():
        assert not custom_ops.direct_call_allowed((x,))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert not custom_ops.direct_call_allowed((x,))
    assert custom_ops.direct_call_allowed((x,))
    # counted as before under FlopCounterMode, and named by the profiler
    name, fn, leaves = _public_calls()[0]
    with FlopCounterMode(display=False) as counter:
        fn(*[t.clone().requires_grad_() for t in leaves]).sum().backward()
    counted = {str(k).split(".")[-1] for k in counter.get_flop_counts()["Global"]}
    assert {"rms_norm_numba", "rms_norm_numba_backward"} <= counted
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn(*[t.clone().requires_grad_() for t in leaves]).sum().backward()
    keys = {e.key for e in prof.key_averages()}
    assert {"longrange::rms_norm_numba", "longrange::rms_norm_numba_backward"} <= keys
