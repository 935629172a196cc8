"""Blocks and models: parameter counts, recurrent == parallel, causality, padding, state_dict."""

from __future__ import annotations

import io

import pytest
import torch

from longrange.errors import ConfigError
from longrange.models.config import ModelConfig
from longrange.models.model import build_model, parameter_report

pytestmark = pytest.mark.usefixtures("float64_default")  # tests/conftest.py


def small(**kw) -> ModelConfig:
    base = dict(block="mamba", primitive="s6", n_layers=2, d_model=8, d_state=4, n_heads=2)
    base.update(kw)
    return ModelConfig(**base)


def numeric_model(cfg: ModelConfig, head="classify", n_out=3, d_input=2, **kw):
    torch.manual_seed(0)
    return build_model(cfg, input_kind="numeric", head=head, n_out=n_out, d_input=d_input, **kw).eval()


CAUSAL_CONFIGS = {
    "mamba-s6": small(),
    "mamba-s4d": small(primitive="s4d"),
    "mamba-s4": small(primitive="s4"),
    "mamba-dlr": small(primitive="dlr"),
    "mamba-s6-placebo": small(direction="placebo"),
    "mamba-s6-rope-BC": small(rope=True, rope_targets=("B", "C", "delta"), rope_base=10.0),
    "mamba-s6-rope-x-trainable-normed": small(rope=True, rope_trainable=True, rope_normalize_len=32),
    "mamba-s4d-rope": small(primitive="s4d", rope=True),
    "simple-s4d": small(block="simple", primitive="s4d"),
    "simple-s4": small(block="simple", primitive="s4"),
    "simple-dlr": small(block="simple", primitive="dlr"),
    "simple-s4d-prenorm-rms": small(block="simple", primitive="s4d", prenorm=True, norm="rms"),
    "simple-s4d-batchnorm": small(block="simple", primitive="s4d", norm="batch"),
    "transformer": small(block="transformer", primitive="attention"),
    "transformer-rope": small(block="transformer", primitive="attention", rope=True),
    "transformer-window": small(block="transformer", primitive="attention", rope=True, attn_window=2),
    "mamba-attention": small(primitive="attention"),
    "transformer-attn-dim": small(block="transformer", primitive="attention", rope=True, attn_dim=4, attn_bias=False),
    "mamba-attention-attn-dim": small(primitive="attention", attn_dim=6, attn_bias=False),
    "transformer-attn-dropout": small(block="transformer", primitive="attention", attn_dropout=0.2),
    "simple-s4-v1": small(
        block="simple", primitive="s4", output_glu=False, primitive_options={"n_ssm_A": 1, "tie_pq": False}
    ),
    "simple-s4-tied-softplus": small(
        block="simple", primitive="s4", primitive_options={"n_ssm": 2, "dt_transform": "softplus"}
    ),
    "simple-s4d-softplus": small(block="simple", primitive="s4d", primitive_options={"dt_transform": "softplus"}),
    # The matrix-state mixers, whole layers in residual blocks (chunks of 4: the 12 steps cross chunks).
    "residual-mamba2": small(
        block="residual", primitive="mamba2", mlp="none", primitive_options={"headdim": 4, "chunk_size": 4}
    ),
    "residual-mamba2-groups": small(
        block="residual",
        primitive="mamba2",
        mlp="gelu",
        primitive_options={"headdim": 4, "ngroups": 2, "chunk_size": 5},
    ),
    "residual-mamba3": small(
        block="residual", primitive="mamba3", mlp="none", primitive_options={"headdim": 4, "chunk_size": 4}
    ),
    "residual-mamba3-mimo": small(
        block="residual",
        primitive="mamba3",
        mlp="none",
        primitive_options={"headdim": 4, "chunk_size": 3, "mimo_rank": 3, "outproj_norm": True},
    ),
    "residual-gla": small(block="residual", primitive="gla", primitive_options={"chunk_size": 4}),
    "residual-gla-conv": small(
        block="residual", primitive="gla", primitive_options={"chunk_size": 4, "use_short_conv": True}
    ),
    "residual-deltanet": small(block="residual", primitive="deltanet", primitive_options={"chunk_size": 4}),
    "residual-gated-deltanet": small(block="residual", primitive="gated-deltanet", primitive_options={"chunk_size": 4}),
    "simple-gated-deltanet": small(block="simple", primitive="gated-deltanet", primitive_options={"chunk_size": 4}),
    "residual-rwkv": small(block="residual", primitive="rwkv", mlp="none", primitive_options={"chunk_size": 4}),
    "mamba-rwkv": small(primitive="rwkv", primitive_options={"chunk_size": 3}),
}

BIDIRECTIONAL_CONFIGS = {
    "residual-rwkv-bi": small(
        block="residual", primitive="rwkv", direction="bidirectional", primitive_options={"chunk_size": 4}
    ),
    "mamba-s6-bi": small(direction="bidirectional"),
    "mamba-s4d-bi": small(primitive="s4d", direction="bidirectional"),
    "simple-s4d-bi": small(block="simple", primitive="s4d", direction="bidirectional"),
    "simple-s4-bi": small(block="simple", primitive="s4", direction="bidirectional"),
    "simple-s6-bi": small(block="simple", primitive="s6", direction="bidirectional"),
    "simple-dlr-bi": small(block="simple", primitive="dlr", direction="bidirectional"),
    "transformer-bi": small(block="transformer", primitive="attention", direction="bidirectional"),
    "transformer-window-bi": small(
        block="transformer", primitive="attention", direction="bidirectional", attn_window=2
    ),
    "simple-s4-tied-bi": small(
        block="simple", primitive="s4", direction="bidirectional", primitive_options={"n_ssm": 1}
    ),
    "residual-mamba2-bi": small(
        block="residual",
        primitive="mamba2",
        direction="bidirectional",
        mlp="none",
        primitive_options={"headdim": 4, "chunk_size": 4},
    ),
    "residual-mamba3-bi": small(
        block="residual",
        primitive="mamba3",
        direction="bidirectional",
        mlp="none",
        primitive_options={"headdim": 4, "chunk_size": 4},
    ),
    "residual-mamba3-mimo-bi": small(
        block="residual",
        primitive="mamba3",
        direction="bidirectional",
        mlp="none",
        primitive_options={"headdim": 4, "chunk_size": 2, "mimo_rank": 2},
    ),
    "residual-gla-bi": small(
        block="residual", primitive="gla", direction="bidirectional", primitive_options={"chunk_size": 4}
    ),
    "residual-deltanet-bi": small(
        block="residual", primitive="deltanet", direction="bidirectional", primitive_options={"chunk_size": 4}
    ),
    "residual-gated-deltanet-bi": small(
        block="residual", primitive="gated-deltanet", direction="bidirectional", primitive_options={"chunk_size": 4}
    ),
}


# Thesis Table 3 (Cifar10-numerical: 3 channels, 10 classes, 6 layers).
TABLE3 = {
    "Mamba-S6": (dict(block="mamba", primitive="s6", d_model=116, d_state=16), 587_000),
    "Mamba-S4D": (dict(block="mamba", primitive="s4d", d_model=116, d_state=16), 564_000),
    "Mamba-S4": (dict(block="mamba", primitive="s4", d_model=116, d_state=16), 587_000),
    "Simple-S4D": (dict(block="simple", primitive="s4d", d_model=170, d_state=64), 551_000),
    "Simple-S4": (dict(block="simple", primitive="s4", d_model=170, d_state=64), 616_000),
}


@pytest.mark.parametrize("name", list(TABLE3))
def test_table3_parameter_counts_within_two_percent(name):
    kw, expected = TABLE3[name]
    torch.set_default_dtype(torch.float32)
    model = build_model(ModelConfig(n_layers=6, **kw), input_kind="numeric", d_input=3, head="classify", n_out=10)
    report = parameter_report(model)
    assert abs(report["total"] - expected) / expected < 0.02, (name, report)
    assert 0 < report["in_primitives"] < report["total"]


@pytest.mark.parametrize("name", list(CAUSAL_CONFIGS))
def test_recurrent_step_equals_parallel_forward(name):
    cfg = CAUSAL_CONFIGS[name]
    model = numeric_model(cfg, head="tokens", n_out=5)
    x = torch.randn(2, 12, 2)
    parallel = model(x)
    state = model.default_state(2)
    steps = []
    for t in range(x.shape[1]):
        y, state = model.step(x[:, t], state)
        steps.append(y)
    torch.testing.assert_close(torch.stack(steps, 1), parallel, rtol=1e-7, atol=1e-9)


def _dependence_on_future(model, t: int, length: int = 10) -> float:
    """Largest gradient of the output at t w.r.t. later inputs, relative to earlier ones.

    FFT convolutions leave round-off of order 1e-16 in exact zeros, hence a ratio, not == 0.
    """
    x = torch.randn(2, length, 2, requires_grad=True)
    out = model(x)
    out[:, t].sum().backward()
    return x.grad[:, t + 1 :].abs().max().item() / x.grad[:, : t + 1].abs().max().item()


@pytest.mark.parametrize("name", list(CAUSAL_CONFIGS))
def test_causal_models_do_not_see_the_future(name):
    model = numeric_model(CAUSAL_CONFIGS[name], head="tokens", n_out=5)
    assert _dependence_on_future(model, t=4) < 1e-12


@pytest.mark.parametrize("name", list(BIDIRECTIONAL_CONFIGS))
def test_bidirectional_models_see_the_future(name):
    model = numeric_model(BIDIRECTIONAL_CONFIGS[name], head="tokens", n_out=5)
    assert _dependence_on_future(model, t=4) > 1e-4


ALL_CONFIGS = {**CAUSAL_CONFIGS, **BIDIRECTIONAL_CONFIGS}


@pytest.mark.parametrize("pooling", ["mean", "last", "cls", "max"])
@pytest.mark.parametrize("name", list(ALL_CONFIGS))
def test_padding_does_not_change_pooled_outputs(name, pooling):
    cfg = ALL_CONFIGS[name].replace(pooling=pooling)
    model = numeric_model(cfg)
    x = torch.randn(3, 9, 2)
    lengths = torch.tensor([9, 5, 7])
    alone = torch.cat([model(x[i : i + 1, : int(n)]) for i, n in enumerate(lengths)])
    padded = x.clone()
    for i, n in enumerate(lengths):
        padded[i, int(n) :] = 100.0  # garbage in the padding must not leak
    more_padding = torch.cat([padded, torch.full((3, 4, 2), -7.0)], dim=1)
    torch.testing.assert_close(model(padded, lengths), alone, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(model(more_padding, lengths), alone, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("name", list(ALL_CONFIGS))
def test_an_all_true_mask_and_no_mask_train_alike(name):
    """A batch without padding reaches the backbone without a mask (``unpadded``): every layer
    must compute the same, values and gradients, in training mode (batch norm's statistics too)."""
    model = numeric_model(ALL_CONFIGS[name]).train()
    x = torch.randn(3, 9, model.backbone.d_model)
    out = {}
    for kind, mask in (("mask", torch.ones(3, 9, dtype=torch.bool)), ("none", None)):
        model.zero_grad()
        torch.manual_seed(1)  # the same dropout draws
        y = model.backbone(x, mask)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        out[kind] = [y.detach()] + [p.grad.clone() for p in model.backbone.parameters() if p.grad is not None]
    assert len(out["mask"]) == len(out["none"]) > 1
    for a, b in zip(out["mask"], out["none"]):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-11)


def test_the_backbone_gets_a_mask_only_when_the_batch_is_padded():
    from longrange.models.model import unpadded

    model = numeric_model(ALL_CONFIGS["mamba-s6"])
    seen = []
    model.backbone.register_forward_pre_hook(lambda module, args: seen.append(args[1]))
    x = torch.randn(2, 5, 2)
    full = model(x, torch.tensor([5, 5]))
    model(x)  # no lengths: every position real
    padded = model(x, torch.tensor([5, 3]))
    assert seen[0] is None and seen[1] is None
    assert seen[2].tolist() == [[True] * 5, [True] * 3 + [False] * 2]
    torch.testing.assert_close(padded[0], full[0])
    assert unpadded(torch.tensor([4, 4]), 4) and not unpadded(torch.tensor([4, 3]), 4)
    assert unpadded(torch.zeros(0, dtype=torch.long), 4)  # an empty batch pads nothing
    assert not unpadded(torch.tensor([4, 4], device="meta"), 4)  # device lengths: no synchronisation
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # plans and dry runs: no values to read, the mask stays
        assert not unpadded(torch.tensor([4, 4]), 4)


def test_retrieval_head_and_token_inputs():
    cfg = small(direction="bidirectional", pooling="mean")
    model = build_model(cfg, input_kind="tokens", vocab_size=20, head="retrieval", n_out=2).eval()
    a = torch.randint(5, 20, (2, 7))
    b = torch.randint(5, 20, (2, 5))
    out = model(a, torch.tensor([7, 4]), b, torch.tensor([5, 5]))
    assert out.shape == (2, 2)
    # Swapping a second-sequence padding value does not change the output.
    b2 = b.clone()
    b2[:, 4:] = 0
    torch.testing.assert_close(
        model(a, torch.tensor([7, 4]), b2, torch.tensor([4, 4])),
        model(a, torch.tensor([7, 4]), b[:, :4], torch.tensor([4, 4])),
    )


@pytest.mark.parametrize("name", ["mamba-s6", "simple-s4", "transformer", "mamba-s4d-bi"])
def test_state_dict_round_trip(name):
    cfg = ALL_CONFIGS[name]
    model = numeric_model(cfg)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    torch.manual_seed(123)
    other = build_model(cfg, input_kind="numeric", head="classify", n_out=3, d_input=2).eval()
    other.load_state_dict(torch.load(buffer, weights_only=True))
    x = torch.randn(2, 6, 2)
    torch.testing.assert_close(other(x), model(x), rtol=0, atol=0)


def test_mask_channel_is_dropped_for_finetuning():
    model = numeric_model(small(), mask_channel=True)
    x = torch.randn(2, 6, 2)
    with_zero_indicator = model(torch.cat([x, torch.zeros(2, 6, 1)], -1))
    model.encoder.drop_mask_channel()
    torch.testing.assert_close(model(x), with_zero_indicator)
    with pytest.raises(ValueError, match=r"\(batch, length, 2\)"):
        model(torch.randn(2, 6, 3))


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="model.block"):
        ModelConfig(block="lstm")
    with pytest.raises(ConfigError, match="placebo"):
        ModelConfig(block="simple", primitive="s4d", direction="placebo")
    with pytest.raises(ConfigError, match="unknown field.*model.d_modle"):
        ModelConfig.from_dict({"d_modle": 3})
    with pytest.raises(ConfigError, match=r"model.primitive_options: unknown option 'nonsense' for primitive 's6'"):
        build_model(small(primitive_options={"nonsense": 1}), input_kind="numeric", head="classify", n_out=2)
    with pytest.raises(ConfigError, match=r"'d_state' of primitive 's6' is set by model.d_state"):
        build_model(small(primitive_options={"d_state": 4}), input_kind="numeric", head="classify", n_out=2)
    with pytest.raises(ConfigError, match="need an S6"):
        build_model(
            small(primitive="s4d", rope=True, rope_targets=("B",)), input_kind="numeric", head="classify", n_out=2
        )


def test_attn_dim_and_attn_bias_reach_every_attention():
    for cfg in (
        small(block="transformer", primitive="attention", attn_dim=4, attn_bias=False),
        small(primitive="attention", attn_dim=4, attn_bias=False),
    ):
        model = numeric_model(cfg)
        attentions = [m for m in model.modules() if type(m).__name__ == "Attention"]
        assert len(attentions) == cfg.n_layers
        for a in attentions:
            assert a.attn_dim == 4 and a.head_dim == 2 and a.qkv.bias is None and a.out_proj.bias is None
    # The defaults build what the model always built: q/k/v of width d_model, with biases.
    names = {
        n: tuple(p.shape)
        for n, p in numeric_model(small(block="transformer", primitive="attention")).named_parameters()
    }
    assert names["backbone.blocks.0.mixer.qkv.weight"] == (24, 8) and names["backbone.blocks.0.mixer.qkv.bias"] == (24,)
    assert (
        names["backbone.blocks.0.mixer.out_proj.weight"] == (8, 8) and "backbone.blocks.0.mixer.out_proj.bias" in names
    )


@pytest.mark.parametrize(
    "kw, match",
    [
        (
            dict(block="transformer", primitive="attention", attn_dim=6, n_heads=4),
            r"model.attn_dim = 6 is not divisible by model.n_heads = 4",
        ),
        (dict(block="transformer", primitive="attention", attn_dim=0), "model.attn_dim must be None"),
        (dict(attn_dim=4), "model.attn_dim applies to attention, not to primitive 's6'"),
        (dict(primitive="s4d", attn_bias=False), "model.attn_bias applies to attention, not to primitive 's4d'"),
    ],
)
def test_attn_dim_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        small(**kw)


def test_attn_bias_must_be_a_bool():
    with pytest.raises(ConfigError, match=r"model.attn_bias"):
        ModelConfig.from_dict({"block": "transformer", "primitive": "attention", "attn_bias": "no"})


def test_attention_bias_option_is_set_by_model_attn_bias():
    with pytest.raises(ConfigError, match=r"'bias' of primitive 'attention' is set by model.attn_bias; set it there"):
        build_model(
            small(primitive="attention", primitive_options={"bias": False}),
            input_kind="numeric",
            head="classify",
            n_out=2,
        )


def test_token_ids_outside_the_vocabulary_are_reported():
    model = build_model(small(), input_kind="tokens", vocab_size=10, head="classify", n_out=2)
    with pytest.raises(ValueError, match="outside the vocabulary of size 10"):
        model(torch.tensor([[1, 2, 12]]))


# ------------------------------------------------------------------ attention-probability dropout
@pytest.mark.parametrize("block", ["transformer", "mamba"])
def test_attn_dropout_off_is_today_s_model_and_on_changes_nothing_in_eval(block):
    """model.attn_dropout reaches every attention (the Transformer block's and an attention
    primitive's). Off (the default, or 0 given) it is the model as built before the field existed:
    the same parameters from the same draws, and in training the same outputs and the same random
    draws; on, the parameters are the same and eval mode gives the same outputs bitwise, while
    training mode drops attention probabilities (so the field does reach the attention)."""
    cfg = small(block=block, primitive="attention")
    x = torch.randn(3, 7, 2)

    def run(model, train):
        model.train(train)
        torch.manual_seed(11)
        return model(x), torch.get_rng_state()

    default, off, on = (numeric_model(c) for c in (cfg, cfg.replace(attn_dropout=0.0), cfg.replace(attn_dropout=0.5)))
    attentions = [m for m in on.modules() if type(m).__name__ == "Attention"]
    assert len(attentions) == cfg.n_layers and all(a.dropout == 0.5 for a in attentions)
    for model in (off, on):
        ref = default.state_dict()
        assert list(model.state_dict()) == list(ref) and all(
            torch.equal(v, ref[k]) for k, v in model.state_dict().items()
        )
    (y_default, rng_default), (y_off, rng_off) = run(default, True), run(off, True)
    assert torch.equal(y_off, y_default) and torch.equal(rng_off, rng_default)
    assert torch.equal(run(on, False)[0], run(default, False)[0])
    assert not torch.allclose(run(on, True)[0], y_default)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(block="transformer", primitive="attention", attn_dropout=1.0), r"model.attn_dropout must be in \[0, 1\)"),
        (
            dict(block="transformer", primitive="attention", attn_dropout=-0.1),
            r"model.attn_dropout must be in \[0, 1\)",
        ),
        (dict(primitive="s4d", attn_dropout=0.1), "model.attn_dropout applies to attention, not to primitive 's4d'"),
        (dict(output_glu=False), "model.output_glu applies to the simple block"),
        (
            dict(block="transformer", primitive="attention", output_glu=False),
            "model.output_glu applies to the simple block",
        ),
    ],
)
def test_new_model_field_errors_name_the_field(kw, match):
    with pytest.raises(ConfigError, match=match):
        small(**kw)


def test_new_model_fields_are_typed():
    with pytest.raises(ConfigError, match="model.attn_dropout"):
        ModelConfig.from_dict({"block": "transformer", "primitive": "attention", "attn_dropout": "lots"})
    with pytest.raises(ConfigError, match="model.output_glu"):
        ModelConfig.from_dict({"block": "simple", "primitive": "s4d", "output_glu": "no"})
    with pytest.raises(
        ConfigError, match=r"'dropout' of primitive 'attention' is set by model.attn_dropout; set it there"
    ):
        build_model(
            small(primitive="attention", primitive_options={"dropout": 0.1}),
            input_kind="numeric",
            head="classify",
            n_out=2,
        )


# ------------------------------------------------------------------ the original S4 output layer
def test_output_glu_false_is_the_v1_output_layer():
    """output_glu (default) keeps Linear(d, 2d) + GLU; False is S4 v1's Linear(d, d) without a GLU:
    y = x + drop(Linear(drop(GELU(primitive(x))))), d^2 + d fewer parameters per layer."""
    d, layers = 8, 2
    glu = numeric_model(small(block="simple", primitive="s4d"))
    plain = numeric_model(small(block="simple", primitive="s4d", output_glu=False))
    assert glu.backbone.blocks[0].output_linear.weight.shape == (2 * d, d)
    assert type(glu.backbone.blocks[0].glu).__name__ == "GLU"
    block = plain.backbone.blocks[0]
    assert block.output_linear.weight.shape == (d, d) and type(block.glu).__name__ == "Identity"
    assert parameter_report(glu)["total"] - parameter_report(plain)["total"] == layers * (d * d + d)
    x = torch.randn(2, 5, d)
    expected = block.norm(x + block.output_linear(torch.nn.functional.gelu(block.mixer(x))), None)
    torch.testing.assert_close(block(x), expected)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"n_ssm": 3}, r"n_ssm must be None \(one per channel\) or a positive divisor of d_model = 8, got 3"),
        ({"n_ssm_A": 16}, r"n_ssm_A must be None .* divisor of d_model = 8, got 16"),
        ({"dt_transform": "sigmoid"}, r"dt_transform must be one of \('exp', 'softplus'\), got 'sigmoid'"),
    ],
)
def test_s4_option_errors_from_the_config_name_the_option(options, match):
    with pytest.raises(ConfigError, match=match):
        numeric_model(small(block="simple", primitive="s4", primitive_options=options))
    if "dt_transform" in options:  # S4D takes it too
        with pytest.raises(ConfigError, match=match):
            numeric_model(small(block="simple", primitive="s4d", primitive_options=options))
