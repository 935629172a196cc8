"""The delta rule and the gated delta rule (``longrange.ops.matrix_state.delta_rule``): the chunked
and step-by-step forms against the loop over time, values and gradients in float64; masks against
unpadded sequences; float32 accuracy; argument checks; FLA's pure-PyTorch references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import longrange.ops.matrix_state.delta_rule as dr
from longrange.ops.matrix_state.delta_rule import (
    default_chunk_size,
    delta_rule_chunk,
    delta_rule_naive,
    delta_rule_step,
    gated_delta_rule_chunk,
    gated_delta_rule_naive,
    gated_delta_rule_step,
)

F64 = torch.float64
TIGHT = dict(rtol=1e-9, atol=1e-10)


def inputs(b=2, l=37, h=3, dk=5, dv=4, dtype=F64, seed=0, gated=True, state=True, decay=1.0):
    """q, k (L2-normalised), v, beta in (0, 1), g <= 0 and an initial state, all requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    x = {
        "q": torch.randn(b, l, h, dk, generator=gen, dtype=dtype),
        "k": F.normalize(torch.randn(b, l, h, dk, generator=gen, dtype=dtype), dim=-1),
        "v": torch.randn(b, l, h, dv, generator=gen, dtype=dtype),
        "beta": torch.rand(b, l, h, generator=gen, dtype=dtype),
    }
    if gated:
        x["g"] = -decay * torch.rand(b, l, h, generator=gen, dtype=dtype)
    if state:
        x["initial_state"] = torch.randn(b, h, dk, dv, generator=gen, dtype=dtype)
    return {name: t.requires_grad_(True) for name, t in x.items()}


def run(kind, gated, x, **kw):
    """(o, final state) of one implementation; ``kind`` naive, chunk or step (a loop of steps)."""
    if kind == "step":
        q, k, v, beta = x["q"], x["k"], x["v"], x["beta"]
        state = x.get("initial_state")
        outs = []
        for t in range(q.shape[1]):
            if gated:
                o, state = gated_delta_rule_step(q[:, t], k[:, t], v[:, t], x["g"][:, t], beta[:, t], state)
            else:
                o, state = delta_rule_step(q[:, t], k[:, t], v[:, t], beta[:, t], state)
            outs.append(o)
        return torch.stack(outs, 1), state
    fn = {
        ("naive", False): delta_rule_naive,
        ("naive", True): gated_delta_rule_naive,
        ("chunk", False): delta_rule_chunk,
        ("chunk", True): gated_delta_rule_chunk,
    }[kind, gated]
    args = {name: t for name, t in x.items() if gated or name != "g"}
    return fn(**args, output_final_state=True, **kw)


def grads(outputs, x, seed=1):
    """Gradients w.r.t. every input of (o, final state) against a random cotangent."""
    gen = torch.Generator().manual_seed(seed)
    cot = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in outputs]
    return torch.autograd.grad(outputs, list(x.values()), cot, allow_unused=True, retain_graph=True)


def assert_same(a, b, x, **tol):
    """Values and gradients of two (o, final state) pairs computed from the inputs ``x``."""
    tol = tol or TIGHT
    torch.testing.assert_close(a[0], b[0], **tol)
    torch.testing.assert_close(a[1], b[1], **tol)
    for name, ga, gb in zip(x, grads(a, x), grads(b, x)):
        assert ga is not None and gb is not None, name
        torch.testing.assert_close(ga, gb, **tol, msg=lambda m, name=name: f"gradient w.r.t. {name}: {m}")


# ----------------------------------------------------------------------------------------------
# chunked and step-by-step against the loop


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("l, chunk_size", [(37, 16), (37, 1), (37, 64), (32, 8), (1, 16), (5, 3)])
def test_chunk_matches_naive(gated, l, chunk_size):
    x = inputs(l=l, gated=gated)
    assert_same(run("chunk", gated, x, chunk_size=chunk_size), run("naive", gated, x), x)


@pytest.mark.parametrize("gated", [False, True])
def test_the_default_chunk_matches_naive(gated):
    x = inputs(l=70, gated=gated)  # 16-position chunks on a CPU at this key width: 5 chunks, the last short
    assert default_chunk_size(x["k"]) == 16
    assert_same(run("chunk", gated, x), run("naive", gated, x), x)


def test_default_chunk_sizes_by_device_and_key_width():
    assert [default_chunk_size(torch.empty(1, 1, 1, dk)) for dk in (8, 32, 33, 64, 128)] == [16, 16, 32, 32, 32]
    assert default_chunk_size(torch.empty(1, 1, 1, 8, device="meta")) == 64  # not a CPU: flash-linear-attention's


@pytest.mark.parametrize("gated", [False, True])
def test_chunk_matches_naive_without_initial_state_and_unequal_dims(gated):
    x = inputs(b=1, l=20, h=2, dk=3, dv=7, gated=gated, state=False)
    assert_same(run("chunk", gated, x, chunk_size=6), run("naive", gated, x), x)


@pytest.mark.parametrize("gated", [False, True])
def test_chunk_matches_naive_with_a_custom_scale_and_large_beta(gated):
    # beta up to 2 (negative eigenvalues), keys shorter than 1, a scale other than dk^-1/2
    x = inputs(l=23, gated=gated)
    with torch.no_grad():
        x["beta"].mul_(2)
        x["k"].mul_(0.8)
    assert_same(run("chunk", gated, x, chunk_size=8, scale=0.7), run("naive", gated, x, scale=0.7), x)


@pytest.mark.parametrize("gated", [False, True])
def test_steps_match_naive(gated):
    x = inputs(l=9, gated=gated)
    assert_same(run("step", gated, x), run("naive", gated, x), x)


@pytest.mark.parametrize("gated", [False, True])
def test_step_state_none_means_zeros_and_dtypes(gated):
    x = inputs(b=2, l=1, h=2, dtype=torch.float32, gated=gated, state=False)
    args = [x["q"][:, 0], x["k"][:, 0], x["v"][:, 0]] + ([x["g"][:, 0]] if gated else []) + [x["beta"][:, 0]]
    step = gated_delta_rule_step if gated else delta_rule_step
    o, s = step(*args, None)
    o0, s0 = step(*args, torch.zeros(2, 2, 5, 4))
    torch.testing.assert_close(o, o0)
    torch.testing.assert_close(s, s0)
    assert o.dtype == torch.float32 and s.dtype == torch.float32
    o64, s64 = step(*args, torch.zeros(2, 2, 5, 4, dtype=F64))  # a float64 state: computed in float64
    assert o64.dtype == torch.float32 and s64.dtype == F64


@pytest.mark.parametrize("gated", [False, True])
def test_pieces_give_the_same_result(monkeypatch, gated):
    # Small pieces: segments of the length (the state carried from one to the next), groups of heads,
    # groups of batch elements. group_size is asked for chunks per head first (one chunk of 4
    # positions here takes at most 288 bytes), then for heads.
    x = inputs(b=3, l=37, h=3, gated=gated)
    whole = run("chunk", gated, x, chunk_size=4)
    for per_chunk, per_head in ((1, 1), (3, 1), (100, 2), (100, 6), (100, 100)):
        monkeypatch.setattr(dr, "group_size", lambda nbytes, a=per_chunk, b=per_head: a if nbytes <= 288 else b)
        assert_same(run("chunk", gated, x, chunk_size=4), whole, x)
        mask = torch.arange(37)[None] < torch.tensor([37, 20, 3])[:, None]
        torch.testing.assert_close(
            run("chunk", gated, x, chunk_size=4, mask=mask)[0], run("naive", gated, x, mask=mask)[0], **TIGHT
        )


def test_unit_lower_inverse_and_its_derivatives():
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(2, 5, 5, generator=gen, dtype=F64).requires_grad_(True)
    inv = dr._UnitLowerInverse.apply
    ref = torch.linalg.inv(torch.eye(5, dtype=F64) + a.detach().tril(-1))
    torch.testing.assert_close(inv(a), ref, **TIGHT)
    assert torch.autograd.gradcheck(inv, (a,))
    assert torch.autograd.gradgradcheck(inv, (a,))


@pytest.mark.parametrize("gated", [False, True])
def test_chunk_second_derivatives(gated):
    x = inputs(b=1, l=4, h=1, dk=2, dv=2, gated=gated)
    names = list(x)

    def f(*ts):
        return run("chunk", gated, dict(zip(names, ts)), chunk_size=2)

    assert torch.autograd.gradgradcheck(f, tuple(x.values()))


def test_meta_tensors_give_shapes():
    q, v = torch.empty(2, 100, 3, 8, device="meta"), torch.empty(2, 100, 3, 4, device="meta")
    beta = torch.empty(2, 100, 3, device="meta")
    o, s = gated_delta_rule_chunk(q, q, v, beta, beta, output_final_state=True, chunk_size=16)
    assert o.shape == (2, 100, 3, 4) and o.device.type == "meta" and s.shape == (2, 3, 8, 4)
    o, s = delta_rule_chunk(q, q, v, beta, output_final_state=True)
    assert o.shape == (2, 100, 3, 4) and s.shape == (2, 3, 8, 4)


# ----------------------------------------------------------------------------------------------
# the gated rule with g = 0 is the delta rule


@pytest.mark.parametrize("kind", ["naive", "chunk", "step"])
def test_gated_with_zero_decay_is_ungated(kind):
    x = inputs(l=13)
    with torch.no_grad():
        x["g"].zero_()
    kw = {"chunk_size": 4} if kind == "chunk" else {}
    a, b = run(kind, True, x, **kw), run(kind, False, x, **kw)
    torch.testing.assert_close(a[0], b[0], **TIGHT)
    torch.testing.assert_close(a[1], b[1], **TIGHT)


# ----------------------------------------------------------------------------------------------
# masks


def masks(b, l):
    gen = torch.Generator().manual_seed(5)
    scattered = torch.rand(b, l, generator=gen) > 0.4
    scattered[0, 0] = False
    right = torch.arange(l)[None] < torch.tensor([l, max(l - 9, 1), 0, 4])[:b, None]
    return {"right-padded": right, "scattered": scattered}


@pytest.mark.parametrize("mask_kind", ["right-padded", "scattered"])
@pytest.mark.parametrize("kind", ["naive", "chunk"])
@pytest.mark.parametrize("gated", [False, True])
def test_mask_equals_the_unpadded_sequences(gated, kind, mask_kind):
    b, l = 4, 29
    x = inputs(b=b, l=l, gated=gated)
    mask = masks(b, l)[mask_kind]
    kw = {"chunk_size": 8} if kind == "chunk" else {}
    o, s = run(kind, gated, x, mask=mask, **kw)
    assert (o[~mask] == 0).all()
    for i in range(b):
        keep = mask[i]
        xi = {name: (t[i : i + 1] if name == "initial_state" else t[i : i + 1, keep]) for name, t in x.items()}
        oi, si = run(kind, gated, xi, **kw)
        torch.testing.assert_close(o[i, keep], oi[0], **TIGHT)
        torch.testing.assert_close(s[i], si[0], **TIGHT)


@pytest.mark.parametrize("gated", [False, True])
def test_chunk_matches_naive_with_a_mask(gated):
    x = inputs(b=4, l=29, gated=gated)
    mask = masks(4, 29)["scattered"]
    assert_same(run("chunk", gated, x, chunk_size=8, mask=mask), run("naive", gated, x, mask=mask), x)


# ----------------------------------------------------------------------------------------------
# float32, strong decays, dtypes


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("chunk_size", [16, 64])
def test_float32_chunk_close_to_float64_naive(gated, chunk_size):
    x64 = inputs(b=2, l=200, h=2, dk=16, dv=16, gated=gated)
    x32 = {name: t.detach().float() for name, t in x64.items()}
    o32, s32 = run("chunk", gated, x32, chunk_size=chunk_size)
    o64, s64 = run("naive", gated, x64)
    assert o32.dtype == torch.float32 and s32.dtype == torch.float32
    torch.testing.assert_close(o32.double(), o64.detach(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s32.double(), s64.detach(), rtol=1e-4, atol=1e-4)


def test_strong_decays_stay_finite_in_float32():
    # cumulative log-decays down to -3000 within a chunk: nothing may overflow
    x = {name: t.detach().float() for name, t in inputs(l=70, decay=100.0).items()}
    o, s = run("chunk", True, x, chunk_size=32)
    o64, s64 = run("naive", True, {name: t.double() for name, t in x.items()})
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    torch.testing.assert_close(o.double(), o64, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s.double(), s64, rtol=1e-4, atol=1e-4)
    x = {name: t.requires_grad_(True) for name, t in x.items()}
    assert all(torch.isfinite(gr).all() for gr in grads(run("chunk", True, x, chunk_size=32), x))


@pytest.mark.parametrize("kind", ["naive", "chunk"])
def test_output_in_v_dtype_state_in_compute_dtype(kind):
    x = {name: t.detach().float() for name, t in inputs(l=6).items()}
    x["initial_state"] = x["initial_state"].double()
    o, s = run(kind, True, x)
    assert o.dtype == torch.float32 and s.dtype == F64
    x["v"] = x["v"].to(torch.bfloat16)
    x["initial_state"] = x["initial_state"].float()
    o, s = run(kind, True, x)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32


@pytest.mark.parametrize("gated", [False, True])
def test_without_final_state_and_empty_sequences(gated):
    x = inputs(l=7, gated=gated)
    args = [x["q"], x["k"], x["v"]] + ([x["g"]] if gated else []) + [x["beta"]]
    naive, chunk = (gated_delta_rule_naive, gated_delta_rule_chunk) if gated else (delta_rule_naive, delta_rule_chunk)
    o = chunk(*args, chunk_size=4)
    assert isinstance(o, torch.Tensor)
    torch.testing.assert_close(o, naive(*args), **TIGHT)
    empty = [t[:, :0] for t in args]
    for fn in (naive, chunk):
        o, s = fn(*empty, initial_state=x["initial_state"], output_final_state=True)
        assert o.shape == (2, 0, 3, 4)
        torch.testing.assert_close(s, x["initial_state"].detach(), **TIGHT)


# ----------------------------------------------------------------------------------------------
# argument checks


def _bad_cases():
    q, k = torch.randn(2, 5, 3, 4), torch.randn(2, 5, 3, 4)
    v, beta, g = torch.randn(2, 5, 3, 6), torch.rand(2, 5, 3), -torch.rand(2, 5, 3)
    ok = dict(q=q, k=k, v=v, beta=beta, g=g)
    return [
        ("q", dict(ok, q=torch.randn(2, 5, 3, 5))),
        ("k", dict(ok, k=torch.randn(2, 5, 4))),
        ("v", dict(ok, v=torch.randn(2, 6, 3, 6))),
        ("beta", dict(ok, beta=torch.rand(2, 5, 3, 1))),
        ("beta", dict(ok, beta=None)),
        ("g", dict(ok, g=torch.rand(2, 5))),
        ("g", dict(ok, g=None)),
        ("mask", dict(ok, mask=torch.ones(2, 5))),
        ("mask", dict(ok, mask=torch.ones(2, 4, dtype=torch.bool))),
        ("initial_state", dict(ok, initial_state=torch.zeros(2, 3, 6, 4))),
    ]


@pytest.mark.parametrize("name, kwargs", _bad_cases())
@pytest.mark.parametrize("fn", [delta_rule_naive, delta_rule_chunk, gated_delta_rule_naive, gated_delta_rule_chunk])
def test_bad_inputs_raise_value_errors_naming_the_argument(fn, name, kwargs):
    gated = fn in (gated_delta_rule_naive, gated_delta_rule_chunk)
    if name == "g" and not gated:
        pytest.skip("the delta rule has no g")
    if not gated:
        kwargs = {key: val for key, val in kwargs.items() if key != "g"}
    with pytest.raises(ValueError, match=rf"{fn.__name__}: {name}\b"):
        fn(**kwargs)


@pytest.mark.parametrize("chunk_size", [0, -3, 2.5, True])
def test_bad_chunk_size(chunk_size):
    q = torch.randn(1, 4, 1, 2)
    for fn, extra in ((delta_rule_chunk, ()), (gated_delta_rule_chunk, (torch.zeros(1, 4, 1),))):
        with pytest.raises(ValueError, match="chunk_size"):
            fn(q, q, q, *extra, torch.rand(1, 4, 1), chunk_size=chunk_size)


def test_bad_step_inputs():
    q, v, beta, g = torch.randn(2, 3, 4), torch.randn(2, 3, 5), torch.rand(2, 3), torch.zeros(2, 3)
    s = torch.zeros(2, 3, 4, 5)
    with pytest.raises(ValueError, match=r"delta_rule_step: k\b"):
        delta_rule_step(q, torch.randn(2, 4), v, beta, s)
    with pytest.raises(ValueError, match=r"delta_rule_step: q\b"):
        delta_rule_step(torch.randn(2, 3, 5), q, v, beta, s)
    with pytest.raises(ValueError, match=r"delta_rule_step: v\b"):
        delta_rule_step(q, q, torch.randn(2, 4, 5), beta, s)
    with pytest.raises(ValueError, match=r"delta_rule_step: beta\b"):
        delta_rule_step(q, q, v, torch.rand(2, 3, 1), s)
    with pytest.raises(ValueError, match=r"delta_rule_step: state\b"):
        delta_rule_step(q, q, v, beta, torch.zeros(2, 3, 5, 4))
    with pytest.raises(ValueError, match=r"gated_delta_rule_step: g\b"):
        gated_delta_rule_step(q, q, v, torch.zeros(3), beta, s)
    o, new = gated_delta_rule_step(q, q, v, g, beta, s)
    assert o.shape == (2, 3, 5) and new.shape == (2, 3, 4, 5)


# ----------------------------------------------------------------------------------------------
# flash-linear-attention's pure-PyTorch references (float32 there)


FLA_WARNINGS = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


@FLA_WARNINGS
@pytest.mark.parametrize("with_state", [False, True])
def test_delta_rule_matches_fla_reference(with_state):
    pytest.importorskip("fla")
    from fla.ops.delta_rule.naive import delta_rule_recurrence

    x = {name: t.detach() for name, t in inputs(l=21, dk=8, dv=6, gated=False, state=with_state).items()}
    # FLA: (batch, heads, length, features), scale fixed at dk^-1/2, computes in float32
    bhl = [x[name].transpose(1, 2).float() for name in ("q", "k", "v")]
    ref_o, ref_s = delta_rule_recurrence(
        *bhl,
        x["beta"].transpose(1, 2).float(),
        initial_state=x["initial_state"].float() if with_state else None,
        output_final_state=True,
    )
    for kind in ("naive", "chunk"):
        o, s = run(kind, False, x, **({"chunk_size": 8} if kind == "chunk" else {}))
        torch.testing.assert_close(o.float(), ref_o.transpose(1, 2), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(s.float(), ref_s, rtol=1e-5, atol=1e-5)


@FLA_WARNINGS
@pytest.mark.parametrize("with_state", [False, True])
def test_gated_delta_rule_matches_fla_reference(with_state):
    pytest.importorskip("fla")
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

    x = {name: t.detach() for name, t in inputs(l=21, dk=8, dv=6, state=with_state).items()}
    # FLA: our layout, argument order (q, k, v, beta, g), computes in float32
    ref_o, ref_s = naive_recurrent_gated_delta_rule(
        *(x[name].float() for name in ("q", "k", "v", "beta", "g")),
        scale=0.3,
        initial_state=x["initial_state"].float() if with_state else None,
        output_final_state=True,
    )
    for kind in ("naive", "chunk"):
        o, s = run(kind, True, x, scale=0.3, **({"chunk_size": 8} if kind == "chunk" else {}))
        torch.testing.assert_close(o.float(), ref_o, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(s.float(), ref_s, rtol=1e-5, atol=1e-5)
