"""Whole-model initialisation schemes (model.init): what each draws, what it keeps, and its errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from longrange.errors import ConfigError
from longrange.models.config import ModelConfig
from longrange.models.model import build_model


def model(seed: int = 0, **kw):
    base = dict(block="transformer", primitive="attention", n_layers=2, d_model=64, n_heads=2, mlp_ratio=4.0)
    base.update(kw)
    torch.manual_seed(seed)
    return build_model(ModelConfig(**base), input_kind="tokens", head="tokens", n_out=300, vocab_size=300)


def linear_weights(m: nn.Module) -> dict[str, torch.Tensor]:
    return {
        name + ".weight": mod.weight.detach()
        for name, mod in m.named_modules()
        if isinstance(mod, nn.Linear) and mod.weight.numel() >= 1024
    }


def test_gpt2_draws_every_linear_and_embedding_at_its_std_and_rescales_the_named_projections():
    m = model(init="gpt2", init_rescaled=["*.mixer.out_proj.weight"], init_std=0.05)
    weights = linear_weights(m)
    rescaled = {n for n in weights if n.endswith("mixer.out_proj.weight")}
    assert len(rescaled) == 2
    for name, w in weights.items():
        expected = 0.05 / math.sqrt(2 * 2) if name in rescaled else 0.05
        assert w.std().item() == pytest.approx(expected, rel=0.08), name
        assert abs(w.mean().item()) < 0.2 * expected, name
    for name, mod in m.named_modules():
        if isinstance(mod, nn.Linear) and mod.bias is not None:
            assert torch.count_nonzero(mod.bias) == 0, name
        if isinstance(mod, nn.Embedding):
            assert mod.weight.std().item() == pytest.approx(0.05, rel=0.08), name
        if isinstance(mod, nn.LayerNorm):  # norms keep their own initialisation
            assert torch.equal(mod.weight, torch.ones_like(mod.weight)), name


def test_default_keeps_the_layers_own_initialisation():
    m = model()
    w = m.backbone.blocks[0].mixer.qkv.weight
    bound = 1 / math.sqrt(64)  # PyTorch's linear initialisation: uniform within 1/sqrt(fan_in)
    assert w.abs().max().item() <= bound and w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.08)
    assert torch.count_nonzero(m.backbone.blocks[0].mixer.qkv.bias) > 0


def test_mamba_scheme_zeroes_biases_draws_embeddings_and_divides_the_named_projections():
    kw = dict(block="mamba", primitive="s6", d_state=16, n_layers=4)
    m = model(init="mamba", init_rescaled=["backbone.blocks.*.out_proj.weight"], **kw)
    plain = model(**kw)  # the same seed: the layers draw the same values before the scheme runs
    block, plain_block = m.backbone.blocks[0], plain.backbone.blocks[0]
    assert torch.equal(block.in_proj.weight, plain_block.in_proj.weight)  # linear weights: the layers' own
    out = block.out_proj.weight  # PyTorch's initialisation divided by sqrt(n_layers)
    bound = 1 / math.sqrt(out.shape[1]) / math.sqrt(4)
    assert out.abs().max().item() <= bound
    assert out.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)
    assert m.encoder.embedding.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.equal(m.head.linear.weight, plain.head.linear.weight)  # the head: a linear map like the others
    assert torch.count_nonzero(m.head.linear.bias) == 0 < torch.count_nonzero(plain.head.linear.bias)
    # S6's time-step bias sets its time scales: every scheme keeps it (mamba_ssm's _no_reinit)
    for scheme in ("mamba", "gpt2"):
        other = model(init=scheme, **kw)
        for b, p in zip(other.backbone.blocks, plain.backbone.blocks):
            ssm, plain_ssm = b.branches[0].ssm, p.branches[0].ssm
            assert torch.equal(ssm.dt_proj.bias, plain_ssm.dt_proj.bias), scheme
            assert torch.count_nonzero(ssm.dt_proj.bias) == ssm.dt_proj.bias.numel()


def test_a_replaced_head_is_drawn_by_the_scheme():
    m = model(init="gpt2")
    m.replace_head("classify", 1000)
    linear = [mod for mod in m.head.modules() if isinstance(mod, nn.Linear)]
    assert linear and all(mod.weight.std().item() == pytest.approx(0.02, rel=0.08) for mod in linear)
    assert all(torch.count_nonzero(mod.bias) == 0 for mod in linear if mod.bias is not None)
    kept = model(init="mamba")
    kept.replace_head("classify", 1000)
    w = next(mod for mod in kept.head.modules() if isinstance(mod, nn.Linear))
    assert w.weight.std().item() == pytest.approx(1 / math.sqrt(64) / math.sqrt(3), rel=0.08)
    assert torch.count_nonzero(w.bias) == 0
    default = model()
    default.replace_head("classify", 1000)
    w = next(mod for mod in default.head.modules() if isinstance(mod, nn.Linear)).weight
    assert w.std().item() == pytest.approx(1 / math.sqrt(64) / math.sqrt(3), rel=0.08)


def test_a_scheme_builds_on_the_meta_device_as_parameter_counts_do():
    with torch.device("meta"):
        m = model(init="gpt2", init_rescaled=["*.out_proj.weight"])
    assert all(p.is_meta for p in m.parameters())


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(init="xavier"), "model.init = 'xavier' is not one of default, gpt2, mamba"),
        (dict(init="gpt"), "did you mean 'gpt2'"),
        (dict(init="gpt2", init_std=0.0), "model.init_std must be a positive number, got 0.0"),
        (dict(init="gpt2", init_std=float("nan")), "model.init_std must be a positive number"),
        (dict(init="gpt2", init_std=True), "model.init_std must be a positive number, got True"),
        (dict(init="gpt2", init_rescaled=["ok", 3]), "model.init_rescaled must be a list of parameter-name patterns"),
        (dict(init="gpt2", init_rescaled="*.out_proj.weight"), "must be a list of parameter-name patterns"),
        (dict(init_rescaled=["*.out_proj.weight"]), "applies to the 'gpt2' and 'mamba' initialisations"),
    ],
)
def test_bad_settings_are_errors_naming_the_field(fields, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig(block="transformer", primitive="attention", **fields)


def test_a_pattern_that_names_no_parameter_is_an_error_naming_it():
    with pytest.raises(ConfigError, match=r"model.init_rescaled: '\*.fc2.weight' names no parameter of the model"):
        model(init="gpt2", init_rescaled=["*.mixer.out_proj.weight", "*.fc2.weight"])


def test_the_default_scheme_adds_nothing_to_a_runs_identity():
    from longrange.identity import identity

    cfg = {"model": {"init": "default", "init_std": 0.02, "init_rescaled": []}}
    assert identity(cfg).get("model", {}) == {}
    assert identity({"model": {"init": "gpt2"}})["model"] == {"init": "gpt2"}
