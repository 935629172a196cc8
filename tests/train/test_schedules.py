"""Learning-rate schedules: warmup, cosine to min_lr_ratio, constant, plateau, state round trip."""
from __future__ import annotations

import math

import pytest

from longrange.errors import ConfigError
from longrange.train import LRSchedule, TrainConfig, build_schedule


def test_cosine_values():
    s = LRSchedule("cosine", total_steps=110, warmup_steps=10, min_lr_ratio=0.1)
    assert s.multiplier(0) == pytest.approx(0.1)         # first warmup step: 1/10
    assert s.multiplier(4) == pytest.approx(0.5)
    assert s.multiplier(9) == pytest.approx(1.0)         # warmup end
    assert s.multiplier(10) == pytest.approx(1.0)
    assert s.multiplier(60) == pytest.approx(0.55)       # half way: (1 + 0.1) / 2
    assert s.multiplier(110) == pytest.approx(0.1)       # end: min_lr_ratio
    assert s.multiplier(500) == pytest.approx(0.1)
    values = [s.multiplier(i) for i in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_constant_and_no_warmup():
    s = LRSchedule("constant", total_steps=20, warmup_steps=4)
    assert [s.multiplier(i) for i in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    s = LRSchedule("cosine", total_steps=20, warmup_steps=0, min_lr_ratio=0.0)
    assert s.multiplier(0) == 1.0 and s.multiplier(20) == pytest.approx(0.0)


def test_plateau_reduces_after_patience_and_round_trips():
    s = LRSchedule("plateau", total_steps=100, warmup_steps=0, plateau_factor=0.5, plateau_patience=2,
                   higher_is_better=True)
    for value in (0.5, 0.6, 0.6, 0.55):   # improve, improve, 2 without improvement -> halve
        s.observe(value)
    assert s.multiplier(50) == pytest.approx(0.5)
    s.observe(0.59)
    state = s.state_dict()
    t = LRSchedule("plateau", total_steps=100, plateau_factor=0.5, plateau_patience=2)
    t.load_state_dict(state)
    assert t.multiplier(50) == pytest.approx(0.5)
    for x in (s, t):
        x.observe(0.58)                   # second bad evaluation since the reduction
    assert s.multiplier(50) == t.multiplier(50) == pytest.approx(0.25)
    s.observe(0.7)
    assert s.bad_evals == 0 and s.best == 0.7


def test_plateau_lower_is_better_and_nan():
    s = LRSchedule("plateau", total_steps=10, plateau_factor=0.1, plateau_patience=1, higher_is_better=False)
    s.observe(1.0)
    s.observe(0.5)
    assert s.multiplier(5) == 1.0
    s.observe(math.nan)
    assert s.multiplier(5) == pytest.approx(0.1)


def test_non_plateau_ignores_observations_and_state_mismatch_errors():
    s = LRSchedule("cosine", total_steps=10)
    s.observe(0.1)
    assert s.state_dict()["scale"] == 1.0
    with pytest.raises(ConfigError, match="'plateau'.*'cosine'"):
        LRSchedule("plateau", total_steps=10).load_state_dict(s.state_dict())
    with pytest.raises(ConfigError, match="train.schedule"):
        LRSchedule("linear-ish", total_steps=10)


def test_build_from_config_warmup_fraction_or_steps():
    assert build_schedule(TrainConfig(warmup=0.1), 200).warmup_steps == 20
    assert build_schedule(TrainConfig(warmup=7), 200).warmup_steps == 7
    assert build_schedule(TrainConfig(warmup=500), 200).warmup_steps == 200


def test_step_decay_values_with_and_without_warmup():
    s = LRSchedule("step", total_steps=100, step_every=10, gamma=0.5)
    assert [s.multiplier(i) for i in (0, 9, 10, 19, 20, 35)] == pytest.approx([1, 1, 0.5, 0.5, 0.25, 0.125])
    w = LRSchedule("step", total_steps=100, warmup_steps=4, step_every=10, gamma=0.5)
    assert [w.multiplier(i) for i in (0, 3, 4, 13, 14, 24)] == pytest.approx([0.25, 1, 1, 1, 0.5, 0.25])
    assert s.state_dict()["kind"] == "step"
    s.observe(0.3)  # no plateau reaction
    assert s.multiplier(10) == pytest.approx(0.5)


def test_step_decay_in_epochs_matches_multistep_milestones():
    """MultiStepLR(milestones=[100, 200, ...], gamma=0.5) stepped per epoch = step decay every 100 epochs."""
    cfg = TrainConfig(schedule="step", step_size=100, step_gamma=0.5, step_unit="epoch", warmup=0)
    spe = 7
    s = build_schedule(cfg, total_steps=500 * spe, steps_per_epoch=spe)
    for epoch in (0, 99, 100, 199, 200, 450):
        expected = 0.5 ** sum(epoch >= m for m in (100, 200, 300, 400, 500))
        assert s.multiplier(epoch * spe) == pytest.approx(expected)
        assert s.multiplier(epoch * spe + spe - 1) == pytest.approx(expected)
    with pytest.raises(ConfigError, match="steps per epoch"):
        build_schedule(cfg, total_steps=100)
    assert build_schedule(TrainConfig(schedule="step", step_size=3, warmup=0), 100).step_every == 3


@pytest.mark.parametrize(
    "data, field",
    [
        (dict(schedule="step"), "train.step_size"),
        (dict(schedule="step", step_size=5, step_gamma=0.0), "train.step_gamma"),
        (dict(schedule="step", step_size=5, step_unit="epochs"), "train.step_unit"),
        (dict(schedule="linear"), "train.schedule"),
    ],
)
def test_step_schedule_config_errors(data, field):
    with pytest.raises(ConfigError, match=field):
        TrainConfig.from_dict(data)
