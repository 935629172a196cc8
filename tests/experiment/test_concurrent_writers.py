"""Two `longrange train` processes into the same --out never both run: the second stops at once,
naming the holder's PID and host, and the first run's files are whole (no duplicated lines)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import longrange

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP/SIGCONT (POSIX)")


def _env() -> dict:
    src = str(Path(longrange.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_second_train_into_the_same_out_stops_at_once(tmp_path):
    from longrange.data.generate.listops import generate

    generate(
        tmp_path / "data" / "listops",
        n_train=64,
        n_val=16,
        n_test=16,
        min_length=8,
        max_length=24,
        max_depth=3,
        max_args=3,
        seed=0,
        quiet=True,
    )
    config = tmp_path / "tiny.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "label": "tiny",
                "task": {"name": "listops", "options": {"seq_len": 32}, "data_dir": str(tmp_path / "data")},
                "model": dict(
                    block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4, direction="bidirectional"
                ),
                "train": {
                    "batch_size": 16,
                    "epochs": 1,
                    "lr": 0.003,
                    "progress": False,
                    "log_every": 1,
                    "num_workers": 0,
                },
            }
        )
    )
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "longrange", "train", "--config", str(config), "--out", str(run)]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        deadline = time.time() + 120
        while not (run / ".lock").exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert first.poll() is None and (run / ".lock").exists(), "the first process never took the lock"
        os.kill(first.pid, signal.SIGSTOP)  # the holder is alive but does not move on
        try:
            # the second writer, even one asking to replace the run, stops without touching it
            second = subprocess.run(cmd + ["--overwrite"], capture_output=True, text=True, timeout=120, env=_env())
            assert first.poll() is None  # the first was still holding the directory meanwhile
        finally:
            os.kill(first.pid, signal.SIGCONT)
        assert second.returncode == 1
        err = second.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("longrange train: error: ")
        assert f"in use by PID {first.pid} on host {socket.gethostname()}" in err[0]
        _, first_err = first.communicate(timeout=300)
        assert first.returncode == 0, first_err
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert lines and len(set(lines)) == len(lines)
    keys = [(r["step"], r["split"]) for r in map(json.loads, lines)]
    assert len(set(keys)) == len(keys)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == max(k[0] for k in keys)
    assert not (run / ".lock").exists()
