"""The step-decay schedule inside the training loop (epochs converted to steps)."""

from __future__ import annotations

import pytest
from toy import ToyObjective, toy_setup

from longrange.data.batch import collate
from longrange.train import Trainer
from longrange.train.logging import read_metrics


def test_step_decay_per_epoch_in_the_loop(tmp_path):
    model, tr, va, _ = toy_setup()
    cfg = {
        "batch_size": 8,
        "epochs": 4,
        "lr": 0.01,
        "progress": False,
        "log_every": 1,
        "warmup": 0,
        "schedule": "step",
        "step_size": 2,
        "step_unit": "epoch",
        "step_gamma": 0.5,
    }
    trainer = Trainer(model, ToyObjective(), tr, va, collate, cfg, tmp_path / "run", tensorboard=False)
    trainer.fit()
    assert trainer.steps_per_epoch == 6
    lrs = [r["lr"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["split"] == "train"]
    assert lrs == pytest.approx([0.01] * 12 + [0.005] * 12)
