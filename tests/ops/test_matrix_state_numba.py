"""The numba kernels of the delta rules, GLA and SSD (``longrange.ops.matrix_state.numba``): against the loop over
time, values and gradients in float64 (odd lengths, spans between checkpoints, initial and final
states), in float32; through the entry points with masks; their operators; the dispatch's choice
and errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from longrange.ops import custom_ops, used
from longrange.ops.matrix_state import dispatch as ms
from longrange.ops.matrix_state import numba as ms_numba
from longrange.ops.matrix_state.delta_rule import delta_rule_naive, gated_delta_rule_naive
from longrange.ops.matrix_state.gla import gla_naive
from longrange.ops.matrix_state.ssd import ssd_naive

numba_only = pytest.mark.skipif(not ms_numba.numba_available(), reason="numba does not import")
F64 = torch.float64
TIGHT = dict(rtol=1e-9, atol=1e-10)


def inputs(b=2, l=37, h=3, dk=5, dv=4, dtype=F64, seed=0, gated=True, state=True, decay=1.0):
    """q, k (L2-normalised), v, beta in (0, 1), g <= 0 and an initial state, all requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    x = {
        "q": torch.randn(b, l, h, dk, generator=gen, dtype=F64),
        "k": F.normalize(torch.randn(b, l, h, dk, generator=gen, dtype=F64), dim=-1),
        "v": torch.randn(b, l, h, dv, generator=gen, dtype=F64),
        "beta": torch.rand(b, l, h, generator=gen, dtype=F64),
    }
    if gated:
        x["g"] = -decay * torch.rand(b, l, h, generator=gen, dtype=F64)
    if state:
        x["initial_state"] = torch.randn(b, h, dk, dv, generator=gen, dtype=F64)
    return {name: t.to(dtype).requires_grad_(True) for name, t in x.items()}


def run(fn, x, **kw):
    return fn(**x, output_final_state=True, **kw)


def naive(gated):
    return gated_delta_rule_naive if gated else delta_rule_naive


def kernel(gated):
    return ms_numba.gated_delta_rule_numba if gated else ms_numba.delta_rule_numba


def grads(outputs, x, seed=1):
    gen = torch.Generator().manual_seed(seed)
    cot = [torch.randn(t.shape, generator=gen, dtype=F64).to(t.dtype) for t in outputs]
    return torch.autograd.grad(outputs, list(x.values()), cot, retain_graph=True)


def assert_same(a, b, x, **tol):
    tol = tol or TIGHT
    torch.testing.assert_close(a[0], b[0], **tol)
    torch.testing.assert_close(a[1], b[1], **tol)
    for name, ga, gb in zip(x, grads(a, x), grads(b, x)):
        torch.testing.assert_close(ga, gb, **tol, msg=lambda m, name=name: f"gradient w.r.t. {name}: {m}")


@numba_only
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("l, span", [(37, None), (37, 1), (37, 4), (32, 8), (1, 16), (5, 3), (70, 64)])
def test_numba_matches_naive(gated, l, span):
    """Spans of checkpoints that divide the length, that do not, and longer than it."""
    x = inputs(l=l, gated=gated)
    assert_same(run(kernel(gated), x, chunk_size=span), run(naive(gated), x), x)


@numba_only
@pytest.mark.parametrize("gated", [False, True])
def test_numba_matches_naive_without_initial_state_with_a_scale_and_large_beta(gated):
    x = inputs(l=23, dk=3, dv=7, gated=gated, state=False)
    with torch.no_grad():
        x["beta"].mul_(2)  # in (0, 2): negative eigenvalues
    assert_same(run(kernel(gated), x, scale=0.7, chunk_size=5), run(naive(gated), x, scale=0.7), x)


@numba_only
@pytest.mark.parametrize("gated", [False, True])
def test_float32_close_to_float64_naive_and_strong_decays_finite(gated):
    x64 = inputs(b=2, l=200, h=2, dk=16, dv=16, gated=gated, decay=30.0)
    x32 = {name: t.detach().float().requires_grad_() for name, t in x64.items()}
    o32, s32 = run(kernel(gated), x32)
    o64, s64 = run(naive(gated), x64)
    assert o32.dtype == s32.dtype == torch.float32
    torch.testing.assert_close(o32.double(), o64.detach(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s32.double(), s64.detach(), rtol=1e-4, atol=1e-4)
    for g32, g64 in zip(grads((o32, s32), x32), grads((o64, s64), x64)):
        torch.testing.assert_close(g32.double(), g64, rtol=1e-3, atol=1e-3)


@numba_only
def test_dtypes_empty_sequences_and_no_final_state():
    x = {name: t.detach() for name, t in inputs(l=6, dtype=torch.float32).items()}
    x["initial_state"] = x["initial_state"].double()  # float64 anywhere: computed in float64
    o, s = run(ms_numba.gated_delta_rule_numba, x)
    assert o.dtype == torch.float32 and s.dtype == F64
    x["initial_state"] = x["initial_state"].float()
    x["v"] = x["v"].to(torch.bfloat16)  # computed in float32, the output in v's dtype
    o, s = run(ms_numba.gated_delta_rule_numba, x)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    x = inputs(l=7)
    args = [x["q"], x["k"], x["v"], x["g"], x["beta"]]
    o = ms_numba.gated_delta_rule_numba(*args)
    assert isinstance(o, torch.Tensor)
    torch.testing.assert_close(o, gated_delta_rule_naive(*args), **TIGHT)
    empty = [t[:, :0] for t in args]
    o, s = ms_numba.gated_delta_rule_numba(*empty, initial_state=x["initial_state"], output_final_state=True)
    assert o.shape == (2, 0, 3, 4)
    torch.testing.assert_close(s, x["initial_state"].detach(), **TIGHT)


@numba_only
@pytest.mark.parametrize("gated", [False, True])
def test_the_entry_point_with_a_mask_matches_naive(gated):
    gen = torch.Generator().manual_seed(5)
    x = inputs(b=4, l=29, gated=gated)
    mask = torch.rand(4, 29, generator=gen) > 0.4
    mask[0, 0] = False
    entry = ms.gated_delta_rule if gated else ms.delta_rule
    assert_same(run(entry, x, mask=mask, impl="numba", chunk_size=8), run(naive(gated), x, mask=mask), x)
    o, _ = run(entry, x, mask=mask, impl="numba")
    assert (o[~mask] == 0).all()


@numba_only
def test_auto_runs_numba_for_small_states_on_cpus_and_reports_it():
    d = ms.DISPATCHERS["gated_delta_rule"]
    assert ms.IMPLS["gated_delta_rule"] == ("auto", "fla", "numba", "chunk", "naive")
    assert ms.IMPLS["delta_rule"] == ("auto", "fla", "numba", "chunk", "naive")
    limit = ms_numba.AUTO_STATE_ELEMENTS
    assert d.auto_impl("cpu", state_elements=limit) == "numba"
    assert d.auto_impl("cpu", state_elements=limit + 1) == "chunk"
    # keys of up to 32 features: states of up to 2,048 elements (the recall preset's 32 x 64 heads)
    assert d.auto_impl("cpu", state_elements=32 * 64, key_width=32) == "numba"
    assert d.auto_impl("cpu", state_elements=64 * 32, key_width=64) == "chunk"
    assert d.auto_impl("cpu", state_elements=32 * 128, key_width=32) == "chunk"
    assert d.auto_impl("cpu", state_elements=64 * 16, key_width=64) == "numba"  # small states, any keys
    assert d.auto_impl("cpu", deterministic=True, state_elements=8) == "numba"  # one loop per task
    assert d.auto_impl("meta", state_elements=8) == "chunk"
    for op in ms.NUMBA:  # longrange info's words, per op
        words = ms.DISPATCHERS[op].describe_auto(torch.device("cpu"))
        assert words.startswith("numba for states of up to 1024") and "2048 for keys of up to 32 features" in words
        assert ms.DISPATCHERS[op].describe_auto(torch.device("meta")) == "chunk"
    x = {name: t.detach() for name, t in inputs(l=5, dk=4, dv=4).items()}
    used.reset()
    ms.gated_delta_rule(**x)
    wide = {"q": x["q"].repeat(1, 1, 1, 16), "k": x["k"].repeat(1, 1, 1, 16), "v": x["v"].repeat(1, 1, 1, 20)}
    ms.gated_delta_rule(**{**x, **wide, "initial_state": None})  # 64 x 80 per head
    assert used.calls()["gated_delta_rule"] == {"numba": 1, "chunk": 1}


def test_errors_name_the_function_the_argument_and_the_device():
    x = {name: t.detach() for name, t in inputs(l=5).items()}
    with pytest.raises(ValueError, match=r"gated_delta_rule_numba: beta\b"):
        ms_numba.gated_delta_rule_numba(**{**x, "beta": x["beta"][:, :4]})
    with pytest.raises(ValueError, match=r"delta_rule_numba: initial_state\b"):
        ms_numba.delta_rule_numba(x["q"], x["k"], x["v"], x["beta"], initial_state=x["initial_state"][:1])
    with pytest.raises(ValueError, match="chunk_size"):
        ms_numba.delta_rule_numba(x["q"], x["k"], x["v"], x["beta"], chunk_size=0)
    meta = {name: t.to("meta") for name, t in x.items()}
    with pytest.raises(RuntimeError, match="impl='numba' cannot run on meta"):
        ms.gated_delta_rule(**meta, impl="numba")


@numba_only
def test_the_operators_pass_opcheck_and_have_fakes_and_flops():
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    ops = custom_ops.operators()
    for op in (ops["delta_rule_numba"], ops["delta_rule_numba_backward"]):
        assert op in flop_registry
    x = {name: t.detach().float() for name, t in inputs(b=1, l=6, h=2, dk=3, dv=2).items()}
    q, k, v, beta, g, S0 = x["q"], x["k"], x["v"], x["beta"], x["g"], x["initial_state"]
    for gated, normalize in ((True, False), (False, True)):
        args = [q, k, v, beta, g, gated, normalize, 0.5, S0, 4]
        grad_args = [a.clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
        result = torch.library.opcheck(ms_numba._forward_op, grad_args)
        assert set(result.values()) == {"SUCCESS"}, result
        o, S, ckpt = ms_numba._forward_op(*args)
        assert ckpt.shape == (1, 2, 2, 3, 2)  # the states entering positions 0 and 4
        back = [q, k, v, beta, g, gated, normalize, 0.5, ckpt, 4, torch.ones_like(o), torch.ones_like(S)]
        result = torch.library.opcheck(ms_numba._backward_op, back)
        assert set(result.values()) == {"SUCCESS"}, result
        meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
        assert [t.shape for t in ms_numba._forward_op(*meta)] == [o.shape, S.shape, ckpt.shape]
    with FlopCounterMode(display=False) as counter:
        o = ms.gated_delta_rule(**{n: t.requires_grad_() for n, t in x.items()}, impl="numba")
        o.sum().backward()
    counts = {str(key).split(".")[-1]: val for key, val in counter.get_flop_counts()["Global"].items()}
    elements = 1 * 6 * 2 * 3 * 2
    assert counts["delta_rule_numba"] == 7 * elements and counts["delta_rule_numba_backward"] == 20 * elements


@numba_only
@pytest.mark.usefixtures("inductor_cpu")
def test_compiled_equals_eager():
    x = {name: t.detach().float().requires_grad_() for name, t in inputs(l=9).items()}
    fn = lambda **kw: ms.gated_delta_rule(**kw, impl="numba", output_final_state=True)  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True)
    a, b = compiled(**x), fn(**x)
    torch.testing.assert_close(a, b)
    for ga, gb in zip(grads(a, x), grads(b, x)):
        torch.testing.assert_close(ga, gb)


@numba_only
def test_the_layers_run_the_kernels_on_cpus():
    """GLA, Gated DeltaNet, DeltaNet and Mamba-2 at the small models' widths choose the kernels by themselves."""
    from longrange.models.backbone import make_primitive

    cases = (("deltanet", "delta_rule"), ("gated-deltanet", "gated_delta_rule"), ("gla", "gla"), ("mamba2", "ssd"))
    for name, op in cases:
        options = {"d_state": 8, "headdim": 16} if name == "mamba2" else {"n_heads": 4}
        layer = make_primitive(name, 32, **options)
        used.reset()
        layer(torch.randn(2, 10, 32)).sum().backward()
        assert used.kernels()[op] == "numba", used.calls()


@pytest.mark.parametrize("impl", [pytest.param("numba", marks=numba_only), "chunk", "naive"])
@pytest.mark.parametrize("gated", [False, True])
def test_normalize_qk_is_the_l2_norm_of_q_and_k_first(gated, impl):
    """Inside the numba kernels, in the entry point for the others: the same values and gradients as
    normalising first, a row of zeros (the norm's floor) included."""
    x = inputs(l=13, dk=6, gated=gated)
    with torch.no_grad():
        x["q"].mul_(3)
        x["k"][0, 2, 1] = 0.0  # a zero row: divided by the floor, its gradient the floor's
        x["q"][1, 4, 0] = 1e-8
    entry = ms.gated_delta_rule if gated else ms.delta_rule
    fused = run(entry, x, impl=impl, normalize_qk=True, chunk_size=4)
    first = {**x, "q": F.normalize(x["q"], dim=-1, eps=1e-6), "k": F.normalize(x["k"], dim=-1, eps=1e-6)}
    assert_same(fused, run(naive(gated), first), x)


# ----------------------------------------------------------------------------------------------
# gated linear attention


def gla_inputs(b=2, l=37, h=3, dk=5, dv=4, dtype=F64, seed=0, state=True, decay=1.0):
    """q, k, v, per-key log-decays g <= 0 and an initial state, all requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    x = {
        "q": torch.randn(b, l, h, dk, generator=gen, dtype=F64),
        "k": torch.randn(b, l, h, dk, generator=gen, dtype=F64),
        "v": torch.randn(b, l, h, dv, generator=gen, dtype=F64),
        "g": -decay * torch.rand(b, l, h, dk, generator=gen, dtype=F64),
    }
    if state:
        x["initial_state"] = torch.randn(b, h, dk, dv, generator=gen, dtype=F64)
    return {name: t.to(dtype).requires_grad_(True) for name, t in x.items()}


@numba_only
@pytest.mark.parametrize("l, span", [(37, None), (37, 1), (37, 4), (32, 8), (1, 16), (5, 3)])
def test_gla_numba_matches_naive(l, span):
    x = gla_inputs(l=l)
    assert_same(run(ms_numba.gla_numba, x, chunk_size=span), run(gla_naive, x), x)


@numba_only
def test_gla_numba_without_initial_state_with_a_scale_float32_and_strong_decays():
    x = gla_inputs(l=23, dk=3, dv=7, state=False)
    assert_same(run(ms_numba.gla_numba, x, scale=0.7, chunk_size=5), run(gla_naive, x, scale=0.7), x)
    x64 = gla_inputs(b=2, l=200, h=2, dk=16, dv=16, decay=30.0)
    x32 = {name: t.detach().float().requires_grad_() for name, t in x64.items()}
    o32, s32 = run(ms_numba.gla_numba, x32)
    o64, s64 = run(gla_naive, x64)
    assert o32.dtype == s32.dtype == torch.float32
    torch.testing.assert_close(o32.double(), o64.detach(), rtol=1e-4, atol=1e-4)
    for g32, g64 in zip(grads((o32, s32), x32), grads((o64, s64), x64)):
        torch.testing.assert_close(g32.double(), g64, rtol=1e-3, atol=1e-3)


@numba_only
def test_gla_entry_point_with_a_mask_auto_and_errors():
    gen = torch.Generator().manual_seed(5)
    x = gla_inputs(b=4, l=29)
    mask = torch.rand(4, 29, generator=gen) > 0.4
    assert_same(run(ms.gla, x, mask=mask, impl="numba", chunk_size=8), run(gla_naive, x, mask=mask), x)
    d = ms.DISPATCHERS["gla"]
    assert ms.IMPLS["gla"] == ("auto", "fla", "numba", "chunk", "naive")
    limit = ms_numba.AUTO_STATE_ELEMENTS
    assert (
        d.auto_impl("cpu", state_elements=limit) == "numba" and d.auto_impl("cpu", state_elements=limit + 1) == "chunk"
    )
    used.reset()
    ms.gla(**{name: t.detach() for name, t in x.items()})
    assert used.calls()["gla"] == {"numba": 1}
    with pytest.raises(ValueError, match=r"gla_numba: g\b"):
        ms_numba.gla_numba(x["q"], x["k"], x["v"], x["g"][..., :2])
    with pytest.raises(RuntimeError, match="impl='numba' cannot run on meta"):
        ms.gla(**{name: t.detach().to("meta") for name, t in x.items()}, impl="numba")


@numba_only
def test_gla_operators_pass_opcheck_and_have_fakes_and_flops():
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    ops = custom_ops.operators()
    for op in (ops["gla_numba"], ops["gla_numba_backward"]):
        assert op in flop_registry
    x = {name: t.detach().float() for name, t in gla_inputs(b=1, l=6, h=2, dk=3, dv=2).items()}
    args = [x["q"], x["k"], x["v"], x["g"], 0.5, x["initial_state"], 4]
    result = torch.library.opcheck(
        ms_numba._gla_op, [a.clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
    )
    assert set(result.values()) == {"SUCCESS"}, result
    o, S, ckpt = ms_numba._gla_op(*args)
    back = [*args[:5], ckpt, 4, torch.ones_like(o), torch.ones_like(S)]
    result = torch.library.opcheck(ms_numba._gla_backward_op, back)
    assert set(result.values()) == {"SUCCESS"}, result
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    assert [t.shape for t in ms_numba._gla_op(*meta)] == [o.shape, S.shape, ckpt.shape]
    with FlopCounterMode(display=False) as counter:
        ms.gla(**{n: t.requires_grad_() for n, t in x.items()}, impl="numba").sum().backward()
    counts = {str(key).split(".")[-1]: val for key, val in counter.get_flop_counts()["Global"].items()}
    elements = 1 * 6 * 2 * 3 * 2
    assert counts["gla_numba"] == 5 * elements and counts["gla_numba_backward"] == 14 * elements


@numba_only
@pytest.mark.usefixtures("inductor_cpu")
def test_compiled_gla_equals_eager():
    x = {name: t.detach().float().requires_grad_() for name, t in gla_inputs(l=9).items()}
    fn = lambda **kw: ms.gla(**kw, impl="numba", output_final_state=True)  # noqa: E731
    a, b = torch.compile(fn, fullgraph=True)(**x), fn(**x)
    torch.testing.assert_close(a, b)
    for ga, gb in zip(grads(a, x), grads(b, x)):
        torch.testing.assert_close(ga, gb)


@numba_only
def test_the_kernels_give_the_same_bits_at_one_and_two_threads():
    """Each (sequence, head) is one task and nothing is summed across tasks: deterministic whatever
    the threads."""
    threads = torch.get_num_threads()
    x = {name: t.detach().float().requires_grad_() for name, t in inputs(b=3, l=40, h=4).items()}
    y = {name: t.detach().float().requires_grad_() for name, t in gla_inputs(b=3, l=40, h=4).items()}
    results = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            a = run(ms_numba.gated_delta_rule_numba, x, normalize_qk=True)
            b = run(ms_numba.gla_numba, y)
            results.append([*a, *b, *grads(a, x), *grads(b, y)])
    finally:
        torch.set_num_threads(threads)
    for one, two in zip(*results):
        assert torch.equal(one, two)


# ----------------------------------------------------------------------------------------------
# Mamba-2's SSD by GLA's kernels with one decay per head


def ssd_inputs(b=2, l=29, h=4, groups=2, n=3, p=5, skip="h", dtype=F64, seed=0, state=True):
    gen = torch.Generator().manual_seed(seed)
    x = {
        "x": torch.randn(b, l, h, p, generator=gen, dtype=F64),
        "dt": 0.05 + 0.2 * torch.rand(b, l, h, generator=gen, dtype=F64),
        "A": -0.5 - torch.rand(h, generator=gen, dtype=F64),
        "B": torch.randn(b, l, groups, n, generator=gen, dtype=F64),
        "C": torch.randn(b, l, groups, n, generator=gen, dtype=F64),
    }
    if skip is not None:
        x["D"] = torch.randn(*((h,) if skip == "h" else (h, p)), generator=gen, dtype=F64)
    if state:
        x["initial_state"] = torch.randn(b, h, n, p, generator=gen, dtype=F64)
    return {name: t.to(dtype).requires_grad_(True) for name, t in x.items()}


@numba_only
@pytest.mark.parametrize("groups, skip, state", [(1, "h", True), (2, "hp", False), (4, None, True)])
@pytest.mark.parametrize("l, span", [(29, None), (29, 4), (8, 8), (1, 3)])
def test_ssd_numba_matches_naive(groups, skip, state, l, span):
    x = ssd_inputs(l=l, groups=groups, skip=skip, state=state)
    assert_same(run(ms_numba.ssd_numba, x, chunk_size=span), run(ssd_naive, x), x)


@numba_only
def test_ssd_float32_the_entry_point_with_a_mask_auto_and_an_empty_sequence():
    x64 = ssd_inputs(l=150, h=2, groups=1, n=16, p=16)
    x32 = {name: t.detach().float().requires_grad_() for name, t in x64.items()}
    y32, s32 = run(ms_numba.ssd_numba, x32)
    y64, s64 = run(ssd_naive, x64)
    assert y32.dtype == s32.dtype == torch.float32
    torch.testing.assert_close(y32.double(), y64.detach(), rtol=1e-4, atol=1e-4)
    for g32, g64 in zip(grads((y32, s32), x32), grads((y64, s64), x64)):
        torch.testing.assert_close(g32.double(), g64, rtol=1e-3, atol=1e-3)
    gen = torch.Generator().manual_seed(5)
    x = ssd_inputs()
    mask = torch.rand(2, 29, generator=gen) > 0.4
    assert_same(run(ms.ssd, x, mask=mask, impl="numba", chunk_size=8), run(ssd_naive, x, mask=mask), x)
    d = ms.DISPATCHERS["ssd"]
    assert ms.IMPLS["ssd"] == ("auto", "mamba", "numba", "chunk", "naive")
    limit = ms_numba.AUTO_STATE_ELEMENTS
    assert (
        d.auto_impl("cpu", state_elements=limit) == "numba" and d.auto_impl("cpu", state_elements=limit + 1) == "chunk"
    )
    used.reset()
    ms.ssd(**{name: t.detach() for name, t in x.items()})
    assert used.calls()["ssd"] == {"numba": 1}
    empty = {name: (t if name in ("A", "D", "initial_state") else t[:, :0]) for name, t in x.items()}
    y, s = run(ms_numba.ssd_numba, empty)
    assert y.shape == (2, 0, 4, 5)
    torch.testing.assert_close(s, x["initial_state"].detach(), **TIGHT)
    with pytest.raises(ValueError, match=r"ssd_numba: A\b"):
        ms_numba.ssd_numba(x["x"], x["dt"], x["A"][:2], x["B"], x["C"])


@numba_only
def test_gla_operator_with_one_decay_per_head_passes_opcheck():
    x = {name: t.detach().float() for name, t in gla_inputs(b=1, l=6, h=2, dk=3, dv=2).items()}
    g = x["g"][..., :1].contiguous()
    args = [x["q"], x["k"], x["v"], g, 1.0, x["initial_state"], 4]
    result = torch.library.opcheck(
        ms_numba._gla_op, [a.clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
    )
    assert set(result.values()) == {"SUCCESS"}, result
    o, S, ckpt = ms_numba._gla_op(*args)
    result = torch.library.opcheck(
        ms_numba._gla_backward_op, [*args[:5], ckpt, 4, torch.ones_like(o), torch.ones_like(S)]
    )
    assert set(result.values()) == {"SUCCESS"}, result
    # the same as GLA with that decay in every row
    wide = ms_numba._gla_op(*args[:3], g.expand(-1, -1, -1, 3).contiguous(), *args[4:])
    for a, b in zip((o, S), wide[:2]):
        torch.testing.assert_close(a, b)
