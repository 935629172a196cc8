"""Runs that survive clusters: unfinished inputs, full disks, preemption, dead hosts' locks."""
from __future__ import annotations

import json
import os
import time

import yaml

from longrange.cli import main


def tiny(data_dir, **train) -> dict:
    return {
        "label": "tiny",
        "task": {"name": "listops", "options": {"seq_len": 32}, "data_dir": str(data_dir)},
        "model": dict(block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4, direction="bidirectional"),
        "train": {"batch_size": 16, "epochs": 1, "lr": 0.003, "progress": False, "log_every": 2, **train},
    }


def _config(tmp_path, data_dir, **train):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(tiny(data_dir, **train)))
    return str(path)


def test_a_dead_hosts_lock_is_taken_over_and_in_the_runs_record(tiny_listops_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text(json.dumps({"pid": 4242, "host": "node-a", "started": 0}))
    old = time.time() - 600
    os.utime(run / ".lock", (old, old))
    assert main(["train", "--config", _config(tmp_path, tiny_listops_dir), "--out", str(run)]) == 0
    record = yaml.safe_load((run / "config.yaml").read_text())["record"]
    assert record["lock_taken_over"]["host"] == "node-a" and record["lock_taken_over"]["pid"] == 4242
    assert not (run / ".lock").exists()


def test_finetuning_refuses_an_unfinished_pretraining_run(tiny_listops_dir, tmp_path, capsys):
    from longrange.train.rundir import RunDir, RunLock

    config = _config(tmp_path, tiny_listops_dir, checkpoint_every=1)
    pre, fine = tmp_path / "pre", tmp_path / "fine"
    assert main(["pretrain", "--config", config, "--out", str(pre)]) == 0
    summary = RunDir(pre).summary.read_text()
    # Interrupted (killed after a checkpoint): a checkpoint, no summary.
    RunDir(pre).summary.unlink()
    capsys.readouterr()
    assert main(["finetune", "--config", config, "--out", str(fine), "--from", str(pre)]) == 1
    err = capsys.readouterr().err
    assert f"the pretraining run {pre} was interrupted at step 4 of 4" in err
    assert f"longrange pretrain ... --resume --out {pre}" in err and not fine.exists()
    # Still running in another process: its live lock.
    RunDir(pre).summary.write_text(summary)
    lock = RunLock(pre).acquire()
    assert main(["finetune", "--config", config, "--out", str(fine), "--from", str(pre)]) == 1
    assert f"is still running (PID {os.getpid()}" in capsys.readouterr().err
    lock.release()
    # A failure recorded after the summary: a later attempt failed.
    RunDir(pre).record_failure("ValueError: boom")
    assert main(["finetune", "--config", config, "--out", str(fine), "--from", str(pre)]) == 1
    assert "failed (ValueError: boom" in capsys.readouterr().err
    RunDir(pre).clear_failure()
    # Finished: the finetuning run records the pretraining run's fingerprint and steps.
    assert main(["finetune", "--config", config, "--out", str(fine), "--from", str(pre)]) == 0
    done = json.loads(RunDir(fine).summary.read_text())
    pretrain = yaml.safe_load(RunDir(pre).config.read_text())
    assert done["pretrain"] == {"run": "../pre", "fingerprint": pretrain["fingerprint"], "steps": 4}
