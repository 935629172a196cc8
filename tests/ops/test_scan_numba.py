"""The numba selective scan against the sequential reference: values, last states, every gradient,
float32 and float64, every B/C layout and option; non-contiguous inputs, partial requires_grad,
no_grad; dispatch and the fallback without numba."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from longrange.ops.scan import auto_impl, selective_scan, selective_scan_ref
from longrange.ops.scan import dispatch as scan_mod
from longrange.ops.scan import numba as scan_numba
from longrange.ops.scan.numba import numba_available, selective_scan_numba

pytestmark = pytest.mark.skipif(not numba_available(), reason="numba does not import")

NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")
LAYOUTS = ["time_invariant", "shared", "grouped"]
OPTIONALS = [(), ("D",), ("z",), ("delta_bias",), ("initial_state",), ("D", "z", "delta_bias", "initial_state")]
TOL = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=2e-4, atol=2e-5)}
GRAD_TOL = {torch.float64: dict(rtol=1e-9, atol=1e-10), torch.float32: dict(rtol=1e-3, atol=1e-4)}


@pytest.fixture(params=["states", "channels", "channels-short-chunks"])
def kernel(request, monkeypatch):
    """Which numba kernels a test runs: the state-vectorised ones only ("states"), or the
    channels-last ones wherever B and C are time-varying, on blocks of any width ("channels"),
    with chunks of 4 positions ("channels-short-chunks": many chunks, and lengths that are not
    a multiple of the chunk)."""
    if request.param == "states":
        monkeypatch.setattr(scan_numba, "CL_MIN_WIDTH", 1 << 30)
    else:
        monkeypatch.setattr(scan_numba, "CL_MIN_WIDTH", 1)
    if request.param == "channels-short-chunks":
        monkeypatch.setattr(scan_numba, "CL_SCRATCH_BYTES", 0)
    return request.param


def make_inputs(b=2, d=4, n=3, l=13, layout="shared", groups=2, seed=0, layout_C=None):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    shapes = {"time_invariant": (d, n), "shared": (b, n, l), "grouped": (b, groups, n, l)}
    return dict(
        u=r(b, d, l),
        delta=r(b, d, l),
        A=-(torch.rand(d, n, generator=g, dtype=torch.float64) + 0.1),
        B=r(*shapes[layout]),
        C=r(*shapes[layout_C or layout]),
        D=r(d),
        z=r(b, d, l),
        delta_bias=r(d),
        initial_state=r(b, d, n),
    )


def call(fn, inp, use, softplus=True, **kw):
    args = {k: inp[k] for k in ("u", "delta", "A", "B", "C")}
    for k in ("D", "z", "delta_bias", "initial_state"):
        args[k] = inp[k] if k in use else None
    if not softplus:  # positive steps, as a model has
        args["delta"] = inp["delta"].abs() + 0.05
    return fn(**args, delta_softplus=softplus, return_last_state=True, **kw)


def grads(fn, inp, use, softplus=True, names=None, dtype=torch.float64):
    """Gradients of a random projection of (output, last state) w.r.t. ``names`` (default: all used)."""
    names = names or [k for k in NAMES if k in ("u", "delta", "A", "B", "C") or k in use]
    leaves = {k: v.to(dtype).detach().requires_grad_(k in names) for k, v in inp.items()}
    out, last = call(fn, leaves, use, softplus)
    g = torch.Generator().manual_seed(123)
    proj, proj_last = (
        torch.randn(out.shape, generator=g, dtype=torch.float64),
        torch.randn(last.shape, generator=g, dtype=torch.float64),
    )
    loss = (out * proj.to(out.dtype)).sum() + (last * proj_last.to(last.dtype)).sum()
    return names, torch.autograd.grad(loss, [leaves[k] for k in names])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("use", OPTIONALS, ids=lambda u: "+".join(u) or "plain")
@pytest.mark.parametrize("softplus", [False, True])
def test_matches_ref_values_and_grads(kernel, dtype, layout, use, softplus):
    inp = make_inputs(layout=layout)
    y_ref, s_ref = call(selective_scan_ref, inp, use, softplus)
    y, s = call(selective_scan_numba, {k: v.to(dtype) for k, v in inp.items()}, use, softplus)
    assert y.dtype == dtype and s.dtype == dtype and y.shape == (2, 4, 13) and s.shape == (2, 4, 3)
    torch.testing.assert_close(y.double(), y_ref, **TOL[dtype])
    torch.testing.assert_close(s.double(), s_ref, **TOL[dtype])
    names, g_ref = grads(selective_scan_ref, inp, use, softplus)
    _, g = grads(selective_scan_numba, inp, use, softplus, dtype=dtype)
    for name, a, b in zip(names, g, g_ref):
        assert a.dtype == dtype and torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), b, **GRAD_TOL[dtype], msg=f"gradient w.r.t. {name}")


@pytest.mark.parametrize(
    "layout_B,layout_C", [("time_invariant", "grouped"), ("grouped", "shared"), ("shared", "time_invariant")]
)
@pytest.mark.parametrize("threads", [1, 3])
def test_mixed_layouts_and_task_splits(kernel, layout_B, layout_C, threads):
    """B and C in different layouts, several channels per group (d=12, 2 or 4 groups): every
    partition of the channels into backward tasks gives the reference's gradients."""
    inp = make_inputs(b=3, d=12, n=5, l=9, layout=layout_B, layout_C=layout_C, groups=4 if layout_B == "grouped" else 2)
    use = ("D", "z", "delta_bias", "initial_state")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        names, g_ref = grads(selective_scan_ref, inp, use)
        _, g = grads(selective_scan_numba, inp, use)
    finally:
        torch.set_num_threads(previous)
    assert torch.get_num_threads() == previous
    for name, a, b in zip(names, g, g_ref):
        torch.testing.assert_close(a, b, **GRAD_TOL[torch.float64], msg=f"gradient w.r.t. {name}")


@pytest.mark.parametrize(
    "b,d,B4,C4,threads,expected",
    [
        (8, 128, (8, 1, 1024, 16), (8, 1, 1024, 16), 2, 128),  # shared: one task per batch element is enough
        (1, 128, (1, 1, 64, 16), (1, 1, 64, 16), 2, 16),  # batch 1: split the channels into 8 tasks
        (1, 12, (1, 4, 9, 5), (1, 12, 1, 5), 16, 1),  # more threads than channels: one channel per task
        (2, 12, (2, 4, 9, 5), (2, 2, 9, 5), 1, 3),  # at most the 3 channels of a group of B
    ],
)
def test_channels_per_task(b, d, B4, C4, threads, expected):
    size = scan_numba._channels_per_task(b, d, torch.empty(B4), torch.empty(C4), threads)
    assert size == expected


def test_non_contiguous_and_mixed_dtypes(kernel):
    inp = make_inputs(l=11, layout="grouped")
    use = ("D", "z", "delta_bias", "initial_state")
    y_ref, s_ref = call(selective_scan_ref, inp, use)

    def strided(t):  # same values, non-contiguous storage
        return torch.stack([t, torch.zeros_like(t)], dim=-1)[..., 0] if t.dim() else t

    odd = {k: strided(v) for k, v in inp.items()}
    odd["u"] = inp["u"].transpose(1, 2).contiguous().transpose(1, 2)
    assert not odd["delta"].is_contiguous() and not odd["u"].is_contiguous()
    y, s = call(selective_scan_numba, odd, use)
    torch.testing.assert_close(y, y_ref, **TOL[torch.float64])
    torch.testing.assert_close(s, s_ref, **TOL[torch.float64])
    # one float64 input makes the computation float64; the output keeps u's dtype
    mixed = {k: (v if k == "A" else v.float()) for k, v in inp.items()}
    y_mixed, s_mixed = call(selective_scan_numba, mixed, use)
    assert y_mixed.dtype == torch.float32 and s_mixed.dtype == torch.float64
    y_half = call(selective_scan_numba, {k: v.bfloat16() for k, v in inp.items()}, use)[0]
    assert y_half.dtype == torch.bfloat16 and torch.isfinite(y_half).all()


def test_gradients_of_some_inputs_only(kernel):
    inp = make_inputs(l=10, layout="shared")
    use = ("D", "z", "delta_bias", "initial_state")
    for names in (["u"], ["A", "D"], ["B", "initial_state"], ["C", "z", "delta_bias"]):
        _, g_ref = grads(selective_scan_ref, inp, use, names=names)
        _, g = grads(selective_scan_numba, inp, use, names=names)
        for name, a, b in zip(names, g, g_ref):
            torch.testing.assert_close(a, b, **GRAD_TOL[torch.float64], msg=f"gradient w.r.t. {name}")


def test_no_grad_and_grad_of_output_only(kernel):
    inp = make_inputs(l=10, layout="grouped")
    use = ("D", "z", "delta_bias")
    leaves = {k: v.clone().requires_grad_() for k, v in inp.items()}
    with torch.no_grad():
        y, s = call(selective_scan_numba, leaves, use)
    assert not y.requires_grad and not s.requires_grad
    torch.testing.assert_close(y, call(selective_scan_ref, inp, use)[0], **TOL[torch.float64])
    # the last state unused: its gradient is absent, not an error
    y = call(selective_scan_numba, leaves, use)[0]
    (g,) = torch.autograd.grad(y.sum(), [leaves["A"]])
    y_ref = call(selective_scan_ref, leaves, use)[0]
    (g_ref,) = torch.autograd.grad(y_ref.sum(), [leaves["A"]])
    torch.testing.assert_close(g, g_ref, **GRAD_TOL[torch.float64])


@pytest.mark.parametrize("length", [0, 1, 2, 37])
def test_lengths(kernel, length):
    inp = make_inputs(l=length, layout="shared", seed=length)
    use = ("D", "z", "delta_bias", "initial_state")
    y_ref, s_ref = call(selective_scan_ref, inp, use)
    y, s = call(selective_scan_numba, inp, use)
    assert y.shape == (2, 4, length)
    torch.testing.assert_close(y, y_ref, **TOL[torch.float64])
    torch.testing.assert_close(s, s_ref, **TOL[torch.float64])
    if length:
        names, g_ref = grads(selective_scan_ref, inp, use)
        _, g = grads(selective_scan_numba, inp, use)
        for name, a, b in zip(names, g, g_ref):
            torch.testing.assert_close(a, b, **GRAD_TOL[torch.float64], msg=f"gradient w.r.t. {name}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_stiff_and_tiny_decays(kernel, dtype):
    """delta*A from -100 (state forgotten at once) to -1e-6 (kept), and softplus beyond its
    threshold: finite and equal to the reference."""
    inp = make_inputs(l=40, layout="shared", seed=3)
    inp["A"] = torch.tensor([-100.0, -1.0, -1e-3])[None].expand(4, 3).contiguous().double()
    inp["delta"] = inp["delta"] * 12  # softplus sees values beyond 20
    use = ("D", "z", "delta_bias")
    y_ref, s_ref = call(selective_scan_ref, inp, use)
    y, s = call(selective_scan_numba, {k: v.to(dtype) for k, v in inp.items()}, use)
    assert torch.isfinite(y).all() and torch.isfinite(s).all()
    torch.testing.assert_close(y.double(), y_ref, **TOL[dtype])
    torch.testing.assert_close(s.double(), s_ref, **TOL[dtype])
    names, g_ref = grads(selective_scan_ref, inp, use)
    _, g = grads(selective_scan_numba, inp, use, dtype=dtype)
    for name, a, b in zip(names, g, g_ref):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), b, **GRAD_TOL[dtype], msg=f"gradient w.r.t. {name}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fast_exp_matches_exp(dtype):
    from numba import njit

    from longrange.ops.scan._numba_kernels import fast_exp

    @njit
    def apply(x, out):
        for i in range(x.shape[0]):
            out[i] = fast_exp(x[i])

    finite = np.concatenate([np.linspace(-120, 100, 20001), np.linspace(-1, 1, 2001), [-1e-30, 0.0, 1e-30]])
    x = np.concatenate([finite, [np.inf, -np.inf, np.nan]]).astype(dtype)
    out = np.empty_like(x)
    apply(x, out)
    expected = np.exp(x.astype(np.float64))
    eps = np.finfo(dtype).eps
    tiny, huge = np.finfo(dtype).tiny, np.finfo(dtype).max
    normal = (expected > tiny) & (expected < huge / 2)
    # about the rounding error of exp at the input's precision (x itself is exact in dtype)
    assert np.all(np.abs(out[normal] - expected[normal]) <= 4 * eps * expected[normal])
    assert np.all(out[expected <= tiny] <= 2 * tiny)  # underflow: zero or the smallest normals
    assert np.all(np.isinf(out[expected >= huge])) and np.isinf(out[-3]) and out[-2] == 0 and np.isnan(out[-1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fast_softplus_matches_softplus_and_sigmoid(dtype):
    """The kernels' softplus (with its slope, the sigmoid) against PyTorch's in float64: F.softplus's
    threshold of 20 (x itself and slope 1 above it), a few units in the last place elsewhere, zero
    where the value is below the dtype's normal numbers, and the infinities and NaN."""
    from numba import njit

    from longrange.ops.scan._numba_kernels import fast_softplus

    @njit
    def apply(x, value, slope):
        for i in range(x.shape[0]):
            value[i], slope[i] = fast_softplus(x[i])

    finite = np.concatenate([np.linspace(-120, 100, 22001), np.linspace(-1e-3, 1e-3, 2001), [19.999, 20.0, 20.001]])
    x = np.concatenate([finite, [np.inf, -np.inf, np.nan]]).astype(dtype)
    value, slope = np.empty_like(x), np.empty_like(x)
    apply(x, value, slope)
    x64 = torch.from_numpy(x.astype(np.float64))
    expected = torch.nn.functional.softplus(x64).numpy()
    expected_slope = torch.where(x64 > 20, 1.0, torch.sigmoid(x64)).numpy()
    eps, tiny = np.finfo(dtype).eps, np.finfo(dtype).tiny
    for got, want in ((value, expected), (slope, expected_slope)):
        normal = np.isfinite(want) & (want > 2 * tiny)
        assert np.all(np.abs(got[normal] - want[normal]) <= 4 * eps * want[normal])
        assert np.all(np.abs(got[~normal & np.isfinite(want)]) <= 2 * tiny)
    assert np.all(value[x > 20] == x[x > 20]) and np.all(slope[np.isfinite(x) & (x > 20)] == 1)
    assert np.isinf(value[-3]) and value[-2] == 0 and slope[-2] == 0 and np.isnan(value[-1]) and np.isnan(slope[-1])


def test_dispatch_auto_on_cpu_is_numba(monkeypatch):
    inp = make_inputs(l=6, layout="shared")
    calls = []
    real = scan_numba.selective_scan_numba
    monkeypatch.setattr(scan_numba, "selective_scan_numba", lambda *a, **k: calls.append(1) or real(*a, **k))
    args = (inp["u"], inp["delta"], inp["A"], inp["B"], inp["C"])
    assert auto_impl("cpu") == "numba"
    y = selective_scan(*args, delta_softplus=True)
    assert calls == [1]
    torch.testing.assert_close(y, selective_scan(*args, delta_softplus=True, impl="chunked"), **TOL[torch.float64])
    selective_scan(*args, impl="numba")
    assert calls == [1, 1]


def test_fallback_to_chunked_without_numba(monkeypatch):
    """Where numba does not import, "auto" runs the chunked scan and "numba" says why it cannot run."""
    inp = make_inputs(l=6, layout="shared")
    monkeypatch.setattr(scan_numba._KERNELS, "module", None)
    monkeypatch.setattr(scan_numba._KERNELS, "error", "ModuleNotFoundError: No module named 'numba'")
    assert not numba_available() and auto_impl("cpu") == "chunked"
    calls = []
    real = scan_mod.selective_scan_chunked
    monkeypatch.setattr(scan_mod, "selective_scan_chunked", lambda *a, **k: calls.append(1) or real(*a, **k))
    args = (inp["u"], inp["delta"], inp["A"], inp["B"], inp["C"])
    y = selective_scan(*args)
    assert calls == [1]
    torch.testing.assert_close(y, selective_scan_ref(*args), **TOL[torch.float64])
    with pytest.raises(RuntimeError, match="impl='numba' needs the numba package.*No module named 'numba'"):
        selective_scan(*args, impl="numba")


def test_errors():
    inp = make_inputs(l=5, layout="shared")
    args = (inp["u"], inp["delta"], inp["A"], inp["B"], inp["C"])
    with pytest.raises(ValueError, match="B must have shape"):
        selective_scan_numba(inp["u"], inp["delta"], inp["A"], inp["B"][:, :2], inp["C"])
    with pytest.raises(RuntimeError, match="CPU tensors only.*meta"):
        selective_scan_numba(*(t.to("meta") for t in args))


def test_threads_follow_torch():
    """The kernels run on torch's thread count, and running them leaves torch's setting alone."""
    import numba

    inp = make_inputs(l=5, layout="shared")
    previous = torch.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            torch.set_num_threads(threads)
            call(selective_scan_numba, inp, ())
            assert torch.get_num_threads() == threads and numba.get_num_threads() == threads
    finally:
        torch.set_num_threads(previous)


def test_softplus_matches_torch_threshold():
    """delta beyond softplus' threshold of 20 passes through unchanged, as in F.softplus."""
    inp = make_inputs(l=4, layout="time_invariant")
    inp["delta"] = torch.full_like(inp["delta"], 30.0)
    inp["A"] = torch.full_like(inp["A"], -1e-3)
    y_ref, _ = call(selective_scan_ref, inp, ())
    y, _ = call(selective_scan_numba, inp, ())
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    assert math.isfinite(y.abs().max().item())


def test_warm_up_loads_both_dtypes():
    scan_numba.warm_up()
    from longrange.ops.scan import _numba_kernels as kernels

    for kernel in (kernels.scan_forward, kernels.scan_backward, kernels.scan_forward_cl, kernels.scan_backward_cl):
        assert {str(sig[0].dtype) for sig in kernel.signatures} >= {"float32", "float64"}, kernel


@pytest.mark.parametrize(
    "b,d,n,B,C,threads,itemsize,expected",
    [
        (8, 256, 16, (8, 1, 1024, 16), (8, 1, 1024, 16), 2, 4, (256, 16)),  # the Mamba backbone: all channels per task
        (8, 256, 16, (8, 1, 1024, 16), (8, 1, 1024, 16), 16, 4, (128, 16)),  # 16 threads: 16 tasks
        (8, 256, 16, (8, 1, 1024, 16), (8, 1, 1024, 16), 2, 8, (256, 8)),  # float64: shorter chunks
        (1, 256, 16, (1, 1, 1024, 16), (1, 1, 1024, 16), 64, 4, (16, 16)),  # no block narrower than 16
        (2, 96, 4, (2, 1, 9, 4), (2, 1, 9, 4), 1, 4, (96, 64)),
        (2, 96, 4, (2, 4, 9, 4), (2, 3, 9, 4), 1, 4, None),  # groups of 24 and 32 channels: blocks of 8 only
        (2, 96, 4, (1, 96, 1, 4), (2, 1, 9, 4), 1, 4, None),  # time-invariant B
        (1, 1024, 16, (1, 1, 9, 16), (1, 1, 9, 16), 2, 4, (256, 16)),  # at most 256 channels per task
    ],
)
def test_channels_last_tiles(b, d, n, B, C, threads, itemsize, expected):
    """(channels per task, positions per chunk) of the channels-last kernels, or None where they do
    not apply; the chunk does not depend on the threads (it fixes the stored states' shape)."""
    B, C = torch.empty(B), torch.empty(C)
    chunk = scan_numba._cl_chunk(d, n, B, C, itemsize)
    got = None if chunk is None else (scan_numba._cl_width(b, d, B, C, threads), chunk)
    assert got == expected


@pytest.mark.parametrize("layout,used", [("shared", True), ("grouped", True), ("time_invariant", False)])
def test_channels_last_kernels_run_where_they_apply(monkeypatch, layout, used):
    """The channels-last operator runs for time-varying B and C on blocks of CL_MIN_WIDTH channels
    or more (here lowered to 2), the state-vectorised one otherwise; same results either way."""
    inp = make_inputs(b=2, d=4, n=3, l=9, layout=layout)
    calls = []
    real = scan_numba._scan_cl_op_eager
    monkeypatch.setattr(scan_numba, "_scan_cl_op_eager", lambda *a: calls.append(a[-1]) or real(*a))
    monkeypatch.setattr(scan_numba, "CL_MIN_WIDTH", 2)
    y, s = call(selective_scan_numba, inp, ("D", "z", "initial_state"))
    assert calls == ([64] if used else [])
    y_ref, s_ref = call(selective_scan_ref, inp, ("D", "z", "initial_state"))
    torch.testing.assert_close(y, y_ref, **TOL[torch.float64])
    torch.testing.assert_close(s, s_ref, **TOL[torch.float64])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_channels_last_at_model_width(dtype):
    """At the width of a model (64 channels, 16 states, several chunks of a long sequence) the
    channels-last kernels give the state-vectorised kernels' values and gradients."""
    inp = make_inputs(b=2, d=64, n=16, l=300, layout="shared", seed=5)
    inp["delta"] = inp["delta"] - 2  # steps of a trained model: mostly below 1
    use = ("D", "z", "delta_bias", "initial_state")
    results = {}
    for kernel, width in (("states", 1 << 30), ("channels", 16)):
        previous = scan_numba.CL_MIN_WIDTH
        scan_numba.CL_MIN_WIDTH = width
        try:
            results[kernel] = (
                call(selective_scan_numba, {k: v.to(dtype) for k, v in inp.items()}, use),
                grads(selective_scan_numba, inp, use, dtype=dtype)[1],
            )
        finally:
            scan_numba.CL_MIN_WIDTH = previous
    (y0, s0), g0 = results["states"]
    (y1, s1), g1 = results["channels"]
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y1, y0, **tol)
    torch.testing.assert_close(s1, s0, **tol)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, **(dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else tol))
