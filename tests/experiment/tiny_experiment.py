"""The tiny experiment of the lifecycle and upgrade tests: Simple-S4D on a 32-token ListOps."""

from __future__ import annotations


def tiny(data_dir, **train) -> dict:
    return {
        "label": "tiny",
        "task": {"name": "listops", "options": {"seq_len": 32}, "data_dir": str(data_dir)},
        "model": dict(block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4, direction="bidirectional"),
        "train": {"batch_size": 16, "epochs": 1, "lr": 0.003, "progress": False, "log_every": 2, **train},
    }
