"""Hybrid stacks (``model.layers``): a pattern of layers repeated to fill ``n_layers``, each a primitive
in its block or a channel mixer of its own."""

from __future__ import annotations

import pytest
import torch

from longrange.cli import main
from longrange.errors import ConfigError
from longrange.identity import identity
from longrange.models import ModelConfig, build_model, layer_report, parameter_report, state_size

SMALL = dict(d_model=32, d_state=4, n_heads=2)


def hybrid(**kw) -> ModelConfig:
    return ModelConfig.from_dict({"block": "residual", "mlp": "none", **SMALL, **kw})


def token_model(cfg: ModelConfig):
    return build_model(cfg, input_kind="tokens", vocab_size=11, head="tokens", n_out=11)


def test_the_pattern_repeats_to_fill_n_layers_and_names_the_model():
    cfg = hybrid(layers=["mamba2", "mamba2", "mamba2", "attention"], n_layers=8)
    assert [layer.name for layer in cfg.stack()] == ["mamba2"] * 3 + ["attention"] + ["mamba2"] * 3 + ["attention"]
    assert cfg.name == "residual[mamba2*3,attention]*2"
    assert cfg.describe() == "residual[mamba2*3,attention]*2 causal L=8 d=32 heads=2 N=4"
    # n_layers left out of a YAML mapping: one repeat of the pattern
    mad = hybrid(layers=["gla", "swiglu", "gla", "swiglu"])
    assert mad.n_layers == 4 and mad.name == "residual[gla,swiglu,gla,swiglu]"
    # a model of one primitive is named and built as before
    assert ModelConfig(block="mamba", primitive="s6").name == "mamba-s6"
    assert [layer.name for layer in ModelConfig(n_layers=2).stack()] == ["mamba-s6", "mamba-s6"]


def test_a_layer_in_another_block_and_with_its_own_options():
    cfg = hybrid(layers=[{"block": "mamba", "primitive": "s6"}, {"primitive": "gla", "options": {"chunk_size": 8}}])
    first, second = cfg.stack()
    assert (first.cfg.block, first.cfg.primitive, first.name) == ("mamba", "s6", "mamba-s6")
    assert second.cfg.primitive_options == {"chunk_size": 8} and second.name == "gla"
    model = token_model(cfg)
    assert type(model.backbone.blocks[0]).__name__ == "MambaBlock"
    assert model.backbone.blocks[1].mixer.chunk_size == 8
    assert cfg.name == "residual[mamba-s6,gla]"


def test_the_stack_round_trips_and_an_empty_stack_leaves_the_identity_alone():
    cfg = hybrid(layers=["mamba2", {"primitive": "attention"}, "swiglu"], n_layers=6)
    again = ModelConfig.from_dict(cfg.to_dict())
    assert again == cfg and again.name == cfg.name
    assert "layers" not in identity({"model": ModelConfig().to_dict()})["model"]
    assert identity({"model": cfg.to_dict()})["model"]["layers"] == cfg.layers


def test_the_stacks_parameters_are_the_sum_of_its_layers_each_as_in_a_model_of_one_primitive():
    cfg = hybrid(layers=["mamba2", "swiglu", "attention", "gla"])
    model = token_model(cfg)
    rows = layer_report(model, seq_len=32)
    assert [r["name"] for r in rows] == ["mamba2", "swiglu", "attention", "gla"]
    backbone = sum(p.numel() for p in model.backbone.parameters())
    assert sum(r["params"] for r in rows) + sum(p.numel() for p in model.backbone.final_norm.parameters()) == backbone
    report = parameter_report(model, seq_len=32)
    assert report["total"] == backbone + report["encoder"] + report["head"]
    assert report["in_primitives"] == sum(r["in_primitives"] for r in rows)
    assert report["state"] == sum(r["state"] for r in rows) == state_size(model, 32)
    for row in rows:
        if row["name"] == "swiglu":
            assert row["in_primitives"] == 0 and row["state"] == 0
            hidden = 88  # 2/3 * mlp_ratio 4 * 32, rounded up to a multiple of 8
            assert row["params"] == 2 * 32 * hidden + hidden * 32 + 32  # gate and up, down, and its norm
            continue
        alone = token_model(ModelConfig(block="residual", mlp="none", primitive=row["name"], n_layers=1, **SMALL))
        assert row["params"] == sum(p.numel() for p in alone.backbone.blocks[0].parameters())
        assert row["state"] == state_size(alone, 32)


def test_a_causal_stack_steps_as_it_runs():
    torch.manual_seed(0)
    cfg = hybrid(
        layers=["mamba2", "swiglu", "attention", {"block": "mamba", "primitive": "s6"}, "mlp"], primitive_options={}
    )
    model = token_model(cfg).double().eval()
    x = torch.randint(0, 11, (2, 9))
    full = model(x)
    state = model.default_state(2, dtype=torch.float64)
    stepped = []
    for t in range(x.shape[1]):
        y, state = model.step(x[:, t], state)
        stepped.append(y)
    torch.testing.assert_close(torch.stack(stepped, dim=1), full, rtol=1e-9, atol=1e-9)


def test_a_bidirectional_stack_sees_the_future():
    torch.manual_seed(0)
    cfg = hybrid(layers=["gla", "swiglu", "attention"], direction="bidirectional")
    model = token_model(cfg).eval()
    x = torch.randint(0, 11, (1, 8))
    changed = x.clone()
    changed[0, -1] = (x[0, -1] + 1) % 11
    assert not torch.allclose(model(x)[0, 0], model(changed)[0, 0])
    causal = token_model(hybrid(layers=["gla", "swiglu", "attention"])).eval()
    torch.testing.assert_close(causal(x)[0, :-1], causal(changed)[0, :-1])


def test_model_wide_settings_go_to_the_layers_they_concern():
    cfg = hybrid(layers=["gla", "attention"], attn_window=4, attn_dropout=0.1, mlp="gelu")
    gla, attention = cfg.stack()
    assert (gla.cfg.attn_window, gla.cfg.attn_dropout, gla.cfg.mlp) == (None, 0.0, "gelu")
    assert (attention.cfg.attn_window, attention.cfg.attn_dropout) == (4, 0.1)
    mixed = hybrid(layers=[{"block": "mamba", "primitive": "s6"}, "attention"], mlp="gelu")
    assert mixed.stack()[0].cfg.mlp == "swiglu" and mixed.stack()[1].cfg.mlp == "gelu"


def test_an_entry_sets_model_fields_for_its_layer_alone():
    cfg = hybrid(
        layers=[
            {"primitive": "gla", "n_heads": 4},
            "attention",
            {"primitive": "swiglu", "mlp_ratio": 2},
            {"primitive": "mamba2", "d_state": 8, "mlp": "gelu"},
        ]
    )
    gla, attention, swiglu, mamba2 = cfg.stack()
    assert (gla.cfg.n_heads, attention.cfg.n_heads) == (4, 2)
    assert (mamba2.cfg.d_state, mamba2.cfg.mlp, gla.cfg.d_state, gla.cfg.mlp) == (8, "gelu", 4, "none")
    model = token_model(cfg)
    assert model.backbone.blocks[0].mixer.n_heads == 4 and model.backbone.blocks[1].mixer.n_heads == 2
    assert model.backbone.blocks[3].mixer.d_state == 8 and model.backbone.blocks[3].mlp is not None
    assert model.backbone.blocks[2].mlp.down.in_features == 48  # 2/3 * 2 * 32 = 42.7, rounded up to a multiple of 8
    # rotary positions: attention takes them from the model; a Mamba block in a stack only from its entry
    rope = hybrid(layers=[{"block": "mamba", "primitive": "s6"}, "attention"], rope=True, mlp="gelu")
    assert [layer.cfg.rope for layer in rope.stack()] == [False, True]
    own = hybrid(layers=[{"block": "mamba", "primitive": "s6", "rope": True}, "attention"], mlp="gelu")
    assert [layer.cfg.rope for layer in own.stack()] == [True, False]


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"layers": [{"primitive": "gla", "attn_window": 4}]},
            "model.layers[0] (gla): model.layers[0].attn_window applies to attention, not to primitive 'gla'",
        ),
        ({"layers": [{"primitive": "gla", "n_heads": "four"}]}, "model.layers[0].n_heads must be an integer"),
        (
            {"layers": ["gla", {"primitive": "swiglu", "n_heads": 2}]},
            "model.layers[1]: the channel mixer 'swiglu' takes only mlp_ratio, norm, prenorm, not n_heads",
        ),
        ({"layers": ["mamba2", "atention"]}, "model.layers[1] = 'atention' is neither a primitive nor a channel mixer"),
        ({"layers": ["mamba2", "atention"]}, "did you mean 'attention'"),
        (
            {"layers": ["mamba2", "attention"], "n_layers": 3},
            "model.n_layers = 3 is not a multiple of the 2 entries of model.layers",
        ),
        ({"layers": ["swiglu", "mlp"]}, "only channel mixers"),
        ({"layers": ["mamba2"], "primitive_options": {"chunk_size": 8}}, "give a layer its options as"),
        ({"layers": ["mamba2", "gla"], "attn_window": 4}, "model.attn_window applies to attention, which no layer"),
        ({"layers": [{"block": "mamba", "primitive": "s6"}], "mlp": "gelu"}, "model.mlp applies to the residual block"),
        (
            {"layers": [{"primitive": "gla", "block": "transformer"}]},
            "model.layers[0] (gla): model.block = 'transformer'",
        ),
        ({"layers": [{"primitive": "gla", "width": 3}]}, "unknown field(s) model.layers[0].width"),
        ({"layers": [{"primitive": "gla", "block": "mambaa"}]}, "did you mean 'mamba'"),
        (
            {"layers": [{"primitive": "swiglu", "options": {"x": 1}}]},
            "takes only mlp_ratio, norm, prenorm, not options",
        ),
        ({"layers": [3]}, "model.layers[0] must be a primitive's name or a mapping"),
        ({"layers": ["gla"], "direction": "placebo"}, "model.layers[0] (gla): model.direction = 'placebo'"),
    ],
)
def test_a_bad_stack_is_a_clear_error(fields, message):
    with pytest.raises(ConfigError) as err:
        hybrid(**fields)
    assert message in str(err.value)


def test_a_bidirectional_layer_in_a_generating_model_is_an_error():
    with pytest.raises(ConfigError) as err:
        token_model(hybrid(layers=["attention", {"primitive": "gla", "options": {"bidirectional": True}}]))
    assert str(err.value).startswith(
        "model.layers[1] (gla): model.layers[1].options: 'bidirectional' of primitive 'gla' is set by model.direction"
    )


def test_a_bidirectional_stack_needs_primitives_with_a_bidirectional_mode():
    from longrange.layers import SequencePrimitive, register_primitive
    from longrange.layers.registry import PRIMITIVES

    @register_primitive("one-way-test")
    class OneWay(SequencePrimitive):
        def __init__(self, d_model: int):
            super().__init__()
            self.d_model = d_model

    try:
        with pytest.raises(
            ConfigError,
            match=r"model.layers\[1\] \(one-way-test\): primitive 'one-way-test' has no "
            "bidirectional mode",
        ):
            token_model(hybrid(layers=["gla", "one-way-test"], direction="bidirectional"))
    finally:
        PRIMITIVES.unregister("one-way-test")


def test_a_stack_is_not_morphed_or_pretrained_causally_into_a_bidirectional_model():
    from longrange.experiment.stage import pretraining_model_config

    bi = hybrid(layers=["gla", "attention"], direction="bidirectional", block="mamba", mlp="swiglu")
    with pytest.raises(ConfigError, match=r"bidirectional mamba\[gla,attention\] model"):
        pretraining_model_config(bi, "causal")


def test_params_prints_each_layer(capsys):
    assert (
        main(
            [
                "params",
                "--preset",
                "demo/s4d",
                "--per-layer",
                "model.block=residual",
                "model.mlp=none",
                "model.direction=causal",
                "model.layers=[gla,swiglu]",
                "model.n_layers=4",
                "model.n_heads=2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "demo/s4d (residual[gla,swiglu]*2):" in out
    table = [line for line in out.splitlines() if line.startswith("| 0 |") or line.startswith("| 3 |")]
    assert table[0].startswith("| 0 | gla |") and table[1].startswith("| 3 | swiglu |")
    assert "residual[gla,swiglu]*2 causal L=4" in out
