"""A run records its training's CPU time beside its wall time (``cpu_seconds``): a process that
waits or is stopped adds wall time and no CPU time; a checkpoint written before the field was
recorded resumes with it unknown (None), never a number counting only the last segment; any other
difference in the trainer's saved fields is refused."""

from __future__ import annotations

import json
import time

import pytest
import torch
from toy import ToyObjective, toy_setup

from longrange.data.batch import collate
from longrange.errors import CheckpointError
from longrange.train import Trainer, load_checkpoint, save_checkpoint
from longrange.train.rundir.summary import RunSummary

CONFIG = {"batch_size": 8, "epochs": 2, "lr": 0.01, "progress": False, "checkpoint_every": 3}


def _trainer(run, **kw) -> Trainer:
    model, tr, va, te = toy_setup()
    return Trainer(model, ToyObjective(), tr, va, collate, dict(CONFIG), run, test_set=te, tensorboard=False, **kw)


@pytest.fixture
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_waiting_adds_wall_time_and_no_cpu_time(tmp_path, one_thread):
    trainer = _trainer(tmp_path / "run")
    waits = []

    def wait(step, path):  # as a process stopped by SIGSTOP, or waiting for a busy machine
        if not waits:
            time.sleep(1.0)
            waits.append(step)

    trainer.on_checkpoint = wait
    result = trainer.fit()
    assert waits and 0 < result["cpu_seconds"] < result["seconds"] - 0.8
    saved = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["trainer"]
    assert 0 < saved["cpu_seconds"] <= result["cpu_seconds"]


def _drop(path, field):
    ckpt = load_checkpoint(path)
    del ckpt["trainer"][field]
    save_checkpoint(ckpt, path)


def _stopped_run(run):
    """A run stopped by an error just after its checkpoint at step 3."""
    trainer = _trainer(run)

    def stop(step, path):
        raise RuntimeError("stopped")

    trainer.on_checkpoint = stop
    with pytest.raises(RuntimeError, match="stopped"):
        trainer.fit()
    return run / "checkpoints" / "last.pt"


def test_a_checkpoint_without_cpu_seconds_resumes_with_it_unknown(tmp_path):
    last = _stopped_run(tmp_path / "old")
    _drop(last, "cpu_seconds")  # as written before the field was recorded
    result = _trainer(tmp_path / "old", resume=True).fit()
    assert result["cpu_seconds"] is None and result["seconds"] > 0 and result["step"] == 12
    assert load_checkpoint(last)["trainer"]["cpu_seconds"] is None
    # a checkpoint with the field resumes with its segments summed
    last = _stopped_run(tmp_path / "new")
    before = load_checkpoint(last)["trainer"]["cpu_seconds"]
    result = _trainer(tmp_path / "new", resume=True).fit()
    assert result["cpu_seconds"] > before > 0


@pytest.mark.parametrize("change", ["unknown", "missing"])
def test_other_differences_in_the_trainers_fields_are_refused(tmp_path, change):
    last = _stopped_run(tmp_path / "run")
    if change == "unknown":
        ckpt = load_checkpoint(last)
        ckpt["trainer"]["wall_clock"] = 1.0
        save_checkpoint(ckpt, last)
    else:
        _drop(last, "epoch")
    with pytest.raises(CheckpointError, match="state fields differ.*--overwrite"):
        _trainer(tmp_path / "run", resume=True)


def test_the_summary_reads_cpu_seconds_or_its_absence(tmp_path):
    base = {
        "task": "t",
        "label": "m",
        "regime": "scratch",
        "stage": "train",
        "seed": 0,
        "metric": "accuracy",
        "higher_is_better": True,
        "best_val": {"accuracy": 0.5},
        "steps": 10,
        "params": {"total": 5, "in_primitives": 3},
        "seconds": 12.5,
    }
    assert RunSummary.from_json(base).cpu_seconds is None  # written before the field
    summary = RunSummary.from_json({**base, "cpu_seconds": 7})
    assert summary.cpu_seconds == 7.0 and isinstance(summary.cpu_seconds, float)
    assert json.loads(json.dumps(summary.to_json()))["cpu_seconds"] == 7.0
    from longrange.errors import DataFormatError

    with pytest.raises(DataFormatError, match="cpu_seconds"):
        RunSummary.from_json({**base, "cpu_seconds": "7 s"}, "x/summary.json")
