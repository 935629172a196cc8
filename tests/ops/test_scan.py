"""The chunked selective scan against the sequential reference: values, last states and gradients."""

from __future__ import annotations

import interpreter
import pytest
import torch

from longrange.ops.scan import chunked as chunked_mod
from longrange.ops.scan import (
    default_impl,
    linear_scan,
    selective_scan,
    selective_scan_chunked,
    selective_scan_ref,
    set_default_impl,
)
from longrange.ops.scan import dispatch as scan_mod

F64 = dict(dtype=torch.float64)


def make_inputs(b=2, d=4, n=3, l=13, layout="time_invariant", groups=2, seed=0, a_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, **F64)  # noqa: E731
    bc_shape = {"time_invariant": (d, n), "shared": (b, n, l), "grouped": (b, groups, n, l)}[layout]
    return dict(
        u=r(b, d, l),
        delta=r(b, d, l),
        A=-(torch.rand(d, n, generator=g, **F64) + 0.1) * a_scale,
        B=r(*bc_shape),
        C=r(*bc_shape),
        D=r(d),
        z=r(b, d, l),
        delta_bias=r(d),
    )


def run(fn, inp, use, softplus=True, last=False, **kw):
    args = dict(u=inp["u"], delta=inp["delta"], A=inp["A"], B=inp["B"], C=inp["C"])
    for k in ("D", "z", "delta_bias"):
        args[k] = inp[k] if k in use else None
    if not softplus:  # keep delta positive so exp(delta*A) decays as in a real model
        args["delta"] = inp["delta"].abs() + 0.05
    return fn(**args, delta_softplus=softplus, return_last_state=last, **kw)


def grads_of(fn, inp, use, softplus, **kw):
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inp.items()}
    out, last = run(fn, leaves, use, softplus, last=True, **kw)
    g = torch.Generator().manual_seed(123)
    proj = torch.randn(out.shape, generator=g, **F64)
    proj_last = torch.randn(last.shape, generator=g, **F64)
    loss = (out * proj).sum() + (last * proj_last).sum()
    names = ["u", "delta", "A", "B", "C"] + [k for k in ("D", "z", "delta_bias") if k in use]
    return names, torch.autograd.grad(loss, [leaves[k] for k in names])


LAYOUTS = ["time_invariant", "shared", "grouped"]
OPTIONALS = [(), ("D",), ("z",), ("delta_bias",), ("D", "z", "delta_bias")]
METHODS = ["segsum", "loop"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("use", OPTIONALS)
@pytest.mark.parametrize("softplus", [False, True])
@pytest.mark.parametrize("method", METHODS)
def test_chunked_matches_ref_values_and_grads(layout, use, softplus, method):
    inp = make_inputs(l=13, layout=layout)
    y_ref, s_ref = run(selective_scan_ref, inp, use, softplus, last=True)
    y, s = run(selective_scan_chunked, inp, use, softplus, last=True, chunk_size=4, chunk_method=method)
    assert y.dtype == torch.float64 and y.shape == inp["u"].shape and s.shape == (2, 4, 3)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-10)
    names, g_ref = grads_of(selective_scan_ref, inp, use, softplus)
    _, g = grads_of(selective_scan_chunked, inp, use, softplus, chunk_size=4, chunk_method=method)
    for name, a, b in zip(names, g, g_ref):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=f"gradient w.r.t. {name}")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("with_initial_state", [False, True])
def test_segmented_long_scan_matches_ref_values_and_grads(layout, with_initial_state):
    """Lengths beyond one segment are scanned piece by piece; values, last state and gradients
    (including w.r.t. the initial state) equal the reference."""
    inp = make_inputs(l=29, layout=layout)
    use = ("D", "z", "delta_bias")
    if with_initial_state:
        inp["initial_state"] = torch.randn(2, 4, 3, **F64)
    # 2·4·3 states of 8 bytes: 8 positions per segment at chunk size 4 -> 4 segments, the last shorter.
    kw = dict(chunk_size=4, segment_bytes=8 * 2 * 4 * 3 * 8)
    extra = {"initial_state": inp["initial_state"]} if with_initial_state else {}
    y_ref, s_ref = run(selective_scan_ref, inp, use, last=True, **extra)
    y, s = run(selective_scan_chunked, inp, use, last=True, **extra, **kw)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-10)
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inp.items()}
    names = list(leaves)

    def loss(fn, **kw2):
        extra2 = {"initial_state": leaves["initial_state"]} if with_initial_state else {}
        out, last = run(fn, leaves, use, last=True, **extra2, **kw2)
        g = torch.Generator().manual_seed(5)
        return (out * torch.randn(out.shape, generator=g, **F64)).sum() + (
            last * torch.randn(last.shape, generator=g, **F64)
        ).sum()

    g_ref = torch.autograd.grad(loss(selective_scan_ref), [leaves[k] for k in names])
    g = torch.autograd.grad(loss(selective_scan_chunked, **kw), [leaves[k] for k in names])
    for name, a, b in zip(names, g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=f"gradient w.r.t. {name}")


@pytest.mark.parametrize("length,chunk", [(1, 4), (2, 4), (4, 4), (16, 4), (17, 4), (31, 8), (50, 7), (9, 32)])
@pytest.mark.parametrize("method", METHODS)
def test_lengths_and_chunk_sizes(length, chunk, method):
    inp = make_inputs(l=length, layout="shared", seed=length)
    use = ("D", "z", "delta_bias")
    y_ref, s_ref = run(selective_scan_ref, inp, use, last=True)
    y, s = run(selective_scan_chunked, inp, use, last=True, chunk_size=chunk, chunk_method=method)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-10)
    names, g_ref = grads_of(selective_scan_ref, inp, use, True)
    _, g = grads_of(selective_scan_chunked, inp, use, True, chunk_size=chunk, chunk_method=method)
    for name, a, b in zip(names, g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=f"gradient w.r.t. {name}")


@pytest.mark.parametrize("method", METHODS)
def test_multi_level_recursion_matches_ref(method):
    # 70 steps with chunks of 2 need six levels of chunk-state recursion.
    inp = make_inputs(b=1, d=2, n=2, l=70, layout="shared", seed=5)
    y_ref = run(selective_scan_ref, inp, ("D",))
    y = run(selective_scan_chunked, inp, ("D",), chunk_size=2, chunk_method=method)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)


def test_segsum_blocks_of_chunks_match_one_block(monkeypatch):
    # A tiny memory budget forces one chunk per block of (chunk x chunk) matrices.
    inp = make_inputs(l=29, layout="grouped", seed=8)
    use = ("D", "z", "delta_bias")
    whole = run(selective_scan_chunked, inp, use, chunk_size=4, chunk_method="segsum")
    monkeypatch.setattr(chunked_mod, "_MAX_BLOCK_ELEMENTS", 1)
    blocked = run(selective_scan_chunked, inp, use, chunk_size=4, chunk_method="segsum")
    torch.testing.assert_close(blocked, whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(blocked, run(selective_scan_ref, inp, use), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("method", METHODS)
def test_stiff_decay_stays_finite_and_accurate(dtype, method):
    # delta * A ~ -50 per step: exp of a cumulative sum over a chunk would underflow to 0 and its
    # inverse overflow; masked segment sums keep every exponent <= 0.
    inp = make_inputs(l=70, layout="shared", seed=1)
    delta = torch.full_like(inp["u"], 1.0)
    A = torch.full_like(inp["A"], -50.0)
    leaves = [inp["u"], delta, A, inp["B"], inp["C"]]
    y_ref, s_ref = selective_scan_ref(*leaves, return_last_state=True)
    cast = [t.to(dtype).requires_grad_() for t in leaves]
    y, s = selective_scan_chunked(*cast, return_last_state=True, chunk_size=32, chunk_method=method)
    assert y.dtype == dtype and torch.isfinite(y).all() and torch.isfinite(s).all()
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(y.double(), y_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(s.double(), s_ref, rtol=tol, atol=tol)
    grads = torch.autograd.grad(y.sum() + s.sum(), cast)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("method", METHODS)
def test_stiff_decay_gradients_match_ref(method):
    inp = make_inputs(l=20, layout="shared", seed=2)
    A = torch.full_like(inp["A"], -50.0)
    base = [inp["u"], inp["delta"].abs() + 0.5, A, inp["B"], inp["C"]]

    def grads(fn, **kw):
        leaves = [t.clone().requires_grad_() for t in base]
        y, s = fn(*leaves, return_last_state=True, **kw)
        return torch.autograd.grad((y * inp["z"]).sum() + s.sum(), leaves)

    for a, b in zip(grads(selective_scan_chunked, chunk_size=8, chunk_method=method), grads(selective_scan_ref)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_tiny_decay_matches_ref(method):
    # delta * A ~ -1e-6: almost no decay, the state accumulates every input.
    inp = make_inputs(l=70, layout="grouped", seed=3)
    delta = torch.full_like(inp["u"], 1e-3)
    A = torch.full_like(inp["A"], -1e-3)
    leaves = [inp["u"], delta, A, inp["B"], inp["C"]]
    y_ref, s_ref = selective_scan_ref(*leaves, return_last_state=True)
    y, s = selective_scan_chunked(*leaves, return_last_state=True, chunk_size=16, chunk_method=method)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-12)
    y32 = selective_scan_chunked(*[t.float() for t in leaves], chunk_size=16, chunk_method=method)
    torch.testing.assert_close(y32.double(), y_ref, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("fn", [selective_scan_ref, selective_scan_chunked])
def test_continuing_from_last_state_equals_one_scan(fn):
    inp = make_inputs(l=23, layout="shared", seed=4)
    full, last_full = fn(
        inp["u"], inp["delta"], inp["A"], inp["B"], inp["C"], inp["D"], inp["z"], inp["delta_bias"], True, True
    )
    cut = 9
    parts, state = [], None
    for sl in (slice(0, cut), slice(cut, None)):
        y, state = fn(
            inp["u"][..., sl],
            inp["delta"][..., sl],
            inp["A"],
            inp["B"][..., sl],
            inp["C"][..., sl],
            inp["D"],
            inp["z"][..., sl],
            inp["delta_bias"],
            True,
            True,
            initial_state=state,
        )
        parts.append(y)
    torch.testing.assert_close(torch.cat(parts, -1), full, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state, last_full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("method", METHODS)
def test_initial_state_gradient_matches_ref(method):
    inp = make_inputs(l=11, layout="time_invariant", seed=6)
    h0 = torch.randn(2, 4, 3, **F64)

    def grad(fn, **kw):
        s = h0.clone().requires_grad_()
        y = fn(inp["u"], inp["delta"], inp["A"], inp["B"], inp["C"], delta_softplus=True, initial_state=s, **kw)
        return torch.autograd.grad((y * inp["z"]).sum(), s)[0]

    torch.testing.assert_close(
        grad(selective_scan_chunked, chunk_size=4, chunk_method=method),
        grad(selective_scan_ref),
        rtol=1e-10,
        atol=1e-12,
    )


def test_float32_inputs_give_float32_output_close_to_float64():
    inp = make_inputs(l=40, layout="shared", seed=7)
    use = ("D", "z", "delta_bias")
    y_ref = run(selective_scan_ref, inp, use)
    y32 = run(selective_scan_chunked, {k: v.float() for k, v in inp.items()}, use)
    assert y32.dtype == torch.float32
    torch.testing.assert_close(y32.double(), y_ref, rtol=1e-4, atol=1e-4)


def test_dispatch_and_default_impl(monkeypatch):
    inp = make_inputs(l=5, layout="shared")
    calls = []
    real_ref = scan_mod.selective_scan_ref
    monkeypatch.setattr(scan_mod, "selective_scan_ref", lambda *a, **k: calls.append("ref") or real_ref(*a, **k))
    args = (inp["u"], inp["delta"], inp["A"], inp["B"], inp["C"])
    y_auto = selective_scan(*args)
    assert calls == []  # "auto" on CPU is the chunked path
    y_ref = selective_scan(*args, impl="ref")
    assert calls == ["ref"]
    with default_impl("ref"):
        selective_scan(*args)
    assert calls == ["ref", "ref"]
    torch.testing.assert_close(y_auto, y_ref)
    with pytest.raises(ValueError, match="unknown impl"):
        selective_scan(*args, impl="fast")
    with pytest.raises(ValueError, match="unknown impl"):
        set_default_impl("nope")
    if scan_mod._optional.selective_scan_cuda_fn is None or not inp["u"].is_cuda:
        with pytest.raises(RuntimeError, match="impl='cuda'"):
            selective_scan(*args, impl="cuda")


def test_chunked_path_keeps_no_per_time_step_graph():
    # The autograd graph of the chunked path has a fixed number of nodes, independent of length.
    def count_nodes(l):
        inp = make_inputs(l=l, layout="shared")
        leaves = {k: v.requires_grad_() for k, v in inp.items()}
        y = run(selective_scan_chunked, leaves, ("D", "z", "delta_bias"), chunk_size=4)
        seen, stack = set(), [y.grad_fn]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            stack.extend(fn for fn, _ in node.next_functions)
        return len(seen)

    assert count_nodes(8) == count_nodes(64)


@pytest.mark.parametrize("method", METHODS)
def test_linear_scan_matches_loop_and_validates(method):
    g = torch.Generator().manual_seed(0)
    a = -torch.rand(19, 3, 2, generator=g, **F64)  # time-major
    x = torch.randn(19, 3, 2, generator=g, **F64)
    h0 = torch.randn(3, 2, generator=g, **F64)
    h, states = h0, []
    for t in range(19):
        h = torch.exp(a[t]) * h + x[t]
        states.append(h)
    got = linear_scan(a, x, h0, chunk_size=4, method=method)
    torch.testing.assert_close(got, torch.stack(states), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="unknown method"):
        linear_scan(a, x, method="parallel")
    with pytest.raises(ValueError, match="chunk_size"):
        linear_scan(a, x, chunk_size=1)
    with pytest.raises(ValueError, match="differ in shape"):
        linear_scan(a, x[:5])
    with pytest.raises(ValueError, match="h0"):
        linear_scan(a, x, h0[:1])


def _bad_shape_cases():
    b, d, n, l = 2, 4, 3, 5
    good = dict(
        u=torch.randn(b, d, l),
        delta=torch.randn(b, d, l),
        A=-torch.rand(d, n),
        B=torch.randn(b, n, l),
        C=torch.randn(b, n, l),
    )
    yield "u", dict(good, u=torch.randn(b, d)), "u must have shape"
    yield "delta", dict(good, delta=torch.randn(b, d, l + 1)), "delta must have the shape of u"
    yield "A", dict(good, A=-torch.rand(d + 1, n)), "A must have shape"
    yield "A complex", dict(good, A=torch.randn(d, n, dtype=torch.complex64)), "complex A"
    yield "B", dict(good, B=torch.randn(b, n + 1, l)), "B must have shape"
    yield "B groups", dict(good, B=torch.randn(b, 3, n, l)), "B must have shape"
    yield "C", dict(good, C=torch.randn(d, n + 1)), "C must have shape"
    yield "D", dict(good, D=torch.randn(d + 1)), "D must have shape"
    yield "delta_bias", dict(good, delta_bias=torch.randn(1, d)), "delta_bias must have shape"
    yield "z", dict(good, z=torch.randn(b, d, l - 1)), "z must have the shape of u"
    yield "initial_state", dict(good, initial_state=torch.randn(b, d, n + 1)), "initial_state must have shape"


@pytest.mark.parametrize("impl", ["ref", "chunked"])
@pytest.mark.parametrize("case", list(_bad_shape_cases()), ids=lambda c: c[0])
def test_bad_shapes_raise(impl, case):
    _, kwargs, message = case
    with pytest.raises(ValueError, match=message):
        selective_scan(**kwargs, impl=impl)


def test_error_message_names_expected_and_actual_shape():
    with pytest.raises(ValueError) as info:
        selective_scan(
            torch.randn(2, 4, 5), torch.randn(2, 4, 5), -torch.rand(4, 3), torch.randn(2, 9, 5), torch.randn(2, 3, 5)
        )
    assert "(2, 3, 5)" in str(info.value) and "(2, 9, 5)" in str(info.value)


def test_ref_matches_explicit_formula():
    # One channel, one state, three steps, written out by hand.
    u = torch.tensor([[[1.0, 2.0, -1.0]]], **F64)
    delta = torch.tensor([[[0.5, 0.25, 1.0]]], **F64)
    A = torch.tensor([[-2.0]], **F64)
    B = torch.tensor([[[3.0, -1.0, 2.0]]], **F64)
    C = torch.tensor([[[1.0, 2.0, 0.5]]], **F64)
    h, expected = 0.0, []
    for t in range(3):
        h = torch.exp(delta[0, 0, t] * A[0, 0]) * h + delta[0, 0, t] * B[0, 0, t] * u[0, 0, t]
        expected.append(C[0, 0, t] * h + 0.5 * u[0, 0, t])
    D = torch.tensor([0.5], **F64)
    for fn in (selective_scan_ref, selective_scan_chunked):
        torch.testing.assert_close(fn(u, delta, A, B, C, D)[0, 0], torch.stack(expected))


def test_zero_length_returns_empty_output_and_initial_state():
    inp = make_inputs(l=0, layout="shared")
    for fn in (selective_scan_ref, selective_scan_chunked):
        y, s = fn(inp["u"], inp["delta"], inp["A"], inp["B"], inp["C"], return_last_state=True)
        assert y.shape == (2, 4, 0) and torch.equal(s, torch.zeros(2, 4, 3, **F64))


# --------------------------------------------------------------------------------------------
# Determinism: with PyTorch's deterministic algorithms on, no implementation whose backward is not
# --------------------------------------------------------------------------------------------


@pytest.fixture
def deterministic():
    """torch.use_deterministic_algorithms(True) inside the test, restored afterwards."""
    before, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before, warn_only=warn_only)


def test_every_impl_states_whether_its_backward_is_deterministic():
    assert set(scan_mod.DETERMINISTIC_BACKWARD) == set(scan_mod.IMPLS) - {"auto"}
    assert {i for i, ok in scan_mod.DETERMINISTIC_BACKWARD.items() if not ok} == {"triton", "cuda"}


def test_auto_picks_only_deterministic_impls_in_deterministic_mode(deterministic):
    for device in ("cpu", "cuda"):
        for has_state in (False, True):
            assert scan_mod.DETERMINISTIC_BACKWARD[scan_mod.auto_impl(device, has_state)]
    assert scan_mod.auto_impl("cuda") == "chunked"
    assert scan_mod.auto_impl("cuda", deterministic=False) in ("cuda", "triton", "chunked")
    inp = make_inputs(l=6, layout="shared")
    args = (inp["u"], inp["delta"], inp["A"], inp["B"], inp["C"])
    torch.testing.assert_close(selective_scan(*args), selective_scan_ref(*args))


def test_forcing_a_non_deterministic_impl_raises_naming_the_alternatives(deterministic, monkeypatch):
    pytest.importorskip("triton")
    interpreter.use(monkeypatch)  # the interpreter counts as Triton
    inp = make_inputs(l=6, layout="shared")
    args = (inp["u"], inp["delta"], inp["A"], inp["B"], inp["C"])
    for impl in ("triton", "cuda"):
        with pytest.raises(RuntimeError, match=rf"impl='{impl}' has a non-deterministic backward.*'chunked'.*'ref'"):
            selective_scan(*args, impl=impl)
    for impl in ("chunked", "ref"):
        selective_scan(*args, impl=impl)  # deterministic ones run


def test_warn_only_mode_warns_and_runs(monkeypatch):
    pytest.importorskip("triton")
    interpreter.use(monkeypatch)
    before, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        inp = make_inputs(l=6, layout="shared")
        args = (inp["u"], inp["delta"], inp["A"], inp["B"], inp["C"])
        with pytest.warns(UserWarning, match="impl='triton' has a non-deterministic backward"):
            y = selective_scan(*args, impl="triton")
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)
    torch.testing.assert_close(y, selective_scan_ref(*args))


@pytest.mark.parametrize("impl", ["chunked", "numba", "ref"])
def test_deterministic_impls_repeat_their_gradients_bit_for_bit(impl):
    if impl not in scan_mod.available_impls("cpu"):
        pytest.skip(f"{impl} cannot run here")
    inp = make_inputs(l=21, layout="grouped", seed=3)

    def grads():
        leaves = {k: v.float().requires_grad_() for k, v in inp.items()}
        leaves["h0"] = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(4)).requires_grad_()
        y, last = selective_scan(
            *(leaves[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")),
            True,
            True,
            leaves["h0"],
            impl=impl,
        )
        (y.square().sum() + last.sum()).backward()
        return [y, last] + [leaves[k].grad for k in sorted(leaves)]

    for a, b in zip(grads(), grads()):
        assert torch.equal(a, b)
