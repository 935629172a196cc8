"""LRA's rsqrt schedule and the cosine over a given length with cycles, inside the training loop."""

from __future__ import annotations

import math

import pytest
from toy import ToyObjective, toy_setup

from longrange.data.batch import collate
from longrange.train import Trainer
from longrange.train.logging import read_metrics

BASE = {"batch_size": 8, "epochs": 4, "progress": False, "log_every": 1}


def _train_lrs(tmp_path, **cfg):
    model, tr, va, _ = toy_setup()
    trainer = Trainer(model, ToyObjective(), tr, va, collate, {**BASE, **cfg}, tmp_path / "run", tensorboard=False)
    trainer.fit()
    assert trainer.steps_per_epoch == 6
    return [r["lr"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["split"] == "train"]


def test_rsqrt_in_the_loop_is_lra_s_formula_with_a_warmup_longer_than_the_run(tmp_path):
    """24 steps with 40 warmup steps (as LRA's retrieval: 5000 steps, 8000 warmup): the lr only ramps."""
    lrs = _train_lrs(tmp_path, lr=0.05, warmup=40, schedule="rsqrt")
    assert lrs == pytest.approx([0.05 * min(1.0, s / 40) / math.sqrt(max(s, 40)) for s in range(24)], abs=1e-15)
    assert lrs[0] == 0.0


def test_periodic_cosine_in_the_loop(tmp_path):
    """A 10-step cosine (2 of warmup) over a 24-step run rises again after its end."""
    lrs = _train_lrs(
        tmp_path, lr=0.01, warmup=2, schedule="cosine", min_lr_ratio=0.0, cosine_steps=10, cycles="periodic"
    )
    expected = [0.01 * (s + 1) / 2 if s < 2 else 0.01 * 0.5 * (1 + math.cos(math.pi * (s - 2) / 8)) for s in range(24)]
    assert lrs == pytest.approx(expected, abs=1e-12)
    assert lrs[10] == pytest.approx(0.0, abs=1e-12) and lrs[18] == pytest.approx(0.01)
