"""RWKV-4's WKV: each implementation (numba, chunked) and the step against the loop over time (float64,
values and gradients), the state carried across a split, masks, keys far beyond exp's float32
range, the dispatch and its errors."""

from __future__ import annotations

import pytest
import torch

from longrange.ops import wkv as W
from longrange.ops.wkv import empty_state, wkv, wkv_ref, wkv_step

IMPLS = [i for i in ("numba", "chunked") if i in W.available_impls("cpu")]

F64 = torch.float64


def inputs(B=2, L=13, D=5, key_scale=3.0, decay_scale=2.0, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(D, generator=g, dtype=F64) * decay_scale + 0.01
    u = torch.randn(D, generator=g, dtype=F64)
    k = torch.randn(B, L, D, generator=g, dtype=F64) * key_scale
    v = torch.randn(B, L, D, generator=g, dtype=F64)
    return tuple(t.to(dtype) for t in (w, u, k, v))


def unscaled(state):
    return state["num"] * state["scale"].exp(), state["den"] * state["scale"].exp()


def grads(fn, tensors, upstream):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    y = fn(*leaves)
    y = y[0] if isinstance(y, tuple) else y
    (y * upstream).sum().backward()
    return y.detach(), [torch.zeros_like(t) if t.grad is None else t.grad for t in leaves]  # None: no path


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("L, chunk", [(1, 4), (13, 4), (16, 4), (29, 8), (7, None)])
def test_each_implementation_matches_the_loop_in_values_and_gradients(impl, L, chunk):
    w, u, k, v = inputs(L=L)
    upstream = torch.randn(2, L, 5, dtype=F64)
    y, g = grads(lambda *t: wkv(*t, chunk_size=chunk, impl=impl), (w, u, k, v), upstream)
    y_ref, g_ref = grads(wkv_ref, (w, u, k, v), upstream)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    for name, a, b in zip("wukv", g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=name)


@pytest.mark.parametrize("L, chunk", [(1, 4), (13, 4), (29, 8)])
def test_the_chunked_forms_final_state_is_the_loops(L, chunk):
    w, u, k, v = inputs(L=L)
    _, state = wkv(w, u, k, v, chunk_size=chunk, return_state=True)
    _, state_ref = wkv_ref(w, u, k, v)
    for a, b in zip(unscaled(state), unscaled(state_ref)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_the_step_and_a_split_with_the_state_carried_give_the_whole_sequence():
    w, u, k, v = inputs(L=11)
    y_ref, _ = wkv_ref(w, u, k, v)
    state, ys = empty_state(2, 5, dtype=F64), []
    for t in range(11):
        y_t, state = wkv_step(w, u, k[:, t], v[:, t], state)
        ys.append(y_t)
    torch.testing.assert_close(torch.stack(ys, 1), y_ref, rtol=1e-10, atol=1e-12)
    y1, s1 = wkv(w, u, k[:, :4], v[:, :4], chunk_size=3, return_state=True)
    y2 = wkv(w, u, k[:, 4:], v[:, 4:], state=s1, chunk_size=3)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y_ref, rtol=1e-10, atol=1e-12)
    y3 = wkv(w, u, k, v, state=empty_state(2, 5, dtype=F64))  # the empty state is no state
    torch.testing.assert_close(y3, y_ref, rtol=1e-10, atol=1e-12)


def test_gradients_flow_into_an_initial_state_as_the_loop_gives_them():
    w, u, k, v = inputs(L=9)
    _, s = wkv_ref(w, u, k[:, :5], v[:, :5])
    state = {
        "num": s["num"] / 3.0,
        "den": s["den"] / 3.0,
        "scale": torch.full_like(s["num"], torch.log(torch.tensor(3.0)).item()),
    }
    upstream = torch.randn(2, 4, 5, dtype=F64)
    leaves = [state[key].clone().requires_grad_() for key in ("num", "den", "scale")]
    y = wkv(w, u, k[:, 5:], v[:, 5:], state=dict(zip(("num", "den", "scale"), leaves)), chunk_size=2)
    (y * upstream).sum().backward()
    ref_leaves = [state[key].clone().requires_grad_() for key in ("num", "den", "scale")]
    y_ref, _ = wkv_ref(w, u, k[:, 5:], v[:, 5:], state=dict(zip(("num", "den", "scale"), ref_leaves)))
    (y_ref * upstream).sum().backward()
    torch.testing.assert_close(y, y_ref.detach(), rtol=1e-10, atol=1e-12)
    for a, b in zip(leaves, ref_leaves):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("impl", IMPLS)
def test_masked_positions_add_nothing_and_leading_padding_changes_no_real_output(impl):
    w, u, k, v = inputs(L=10)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[0, :3] = False  # leading padding, as a reversed padded sequence has it
    mask[1, 6:] = False
    upstream = torch.randn(2, 10, 5, dtype=F64)
    y, g = grads(lambda *t: wkv(*t, mask=mask, chunk_size=4, impl=impl), (w, u, k, v), upstream)
    y_ref, g_ref = grads(lambda *t: wkv_ref(*t, mask=mask), (w, u, k, v), upstream)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    for name, a, b in zip("wukv", g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=name)
    alone, _ = wkv_ref(w, u, k[:1, 3:], v[:1, 3:])  # the first sequence without its padding
    torch.testing.assert_close(y[:1, 3:], alone, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_float32_stays_finite_and_accurate_with_keys_far_beyond_exps_range(impl):
    w, u, k, v = inputs(L=300, key_scale=60.0, decay_scale=20.0, dtype=torch.float32)
    assert k.abs().max() > 150  # exp(150) overflows float32
    y, (_, state) = wkv(w, u, k, v, impl=impl), wkv(w, u, k, v, return_state=True)
    y_ref, _ = wkv_ref(*(t.double() for t in (w, u, k, v)))
    assert torch.isfinite(y).all() and all(torch.isfinite(t).all() for t in state.values())
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-4, atol=1e-4)
    s = empty_state(2, 5)
    for t in range(300):
        y_t, s = wkv_step(w, u, k[:, t], v[:, t], s)
    torch.testing.assert_close(y_t.double(), y_ref[:, -1], rtol=1e-4, atol=1e-4)
    k.requires_grad_()
    wkv(w, u, k, v, impl=impl).sum().backward()
    assert torch.isfinite(k.grad).all()


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(v=torch.zeros(2, 13, 4, dtype=F64)), r"k and v must be \(batch, length, channels\) of one shape"),
        (dict(w=torch.ones(4, dtype=F64)), r"w must have shape \(5,\) for k of shape \(2, 13, 5\), got \(4,\)"),
        (dict(k=torch.zeros(2, 0, 5, dtype=F64), v=torch.zeros(2, 0, 5, dtype=F64)), "the length must be at least 1"),
        (dict(mask=torch.ones(2, 12, dtype=torch.bool)), r"mask must be boolean of shape \(2, 13\)"),
        (dict(state={"num": torch.zeros(2, 5)}), "a WKV state is a dict of num, den, scale"),
        (
            dict(state={"num": torch.zeros(2, 5), "den": torch.zeros(2, 5), "scale": torch.zeros(3, 5)}),
            r"state\['scale'\] must have shape \(2, 5\)",
        ),
    ],
)
def test_bad_inputs_are_errors_naming_the_argument(change, message):
    w, u, k, v = inputs()
    args = {**dict(w=w, u=u, k=k, v=v), **change}
    with pytest.raises(ValueError, match=message):
        wkv(**args)


def test_auto_runs_numba_on_a_cpu_without_states_and_the_chunked_form_with_them():
    assert W.auto_impl("cpu", has_state=True) == "chunked"
    assert W.auto_impl("meta") == "chunked"
    assert W.auto_impl("cpu") == ("numba" if "numba" in IMPLS else "chunked")
    w, u, k, v = inputs(L=6)
    with pytest.raises(
        ValueError, match=r"wkv: unknown impl 'fast'; expected one of \('auto', 'numba', 'chunked', 'ref'\)"
    ):
        wkv(w, u, k, v, impl="fast")


@pytest.mark.skipif("numba" not in IMPLS, reason="numba does not import here")
def test_numba_refuses_a_state_naming_the_chunked_form():
    w, u, k, v = inputs(L=6)
    message = "impl='numba' starts from an empty state and gives the outputs alone"
    with pytest.raises(RuntimeError, match=message):
        wkv(w, u, k, v, impl="numba", return_state=True)
    with pytest.raises(RuntimeError, match=message):
        wkv(w, u, k, v, state=empty_state(2, 5, dtype=F64), impl="numba")


@pytest.mark.skipif("numba" not in IMPLS, reason="numba does not import here")
def test_the_numba_backward_gives_the_same_bits_at_any_thread_count():
    w, u, k, v = inputs(B=5, L=40, D=7, dtype=torch.float32)
    upstream = torch.randn(5, 40, 7)
    runs = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            runs.append(grads(lambda *t: wkv(*t, impl="numba"), (w, u, k, v), upstream))
    finally:
        torch.set_num_threads(threads)
    for y, g in runs[1:]:
        assert torch.equal(y, runs[0][0]) and all(torch.equal(a, b) for a, b in zip(g, runs[0][1]))
    assert W.DETERMINISTIC_BACKWARD == {"numba": True, "chunked": True, "ref": True}
