"""Parameter groups by name (train.param_groups): first match wins, before the hints; errors for
rules that match nothing; with the parameter names of the S4, S4D, S6 and DLR layers."""

from __future__ import annotations

import pytest
import torch

from longrange.errors import ConfigError
from longrange.models.config import ModelConfig
from longrange.models.model import build_model
from longrange.train import TrainConfig, build_optimizer, group_report, param_groups


def model_of(block, primitive, direction="bidirectional"):
    cfg = ModelConfig(block=block, primitive=primitive, n_layers=2, d_model=8, d_state=4, direction=direction)
    return build_model(cfg, input_kind="numeric", d_input=2, head="classify", n_out=3)


def by_name(groups):
    return {g["name"]: g for g in groups}


def test_spt_s4_choice_for_a_b_c_and_delta():
    """SPT's S4: A, B, Δ at the SSM lr 0.001 without weight decay; C at the main lr 0.01 with wd 0.05."""
    model = model_of("simple", "s4")
    rules = [
        {"match": "*.mixer.C_tilde", "lr_scale": 1.0, "weight_decay": 0.05},
        {"match": "*.mixer.log_dt", "lr": 0.001, "weight_decay": 0.0},
        {"match": "*.mixer.*", "weight_decay": 0.0},  # Λ, P, B keep their hinted SSM lr; D its no-decay group
    ]
    cfg = TrainConfig(lr=0.01, weight_decay=0.05, ssm_lr_scale=0.1, param_groups=rules)
    groups = by_name(param_groups(model, cfg))
    c = groups["match:*.mixer.C_tilde"]
    assert c["param_names"] == [f"backbone.blocks.{i}.mixer.C_tilde" for i in range(2)]
    assert c["lr"] == pytest.approx(0.01) and c["weight_decay"] == 0.05
    assert groups["match:*.mixer.log_dt"]["lr"] == 0.001 and groups["match:*.mixer.log_dt"]["peak_lr"] == 0.001
    ssm = groups["match:*.mixer.*+ssm"]
    assert sorted({n.rsplit(".", 1)[1] for n in ssm["param_names"]}) == ["B", "Lambda_imag", "Lambda_real", "P"]
    assert ssm["lr"] == pytest.approx(0.001) and ssm["weight_decay"] == 0.0
    assert groups["match:*.mixer.*+no_decay"]["param_names"] == [f"backbone.blocks.{i}.mixer.D" for i in range(2)]
    assert "default" in groups and all("mixer" not in n for n in groups["default"]["param_names"])
    report = group_report(param_groups(model, cfg))
    assert report["match:*.mixer.C_tilde"]["tensors"] == 2 and report["match:*.mixer.C_tilde"]["lr"] == pytest.approx(
        0.01
    )
    # The optimiser takes these values.
    opt = build_optimizer(model, cfg)
    lr_of = {g["name"]: (g["lr"], g["weight_decay"]) for g in opt.param_groups}
    assert lr_of["match:*.mixer.C_tilde"] == (pytest.approx(0.01), 0.05)


@pytest.mark.parametrize(
    "block, primitive, names",
    [
        ("simple", "s4", {"A": ["Lambda_real", "Lambda_imag", "P"], "B": ["B"], "C": ["C_tilde"], "dt": ["log_dt"]}),
        ("simple", "s4d", {"A": ["A_real", "A_imag"], "B": ["B"], "C": ["C"], "dt": ["log_dt"]}),
        ("simple", "dlr", {"A": ["nu", "theta"], "C": ["C"]}),
        ("mamba", "s6", {"A": ["A_log"], "BCdt": ["x_proj.weight"], "dt": ["dt_proj.weight", "dt_proj.bias"]}),
    ],
)
def test_rules_reach_the_parameters_of_every_primitive(block, primitive, names):
    model = model_of(block, primitive)
    prefix = "*.ssm." if block == "mamba" else "*.mixer."
    rules = [
        {"match": prefix + n, "lr": 1e-4 * (k + 1), "weight_decay": 0.0}
        for k, n in enumerate(n for group in names.values() for n in group)
    ]
    groups = param_groups(model, TrainConfig(lr=0.01, param_groups=rules))
    for k, rule in enumerate(rules):
        (group,) = [g for g in groups if g["name"] == f"match:{rule['match']}"]
        assert group["lr"] == pytest.approx(1e-4 * (k + 1)) and len(group["param_names"]) >= 2


def test_first_match_wins_and_rules_come_before_hints():
    model = model_of("simple", "s4d")
    rules = [{"match": "*.log_dt", "lr_scale": 2.0}, {"match": "*.mixer.*", "lr_scale": 0.5, "weight_decay": 0.3}]
    groups = by_name(param_groups(model, TrainConfig(lr=0.01, ssm_weight_decay=0.0, param_groups=rules)))
    dt = groups["match:*.log_dt+ssm"]
    assert dt["lr"] == pytest.approx(0.02) and dt["weight_decay"] == 0.0  # wd from the SSM hint
    rest = groups["match:*.mixer.*"]
    assert "backbone.blocks.0.mixer.log_dt" not in rest["param_names"]
    assert "backbone.blocks.0.mixer.D" in rest["param_names"] and rest["weight_decay"] == 0.3


def test_rules_that_match_nothing_are_errors_naming_them():
    model = model_of("simple", "s4")
    with pytest.raises(ConfigError, match=r"train.param_groups\[1\] \(match '\*.C'\) matches no trainable parameter"):
        param_groups(model, TrainConfig(param_groups=[{"match": "*.B", "lr": 0.1}, {"match": "*.C", "lr": 0.1}]))
    with pytest.raises(
        ConfigError,
        match=r"param_groups\[1\] \(match '\*.B'\) matches only parameters that earlier "
        r"rules took .*param_groups\[0\]",
    ):
        param_groups(model, TrainConfig(param_groups=[{"match": "*mixer*", "lr": 0.1}, {"match": "*.B", "lr": 0.2}]))
    frozen = model_of("simple", "s4d")
    for p in frozen.head.parameters():
        p.requires_grad_(False)
    with pytest.raises(ConfigError, match="matches no trainable parameter"):
        param_groups(frozen, TrainConfig(param_groups=[{"match": "head.*", "lr": 0.1}]))


@pytest.mark.parametrize(
    "rules, match",
    [
        ([{"lr": 0.1}], r"param_groups\[0\].match"),
        ([{"match": "*.C", "lr": 0.1, "lr_scale": 2}], "both lr and lr_scale"),
        ([{"match": "*.C"}], "sets none of"),
        ([{"match": "*.C", "learning_rate": 0.1}], "unknown key"),
        ([{"match": "*.C", "lr": -1}], r"param_groups\[0\].lr must be > 0"),
        ([{"match": "*.C", "weight_decay": "much"}], r"param_groups\[0\].weight_decay must be a number"),
        (["*.C"], r"param_groups\[0\] must be a mapping"),
        ({"match": "*.C"}, "train.param_groups must be a list"),
    ],
)
def test_rule_config_errors(rules, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig.from_dict({"param_groups": rules})


def test_rules_round_trip_and_yaml_strings():
    cfg = TrainConfig.from_dict({"param_groups": [{"match": "*.C", "lr": "1e-3", "weight_decay": 0}]})
    assert cfg.param_groups == [{"match": "*.C", "lr": 1e-3, "weight_decay": 0.0}]
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


def test_training_applies_the_rules(tmp_path):
    """A frozen-by-rule (lr tiny) parameter barely moves while the rest trains: the rule reaches the optimiser."""
    torch.manual_seed(0)
    model = model_of("simple", "s4d")
    cfg = TrainConfig(lr=0.01, param_groups=[{"match": "*.mixer.C", "lr": 1e-12, "weight_decay": 0.0}])
    opt = build_optimizer(model, cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x = torch.randn(4, 6, 2)
    for _ in range(3):
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()
    for n, p in model.named_parameters():
        moved = (p.detach() - before[n]).abs().max().item()
        if n.endswith("mixer.C"):
            assert moved < 1e-9
        elif n.endswith("output_linear.weight"):
            assert moved > 1e-4
