"""A run's own configuration given back as ``--config``: read as the experiment it ran (its run
fields left out), so that the same command and seed make a run of the same settings."""

from __future__ import annotations

import pytest
import yaml

from longrange.cli import main
from longrange.errors import ConfigError
from longrange.experiment.config import RUN_FIELDS, experiment_of_run, is_run_config, resolve
from longrange.experiment.stage import resolve_stage
from longrange.train.rundir import RunDir

TINY = [
    "task.generate={config: short, n_train: 40, n_val: 8, n_test: 8, min_length: 8, max_length: 32, "
    "max_depth: 3, max_args: 3}",
    "task.options.seq_len=32",
    "task.train_subset=null",
    "train.batch_size=16",
    "train.epochs=1",
    "model.n_layers=1",
    "model.d_model=8",
    "model.d_state=4",
    "train.progress=false",
]


def test_a_finished_runs_config_reruns_it_with_the_same_settings(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--preset", "demo/s4d", "--out", "first", "--seed", "1", *TINY]) == 0
    saved = RunDir(tmp_path / "first").read_config()
    assert is_run_config(saved) and set(RUN_FIELDS) <= set(saved)
    capsys.readouterr()
    # was: "unknown field(s) data, fingerprint, head, init, record, regime, seed, stage"
    assert main(["train", "--config", "first/config.yaml", "--out", "again", "--seed", "1"]) == 0
    err = capsys.readouterr().err
    assert (
        "first/config.yaml: a run's configuration (train stage, seed 1), read as the experiment it ran: its run "
        "fields (regime, stage, seed, data, init, head, record, fingerprint) are left out"
    ) in err
    again = RunDir(tmp_path / "again").read_config()
    assert again["fingerprint"] == saved["fingerprint"] and again["train"] == saved["train"]
    # the same settings: given its own directory, the command finds the run finished
    assert main(["train", "--config", "first/config.yaml", "--out", "first", "--seed", "1"]) == 1
    assert "already holds a finished run" in capsys.readouterr().err
    # settings apply on top, as on a preset
    wider = resolve(config=tmp_path / "first" / "config.yaml", overrides=["model.d_model=12"])
    assert wider.model.d_model == 12 and wider.label == "S4D" and wider.task.generate["n_train"] == 40


def test_a_pretraining_runs_config_keeps_the_stages_own_settings(tmp_path, capsys):
    """A pretraining stage's config holds the settings the stage ran with (``pretrain``, ``pretrain_model``
    applied); read back, the same pretraining command resolves to the same fingerprint."""
    exp = resolve(
        "demo/s4d",
        overrides=[
            *TINY,
            f"task.data_dir={tmp_path / 'data'}",
            "pretrain.epochs=3",
            "pretrain.lr=0.01",
            "pretrain_model={dropout: 0.2}",
        ],
    )
    stage = resolve_stage(exp, "pretrain", seed=2, objective="masked")
    run = RunDir(tmp_path / "pre")
    written = run.write_config(stage.config())
    assert written["train"]["epochs"] == 3 and written["model"]["dropout"] == 0.2
    back = resolve(config=run.config)
    assert "pretrain stage, objective masked, seed 2" in capsys.readouterr().err
    assert back.train["epochs"] == 3 and back.train["lr"] == 0.01 and "seed" not in back.train
    assert back.model.dropout == 0.2 and back.objective.mask_ratio == exp.objective.mask_ratio
    assert resolve_stage(back, "pretrain", seed=2, objective="masked").fingerprint() == written["fingerprint"]


def test_a_run_config_with_a_field_of_neither_kind_is_still_an_error(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"stage": "train", "fingerprint": "x", "label": "m", "modle": {"d_model": 8}}))
    with pytest.raises(ConfigError, match=r"unknown field\(s\) modle"):
        resolve(config=path)
    out = experiment_of_run(
        {"stage": "train", "seed": 0, "fingerprint": "x", "objective": {"kind": "supervised", "reverse": False}}
    )
    assert out == {"objective": {}, "train": {}}


def test_a_seed_written_in_the_experiment_is_the_stages_and_a_different_one_asked_for_is_an_error():
    """``train.seed`` (or a stage's own ``pretrain.seed``) is the stage's seed when none is asked for;
    ``--seed`` or a comparison's seed that disagrees with it is an error, never a silent replacement."""
    exp = resolve("demo/s4d", overrides=["train.seed=5"])
    stage = resolve_stage(exp, "train")
    assert stage.seed == 5 and stage.train.seed == 5
    assert resolve_stage(exp, "train", seed=5).seed == 5
    with pytest.raises(
        ConfigError, match=r"train.seed is 5 in the experiment, but the stage was asked to run with seed 6"
    ):
        resolve_stage(exp, "train", seed=6)
    plain = resolve("demo/s4d")
    assert resolve_stage(plain, "train").seed == 0 and resolve_stage(plain, "train", seed=3).seed == 3
    own = resolve("demo/s4d", overrides=["train.seed=5", "pretrain.seed=7"])
    assert resolve_stage(own, "pretrain", objective="masked").seed == 7 and resolve_stage(own, "train").seed == 5
