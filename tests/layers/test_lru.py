"""The LRU (layers/lru.py) and its scan (ops/complex_scan/): every implementation of the scan
against the loop over time (values and gradients, complex128) and its dispatch (impl, defaults,
errors), step == forward, the ring and γ initialisation, causality and bidirectionality, padding,
the options' errors, the optimiser hints and a training step in a Simple block."""

from __future__ import annotations

import math

import pytest
import torch

from longrange.blocks.simple import SimpleBlock
from longrange.errors import ConfigError
from longrange.layers import LRU, SSM_GROUP, get_optim_hint
from longrange.layers.check_cases import step_through
from longrange.models.backbone import make_primitive
from longrange.ops import complex_scan, used
from longrange.ops.complex_scan import complex_diag_scan, complex_diag_scan_ref
from longrange.ops.dispatch import dispatcher
from longrange.train.config import TrainConfig
from longrange.train.optim import build_optimizer, param_groups

C128 = torch.complex128


def _log_decay(n: int, gen: torch.Generator) -> torch.Tensor:
    """log λ with |λ| in about [0.5, 1) and phases in [0, 3)."""
    return torch.complex(
        -0.7 * torch.rand(n, dtype=torch.float64, generator=gen), 3 * torch.rand(n, dtype=torch.float64, generator=gen)
    )


# ------------------------------------------------------------------------------------------- scan
@pytest.mark.parametrize("impl", ["chunk", "loop", "ref", "auto"])
@pytest.mark.parametrize("length,chunk", [(1, 4), (4, 4), (9, 4), (37, 3), (70, 4)])  # 37, 70: recursion of depth >= 3
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("with_h0", [False, True])
def test_every_implementation_matches_the_loop_in_values_and_gradients(impl, length, chunk, reverse, with_h0):
    gen = torch.Generator().manual_seed(length * 10 + chunk)
    N = 3
    log_decay = _log_decay(N, gen).requires_grad_()
    v = torch.randn(2, length, N, dtype=C128, generator=gen).requires_grad_()
    h0 = torch.randn(2, N, dtype=C128, generator=gen).requires_grad_() if with_h0 else None
    inputs = [log_decay, v] + ([h0] if with_h0 else [])
    weight = torch.randn(2, length, N, dtype=C128, generator=gen)

    fast = complex_diag_scan(log_decay, v, h0, reverse=reverse, chunk_size=chunk, impl=impl)
    slow = complex_diag_scan_ref(log_decay, v, h0, reverse=reverse)
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    g_fast = torch.autograd.grad((fast * weight).real.sum(), inputs)
    g_slow = torch.autograd.grad((slow * weight).real.sum(), inputs)
    for a, b in zip(g_fast, g_slow):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_the_loop_is_the_recurrence():
    lam = torch.tensor([0.5 + 0.5j], dtype=C128)
    v = torch.tensor([[1.0], [2.0], [3.0]], dtype=C128)
    x = complex_diag_scan_ref(torch.log(lam), v)[:, 0]
    l = lam[0]
    torch.testing.assert_close(x, torch.stack([1 + 0 * l, l + 2, l * (l + 2) + 3]))
    backward = complex_diag_scan_ref(torch.log(lam), v, reverse=True)[:, 0]
    torch.testing.assert_close(backward, torch.stack([l * (l * 3 + 2) + 1, l * 3 + 2, 3 + 0 * l]))


def test_a_long_stable_scan_neither_overflows_nor_drifts():
    # |λ| from 0.05 to 0.9999: powers up to λ^4096 through three levels of chunks stay finite and exact.
    gen = torch.Generator().manual_seed(0)
    log_decay = torch.complex(
        torch.log(torch.tensor([0.05, 0.9, 0.9999], dtype=torch.float64)),
        torch.tensor([0.1, 2.0, 3.1], dtype=torch.float64),
    )
    v = torch.randn(1, 4096, 3, dtype=C128, generator=gen)
    for impl in ("chunk", "loop"):
        torch.testing.assert_close(
            complex_diag_scan(log_decay, v, chunk_size=16, impl=impl),
            complex_diag_scan_ref(log_decay, v),
            rtol=1e-10,
            atol=1e-10,
        )


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: complex_diag_scan(torch.zeros(3), torch.zeros(1, 4, 3, dtype=C128)), "must be complex"),
        (
            lambda: complex_diag_scan(torch.zeros(2, dtype=C128), torch.zeros(1, 4, 3, dtype=C128)),
            r"log_decay must have shape \(N,\) = \(3,\)",
        ),
        (
            lambda: complex_diag_scan(
                torch.zeros(3, dtype=C128), torch.zeros(4, 3, dtype=C128), torch.zeros(2, 3, dtype=C128)
            ),
            r"h0 must have shape \(3,\)",
        ),
        (
            lambda: complex_diag_scan(torch.zeros(3, dtype=C128), torch.zeros(1, 4, 3, dtype=C128), chunk_size=1),
            "chunk_size must be an integer >= 2",
        ),
        (
            lambda: complex_diag_scan(torch.zeros(3, dtype=C128), torch.zeros(1, 4, 3, dtype=C128), impl="fft"),
            r"complex_diag_scan: unknown impl 'fft'; expected one of \('auto', 'chunk', 'loop', 'ref'\)",
        ),
        (
            lambda: complex_diag_scan(torch.zeros(3, dtype=C128), torch.zeros(1, 4, 3, dtype=C128), impl="matmul"),
            "unknown impl 'matmul'",
        ),
        (
            lambda: complex_scan.complex_diag_scan_loop(
                torch.zeros(3, dtype=C128), torch.zeros(1, 4, 3, dtype=C128), chunk_size=0
            ),
            "complex_diag_scan_loop: chunk_size must be an integer >= 2",
        ),
        (lambda: complex_scan.set_default_impl("fft"), "complex_diag_scan: unknown impl 'fft'"),
        (
            lambda: dispatcher("complex_diag_scn"),
            r"no dispatcher for the op 'complex_diag_scn'; did you mean 'complex_diag_scan'\?",
        ),
    ],
)
def test_the_scan_refuses_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_the_scan_follows_the_dispatch_convention():
    d = complex_scan.DISPATCHER
    assert dispatcher("complex_diag_scan") is d and d.function == "complex_diag_scan" and d.reference == "ref"
    assert complex_scan.IMPLS == ("auto", "chunk", "loop", "ref")
    assert complex_scan.available_impls("cpu") == complex_scan.available_impls("cuda") == ("chunk", "loop", "ref")
    # "auto": stepping within chunks on CPUs, matrix products within chunks elsewhere; never the loop over time.
    assert (
        complex_scan.auto_impl("cpu") == "loop"
        and complex_scan.auto_impl("cuda") == complex_scan.auto_impl("meta") == "chunk"
    )
    assert complex_scan.auto_impl("cpu", deterministic=True) == "loop"
    assert all(complex_scan.DETERMINISTIC_BACKWARD.values())
    log_decay, v = torch.zeros(2, dtype=C128), torch.ones(1, 5, 2, dtype=C128)

    def ran(**kw) -> set[str]:
        before = used.calls().get("complex_diag_scan", {})
        complex_diag_scan(log_decay, v, **kw)
        return {i for i, n in used.calls()["complex_diag_scan"].items() if n > before.get(i, 0)}

    assert ran() == ran(impl="auto") == {"loop"}  # the tensors are on the CPU
    assert ran(impl="ref") == {"ref"} and ran(impl="chunk") == {"chunk"}
    with complex_scan.default_impl("ref"):
        assert ran() == {"ref"} and ran(impl="chunk") == {"chunk"}
    assert d.default == "auto"
    previous = complex_scan.set_default_impl("chunk")
    try:
        assert previous == "auto" and ran() == {"chunk"}
    finally:
        complex_scan.set_default_impl(previous)


# ----------------------------------------------------------------------------------------- layer
def _layer(bidirectional: bool = False, **kw) -> LRU:
    torch.manual_seed(0)
    return LRU(6, d_state=5, r_min=0.4, r_max=0.99, bidirectional=bidirectional, chunk_size=4, **kw).double()


@pytest.mark.parametrize("impl", ["chunk", "loop", "ref"])
def test_step_equals_forward_in_values_and_gradients(impl):
    layer = _layer(impl=impl)
    x = torch.randn(2, 19, 6, dtype=torch.float64, requires_grad=True)  # 19 positions: chunks of 4 at two levels
    before = used.calls().get("complex_diag_scan", {}).get(impl, 0)
    y = layer(x)
    assert used.calls()["complex_diag_scan"][impl] == before + 1  # the layer's option reaches the scan
    stepped = step_through(layer, x)
    torch.testing.assert_close(y, stepped, rtol=1e-10, atol=1e-10)
    weight = torch.randn_like(y)
    inputs = [x, *layer.parameters()]
    for a, b in zip(
        torch.autograd.grad((y * weight).sum(), inputs), torch.autograd.grad((stepped * weight).sum(), inputs)
    ):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_step_equals_forward_in_float32():
    torch.manual_seed(0)
    layer = LRU(8, d_state=6, r_min=0.9, r_max=0.999)
    x = torch.randn(2, 50, 8)
    torch.testing.assert_close(step_through(layer, x), layer(x), rtol=1e-4, atol=1e-4)
    state = layer.default_state(2)
    assert state.dtype == torch.complex64 and state.shape == (2, 6) and not state.any()
    assert layer.state_size(50) == 12  # 6 complex numbers


def test_the_ring_init_keeps_lambda_in_the_ring_and_the_phases_in_range():
    torch.manual_seed(0)
    for r_min, r_max, max_phase in [(0.0, 1.0, 2 * math.pi), (0.9, 0.999, math.pi / 10), (0.999, 0.9999, 0.31)]:
        layer = LRU(4, d_state=4000, r_min=r_min, r_max=r_max, max_phase=max_phase).double()
        lam = torch.exp(layer.log_lambda())
        modulus, phase = lam.abs(), torch.exp(layer.theta_log)
        assert modulus.min() >= r_min and modulus.max() <= r_max
        assert phase.min() > 0 and phase.max() <= max_phase * (1 + 1e-12)
        # Uniform by area: |λ|² is uniform on [r_min², r_max²), the phase uniform on (0, max_phase].
        assert abs((modulus**2).mean().item() - (r_min**2 + r_max**2) / 2) < 0.03 * (r_max**2 - r_min**2)
        assert abs(phase.mean().item() - max_phase / 2) < 0.03 * max_phase
        # γ = sqrt(1 - |λ|²) at init.
        torch.testing.assert_close(torch.exp(layer.gamma_log), torch.sqrt(1 - modulus**2))


def test_gamma_keeps_the_state_at_the_input_s_scale_for_white_noise():
    torch.manual_seed(0)
    H, N, L = 16, 64, 1500
    layer = LRU(H, d_state=N, r_min=0.9, r_max=0.99).double()
    u = torch.randn(8, L, H, dtype=torch.float64)  # unit variance
    log_lam, B, _ = layer.ssm()
    states = complex_diag_scan(log_lam, torch.einsum("nh,blh->bln", B, u.to(C128)))
    per_state = states[:, 1000:].abs().pow(2).mean((0, 1))  # stationary part
    assert abs(per_state.mean().item() - 1.0) < 0.15
    # Without γ the state's variance is about 1 / (1 - |λ|²): far larger.
    bare = complex_diag_scan(log_lam, torch.einsum("nh,blh->bln", B / torch.exp(layer.gamma_log)[:, None], u.to(C128)))
    assert bare[:, 1000:].abs().pow(2).mean().item() > 10


def test_a_causal_layer_does_not_see_the_future_and_a_bidirectional_one_does():
    x = torch.randn(2, 12, 6, dtype=torch.float64)
    changed = x.clone()
    changed[:, 8:] += 1.0
    causal, bi = _layer(False), _layer(True)
    torch.testing.assert_close(causal(changed)[:, :8], causal(x)[:, :8])
    assert (bi(changed)[:, :8] - bi(x)[:, :8]).abs().max() > 1e-3
    # Its backward part reads position t itself and what follows: the sum of the two causal directions.
    fwd, bwd = bi.causal_directions()
    torch.testing.assert_close(bi(x), fwd(x) + bwd(x.flip(1)).flip(1))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_outputs_at_real_positions_do_not_depend_on_padding(bidirectional):
    layer = _layer(bidirectional)
    x = torch.randn(2, 9, 6, dtype=torch.float64)
    lengths = [9, 5]
    padded = torch.cat([x, torch.randn(2, 6, 6, dtype=torch.float64)], dim=1)  # more positions, junk in them
    padded[1, 5:] = torch.randn(10, 6, dtype=torch.float64)
    mask = torch.arange(15)[None, :] < torch.tensor(lengths)[:, None]
    out = layer(padded, mask)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(out[b, :n], layer(x[b : b + 1, :n])[0])


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"r_min": 0.9, "r_max": 0.9}, r"LRU: r_min must be < r_max .* got r_min=0.9, r_max=0.9"),
        ({"r_min": 0.95, "r_max": 0.5}, r"LRU: r_min must be < r_max"),
        ({"r_max": 1.5}, r"LRU: r_max must be in \(0, 1\] .* got 1.5"),
        ({"r_min": -0.1}, r"LRU: r_min must be >= 0"),
        ({"max_phase": -1.0}, r"LRU: max_phase must be > 0 .* got -1.0"),
        ({"max_phase": 0}, r"LRU: max_phase must be > 0"),
        ({"r_max": "high"}, r"LRU: r_max must be a finite number, got 'high'"),
        ({"d_state": 0}, r"LRU: d_state must be a positive integer"),
        ({"ssm_lr_scale": -1.0}, r"LRU: ssm_lr_scale must be None or > 0"),
        ({"chunk_size": 1}, r"LRU: chunk_size must be None or an integer >= 2"),
        (
            {"impl": "fft"},
            r"LRU: impl: complex_diag_scan: unknown impl 'fft'; expected one of \('auto', 'chunk', 'loop', 'ref'\)",
        ),
    ],
)
def test_bad_options_are_config_errors_naming_the_option(kw, match):
    with pytest.raises(ConfigError, match=match):
        LRU(4, **kw)


def test_bad_step_inputs_and_a_bidirectional_step_are_refused():
    layer = _layer()
    with pytest.raises(ValueError, match=r"state of shape \(2, 4\) does not match expected \(2, 5\)"):
        layer.step(torch.zeros(2, 6, dtype=torch.float64), torch.zeros(2, 4, dtype=C128))
    with pytest.raises(ValueError, match=r"expects input of shape \(batch, length, 6\)"):
        layer(torch.zeros(2, 3, 5, dtype=torch.float64))
    bi = _layer(True)
    assert bi.state_size(5) is None
    with pytest.raises(RuntimeError, match="bidirectional"):
        bi.default_state(1)
    with pytest.raises(ValueError, match="only a bidirectional LRU"):
        layer.causal_directions()


def test_the_model_builds_it_by_name_with_its_state_size_and_direction():
    layer = make_primitive("lru", 8, d_state=12, bidirectional=True, r_min=0.5, impl="chunk")
    assert isinstance(layer, LRU) and layer.d_state == 12 and layer.bidirectional and layer.r_min == 0.5
    assert layer.impl == "chunk" and all(d.impl == "chunk" for d in layer.causal_directions())
    assert layer.C.shape == (2, 8, 12, 2)
    params = sum(p.numel() for p in layer.parameters())
    assert params == 3 * 12 + 2 * 12 * 8 + 2 * 2 * 12 * 8 + 8


def test_the_recurrent_parameters_carry_the_ssm_hint_and_the_rest_none():
    layer = LRU(4, d_state=3)
    for name in ("nu_log", "theta_log", "gamma_log"):
        assert get_optim_hint(getattr(layer, name)) == {"group": SSM_GROUP}
    for name in ("B", "C", "D"):
        assert get_optim_hint(getattr(layer, name)) == {}
    pinned = LRU(4, d_state=3, ssm_lr_scale=0.5)
    assert get_optim_hint(pinned.nu_log) == {"group": SSM_GROUP, "lr_scale": 0.5}


def test_one_training_step_in_a_simple_block():
    torch.manual_seed(0)
    block = SimpleBlock(LRU(8, d_state=6, r_min=0.5, r_max=0.99), dropout=0.1, norm="batch", prenorm=True)
    cfg = TrainConfig(
        lr=0.01,
        weight_decay=0.05,
        ssm_lr_scale=0.5,
        param_groups=[{"match": "*.B", "lr_scale": 0.5, "weight_decay": 0.0}],
    )
    groups = {g["name"]: g for g in param_groups(block, cfg)}
    assert groups[SSM_GROUP]["lr"] == pytest.approx(0.005) and groups[SSM_GROUP]["weight_decay"] == 0.0
    assert groups["match:*.B"]["lr"] == pytest.approx(0.005)
    optimizer = build_optimizer(block, cfg)
    x, target = torch.randn(4, 10, 8), torch.randn(4, 10, 8)
    before = {n: p.detach().clone() for n, p in block.named_parameters()}
    loss = (block(x) - target).pow(2).mean()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in block.parameters())
    optimizer.step()
    assert all(not torch.equal(before[n], p) for n, p in block.named_parameters() if n.startswith("mixer."))
    block.eval()
    with torch.no_grad():
        assert (block(x) - target).pow(2).mean() < loss


# --------------------------------------------------------------------------------------- presets
LRU_PRESETS = ["lru/listops", "lru/path-x", "lru/pathfinder", "lru/retrieval", "lru/scifar", "lru/text"]


def test_the_lra_presets_are_listed():
    from longrange.experiment.config import list_presets

    assert sorted(n for n in list_presets() if n.startswith("lru/")) == LRU_PRESETS


@pytest.mark.parametrize("name", LRU_PRESETS)
def test_an_lra_preset_builds_its_model_and_optimiser_groups(name):
    import longrange.data  # noqa: F401  (registers the tasks)
    from longrange.data.tasks import get_spec
    from longrange.experiment.config import resolve
    from longrange.models.model import build_model
    from longrange.objectives.factory import supervised_head

    exp = resolve(name)
    exp.validate()
    assert (
        exp.model.block == "simple" and exp.model.primitive == "lru" and exp.model.prenorm and exp.model.norm == "batch"
    )
    assert "Not confirmed" in exp.description and "simple block" in exp.description
    spec = get_spec(exp.task.name, **exp.task.options)
    head, n_out = supervised_head(spec)
    with torch.device("meta"):
        model = build_model(
            exp.model,
            input_kind=spec.input_kind,
            head=head,
            n_out=n_out,
            d_input=spec.d_input,
            vocab_size=300 if spec.input_kind == "tokens" else None,
        )
    layers = [m for m in model.modules() if isinstance(m, LRU)]
    assert len(layers) == exp.model.n_layers
    assert all(l.d_state == exp.model.d_state and l.bidirectional == exp.model.bidirectional for l in layers)
    groups = {g["name"]: g for g in param_groups(model, exp.train_config("train"))}
    ssm = groups[SSM_GROUP]
    assert len(ssm["params"]) == 3 * exp.model.n_layers and ssm["weight_decay"] == 0.0
    train = exp.train_config("train")
    assert ssm["lr"] == pytest.approx(train.lr * train.ssm_lr_scale)
    if name == "lru/path-x":
        assert (layers[0].r_min, layers[0].r_max, layers[0].max_phase) == (0.999, 0.9999, pytest.approx(math.pi / 10))
        assert "match:*.B" not in groups
    else:
        assert len(groups["match:*.B"]["params"]) == exp.model.n_layers
