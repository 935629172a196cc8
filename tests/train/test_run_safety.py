"""Runs never end as silent wrong results: divergence stops the run, one writer per run directory."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time

import pytest
from toy import ToyObjective, toy_setup

from longrange.data.batch import collate
from longrange.errors import ConfigError, TrainingDivergedError
from longrange.train import Trainer
from longrange.train.progress import format_seconds
from longrange.train.rundir import RunLock, RunLockedError, check_out_dir, differences, fingerprint

FAST = {"batch_size": 8, "epochs": 2, "lr": 0.01, "progress": False, "log_every": 2}


def _trainer(path, cfg=None, **kw):
    model, tr, va, te = toy_setup()
    return Trainer(
        model, ToyObjective(), tr, va, collate, {**FAST, **(cfg or {})}, path, test_set=te, tensorboard=False, **kw
    )


def test_a_huge_learning_rate_stops_with_the_step_and_the_last_good_checkpoint(tmp_path):
    trainer = _trainer(tmp_path / "run", cfg={"lr": 1e30, "log_every": 1, "eval_every": 1, "epochs": 4})
    with pytest.raises(TrainingDivergedError, match=r"training diverged at step \d+ of 24: .*(nan|inf|non-finite)"):
        trainer.fit()
    assert not (tmp_path / "run" / ".lock").exists()  # the lock is released on failure


def test_nan_loss_names_the_last_good_checkpoint(tmp_path):
    class NanAfter(ToyObjective):
        def __call__(self, model, batch):
            out = super().__call__(model, batch)
            if self.calls >= 5:
                out.loss = out.loss * float("nan")
            self.calls += 1
            return out

    objective = NanAfter()
    objective.calls = 0
    model, tr, va, te = toy_setup()
    trainer = Trainer(
        model, objective, tr, va, collate, {**FAST, "eval_every": 2, "log_every": 1}, tmp_path / "r", tensorboard=False
    )
    with pytest.raises(
        TrainingDivergedError, match=r"at step \d of 12: the training loss is nan.*last good checkpoint is .*last\.pt"
    ):
        trainer.fit()


def test_second_writer_stops_at_once_with_the_holders_pid_and_host(tmp_path):
    first = _trainer(tmp_path / "run")
    with pytest.raises(RunLockedError, match=rf"in use by PID {os.getpid()} on host {socket.gethostname()}"):
        RunLock(tmp_path / "run").acquire()  # another writer in this process tree
    first.fit()
    assert not (tmp_path / "run" / ".lock").exists()
    _trainer(tmp_path / "run", overwrite=True).close()  # free again once the first is done


def test_a_concurrent_train_process_is_refused(tmp_path):
    lock = RunLock(tmp_path / "run").acquire()
    code = f"import sys; from longrange.train.rundir import RunLock\nRunLock({str(tmp_path / 'run')!r}).acquire()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and f"in use by PID {os.getpid()}" in proc.stderr
    lock.release()


def test_a_stale_lock_from_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": 0}))
    lock = RunLock(tmp_path / "run").acquire()
    assert json.loads((tmp_path / "run" / ".lock").read_text())["pid"] == os.getpid()
    lock.release()
    # On another host: stale only without a heartbeat for STALE_AFTER seconds.
    path = tmp_path / "run" / ".lock"
    path.write_text(json.dumps({"pid": 1, "host": "other-node", "started": 0}))
    with pytest.raises(RunLockedError, match="other-node"):
        RunLock(tmp_path / "run").acquire()
    old = time.time() - 7200
    os.utime(path, (old, old))
    RunLock(tmp_path / "run").acquire().release()


def test_an_out_that_is_a_file_is_a_clear_error(tmp_path):
    (tmp_path / "f").write_text("x")
    for out in (tmp_path / "f", tmp_path / "f" / "sub"):
        with pytest.raises(ConfigError, match="is not a directory"):
            check_out_dir(out)
        with pytest.raises(ConfigError, match="is not a directory"):
            _trainer(out)


def test_fingerprint_ignores_presentation_and_names_differences():
    a = {"model": {"d": 1}, "train": {"lr": 0.1, "progress": True, "log_every": 10}, "record": {"host": "x"}}
    b = {"model": {"d": 1}, "train": {"lr": 0.1, "progress": False, "log_every": 3}, "record": {"host": "y"}}
    assert fingerprint(a) == fingerprint(b) and differences(a, b) == []
    c = {"model": {"d": 2}, "train": {"lr": 0.2}}
    assert fingerprint(a) != fingerprint(c)
    assert differences(a, c) == ["model.d: 1 -> 2", "train.lr: 0.1 -> 0.2"]


def test_plain_progress_lines_off_a_terminal(tmp_path, monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    trainer = _trainer(tmp_path / "run", cfg={"progress": True, "progress_every": 1e-9, "log_every": 1})
    trainer.fit()
    lines = stream.getvalue().splitlines()
    assert any(l.startswith("step 3/12 (25%)  loss ") and " lr " in l and " eta " in l for l in lines), lines
    assert any(l.startswith("step 12/12: val loss") for l in lines)
    assert any("val accuracy" in l for l in lines if l.startswith("step 7/12 "))  # after the first evaluation
    assert format_seconds(3725) == "1h02m" and format_seconds(65) == "1m05s" and format_seconds(float("inf")) == "?"


def test_wall_time_is_counted_once_across_checkpoints_and_summed_over_resumes(tmp_path):
    start = time.time()
    summary = _trainer(tmp_path / "run", cfg={"checkpoint_every": 1, "epochs": 3}).fit()
    wall = time.time() - start
    assert 0 < summary["seconds"] <= wall
    from longrange.train import load_checkpoint

    saved = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["trainer"]["elapsed"]
    assert 0 < saved <= summary["seconds"]
    # A resumed (finished) run adds its own segment to the saved time, once.
    start = time.time()
    again = _trainer(tmp_path / "run", cfg={"checkpoint_every": 1, "epochs": 3}, resume=True).fit()
    assert saved <= again["seconds"] <= saved + (time.time() - start)


def test_a_held_lock_beats_and_a_dead_hosts_lock_is_taken_over_within_minutes(tmp_path, capsys):
    from longrange.train.rundir import RunDir

    # The holder's heartbeat: a background thread refreshes the lock's time stamp while it is held.
    lock = RunLock(tmp_path / "alive", heartbeat_every=0.05).acquire()
    old = time.time() - 3600
    os.utime(lock.path, (old, old))
    deadline = time.time() + 10
    while time.time() - lock.path.stat().st_mtime > 60 and time.time() < deadline:
        time.sleep(0.05)
    assert time.time() - lock.path.stat().st_mtime < 60, "the heartbeat never refreshed the lock"
    assert json.loads(lock.path.read_text())["stale_after"] == 300.0
    lock.release()
    # A node that died: its lock (another host) shows no heartbeat for 6 minutes, over the 5 of its
    # window, and is taken over; the take-over says whose lock it was.
    run = tmp_path / "run"
    run.mkdir()
    path = run / ".lock"
    path.write_text(json.dumps({"pid": 4242, "host": "node-a", "started": 0, "stale_after": 300}))
    six_minutes_ago = time.time() - 360
    os.utime(path, (six_minutes_ago, six_minutes_ago))
    lock = RunLock(run).acquire()
    assert (
        lock.took_over["pid"] == 4242 and lock.took_over["host"] == "node-a" and lock.took_over["silent_seconds"] >= 360
    )
    assert "taking over the lock" in capsys.readouterr().err
    lock.release()
    # Within its window (4 minutes of silence) it is still held; a holder may set a longer window.
    path.write_text(json.dumps({"pid": 4242, "host": "node-a", "started": 0, "stale_after": 300}))
    four_minutes_ago = time.time() - 240
    os.utime(path, (four_minutes_ago, four_minutes_ago))
    with pytest.raises(RunLockedError, match="node-a"):
        RunLock(run).acquire()
    path.write_text(json.dumps({"pid": 4242, "host": "node-a", "started": 0, "stale_after": 3600}))
    os.utime(path, (six_minutes_ago, six_minutes_ago))
    with pytest.raises(RunLockedError, match="node-a"):
        RunLock(run).acquire()
    assert RunDir(run).lock(stale_after=120).stale_after == 120
