"""benchmarks/state_tracking_small.py: its runs take the setting it states (parity trained short,
tested long; the four models and their eigenvalue ranges), write every run's accuracies and print
the table; an unknown model is refused by name."""

from __future__ import annotations

import json

import pytest
import repo_scripts


def test_the_setting_is_the_stated_one():
    script = repo_scripts.load("benchmarks/state_tracking_small.py")
    exp = script.experiment("mamba-negative", seed=3, data_seed=1, steps=600)
    assert exp["task"]["name"] == "parity" and exp["task"]["seed"] == 1
    assert {k: exp["task"]["options"][k] for k in ("min_len", "max_len", "eval_min_len", "eval_max_len")} == {
        "min_len": 2,
        "max_len": 12,
        "eval_min_len": 12,
        "eval_max_len": 40,
    }
    assert exp["task"]["options"]["n_train"] == 64 * 600  # fresh examples: one epoch of the run
    assert exp["train"]["seed"] == 3 and exp["model"]["d_model"] == 16 and exp["model"]["n_layers"] == 1
    negative = {m: cfg.get("primitive_options", {}).get("allow_neg_eigval", False) for m, cfg in script.MODELS.items()}
    assert negative == {"mamba": False, "mamba-negative": True, "deltanet": False, "deltanet-negative": True}


def test_a_smoke_run_writes_every_runs_accuracies_and_the_table(tmp_path, capsys):
    script = repo_scripts.load("benchmarks/state_tracking_small.py")
    out = tmp_path / "st"
    script.main(["--steps", "2", "--seeds", "0", "--models", "mamba-negative,deltanet", "--out", str(out)])
    rows = json.loads((out / "results.json").read_text())
    assert [(r["model"], r["seed"], r["data_seed"]) for r in rows] == [("mamba-negative", 0, 1), ("deltanet", 0, 1)]
    assert all(0.0 <= r["test_accuracy"] <= 1.0 and 0.0 <= r["val_accuracy"] <= 1.0 for r in rows)
    printed = capsys.readouterr().out
    assert "| mamba-negative |" in printed and "| deltanet |" in printed and "| mamba |" not in printed


def test_an_unknown_model_is_named():
    script = repo_scripts.load("benchmarks/state_tracking_small.py")
    with pytest.raises(SystemExit):
        script.main(["--models", "mamba3"])
