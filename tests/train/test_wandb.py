"""Weights & Biases as a logger (``train.loggers``), in offline mode: no network, no account."""

from __future__ import annotations

import sys

import pytest
from toy import ToyObjective, toy_setup

from longrange.data.batch import collate
from longrange.errors import ConfigError
from longrange.train import TrainConfig, Trainer, load_checkpoint
from longrange.train.logging import open_logger, read_metrics
from longrange.train.rundir import RunDir, fingerprint

WANDB = {
    "batch_size": 8,
    "epochs": 2,
    "lr": 0.01,
    "progress": False,
    "log_every": 2,
    "loggers": ["wandb"],
    "wandb": {"project": "toy"},
}


def _trainer(run_dir, resume=False, **kw):
    model, tr, va, te = toy_setup()
    return Trainer(model, ToyObjective(), tr, va, collate, WANDB, run_dir, test_set=te, resume=resume, **kw)


def test_a_run_logs_its_config_record_metrics_and_summary(tmp_path, wandb_offline):
    trainer = _trainer(tmp_path / "run", extra_config={"task": "toy", "record": {"host": "here"}}, run_group="grid")
    result = trainer.fit()
    (run,) = wandb_offline.runs()
    assert (run["name"], run["group"], run["project"]) == ("run", "grid", "toy")  # default name: the directory's
    config = run["config"]
    assert config["task"] == "toy" and config["train"]["lr"] == 0.01 and config["train"]["loggers"] == ["wandb"]
    record = config["record"]
    assert (
        record["host"] == "here" and record["device"] == result["device"] and record["precision"] == result["precision"]
    )
    assert record["kernels"] == result["kernels"] and record["deterministic"] is False  # added at the end
    # every line of metrics.jsonl, at its step
    history = {}
    for row in run["history"]:
        history.setdefault(row["_step"], {}).update(row)
    lines = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert {line["split"] for line in lines} == {"train", "val", "test"}
    for line in lines:
        for name, value in line["metrics"].items():
            assert history[line["step"]][f"{line['split']}/{name}"] == value
        if line["split"] == "train":
            assert history[line["step"]]["train/lr"] == line["lr"]
    assert run["summary"]["best/value"] == result["best"]["value"] and run["summary"]["step"] == result["step"]
    assert not RunDir(tmp_path / "run").tensorboard.exists()  # not among the loggers


class Stop(Exception):
    pass


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path, wandb_offline):
    first = _trainer(tmp_path / "run")

    def stop(step, path):
        if step == 6:
            raise Stop

    first.on_checkpoint = stop
    with pytest.raises(Stop):
        first.fit()
    saved = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["loggers"]["wandb"]["id"]
    _trainer(tmp_path / "run", resume=True).fit()
    runs = wandb_offline.runs()
    assert len(runs) == 2 and runs[0]["id"] == runs[1]["id"] == saved
    assert max(row["_step"] for row in runs[0]["history"]) == 6
    assert min(row["_step"] for row in runs[1]["history"]) > 6 and "best/value" in runs[1]["summary"]


def test_only_the_main_process_logs(tmp_path, wandb_offline):
    logger = open_logger(RunDir(tmp_path / "run"), TrainConfig.from_dict(WANDB), enabled=False, name="run")
    logger.log(1, 0.1, "train", {"loss": 1.0}, 0.1, 1.0)
    logger.close()
    assert logger.wandb is None and wandb_offline.runs() == [] and not (tmp_path / "run").exists()


def test_logger_settings_do_not_change_the_fingerprint():
    base = {"train": TrainConfig().to_dict()}
    other = {
        "train": TrainConfig.from_dict(
            {
                "loggers": ["tensorboard", "wandb"] if _has_wandb() else [],
                "wandb": {"project": "p", "group": "g", "mode": "offline"},
            }
        ).to_dict()
    }
    assert fingerprint(base) == fingerprint(other)
    assert fingerprint(base) != fingerprint({"train": TrainConfig(deterministic=True).to_dict()})


def _has_wandb() -> bool:
    from longrange import _optional

    return _optional.installed("wandb")


def test_settings_are_checked(monkeypatch):
    with pytest.raises(ConfigError, match="train.loggers must be a list of distinct names among tensorboard, wandb"):
        TrainConfig(loggers=["tensorbord"])
    with pytest.raises(ConfigError, match="train.wandb.mode must be one of online, offline, disabled"):
        TrainConfig(wandb={"mode": "offlin"})
    with pytest.raises(ConfigError, match="train.wandb.*projekt.*did you mean project"):
        TrainConfig.from_dict({"wandb": {"projekt": "p"}})
    # without the package: one line naming the extra, before any run starts
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError) as err:
        TrainConfig(loggers=["tensorboard", "wandb"])
    assert str(err.value) == "train.loggers asks for wandb, which is not installed: pip install 'longrange[wandb]'"
    from longrange.train.wandb_logger import import_wandb

    with pytest.raises(ConfigError, match=r"pip install 'longrange\[wandb\]'$"):
        import_wandb()
