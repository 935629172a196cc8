"""Learning-rate schedules: warmup, cosine to min_lr_ratio, constant, plateau, state round trip."""

from __future__ import annotations

import math

import pytest

from longrange.errors import ConfigError
from longrange.train import LRSchedule, TrainConfig, build_schedule


def test_cosine_values():
    s = LRSchedule("cosine", total_steps=110, warmup_steps=10, min_lr_ratio=0.1)
    assert s.multiplier(0) == pytest.approx(0.1)  # first warmup step: 1/10
    assert s.multiplier(4) == pytest.approx(0.5)
    assert s.multiplier(9) == pytest.approx(1.0)  # warmup end
    assert s.multiplier(10) == pytest.approx(1.0)
    assert s.multiplier(60) == pytest.approx(0.55)  # half way: (1 + 0.1) / 2
    assert s.multiplier(110) == pytest.approx(0.1)  # end: min_lr_ratio
    assert s.multiplier(500) == pytest.approx(0.1)
    values = [s.multiplier(i) for i in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_constant_and_no_warmup():
    s = LRSchedule("constant", total_steps=20, warmup_steps=4)
    assert [s.multiplier(i) for i in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    s = LRSchedule("cosine", total_steps=20, warmup_steps=0, min_lr_ratio=0.0)
    assert s.multiplier(0) == 1.0 and s.multiplier(20) == pytest.approx(0.0)


def test_plateau_reduces_after_patience_and_round_trips():
    s = LRSchedule(
        "plateau", total_steps=100, warmup_steps=0, plateau_factor=0.5, plateau_patience=2, higher_is_better=True
    )
    for value in (0.5, 0.6, 0.6, 0.55):  # improve, improve, 2 without improvement -> halve
        s.observe(value)
    assert s.multiplier(50) == pytest.approx(0.5)
    s.observe(0.59)
    state = s.state_dict()
    t = LRSchedule("plateau", total_steps=100, plateau_factor=0.5, plateau_patience=2)
    t.load_state_dict(state)
    assert t.multiplier(50) == pytest.approx(0.5)
    for x in (s, t):
        x.observe(0.58)  # second bad evaluation since the reduction
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


# ------------------------------------------------------------------ rsqrt (LRA) and cosine cycles
def lra_rsqrt(step: int, constant: float, warmup: int) -> float:
    """LRA's create_learning_rate_scheduler("constant * linear_warmup * rsqrt_decay") at the 0-based
    step it is called with (lra_benchmarks/utils/train_utils.py)."""
    return constant * min(1.0, step / warmup) / math.sqrt(max(step, warmup))


@pytest.mark.parametrize("warmup, total", [(1000, 5000), (8000, 20000), (8000, 5000)])  # ListOps, Text, Retrieval
def test_rsqrt_is_lra_s_formula(warmup, total):
    cfg = TrainConfig(schedule="rsqrt", lr=0.05, warmup=warmup, max_steps=total)
    s = build_schedule(cfg, total)
    assert s.warmup_steps == warmup  # not cut to the run: the retrieval warmup outlasts its 5000 steps
    for step in (0, 1, 17, warmup // 2, warmup - 1, warmup, warmup + 1, total // 2, total - 1, total):
        assert cfg.lr * s.multiplier(step) == pytest.approx(lra_rsqrt(step, 0.05, warmup), rel=1e-12, abs=0)
    # A few values written out: the peak 0.05 / sqrt(warmup), then the decay.
    if (warmup, total) == (1000, 5000):
        assert [round(0.05 * s.multiplier(i), 9) for i in (0, 500, 1000, 4000)] == [
            0.0,
            0.000790569,
            0.001581139,
            0.000790569,
        ]
    if (warmup, total) == (8000, 5000):
        assert 0.05 * s.multiplier(4999) == pytest.approx(0.05 * 4999 / 8000 / math.sqrt(8000))


def transformers_cosine(step: int, warmup: int, training_steps: int) -> float:
    """transformers.get_cosine_schedule_with_warmup's multiplier after the warmup (num_cycles 0.5)."""
    progress = (step - warmup) / max(1, training_steps - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))


def lra_cosine(step: int, warmup: int, steps_per_cycle: int) -> float:
    """LRA's cosine_decay factor: cyclic, back at the peak every steps_per_cycle steps after the warmup."""
    progress = max(0.0, (step - warmup) / steps_per_cycle)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * (progress % 1.0))))


def test_cosine_over_a_given_number_of_steps_ends_where_the_file_s_does():
    """cosine_steps: the file's num_training_steps, not the run: a run of 180 steps of a 200-step
    cosine ends above 0 (SPT's image files: 180000 of 200000 steps end at 2.4% of the peak)."""
    s = build_schedule(TrainConfig(warmup=10, min_lr_ratio=0.0, cosine_steps=200), 180)
    for step in range(10, 181, 7):
        assert s.multiplier(step) == pytest.approx(transformers_cosine(step, 10, 200), abs=1e-12)
    assert s.multiplier(179) == pytest.approx(0.5 * (1 + math.cos(math.pi * 169 / 190)))
    assert 0.02 < s.multiplier(180) < 0.03
    # once: the final ratio is held after the end of the decay
    held = build_schedule(TrainConfig(warmup=0, min_lr_ratio=0.01, cosine_steps=50), 120)
    assert held.multiplier(50) == pytest.approx(0.01) and held.multiplier(119) == pytest.approx(0.01)


def test_periodic_cosine_is_transformers_past_its_end():
    """cycles periodic: past cosine_steps the lr rises again along the cosine, as transformers'
    schedule does when a run outlasts num_training_steps (SPT's Pythia ListOps file: 2000 steps)."""
    s = build_schedule(TrainConfig(warmup=200, min_lr_ratio=0.0, cosine_steps=2000, cycles="periodic"), 10_000)
    for step in list(range(200, 10_000, 97)) + [2000, 3800, 5600]:
        assert s.multiplier(step) == pytest.approx(transformers_cosine(step, 200, 2000), abs=1e-12)
    assert s.multiplier(2000) == pytest.approx(0.0, abs=1e-12) and s.multiplier(3800) == pytest.approx(1.0)
    # with a final ratio, the same shape between it and the peak
    r = build_schedule(TrainConfig(warmup=0, min_lr_ratio=0.1, cosine_steps=100, cycles="periodic"), 1000)
    assert (
        r.multiplier(100) == pytest.approx(0.1)
        and r.multiplier(150) == pytest.approx(0.55)
        and r.multiplier(200) == pytest.approx(1.0)
    )


def test_restarting_cosine_is_lra_s_cosine_decay():
    """cycles restart: back at the peak at the start of every span (LRA's progress % 1.0)."""
    s = build_schedule(TrainConfig(warmup=10, min_lr_ratio=0.0, cosine_steps=60, cycles="restart"), 500)
    for step in range(10, 500, 3):
        assert s.multiplier(step) == pytest.approx(lra_cosine(step, 10, 50), abs=1e-12)
    assert (
        s.multiplier(59) < 0.01 and s.multiplier(60) == pytest.approx(1.0) and s.multiplier(110) == pytest.approx(1.0)
    )


def test_default_cosine_is_unchanged():
    """cosine_steps 0 and cycles once are the cosine over the run, bitwise."""
    for cfg, total in (
        (TrainConfig(), 137),
        (TrainConfig(warmup=0, min_lr_ratio=0.0), 20),
        (TrainConfig(warmup=30), 20),
    ):
        s = build_schedule(cfg, total)
        w = min(cfg.warmup_steps(total), total)
        for step in range(w, total + 20):
            span = total - w
            p = min(1.0, (step - w) / span) if span > 0 else 1.0
            assert s.multiplier(step) == cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (
                1.0 + math.cos(math.pi * p)
            )


@pytest.mark.parametrize(
    "data, match",
    [
        (dict(cycles="sometimes"), "train.cycles must be one of once, periodic, restart"),
        (dict(cosine_steps=-1), "train.cosine_steps must be >= 0"),
        (dict(warmup=100, cosine_steps=100), "train.cosine_steps must exceed train.warmup"),
        (dict(schedule="rsqrt", warmup=0), "train.warmup must be > 0 for schedule 'rsqrt'"),
        (dict(schedule="sqrt"), "train.schedule"),
        (dict(cosine_steps=1.5), "train.cosine_steps"),
    ],
)
def test_new_schedule_fields_errors_name_the_field(data, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig.from_dict(data)


def test_schedule_errors_at_build_time():
    with pytest.raises(ConfigError, match="rsqrt schedule needs train.warmup >= 1"):
        LRSchedule("rsqrt", total_steps=10, warmup_steps=0)
    with pytest.raises(ConfigError, match="train.cosine_steps"):
        build_schedule(TrainConfig(warmup=0.5, cosine_steps=40), 100)  # a warmup of 50 steps
    with pytest.raises(ConfigError, match="train.cycles"):
        LRSchedule("cosine", total_steps=10, cycles="often")
