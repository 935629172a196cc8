"""Stages and the comparison end to end on a tiny generated ListOps."""

from __future__ import annotations

import json

import pytest
import torch

from longrange.errors import CheckpointError, ConfigError
from longrange.experiment.compare import compare
from longrange.experiment.config import apply_overrides, experiment_from_dict, resolve
from longrange.experiment.execute import run_stage
from longrange.experiment.stage import resolve_stage
from longrange.experiment.weights import load_model, transfer_pretrained
from longrange.models.config import ModelConfig
from longrange.models.model import build_model


@pytest.fixture(scope="module")
def listops_dir(tmp_path_factory):
    from longrange.data.generate.listops import generate

    root = tmp_path_factory.mktemp("data")
    generate(
        root / "listops",
        n_train=96,
        n_val=32,
        n_test=32,
        min_length=10,
        max_length=40,
        max_depth=3,
        max_args=4,
        seed=0,
        quiet=True,
    )
    return root


def tiny(data_dir, **model) -> dict:
    m = dict(block="simple", primitive="s4d", n_layers=1, d_model=16, d_state=8, direction="bidirectional")
    m.update(model)
    return {
        "label": "tiny",
        "task": {"name": "listops", "options": {"seq_len": 64}, "data_dir": str(data_dir)},
        "model": m,
        "train": {"batch_size": 16, "epochs": 1, "lr": 0.003, "progress": False, "log_every": 2},
        "pretrain": {"epochs": 2},
    }


def test_pretrain_then_finetune_transfers_encoder_and_backbone(listops_dir, tmp_path):
    config = tiny(listops_dir, dropout=0.1)
    config["pretrain_model"] = {"dropout": 0.0}
    config["pretrain_task"] = {"options": {"truncate": True}}
    exp = experiment_from_dict(config)
    pre = run_stage(resolve_stage(exp, "pretrain", objective="masked"), tmp_path / "pre")
    assert pre["stage"] == "pretrain" and pre["metric"] == "loss" and pre["test"] is None
    pretrained = load_model(tmp_path / "pre")
    # Stage-specific model and task settings are used for pretraining only.
    assert yaml_of(tmp_path / "pre")["model"]["dropout"] == 0.0
    assert yaml_of(tmp_path / "pre")["task"]["options"] == {"seq_len": 64, "truncate": True}
    fine = run_stage(resolve_stage(exp, "finetune", init_from=tmp_path / "pre"), tmp_path / "fine")
    assert fine["regime"] == "masked-spt" and fine["test"]["accuracy"] >= 0
    record = json.loads(json.dumps(__import__("yaml").safe_load((tmp_path / "fine" / "config.yaml").read_text())))
    transfer = record["record"]["transfer"]
    assert transfer["not_transferred"] == ["head.linear.bias", "head.linear.weight"]
    assert transfer["newly_initialised"] == ["head.linear.bias", "head.linear.weight"]
    # The finetuning run started from the pretrained weights: its first logged train loss is a
    # classification loss, and a model rebuilt from its record has the same structure.
    finetuned = load_model(tmp_path / "fine")
    assert yaml_of(tmp_path / "fine")["model"]["dropout"] == 0.1
    assert yaml_of(tmp_path / "fine")["task"]["options"] == {"seq_len": 64}
    assert finetuned.encoder.embedding.weight.shape == pretrained.encoder.embedding.weight.shape


def test_finetune_fails_when_backbone_tensors_are_missing():
    cfg = ModelConfig(block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4)
    target = build_model(cfg, input_kind="tokens", vocab_size=20, head="classify", n_out=3)
    source = build_model(cfg, input_kind="tokens", vocab_size=20, head="tokens", n_out=20)

    class Partial:
        def __init__(self, model, drop):
            self.cfg = model.cfg
            self._state = {k: v for k, v in model.state_dict().items() if k != drop}

        def state_dict(self):
            return self._state

    dropped = next(k for k in source.state_dict() if k.startswith("backbone.") and "mixer" in k)
    with pytest.raises(CheckpointError, match=dropped.replace(".", r"\.")):
        transfer_pretrained(target, Partial(source, dropped))
    with pytest.raises(ConfigError, match="d_model"):
        transfer_pretrained(
            target, build_model(cfg.replace(d_model=12), input_kind="tokens", vocab_size=20, head="tokens", n_out=20)
        )


def test_numeric_pretraining_mask_channel_is_stripped_for_finetuning():
    from longrange.experiment.weights import prepare_source as _prepare_source

    cfg = ModelConfig(block="mamba", primitive="s4d", n_layers=1, d_model=8, d_state=4)
    source = build_model(cfg, input_kind="numeric", d_input=3, head="tokens", n_out=3, mask_channel=True)
    target = build_model(cfg, input_kind="numeric", d_input=3, head="classify", n_out=10)
    prepared, morph = _prepare_source(source, target, None)
    assert morph is None and prepared.encoder.linear.in_features == 3
    report = transfer_pretrained(target, prepared)
    assert torch.equal(target.encoder.linear.weight, source.encoder.linear.weight[:, :3])
    assert report["newly_initialised"] == ["head.linear.bias", "head.linear.weight"]


def test_causal_pretraining_of_bidirectional_mamba_is_morphed_f1(listops_dir, tmp_path):
    exp = experiment_from_dict(tiny(listops_dir, block="mamba", primitive="s6"))
    run_stage(resolve_stage(exp, "pretrain", objective="causal"), tmp_path / "pre")
    assert yaml_of(tmp_path / "pre")["model"]["direction"] == "causal"
    fine = run_stage(resolve_stage(exp, "finetune", init_from=tmp_path / "pre"), tmp_path / "fine")
    assert fine["regime"] == "f1-spt"
    assert yaml_of(tmp_path / "fine")["record"]["transfer"]["morph"] == "f1"
    # Causal pretraining of a bidirectional Simple-S4D model is refused with a clear reason.
    with pytest.raises(ConfigError, match="reverse"):
        run_stage(
            resolve_stage(experiment_from_dict(tiny(listops_dir)), "pretrain", objective="causal"), tmp_path / "x"
        )


def yaml_of(run_dir):
    import yaml

    return yaml.safe_load((run_dir / "config.yaml").read_text())


def test_compare_runs_scratch_spt_and_compute_matched_and_reuses_finished_stages(listops_dir, tmp_path, capsys):
    exp = experiment_from_dict(tiny(listops_dir))
    summaries = compare([exp], tmp_path, seeds=[0], objectives=["masked"])
    regimes = {s["regime"]: s for s in summaries}
    assert set(regimes) == {"scratch", "masked-spt", "scratch-matched"}
    pre = json.loads((tmp_path / "listops" / "tiny" / "masked-spt" / "seed0" / "pretrain" / "summary.json").read_text())
    assert regimes["scratch-matched"]["steps"] == pre["steps"] + regimes["masked-spt"]["steps"]
    again = compare([exp], tmp_path, seeds=[0], objectives=["masked"])
    assert [s["seconds"] for s in again] == [s["seconds"] for s in summaries]
    assert "reusing" in capsys.readouterr().err


def test_compare_checks_objectives_before_training(listops_dir, tmp_path):
    exp = experiment_from_dict(tiny(listops_dir))
    with pytest.raises(ConfigError, match="unknown SPT objective"):
        compare([exp], tmp_path, objectives=["mlm"])
    with pytest.raises(ConfigError, match="reverse"):  # causal SPT of a bidirectional Simple-S4D
        compare([exp], tmp_path, objectives=["causal"])
    assert not list(tmp_path.iterdir())  # nothing was trained


def test_overrides_and_unknown_fields():
    data = apply_overrides(
        {"model": {"d_model": 4}},
        ["model.d_model=128", "train.lr=3e-4", "task.options.seq_len=1024", "compare.seeds=[0,1]"],
    )
    assert data["model"]["d_model"] == 128 and data["train"]["lr"] == 3e-4
    assert data["task"]["options"]["seq_len"] == 1024 and data["compare"]["seeds"] == [0, 1]
    with pytest.raises(ConfigError, match="form field.name=value"):
        apply_overrides({}, ["model.d_model"])
    with pytest.raises(ConfigError, match="unknown field.*model.d_modle.*did you mean d_model"):
        experiment_from_dict({"model": {"d_modle": 3}})
    with pytest.raises(ConfigError, match="unknown field.*train.learning_rate"):
        experiment_from_dict({"train": {"learning_rate": 3}})
    with pytest.raises(ConfigError, match="task.nmae"):
        experiment_from_dict({"task": {"nmae": "x"}})
    with pytest.raises(ConfigError, match="unknown preset"):
        resolve("no/such/preset")


def test_demo_presets_resolve():
    for name in ("demo/dlr", "demo/transformer", "demo/s4d"):
        exp = resolve(name)
        assert exp.task.name == "listops" and exp.compare.objectives == ["masked"]
