"""Runs that survive clusters: unfinished inputs, full disks, preemption, dead hosts' locks."""

from __future__ import annotations

import json
import os
import time

import yaml
from tiny_experiment import tiny

from longrange.cli import main


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
    # Still running in another process: its live lock, no summary yet.
    lock = RunLock(pre).acquire()
    assert main(["finetune", "--config", config, "--out", str(fine), "--from", str(pre)]) == 1
    assert f"is still running (PID {os.getpid()}" in capsys.readouterr().err
    lock.release()
    # Its last attempt failed (failed.json, no summary).
    RunDir(pre).record_failure("ValueError: boom")
    assert main(["finetune", "--config", config, "--out", str(fine), "--from", str(pre)]) == 1
    assert "failed (ValueError: boom" in capsys.readouterr().err
    # The summary is the commit point: a failure recorded beside it (a worker reported dead after it
    # finished) does not make the run unfinished.
    RunDir(pre).summary.write_text(summary)
    # Finished: the finetuning run records the pretraining run's fingerprint and steps.
    assert main(["finetune", "--config", config, "--out", str(fine), "--from", str(pre)]) == 0
    done = json.loads(RunDir(fine).summary.read_text())
    pretrain = yaml.safe_load(RunDir(pre).config.read_text())
    assert done["pretrain"] == {"run": "../pre", "fingerprint": pretrain["fingerprint"], "steps": 4}


def _failing_writes(monkeypatch, name: str, after: int = 0) -> None:
    """Every write of the file ``name`` after the first ``after`` fails half-way with ENOSPC."""
    import errno
    from pathlib import Path

    from longrange import fileio

    real, seen = fileio._write_bytes, {"n": 0}

    def write(f, data):
        target = Path(f.name).name
        if target == name or target.startswith(f".{name}.tmp"):
            seen["n"] += 1
            if seen["n"] > after:
                f.write(data[: len(data) // 2])
                f.flush()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(f, data)

    monkeypatch.setattr(fileio, "_write_bytes", write)


def _error_line(capsys) -> str:
    lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("longrange train: error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_full_disk_while_writing_a_checkpoint_is_one_line_and_leaves_the_last_good_one(
    tiny_listops_dir, tmp_path, monkeypatch, capsys
):
    from longrange.train import load_checkpoint

    run = tmp_path / "run"
    _failing_writes(monkeypatch, "last.pt", after=2)
    assert main(["train", "--config", _config(tmp_path, tiny_listops_dir, checkpoint_every=1), "--out", str(run)]) == 1
    line = _error_line(capsys)
    assert f"cannot write {run / 'checkpoints' / 'last.pt'}: no space left on device" in line
    assert (
        f"training stopped at step 3 of 4; the last good checkpoint is {run / 'checkpoints' / 'last.pt'} (step 2)"
        in line
    )
    assert load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["step"] == 2
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.pt"]  # no temporary left
    assert not (run / ".lock").exists() and not (run / "summary.json").exists()


def test_a_full_disk_while_writing_metrics_leaves_no_half_line(tiny_listops_dir, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    _failing_writes(monkeypatch, "metrics.jsonl", after=1)
    assert main(["train", "--config", _config(tmp_path, tiny_listops_dir), "--out", str(run)]) == 1
    line = _error_line(capsys)
    assert (
        f"cannot write {run / 'metrics.jsonl'}: no space left on device" in line
        and "no checkpoint was written yet" in line
    )
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["split"] == "train"  # the failed line is not there, not even half
    assert not (run / ".lock").exists()


def test_a_full_disk_while_writing_the_summary_says_how_to_write_it(tiny_listops_dir, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    config = _config(tmp_path, tiny_listops_dir)
    with monkeypatch.context() as m:
        _failing_writes(m, "summary.json")
        assert main(["train", "--config", config, "--out", str(run)]) == 1
        line = _error_line(capsys)
    assert f"cannot write {run / 'summary.json'}: no space left on device; training finished at step 4" in line
    assert "--resume to write the summary" in line
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []  # no temporary, no lock
    assert main(["train", "--config", config, "--out", str(run), "--resume"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 4


def test_a_data_cache_that_cannot_be_written_is_a_warning_not_a_failure(tmp_path, monkeypatch, capsys):
    import longrange.fileio as fileio
    from longrange.data.cache import cached

    real = fileio._write_bytes

    def write(f, data):  # the cache entry's temporary file is .toy-<key>.pt.tmp-<pid>
        from pathlib import Path

        if Path(f.name).name.startswith(".toy-"):
            import errno

            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        real(f, data)

    monkeypatch.setattr(fileio, "_write_bytes", write)
    source = tmp_path / "src.txt"
    source.write_text("x")
    out = cached(tmp_path, "toy", [source], {}, lambda: {"x": [1, 2]}, quiet=True)
    assert out == {"x": [1, 2]}
    err = capsys.readouterr().err
    assert "warning: the prepared data is not cached (cannot write" in err and "read-only file system" in err
    assert not [p for p in (tmp_path / ".cache").iterdir()]  # nothing half-written


def test_train_on_sigterm_exits_75_with_the_preemption_line_and_continue_resumes(
    tiny_listops_dir, tmp_path, monkeypatch, capsys
):
    import signal

    from longrange.train.loop import Trainer

    step = Trainer._step

    def signalled(self, micro_batches):  # the scheduler's SIGTERM arrives during step 2
        if self.state.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        step(self, micro_batches)

    run, config = tmp_path / "run", _config(tmp_path, tiny_listops_dir)
    with monkeypatch.context() as m:
        m.setattr(Trainer, "_step", signalled)
        assert main(["train", "--config", config, "--out", str(run)]) == 75
    err = capsys.readouterr().err
    assert "longrange train: preempted at step 2 of 4, its checkpoint written; `--resume` continues" in err
    assert not (run / ".lock").exists() and not (run / "summary.json").exists()
    assert main(["train", "--config", config, "--out", str(run), "--continue"]) == 0  # as a requeued job script does
    assert json.loads((run / "summary.json").read_text())["steps"] == 4
    assert main(["train", "--config", config, "--out", str(run), "--continue"]) == 0  # finished: left as it is
    assert "already finished; its summary is unchanged" in capsys.readouterr().err
