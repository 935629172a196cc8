"""The generated sequence tasks through the command line: train, pretrain and finetune, compare."""

from __future__ import annotations

import json

import pytest
import yaml

from longrange.cli import main
from longrange.train.logging import read_metrics

#: Tiny settings of each task: a few steps of a one-layer causal S4D model, seconds per run.
TINY = {
    "selective-copying": {"vocab_size": 6, "seq_len": 16, "n_tokens": 3},
    "induction-heads": {"vocab_size": 6, "seq_len": 12},
    "mqar": {"vocab_size": 32, "seq_len": 16, "n_pairs": 2},
    "associative-recall": {"vocab_size": 32, "seq_len": 12, "n_pairs": 3},
}
PER_POSITION = {"selective-copying", "induction-heads", "mqar"}


def config_file(tmp_path, task, **model) -> str:
    config = {
        "label": "tiny",
        "task": {"name": task, "options": {**TINY[task], "n_train": 64, "n_val": 32, "n_test": 32}},
        "model": {
            "block": "simple",
            "primitive": "s4d",
            "n_layers": 1,
            "d_model": 8,
            "d_state": 4,
            "direction": "causal",
            "pooling": "last",
            **model,
        },
        # the papers' knobs: batch, steps, lr, weight decay, cosine schedule
        "train": {
            "batch_size": 16,
            "max_steps": 4,
            "lr": 0.003,
            "weight_decay": 0.1,
            "schedule": "cosine",
            "eval_every": 2,
            "log_every": 2,
            "progress": False,
        },
        "pretrain": {"max_steps": 2},
    }
    path = tmp_path / f"{task}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.mark.parametrize("task", sorted(TINY))
def test_train_through_the_command_line(task, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--config", config_file(tmp_path, task), "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["task"] == task and summary["metric"] == "accuracy" and summary["steps"] == 4
    assert summary["data_dir"] == "(generated)"
    config = yaml.safe_load((out / "config.yaml").read_text())
    records = read_metrics(out / "metrics.jsonl")
    if task in PER_POSITION:
        assert config["head"]["kind"] == "tokens" and config["head"]["n_out"] == TINY[task]["vocab_size"] + 5
        assert config["data"]["generator"] == f"{task} v1"
        for metrics in (summary["best_val"], summary["test"]):
            assert set(metrics) == {"loss", "accuracy", "sequence_accuracy"}
            assert 0 <= metrics["sequence_accuracy"] <= metrics["accuracy"] <= 1
        assert {r["split"] for r in records if "sequence_accuracy" in r["metrics"]} == {"train", "val", "test"}
    else:
        assert config["head"]["kind"] == "classify" and set(summary["test"]) == {"loss", "accuracy"}


def test_a_next_token_task_refuses_a_bidirectional_model(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--config", config_file(tmp_path, "mqar", direction="bidirectional"), "--out", str(out)]) == 1
    assert "model.direction=causal" in capsys.readouterr().err
    assert not out.exists()


def test_pretrain_then_finetune_on_a_generated_task(tmp_path, capsys):
    cfg = config_file(tmp_path, "induction-heads")
    pre, fine = tmp_path / "pre", tmp_path / "fine"
    assert main(["pretrain", "--config", cfg, "--out", str(pre), "--objective", "causal"]) == 0
    assert main(["finetune", "--config", cfg, "--out", str(fine), "--from", str(pre)]) == 0
    summary = json.loads((fine / "summary.json").read_text())
    assert summary["regime"] == "causal-spt" and "sequence_accuracy" in summary["test"]


def test_compare_and_report_show_the_sequence_accuracy(tmp_path, capsys):
    out = tmp_path / "cmp"
    cfg = config_file(tmp_path, "mqar")
    assert (
        main(
            [
                "compare",
                "--config",
                cfg,
                "--out",
                str(out),
                "--seeds",
                "0",
                "--objectives",
                "causal",
                "--no-compute-matched",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "mqar (accuracy (%))" in printed
    further = printed[printed.index("### Further metrics") :]
    assert "sequence accuracy (%)" in further
    assert "| tiny | mqar |" in further and "| tiny + causal SPT | mqar |" in further
    assert "sequence accuracy (%)" in (out / "report.md").read_text()
