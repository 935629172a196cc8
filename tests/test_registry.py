"""The registries of the extension points: lookups, option checks before construction, plugins."""

from __future__ import annotations

import inspect
import sys

import pytest
import torch

import longrange.data  # noqa: F401  (registers the tasks)
from longrange import registry as registry_module
from longrange.data.tasks import TASKS
from longrange.errors import ConfigError
from longrange.models import ModelConfig, build_model
from longrange.models.backbone import make_primitive
from longrange.models.registry import BLOCKS, HEADS, PRIMITIVES, block_names, head_names, primitive_names
from longrange.objectives import OBJECTIVES
from longrange.registry import PLUGINS_ENV, Registry


class Widget:
    def __init__(self, size: int, *, colour: str, shine: float = 0.5, depth: int = 1):
        if size < 0:
            raise TypeError("a bug inside the constructor")
        self.size, self.colour, self.shine, self.depth = size, colour, shine, depth


def make_registry() -> Registry:
    reg = Registry("widget")
    reg.register("widget", Widget)
    return reg


def test_builtin_names():
    assert (
        primitive_names()
        == list(PRIMITIVES)
        == [
            "attention",
            "base-conv",
            "deltanet",
            "dlr",
            "gated-deltanet",
            "gla",
            "h3",
            "hyena",
            "linear-attention",
            "lru",
            "mamba2",
            "mamba3",
            "rwkv",
            "s4",
            "s4d",
            "s6",
        ]
    )
    assert block_names() == list(BLOCKS) == ["hf", "mamba", "residual", "simple", "transformer"]
    assert head_names() == ["classify", "decode-last", "regress", "retrieval", "tokens"]
    assert OBJECTIVES.names() == ["causal", "classification", "masked", "positions", "regression"]
    assert {
        "listops",
        "text",
        "retrieval",
        "image",
        "pathfinder",
        "bidmc-hr",
        "species",
        "selective-copying",
        "induction-heads",
        "mqar",
        "associative-recall",
    } <= set(TASKS)
    assert "s4d" in PRIMITIVES and "s5" not in PRIMITIVES


def test_unknown_names_suggest_the_closest_and_list_the_known():
    reg = make_registry()
    with pytest.raises(
        ConfigError, match=r"unknown widget 'widgte' \(did you mean 'widget'\?\); known widgets: widget"
    ):
        reg.get("widgte")
    with pytest.raises(
        ConfigError,
        match=r"unknown primitive 's4dd' \(did you mean 's4d'.*known primitives: attention, base-conv, deltanet, dlr, gated-deltanet, gla, h3, hyena, linear-attention, lru, mamba2, mamba3, rwkv, s4, s4d, s6",
    ):
        make_primitive("s4dd", 8)
    with pytest.raises(ConfigError, match=r"unknown block 'mambo' \(did you mean 'mamba'\?\)"):
        BLOCKS.get("mambo")
    with pytest.raises(ConfigError, match=r"unknown head 'clasify' \(did you mean 'classify'\?\)"):
        build_model(ModelConfig(n_layers=1, d_model=8, d_state=4), input_kind="numeric", head="clasify", n_out=2)
    with pytest.raises(ConfigError, match=r"unknown task 'listop' \(did you mean 'listops'\?\)"):
        longrange.data.get_spec("listop")


def test_build_checks_options_against_the_signature_before_construction():
    reg = make_registry()
    w = reg.build("widget", 3, colour="red")
    assert (w.size, w.colour, w.shine) == (3, "red", 0.5)
    assert reg.options("widget", 1) == {"colour": inspect.Parameter.empty, "shine": 0.5, "depth": 1}
    with pytest.raises(
        ConfigError,
        match=r"unknown option 'shin' for widget 'widget' \(did you mean 'shine'\?\); valid options: colour, depth, shine",
    ):
        reg.build("widget", 3, colour="red", shin=1.0)
    with pytest.raises(ConfigError, match=r"widget 'widget' needs the option\(s\) colour"):
        reg.build("widget", 3)
    with pytest.raises(ConfigError, match="'size' of widget 'widget' is set by the builder"):
        reg.build("widget", 3, colour="red", size=4)
    with pytest.raises(ConfigError, match=r"takes 1 positional argument\(s\), is built with 2"):
        reg.build("widget", 3, 4, colour="red")
    with pytest.raises(ConfigError, match="^model.widget_options: unknown option"):
        reg.build_from("widget", (3,), {"colour": "red", "size2": 1}, where="model.widget_options")
    # offered settings go only to parameters the constructor names, and options override them
    w = reg.build_from("widget", (3,), {"colour": "red", "depth": 5}, offered={"depth": 2, "shine": 0.9, "n_heads": 8})
    assert (w.depth, w.shine) == (5, 0.9)
    # an error inside the constructor is not relabelled
    with pytest.raises(TypeError, match="a bug inside the constructor"):
        reg.build("widget", -1, colour="red")


def test_registering_twice():
    reg = make_registry()

    class Other(Widget):
        pass

    with pytest.raises(ConfigError, match=r"widget 'widget' is already registered \(.*Widget\)"):
        reg.register("widget", Other)
    reg.register("widget", Other, replace=True)
    assert reg.get("widget") is Other
    # the same definition again (its module imported anew) replaces silently
    Again = type("Other", (Widget,), {"__module__": Other.__module__, "__qualname__": Other.__qualname__})
    reg.register("widget", Again)
    assert reg.get("widget") is Again
    reg.unregister("widget")
    assert list(reg) == []
    with pytest.raises(ConfigError, match="non-empty string"):
        reg.register("", Widget)


def test_model_settings_are_not_options():
    cfg = dict(block="simple", n_layers=1, d_model=8, d_state=4)
    with pytest.raises(
        ConfigError, match=r"model.primitive_options: 'd_state' of primitive 's4d' is set by model.d_state"
    ):
        build_model(
            ModelConfig(primitive="s4d", primitive_options={"d_state": 8}, **cfg),
            input_kind="numeric",
            head="classify",
            n_out=2,
        )
    with pytest.raises(ConfigError, match=r"'block_size' of primitive 'attention' is set by model.attn_block_size"):
        build_model(
            ModelConfig(primitive="attention", n_heads=2, primitive_options={"block_size": 2}, **cfg),
            input_kind="numeric",
            head="classify",
            n_out=2,
        )
    # the renamed S6 option is unknown, with its successor listed
    with pytest.raises(ConfigError, match=r"unknown option 'use_fast_path' for primitive 's6'.*scan_impl"):
        make_primitive("s6", 8, d_state=4, use_fast_path=False)
    # Mamba's dt_rank is a default that an option may override
    model = build_model(
        ModelConfig(block="mamba", primitive="s6", n_layers=1, d_model=8, d_state=4, primitive_options={"dt_rank": 3}),
        input_kind="numeric",
        head="classify",
        n_out=2,
    )
    assert model.backbone.mixers()[0].dt_rank == 3


def test_a_primitive_without_bidirectional_mode_is_refused(monkeypatch):
    class CausalOnly(torch.nn.Module):
        def __init__(self, d_model: int):
            super().__init__()
            self.d_model = d_model

    monkeypatch.setitem(PRIMITIVES._entries, "causal-only", CausalOnly)
    assert isinstance(make_primitive("causal-only", 8, d_state=4), CausalOnly)
    with pytest.raises(ConfigError, match="primitive 'causal-only' has no bidirectional mode"):
        make_primitive("causal-only", 8, d_state=4, bidirectional=True)


def test_heads_and_objectives_build_by_name():
    assert type(HEADS.build("classify", 8, 3)).__name__ == "PooledHead"
    from longrange.models import make_head

    # settings go to the heads that take them
    assert make_head("retrieval", 8, 2, "last", hidden=5).mlp[0].out_features == 5
    assert make_head("tokens", 8, 3, "last", hidden=5).linear.out_features == 3
    assert make_head("regress", 8, 1, "last").pooling == "last"
    masked = OBJECTIVES.build("masked", "tokens", 0.15, vocab_size=10)
    assert masked.ratio == 0.15 and masked.metric == "loss"
    with pytest.raises(ConfigError, match=r"unknown option 'spans' for objective 'masked' \(did you mean 'span'\?\)"):
        OBJECTIVES.build("masked", "tokens", 0.15, spans=2)


def test_plugins_named_in_the_environment_are_imported_at_the_first_lookup(tmp_path, monkeypatch):
    (tmp_path / "my_longrange_plugin.py").write_text(
        "from longrange.layers import SequencePrimitive, register_primitive\n"
        "@register_primitive('plugin-identity')\n"
        "class Identity(SequencePrimitive):\n"
        "    def __init__(self, d_model: int):\n"
        "        super().__init__()\n"
        "        self.d_model = d_model\n"
        "    def forward(self, x, mask=None):\n"
        "        return x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(PLUGINS_ENV, " my_longrange_plugin , ")
    monkeypatch.setattr(registry_module, "_plugins_loaded", set())
    try:
        assert "plugin-identity" in PRIMITIVES
        assert "my_longrange_plugin" in sys.modules
        assert ModelConfig(block="simple", primitive="s4d").primitive == "s4d"
        layer = make_primitive("plugin-identity", 4, d_state=4)
        x = torch.randn(2, 3, 4)
        assert torch.equal(layer(x), x)
        monkeypatch.setenv(PLUGINS_ENV, "my_longrange_plugin,no_such_longrange_plugin")
        with pytest.raises(
            ConfigError, match=f"{PLUGINS_ENV} names the module 'no_such_longrange_plugin', which cannot be found"
        ):
            PRIMITIVES.names()
    finally:
        PRIMITIVES.unregister("plugin-identity")
        sys.modules.pop("my_longrange_plugin", None)


def test_a_registered_block_builds_the_backbone(monkeypatch):
    from longrange.blocks import SimpleBlock
    from longrange.models import make_mixer, register_block

    @register_block("plain")
    def plain_block(cfg):
        return SimpleBlock(make_mixer(cfg), dropout=cfg.dropout, norm="none")

    try:
        cfg = ModelConfig(block="plain", primitive="s4d", n_layers=2, d_model=8, d_state=4, norm="none", prenorm=False)
        model = build_model(cfg, input_kind="numeric", head="classify", n_out=2)
        assert [type(b).__name__ for b in model.backbone.blocks] == ["SimpleBlock", "SimpleBlock"]
        assert [type(m).__name__ for m in model.backbone.mixers()] == ["S4D", "S4D"]
        assert model(torch.randn(2, 5, 1)).shape == (2, 2)
    finally:
        BLOCKS.unregister("plain")
