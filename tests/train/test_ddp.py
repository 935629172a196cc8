"""Two CPU processes under torchrun (gloo) train exactly like one process with the same global batch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from longrange.train import load_checkpoint
from longrange.train.logging import read_metrics

TOY = Path(__file__).with_name("toy.py")
# Global batch 8 = 2 ranks x 2 micro-batches x 2 items; evaluation batches of 3 leave ragged tails.
CONFIG = {"epochs": 2, "batch_size": 8, "lr": 0.01, "log_every": 2, "eval_batch_size": 3, "seed": 3, "grad_clip": 1.0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_two_process_ddp_equals_single_process(tmp_path):
    single, multi = tmp_path / "single", tmp_path / "ddp"
    p_single = subprocess.Popen(
        [sys.executable, str(TOY), str(single), "--float64", "--config", json.dumps(CONFIG)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    p_multi = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--nnodes=1",
            "--master_addr=127.0.0.1",
            f"--master_port={_free_port()}",
            str(TOY),
            str(multi),
            "--float64",
            "--config",
            json.dumps({**CONFIG, "grad_accum": 2}),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    for proc in (p_single, p_multi):
        # about 35 s on an idle 2-core machine; minutes when other work shares the cores
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]

    a = load_checkpoint(single / "checkpoints" / "last.pt")
    b = load_checkpoint(multi / "checkpoints" / "last.pt")
    assert b["world_size"] == 2 and len(b["rng"]) == 2
    assert a["trainer"]["step"] == b["trainer"]["step"] == 12
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=1e-10, atol=1e-12, msg=key)

    ra, rb = read_metrics(single / "metrics.jsonl"), read_metrics(multi / "metrics.jsonl")
    assert [(r["step"], r["split"]) for r in ra] == [(r["step"], r["split"]) for r in rb]
    for x, y in zip(ra, rb):
        assert x["metrics"].keys() == y["metrics"].keys()
        for name, value in x["metrics"].items():
            assert abs(value - y["metrics"][name]) < 1e-9, (x, y)
    assert any(r["split"] == "val" for r in ra) and any(r["split"] == "test" for r in ra)


def test_distributed_environment_errors(monkeypatch):
    import pytest

    from longrange.errors import ConfigError
    from longrange.train.distributed import init_distributed

    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="WORLD_SIZE must be an integer, got 'two'"):
        init_distributed("cpu")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ConfigError, match="MASTER_ADDR is not set; launch with torchrun"):
        init_distributed("cpu")
    monkeypatch.setenv("WORLD_SIZE", "1")
    env = init_distributed("cpu")
    assert (env.rank, env.world_size, env.distributed, env.is_main) == (0, 1, False, True)
