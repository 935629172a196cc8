"""The typed configuration layer: values converted by their declared types, one-line errors naming the field."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import yaml

from longrange import typed
from longrange.errors import ConfigError
from longrange.experiment.config import experiment_from_dict
from longrange.models.config import ModelConfig
from longrange.train.config import TrainConfig


@dataclass
class Inner:
    k: int = 1


@dataclass
class Sample:
    n: int = 1
    x: float = 0.5
    flag: bool = False
    name: str = "a"
    maybe: int | None = None
    either: int | float = 1
    items: list[int] = field(default_factory=list)
    pair: tuple[float, float] = (0.0, 1.0)
    tags: tuple[str, ...] = ()
    options: dict[str, int] = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)


def test_conversions_follow_the_annotations():
    s = typed.from_dict(
        Sample,
        {
            "n": "16",
            "x": "1e-1",
            "flag": "False",
            "maybe": 3.0,
            "either": 2.5,
            "items": [1.0, "2"],
            "pair": [0, "1"],
            "tags": ["a"],
            "options": {"a": "3"},
            "inner": {"k": "4"},
        },
        "s",
    )
    assert s.n == 16 and s.x == 0.1 and s.flag is False and s.maybe == 3 and s.either == 2.5
    assert s.items == [1, 2] and s.pair == (0.0, 1.0) and s.tags == ("a",) and s.options == {"a": 3}
    assert s.inner == Inner(4)
    assert typed.from_dict(Sample, {"either": 3}).either == 3 and isinstance(
        typed.from_dict(Sample, {"either": 3}).either, int
    )
    assert typed.from_dict(Sample, {"maybe": None}).maybe is None


@pytest.mark.parametrize(
    "data, message",
    [
        ({"n": 2.5}, r"s\.n must be an integer, got 2\.5"),
        ({"n": True}, r"s\.n must be an integer"),
        ({"x": "fast"}, r"s\.x must be a number, got 'fast'"),
        ({"flag": "maybe"}, r"s\.flag must be true or false, got 'maybe'"),
        ({"flag": 1}, r"s\.flag must be true or false"),
        ({"name": 3}, r"s\.name must be a string, got 3"),
        ({"items": 3}, r"s\.items must be a list, got 3"),
        ({"items": [1, "x"]}, r"s\.items\[1\] must be an integer"),
        ({"pair": [1, 2, 3]}, r"s\.pair must be a list of 2 values"),
        ({"options": [1]}, r"s\.options must be a mapping"),
        ({"inner": {"k": "x"}}, r"s\.inner\.k must be an integer"),
        ({"inner": {"kk": 1}}, r"unknown field\(s\) s\.inner\.kk \(did you mean k\?\)"),
        ({"nn": 1}, r"unknown field\(s\) s\.nn \(did you mean n\?\)"),
    ],
)
def test_wrong_types_are_one_line_errors_naming_the_field(data, message):
    with pytest.raises(ConfigError, match=message) as err:
        typed.from_dict(Sample, data, "s")
    assert "\n" not in str(err.value)


def test_model_values_from_yaml_are_converted_or_refused():
    # The cases that used to be silently wrong or to fail after the data had loaded.
    cfg = ModelConfig.from_dict(yaml.safe_load('rope: "false"\nd_model: "16"\nn_layers: 1.0\ndropout: 1e-1\n'))
    assert cfg.rope is False and cfg.d_model == 16 and cfg.n_layers == 1 and cfg.dropout == pytest.approx(0.1)
    assert isinstance(cfg.n_layers, int) and isinstance(cfg.d_model, int)
    with pytest.raises(ConfigError, match=r"model\.d_model must be an integer, got 2\.5"):
        ModelConfig.from_dict({"d_model": 2.5})
    with pytest.raises(ConfigError, match=r"model\.rope must be true or false, got 'off please'"):
        ModelConfig.from_dict({"rope": "off please"})


def test_every_experiment_section_is_typed_before_data_loads():
    base = {"task": {"name": "listops", "data_dir": "/nonexistent"}}
    exp = experiment_from_dict(
        {
            **base,
            "task": {**base["task"], "train_subset": "0.5", "skip_bad": "true"},
            "compare": {"seeds": ["1", 2.0]},
            "objective": {"span": "2"},
        }
    )
    assert exp.task.train_subset == 0.5 and exp.task.skip_bad is True
    assert exp.compare.seeds == [1, 2] and exp.objective.span == 2
    cases = [
        ({"compare": {"seeds": [0.5]}}, r"compare\.seeds\[0\] must be an integer"),
        ({"compare": {"compute_matched": "sometimes"}}, r"compare\.compute_matched must be true or false"),
        ({"objective": {"mask_ratio": "lots"}}, r"objective\.mask_ratio must be a number or null"),
        ({"task": {"skip_bad": 2}}, r"task\.skip_bad must be true or false"),
        ({"train": {"epochs": 2.5}}, r"train\.epochs must be an integer"),
        ({"pretrain": {"lr": "fast"}}, r"pretrain\.lr must be a number"),
        ({"finetune": {"epochs": "x"}}, r"finetune\.epochs must be an integer"),
        ({"pretrain_model": {"dropout": "x"}}, r"pretrain_model\.dropout must be a number"),
        ({"pretrain_task": {"seed": "x"}}, r"pretrain_task\.seed must be an integer"),
        ({"modle": {}}, r"unknown field\(s\) modle \(did you mean model\?\)"),
    ]
    for extra, message in cases:
        with pytest.raises(ConfigError, match=message):
            experiment_from_dict({**base, **extra})


def test_train_config_keeps_its_range_checks():
    assert TrainConfig.from_dict({"betas": ["0.9", 0.95]}).betas == (0.9, 0.95)
    with pytest.raises(ConfigError, match=r"train\.lr must be a positive number"):
        TrainConfig.from_dict({"lr": -1})
