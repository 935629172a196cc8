"""Parameter groups from optimiser hints, and the training config's checks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from longrange.errors import ConfigError
from longrange.layers.base import set_optim_hint
from longrange.train import TrainConfig, build_optimizer, group_report, param_groups


class Hinted(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 4)
        self.lin = nn.Linear(4, 4)
        self.A = set_optim_hint(nn.Parameter(torch.zeros(4, 3)), "ssm")
        self.dt = set_optim_hint(nn.Parameter(torch.zeros(4)), "ssm", lr_scale=0.5)
        self.D = set_optim_hint(nn.Parameter(torch.zeros(4)), "ssm", weight_decay=0.2)
        self.gain = set_optim_hint(nn.Parameter(torch.ones(4)), "no_decay")
        self.frozen = nn.Parameter(torch.zeros(2), requires_grad=False)
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.emb.weight  # tied: must appear once


def _by_name(groups):
    return {g["name"]: g for g in groups}


def test_groups_follow_hints():
    cfg = TrainConfig(lr=0.01, weight_decay=0.05, ssm_lr_scale=0.1, ssm_weight_decay=0.0)
    groups = _by_name(param_groups(Hinted(), cfg))
    assert set(groups) == {"default", "ssm", "ssm[lr_scale=0.5]", "ssm[weight_decay=0.2]", "no_decay"}
    assert groups["default"]["param_names"] == ["emb.weight", "lin.weight", "lin.bias"]
    assert groups["default"]["lr"] == pytest.approx(0.01) and groups["default"]["weight_decay"] == 0.05
    assert groups["ssm"]["param_names"] == ["A"]
    assert groups["ssm"]["lr"] == pytest.approx(0.001) and groups["ssm"]["weight_decay"] == 0.0
    assert groups["ssm[lr_scale=0.5]"]["lr"] == pytest.approx(0.005)
    assert groups["ssm[lr_scale=0.5]"]["weight_decay"] == 0.0
    assert groups["ssm[weight_decay=0.2]"]["lr"] == pytest.approx(0.001)
    assert groups["ssm[weight_decay=0.2]"]["weight_decay"] == 0.2
    assert groups["no_decay"]["lr"] == pytest.approx(0.01) and groups["no_decay"]["weight_decay"] == 0.0


def test_shared_and_frozen_parameters_and_counts():
    model = Hinted()
    groups = param_groups(model, TrainConfig())
    params = [p for g in groups for p in g["params"]]
    assert len(params) == len({id(p) for p in params})
    assert all(p is not model.frozen for p in params)
    trainable = {id(p): p for p in model.parameters() if p.requires_grad}
    assert {id(p) for p in params} == set(trainable)
    report = group_report(groups)
    assert report["default"] == {"tensors": 3, "parameters": 28 + 16 + 4, "lr": 1e-3, "weight_decay": 0.01}
    assert report["ssm"]["parameters"] == 12
    assert sum(r["parameters"] for r in report.values()) == sum(p.numel() for p in trainable.values())


def test_1d_parameters_to_no_decay_when_asked():
    groups = _by_name(param_groups(Hinted(), TrainConfig(weight_decay_1d=False)))
    assert sorted(groups["no_decay"]["param_names"]) == ["gain", "lin.bias"]
    assert groups["default"]["param_names"] == ["emb.weight", "lin.weight"]


def test_optimizer_applies_group_settings():
    model = Hinted()
    opt = build_optimizer(model, TrainConfig(lr=0.1, weight_decay=0.5, ssm_lr_scale=0.1))
    # With zero gradients AdamW's update is pure decoupled weight decay: p <- p (1 - lr wd).
    for p in model.parameters():
        p.data.fill_(1.0)
        p.grad = torch.zeros_like(p) if p.requires_grad else None
    opt.step()
    assert torch.allclose(model.lin.weight, torch.full_like(model.lin.weight, 1 - 0.1 * 0.5))
    assert torch.equal(model.A, torch.ones_like(model.A))  # ssm: no decay
    assert torch.allclose(model.D, torch.full_like(model.D, 1 - 0.01 * 0.2))
    assert torch.equal(model.gain, torch.ones_like(model.gain))  # no_decay


def test_unknown_hint_group_is_an_error():
    model = nn.Linear(2, 2)
    set_optim_hint(model.weight, "mystery")
    with pytest.raises(ConfigError, match="'weight'.*unknown group 'mystery'"):
        param_groups(model, TrainConfig())
    set_optim_hint(model.weight, "mystery", lr_scale=2.0, weight_decay=0.0)
    groups = _by_name(param_groups(model, TrainConfig(lr=0.1)))
    assert groups["mystery[lr_scale=2,weight_decay=0]"]["lr"] == pytest.approx(0.2)


def test_no_trainable_parameters_is_an_error():
    model = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ConfigError, match="no trainable parameters"):
        param_groups(model, TrainConfig())


def test_config_round_trip_and_coercion():
    cfg = TrainConfig(lr=3e-3, betas=(0.9, 0.98), schedule="plateau", grad_accum=2)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    yaml_like = {"lr": "1e-3", "epochs": 5.0, "betas": [0.8, 0.9], "progress": False}
    cfg = TrainConfig.from_dict(yaml_like)
    assert cfg.lr == 1e-3 and cfg.epochs == 5 and cfg.betas == (0.8, 0.9) and cfg.progress is False


@pytest.mark.parametrize(
    "data, field",
    [
        ({"learning_rate": 0.1}, "learning_rate"),
        ({"lr": -1.0}, "train.lr"),
        ({"lr": "fast"}, "train.lr"),
        ({"epochs": 1.5}, "train.epochs"),
        ({"progress": "yes"}, "train.progress"),
        ({"schedule": "linear"}, "train.schedule"),
        ({"precision": "fp8"}, "train.precision"),
        ({"warmup": 2.5}, "train.warmup"),
        ({"betas": [0.9]}, "train.betas"),
        ({"min_lr_ratio": 2.0}, "train.min_lr_ratio"),
    ],
)
def test_config_errors_name_the_field(data, field):
    with pytest.raises(ConfigError, match=field):
        TrainConfig.from_dict(data)


def test_batch_divisibility_errors():
    cfg = TrainConfig(batch_size=12, grad_accum=4)
    assert cfg.micro_batch(1) == 3
    with pytest.raises(ConfigError, match="not divisible by the world size 5"):
        cfg.micro_batch(5)
    with pytest.raises(ConfigError, match="grad_accum 4"):
        cfg.micro_batch(2)
