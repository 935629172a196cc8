"""A Hugging Face causal LM (block hf) through the stages: training, causal pretraining then
finetuning, save/load through the run directory (also without the snapshot)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml

from longrange.experiment.config import experiment_from_dict
from longrange.experiment.execute import run_stage
from longrange.experiment.stage import resolve_stage
from longrange.experiment.taskdata import load_data
from longrange.experiment.weights import load_model
from longrange.models.model import parameter_report

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from hf_tiny import write_tiny_lm  # noqa: E402


def experiment(data_dir, lm_dir, pretrained=True):
    return experiment_from_dict(
        {
            "label": "tiny-neox",
            "task": {"name": "listops", "options": {"seq_len": 48}, "data_dir": str(data_dir)},
            "model": {
                "block": "hf",
                "hf": {"model": str(lm_dir), "pretrained": pretrained},
                "pooling": "last",
                "head_layers": 2,
            },
            "train": {"batch_size": 16, "epochs": 1, "lr": 0.003, "progress": False, "log_every": 1},
            "pretrain": {"epochs": 1},
        }
    )


def test_pretrain_causal_then_finetune_and_load_without_the_snapshot(tiny_listops_dir, tmp_path):
    lm_dir = tmp_path / "snapshot"
    write_tiny_lm(lm_dir)
    exp = experiment(tiny_listops_dir, lm_dir)
    pre = run_stage(resolve_stage(exp, "pretrain", objective="causal"), tmp_path / "pre")
    assert pre["steps"] == 4 and pre["params"]["total"] > 0  # 64 training sequences (tiny_listops_dir), batch 16
    record = yaml.safe_load((tmp_path / "pre" / "config.yaml").read_text())
    assert (
        record["head"]["vocab"][:3] == ["0", "1", "2"] and record["head"]["hf_resolved"]["config"]["hidden_size"] == 32
    )
    fine = run_stage(resolve_stage(exp, "finetune", init_from=tmp_path / "pre"), tmp_path / "fine")
    assert fine["regime"] == "causal-spt" and 0 <= fine["test"]["accuracy"] <= 1
    transfer = yaml.safe_load((tmp_path / "fine" / "config.yaml").read_text())["record"]["transfer"]
    assert transfer["newly_initialised"] == [
        "head.mlp.0.bias",
        "head.mlp.0.weight",
        "head.mlp.2.bias",
        "head.mlp.2.weight",
    ]
    from longrange.train.checkpoint import load_weights

    assert any(
        k.startswith("backbone.lm.layers.")
        for k in load_weights(tmp_path / "fine" / "checkpoints" / "best.safetensors")
    )
    # The run reloads without the snapshot, with its own weights.
    shutil.rmtree(lm_dir)
    model = load_model(tmp_path / "fine")
    data = load_data(exp.task)
    batch = data.collate([data.test[i] for i in range(4)])
    ref = load_weights(tmp_path / "fine" / "checkpoints" / "best.safetensors")
    for key, value in model.state_dict().items():
        assert torch.equal(value, ref[key]), key
    out = model(batch["inputs"], batch["lengths"])
    assert out.shape == (4, data.spec.n_classes) and torch.isfinite(out).all()
    assert parameter_report(model)["total"] == fine["params"]["total"]


def test_scratch_training_of_a_random_init_lm(tiny_listops_dir, tmp_path):
    lm_dir = tmp_path / "config-only"
    write_tiny_lm(lm_dir, weights=False, tokenizer=False)
    exp = experiment(tiny_listops_dir, lm_dir, pretrained=False)
    summary = run_stage(resolve_stage(exp, "train"), tmp_path / "scratch")
    assert summary["steps"] == 4 and summary["regime"] == "scratch"
    model = load_model(tmp_path / "scratch")
    assert model.encoder.sub_ids[:, 0].tolist() == list(range(model.encoder.vocab_size))
