"""H3 (arXiv 2212.14052): the shift SSM against its explicit recurrence and the whole layer against a
loop over time (values and gradients, float64); step == forward for several inner SSMs; the
published defaults; bidirectional use (two-sided, and flip-and-sum for an inner SSM without a
bidirectional mode); padding; options that cannot build; H3 in residual and simple blocks."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from longrange.errors import ConfigError
from longrange.layers import H3, PRIMITIVES, S4D, FlipSum, SequencePrimitive, apply_mask
from longrange.layers.check_cases import step_through
from longrange.models.config import ModelConfig
from longrange.models.model import build_model
from longrange.train import TrainConfig, build_optimizer, param_groups

pytestmark = pytest.mark.usefixtures("float64_default")  # tests/conftest.py


def _randomise(layer: torch.nn.Module) -> torch.nn.Module:
    """Perturb every parameter, so that no value sits at a special initial point (B = 1, ...)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return layer


def _grads(out: Tensor, inputs: list[Tensor]) -> list[Tensor]:
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))  # the same whatever out's strides
    return list(torch.autograd.grad(out, inputs, g))


# ---- the shift SSM ----------------------------------------------------------------------------


def shift_recurrence(C: Tensor, D: Tensor, k: Tensor) -> Tensor:
    """The shift SSM by its recurrence: s_t = A s_{t-1} + B k_t, out_t = C·s_t + D k_t, with A the
    N x N shift matrix ((A s)_n = s_{n-1}) and B = e_1; C (d, N), D (d,), k (batch, length, d)."""
    b, l, d = k.shape
    N = C.shape[-1]
    A = torch.diag(torch.ones(N - 1), -1)
    B = torch.zeros(N)
    B[0] = 1.0
    s = k.new_zeros(b, d, N)
    out = []
    for t in range(l):
        s = s @ A.T + B * k[:, t, :, None]
        out.append((C * s).sum(-1) + D * k[:, t])
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("length", [3, 11])  # shorter and longer than the width N = 6
def test_shift_ssm_is_its_recurrence_values_and_gradients(length):
    torch.manual_seed(0)
    layer = H3(6, d_state=6)
    k = torch.randn(2, length, 6, requires_grad=True)
    params = [k, layer.shift_C, layer.shift_D]
    fast, slow = layer.shift(k), shift_recurrence(layer.shift_C[0], layer.shift_D, k)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)
    for a, b in zip(_grads(fast, params), _grads(slow, params)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_two_sided_shift_ssm_adds_a_backward_kernel_over_later_keys():
    """Bidirectional: out_t = Σ_j C_f[j] k_{t-j} + D k_t + Σ_j C_b[j] k_{t+1+j} (j < N)."""
    torch.manual_seed(0)
    layer = H3(6, d_state=4, bidirectional=True)
    assert layer.shift_C.shape == (2, 6, 4)
    k = torch.randn(2, 9, 6)
    backward = shift_recurrence(layer.shift_C[1], torch.zeros(6), k.flip(1)).flip(1)
    expected = shift_recurrence(layer.shift_C[0], layer.shift_D, k) + torch.cat(
        [backward[:, 1:], torch.zeros_like(backward[:, :1])], dim=1
    )
    torch.testing.assert_close(layer.shift(k), expected, rtol=1e-10, atol=1e-12)


# ---- the whole layer ------------------------------------------------------------------------


def reference_h3(layer: H3, x: Tensor) -> Tensor:
    """H3 with an inner S4D by a loop over time: the shift SSM's recurrence, the per-head outer
    products, the S4D recurrence (bilinear) per entry, the gate with the published output layout."""
    b, l, d = x.shape
    P, H, N = layer.head_dim, layer.n_heads, layer.d_state
    s4d = layer.inner
    assert isinstance(s4d, S4D) and s4d.discretization == "bilinear" and not s4d.bidirectional
    dt, A, B, C = s4d.ssm()
    dtA = dt[:, None] * A
    dA, dB = (1 + dtA / 2) / (1 - dtA / 2), dt[:, None] * B / (1 - dtA / 2)  # (H, N/2)
    keys = x.new_zeros(b, d, N)  # the shift SSM's state (k_t, k_{t-1}, ...)
    X = torch.zeros(b, H, P, P, N // 2, dtype=dA.dtype)  # the S4D state of every (h, i, j) entry
    out = []
    for t in range(l):
        q = x[:, t] @ layer.q_proj.weight.T + layer.q_proj.bias
        k = x[:, t] @ layer.k_proj.weight.T + layer.k_proj.bias
        v = x[:, t] @ layer.v_proj.weight.T + layer.v_proj.bias
        keys = torch.cat([k[..., None], keys[..., :-1]], dim=-1)
        k_bar = (layer.shift_C[0] * keys).sum(-1) + layer.shift_D * k
        kv = k_bar.reshape(b, H, P, 1) * v.reshape(b, H, 1, P)  # kv[:, h, i, j] = k̄[hP + i] v[hP + j]
        X = dA[:, None, None] * X + dB[:, None, None] * kv[..., None]
        z = 2 * (C[0][:, None, None] * X).sum(-1).real + s4d.D[:, None, None] * kv
        o = torch.stack(
            [
                (q[:, h * P : (h + 1) * P] * z[:, h, :, j]).sum(-1)  # channel j·H + h
                for j in range(P)
                for h in range(H)
            ],
            dim=-1,
        )
        out.append(o @ layer.out_proj.weight.T + layer.out_proj.bias)
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("head_dim", [1, 2, 4, 8])  # 2 and 4: products of slices; 8: einsum (SMALL_HEAD)
def test_layer_is_its_loop_over_time_values_and_gradients(head_dim):
    torch.manual_seed(0)
    layer = _randomise(H3(8, d_state=4, head_dim=head_dim))
    x = torch.randn(2, 9, 8, requires_grad=True)
    params = [x, *layer.parameters()]
    fast, slow = layer(x), reference_h3(layer, x)
    torch.testing.assert_close(fast, slow, rtol=1e-9, atol=1e-11)
    for a, b in zip(_grads(fast, params), _grads(slow, params)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_head_dim_one_is_the_elementwise_gate():
    """y = W_o (q ⊙ SSM(shift(k) ⊙ v)) + b_o."""
    torch.manual_seed(0)
    layer = H3(8, d_state=4)
    x = torch.randn(2, 7, 8)
    q, k, v = layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)
    expected = layer.out_proj(q * layer.inner(layer.shift(k) * v))
    torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)


def test_published_defaults():
    torch.manual_seed(0)
    layer = H3(16)
    assert (layer.d_state, layer.head_dim, layer.n_heads, layer.inner_name) == (64, 1, 16, "s4d")
    s4d = layer.inner
    assert isinstance(s4d, S4D) and (s4d.d_model, s4d.d_state) == (16, 64)
    assert (s4d.init, s4d.discretization) == ("lin", "bilinear")  # the published diag-lin, bilinear kernel
    _, A, B, _ = s4d.ssm()
    torch.testing.assert_close(A.imag[0], torch.pi * torch.arange(32.0))
    torch.testing.assert_close(A.real, torch.full((16, 32), -0.5))
    torch.testing.assert_close(B, torch.ones(16, 32, dtype=B.dtype))
    assert not torch.allclose(s4d.D, torch.ones(16))  # D ~ N(0, 1), not S4D's ones
    assert layer.shift_C.shape == (1, 16, 64) and layer.shift_C.abs().max() <= 64**-0.5
    # inner_options override H3's choices for the inner SSM.
    other = H3(16, d_state=8, inner_options={"discretization": "zoh", "d_init": "ones"})
    assert other.inner.discretization == "zoh" and torch.equal(other.inner.D, torch.ones(16))


# ---- step mode ----------------------------------------------------------------------------------

STEPPED = {
    "s4d": {},
    "s6": {},
    "s6-own-state": {"d_state": 3},
    "s4": {"l_max": 8},  # shorter than the 11 steps
    "dlr": {},
    "mamba2": {"expand": 1, "headdim": 2, "chunk_size": 4},
}


@pytest.mark.parametrize("head_dim", [1, 2])
@pytest.mark.parametrize("name", list(STEPPED))
def test_step_equals_forward(name, head_dim):
    torch.manual_seed(0)
    inner = name.split("-")[0]
    layer = _randomise(H3(8, d_state=4, head_dim=head_dim, inner=inner, inner_options=STEPPED[name])).eval()
    x = torch.randn(2, 11, 8)
    torch.testing.assert_close(step_through(layer, x), layer(x), rtol=1e-9, atol=1e-11)


def test_state_size_counts_the_key_buffer_and_the_inner_states():
    layer = H3(8, d_state=4, head_dim=2)  # 4 heads; 4 entries each
    state = layer.default_state(3)
    assert state["keys"].shape == (3, 8, 3)  # the last N - 1 keys
    assert state["inner"].shape == (3 * 4, 4, 2)  # S4D: N/2 complex modes per channel, batch · P²
    assert layer.state_size(100) == 8 * 3 + 4 * 4 * 4
    assert H3(8, d_state=4, inner="s6", inner_options={"d_state": 3}).state_size(100) == 8 * 3 + 8 * 3


def test_step_checks_its_inputs():
    layer = H3(8, d_state=4)
    with pytest.raises(ValueError, match=r"H3.step expects x of shape \(batch, 8\)"):
        layer.step(torch.randn(2, 1, 8), layer.default_state(2))
    with pytest.raises(ValueError, match=r"state\['keys'\] must have shape \(2, 8, 3\)"):
        layer.step(torch.randn(2, 8), layer.default_state(3))


# ---- bidirectional ------------------------------------------------------------------------------


def _dependence_on_future(layer: SequencePrimitive, t: int, length: int = 10) -> float:
    x = torch.randn(2, length, layer.d_model, requires_grad=True)
    layer(x)[:, t].sum().backward()
    return x.grad[:, t + 1 :].abs().max().item() / x.grad[:, : t + 1].abs().max().item()


class _CausalEMA(SequencePrimitive):
    """A causal primitive without a bidirectional mode: y_t = x_t + a ⊙ y_{t-1}."""

    def __init__(self, d_model: int):
        super().__init__()
        self.d_model = d_model
        self.a = torch.nn.Parameter(torch.full((d_model,), 0.5))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        x, y, out = apply_mask(x, mask), x.new_zeros(x.shape[0], self.d_model), []
        for t in range(x.shape[1]):
            y = x[:, t] + self.a * y
            out.append(y)
        return torch.stack(out, 1)

    def default_state(self, batch_size: int, device=None, dtype=None) -> Tensor:
        return torch.zeros(batch_size, self.d_model, device=device, dtype=dtype or self.a.dtype)

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        y = x + self.a * state
        return y, y


class _BidirectionalOnly(_CausalEMA):
    """A primitive that is bidirectional only (no 'bidirectional' option)."""

    bidirectional = True

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return super().forward(x, mask) + super().forward(x.flip(1), None if mask is None else mask.flip(1)).flip(1)


@pytest.fixture
def test_primitives():
    PRIMITIVES.register("h3-test-ema", _CausalEMA)
    PRIMITIVES.register("h3-test-bidirectional", _BidirectionalOnly)
    yield
    PRIMITIVES.unregister("h3-test-ema")
    PRIMITIVES.unregister("h3-test-bidirectional")


@pytest.mark.parametrize("inner", ["s4d", "s6"])
def test_bidirectional_layer_is_two_sided_and_sees_the_future(inner):
    torch.manual_seed(0)
    layer = H3(8, d_state=4, head_dim=2, inner=inner, bidirectional=True)
    assert layer.directions is None and layer.inner.bidirectional and layer.shift_C.shape[0] == 2
    assert _dependence_on_future(layer, t=4) > 1e-3
    assert layer.state_size(10) is None
    with pytest.raises(RuntimeError, match="bidirectional"):
        layer.default_state(1)
    # Twice the shift kernels and the inner SSM's backward part; one set of projections.
    causal = H3(8, d_state=4, head_dim=2, inner=inner)
    extra = sum(p.numel() for p in layer.parameters()) - sum(p.numel() for p in causal.parameters())
    assert extra == 8 * 4 + sum(p.numel() for p in layer.inner.parameters()) - sum(
        p.numel() for p in causal.inner.parameters()
    )


def test_causal_layer_does_not_see_the_future():
    torch.manual_seed(0)
    assert _dependence_on_future(H3(8, d_state=4, head_dim=2), t=4) < 1e-12


def test_inner_without_bidirectional_mode_gives_the_flip_and_sum_of_two_causal_layers(test_primitives):
    torch.manual_seed(0)
    layer = H3(8, d_state=4, inner="h3-test-ema", bidirectional=True)
    assert isinstance(layer.directions, FlipSum)
    fwd, bwd = layer.directions.fwd, layer.directions.bwd
    assert fwd.causal and bwd.causal and isinstance(fwd.inner, _CausalEMA)
    x = torch.randn(2, 7, 8)
    torch.testing.assert_close(layer(x), fwd(x) + bwd(x.flip(1)).flip(1))
    torch.testing.assert_close(step_through(fwd, x), fwd(x))
    assert _dependence_on_future(layer, t=4) > 1e-3


def test_a_bidirectional_only_inner_serves_a_bidirectional_h3(test_primitives):
    layer = H3(8, d_state=4, inner="h3-test-bidirectional", bidirectional=True)
    assert layer.directions is None and _dependence_on_future(layer, t=4) > 1e-3


# ---- padding ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("inner,head_dim", [("s4d", 2), ("s6", 1), ("h3-test-ema", 2)])
def test_padding_does_not_change_outputs_at_real_positions(inner, head_dim, bidirectional, test_primitives):
    torch.manual_seed(0)
    layer = _randomise(H3(8, d_state=4, head_dim=head_dim, inner=inner, bidirectional=bidirectional))
    x = torch.randn(3, 9, 8)
    lengths = [9, 5, 7]
    padded = x.clone()
    for i, n in enumerate(lengths):
        padded[i, n:] = 100.0  # garbage in the padding must not leak
    longer = torch.cat([padded, torch.full((3, 4, 8), -7.0)], dim=1)
    for inputs in (padded, longer):
        mask = torch.arange(inputs.shape[1])[None, :] < torch.tensor(lengths)[:, None]
        out = layer(inputs, mask)
        for i, n in enumerate(lengths):
            torch.testing.assert_close(out[i, :n], layer(x[i : i + 1, :n])[0], rtol=1e-9, atol=1e-11)


# ---- options that cannot build ------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(d_model=10, head_dim=3), r"H3: d_model = 10 is not divisible by head_dim=3"),
        (dict(d_model=8, head_dim=0), r"H3: head_dim must be a positive integer"),
        (dict(d_model=8, d_state=0), r"H3: d_state must be a positive integer"),
        (dict(d_model=8, inner="s4dd"), r"H3: inner: unknown primitive 's4dd' \(did you mean 's4d'"),
        (dict(d_model=8, inner="h3"), r"H3: inner='h3': H3 cannot be its own inner SSM"),
        (dict(d_model=8, inner=None), r"H3: inner must be the name of a registered primitive"),
        (dict(d_model=8, inner_options=["init"]), r"H3: inner_options must be a dict"),
        (dict(d_model=8, inner_options={"bidirectional": True}), r"'bidirectional' is set by H3's own bidirectional"),
        (
            dict(d_model=8, inner_options={"nonsense": 1}),
            r"H3: inner='s4d': unknown option 'nonsense' for primitive 's4d'",
        ),
        (dict(d_model=8, d_state=3), r"H3: inner='s4d': d_state must be an even integer"),
        (
            dict(d_model=8, inner="h3-test-bidirectional"),
            r"H3: inner='h3-test-bidirectional' is bidirectional only; a causal H3 needs a causal inner SSM",
        ),
    ],
)
def test_options_that_cannot_build_name_themselves(kwargs, match, test_primitives):
    with pytest.raises(ConfigError, match=match):
        H3(**kwargs)


# ---- in the model -------------------------------------------------------------------------------


def _model(**kw):
    cfg = ModelConfig(**{**dict(block="residual", primitive="h3", n_layers=2, d_model=8, d_state=4), **kw})
    torch.manual_seed(0)
    return build_model(cfg, input_kind="numeric", d_input=2, head="tokens", n_out=3)


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(mlp="gelu", primitive_options={"head_dim": 2}),
        dict(primitive_options={"inner": "s6", "inner_options": {"d_state": 2}}),
        dict(block="simple"),
    ],
)
def test_h3_blocks_step_equals_forward(kw):
    model = _model(**kw).eval()
    mixers = [m for m in model.modules() if isinstance(m, H3)]
    assert len(mixers) == 2 and mixers[0].d_state == 4
    x = torch.randn(2, 9, 2)
    torch.testing.assert_close(step_through(model, x), model(x), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("block", ["residual", "simple"])
def test_bidirectional_h3_blocks_see_the_future(block):
    model = _model(block=block, direction="bidirectional").eval()
    x = torch.randn(2, 10, 2, requires_grad=True)
    model(x)[:, 4].sum().backward()
    assert x.grad[:, 5:].abs().max() > 1e-4 * x.grad[:, :5].abs().max()


def test_one_training_step_in_residual_blocks():
    torch.set_default_dtype(torch.float32)
    model = _model(mlp="swiglu", primitive_options={"head_dim": 2})
    cfg = TrainConfig(lr=1e-2)
    groups = {g["name"]: g["param_names"] for g in param_groups(model, cfg)}
    names = {n for ns in groups.values() for n in ns}
    assert "backbone.blocks.0.mixer.shift_C" in names
    assert any(n.endswith("mixer.shift_D") for n in groups.get("no_decay", []))
    assert any(n.endswith("mixer.inner.log_dt") for n in groups.get("ssm", []))
    opt = build_optimizer(model, cfg)
    x, target = torch.randn(4, 12, 2), torch.randint(0, 3, (4, 12))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), target.flatten())
    opt.zero_grad()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    opt.step()
    for n, p in model.named_parameters():
        assert torch.isfinite(p).all() and not torch.equal(p.detach(), before[n]), n
