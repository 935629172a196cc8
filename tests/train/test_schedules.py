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
        LRSchedule("step", total_steps=10)


def test_build_from_config_warmup_fraction_or_steps():
    assert build_schedule(TrainConfig(warmup=0.1), 200).warmup_steps == 20
    assert build_schedule(TrainConfig(warmup=7), 200).warmup_steps == 7
    assert build_schedule(TrainConfig(warmup=500), 200).warmup_steps == 200
