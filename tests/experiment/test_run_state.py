"""One reading of a run directory's state (``RunDir.state``): every combination of files that a kill
can leave is exactly one of finished / resumable / failed / held (or pending, when nothing was
written), and a rerun with a comparison's intent moves each to finished, with the result of an
uninterrupted run."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
from tiny_experiment import tiny

from longrange.experiment.config import experiment_from_dict
from longrange.experiment.execute import run_stage
from longrange.experiment.stage import resolve_stage
from longrange.train.rundir import Intent, RunDir, RunLock, RunState

#: Fields of a summary that depend on when it ran, not on what it computed.
VOLATILE = ("seconds", "cpu_seconds")


def result(run: Path) -> dict:
    return {k: v for k, v in json.loads(RunDir(run).summary.read_text()).items() if k not in VOLATILE}


@pytest.fixture(scope="module")
def finished(tiny_listops_dir, tmp_path_factory):
    """A finished tiny run (checkpoint every step), and its experiment."""
    exp = experiment_from_dict(tiny(tiny_listops_dir, checkpoint_every=1))
    run = tmp_path_factory.mktemp("finished") / "run"
    run_stage(resolve_stage(exp, "train", seed=0), run)
    return exp, run


def metrics(run: Path) -> list[dict]:
    """The run's metrics lines without their wall times."""
    return [
        {k: v for k, v in json.loads(line).items() if k != "elapsed"}
        for line in RunDir(run).metrics.read_text().splitlines()
    ]


def _cut(path: Path, keep: float = 0.5) -> None:
    """``path`` cut off part-way, as a file system without atomic renames can leave it."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _failure(run: RunDir, at: float) -> None:
    run.record_failure("the worker was killed by SIGKILL")
    record = json.loads(run.failure.read_text())
    run.failure.write_text(json.dumps({**record, "time": at}))


def _dead_pid() -> int:
    """A PID that no live process has."""
    pid = 2**22 - 7
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def _dead_lock(run: RunDir) -> None:
    run.lock_path.write_text(
        json.dumps({"pid": _dead_pid(), "host": socket.gethostname(), "started": 0.0, "stale_after": 300.0})
    )


# Each case: how to plant it (from a finished run's files), the state it must read as, whether a
# rerun must start afresh, and what a rerun does ("reuse", "resume" or "fresh").
def _summary_plus_failure_before(r: RunDir) -> None:
    _failure(r, time.time() - 60)  # an earlier attempt failed; a retry finished, killed before tidying


def _summary_plus_failure_after(r: RunDir) -> None:
    _failure(r, time.time() + 1)  # the coordinator saw the worker die after it wrote its summary


CASES = {
    "nothing": (
        lambda r: [f.unlink() if f.is_file() else shutil.rmtree(f) for f in list(r.root.iterdir())],
        RunState.PENDING,
        True,
        "fresh",
    ),
    "config only": (
        lambda r: [r.summary.unlink(), r.metrics.unlink(), shutil.rmtree(r.checkpoints)],
        RunState.RESUMABLE,
        True,
        "fresh",
    ),
    "checkpoints, no summary": (lambda r: r.summary.unlink(), RunState.RESUMABLE, False, "resume"),
    "summary and checkpoints": (lambda r: None, RunState.FINISHED, False, "reuse"),
    "summary, no checkpoint": (lambda r: r.last.unlink(), RunState.FINISHED, False, "reuse"),
    "summary, failed.json written before it": (_summary_plus_failure_before, RunState.FINISHED, False, "reuse"),
    "summary, failed.json written after it": (_summary_plus_failure_after, RunState.FINISHED, False, "reuse"),
    "summary and a live lock": (None, RunState.FINISHED, False, "reuse"),  # planted in the test (the lock is ours)
    "failed.json and checkpoints": (
        lambda r: [r.summary.unlink(), _failure(r, time.time())],
        RunState.FAILED,
        False,
        "resume",
    ),
    "failed.json, no checkpoint": (
        lambda r: [r.summary.unlink(), shutil.rmtree(r.checkpoints), _failure(r, time.time())],
        RunState.FAILED,
        True,
        "fresh",
    ),
    "half-written summary": (lambda r: _cut(r.summary), RunState.RESUMABLE, False, "resume"),
    "half-written config": (lambda r: _cut(r.config), RunState.RESUMABLE, True, "fresh"),
    "half-written checkpoint": (lambda r: [r.summary.unlink(), _cut(r.last)], RunState.RESUMABLE, True, "fresh"),
    "half-written best weights": (lambda r: _cut(r.best_weights), RunState.RESUMABLE, True, "fresh"),
    "half-written failed.json": (
        lambda r: [r.summary.unlink(), r.failure.write_text('{"error": "the wor')],
        RunState.FAILED,
        False,
        "resume",
    ),
    "half-written metrics line": (
        lambda r: [r.summary.unlink(), r.metrics.open("a").write('{"step": 9, "spl')],
        RunState.RESUMABLE,
        False,
        "resume",
    ),
    "leftover temporary files": (
        lambda r: [
            r.summary.unlink(),
            (r.root / f".{r.summary.name}.tmp-{_dead_pid()}").write_text("{"),
            (r.checkpoints / f".{r.last.name}.tmp-{_dead_pid()}").write_bytes(b"PK"),
        ],
        RunState.RESUMABLE,
        False,
        "resume",
    ),
    "lock of a dead process": (lambda r: [r.summary.unlink(), _dead_lock(r)], RunState.RESUMABLE, False, "resume"),
    "lock of a live process": (None, RunState.HELD, False, "resume"),  # planted in the test
}


def test_a_config_cut_at_any_offset_is_damaged_never_whole(finished, tmp_path):
    """Wherever a cut lands (the config holds a path, so one fixed fraction lands at a different
    place in every folder), the prefix is never read as the whole config: the run is resumable,
    starts afresh and names the file."""
    _, source = finished
    run = RunDir(tmp_path / "run")
    shutil.copytree(source, run.root)
    whole = run.config.read_bytes()
    header = whole.index(b"\n") + 1
    # Every offset in the seal line and the last 64 bytes; every 5th elsewhere.
    offsets = sorted({*range(0, header + 2), *range(header, len(whole), 5), *range(len(whole) - 64, len(whole))})
    for at in offsets:
        run.config.write_bytes(whole[:at])
        state = run.state()
        assert state.kind is RunState.RESUMABLE and state.restart, (at, state)
        assert any(str(run.config) in d for d in state.damaged), (at, state.damaged)
    # An altered byte (same length) is damaged too; the whole file reads as finished.
    flipped = bytearray(whole)
    flipped[len(whole) // 2] ^= 0x01
    run.config.write_bytes(bytes(flipped))
    assert run.state().kind is RunState.RESUMABLE
    run.config.write_bytes(whole)
    assert run.state().kind is RunState.FINISHED


def test_a_config_without_a_seal_is_read_by_parsing(finished, tmp_path):
    """A config.yaml written before seals existed (or by hand) still reads."""
    _, source = finished
    run = RunDir(tmp_path / "run")
    shutil.copytree(source, run.root)
    text = run.config.read_text()
    assert text.startswith("# longrange-sealed: ")
    run.config.write_text(text.partition("\n")[2])
    assert run.state().kind is RunState.FINISHED
    assert run.read_config() == RunDir(source).read_config()


def test_invalid_yaml_in_a_sealed_config_names_the_line_of_the_file(tmp_path):
    from longrange.errors import DataFormatError
    from longrange.fileio import seal

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    run.config.write_bytes(seal("seed: 1\ntask: [unclosed\n"))
    with pytest.raises(DataFormatError, match=r"config.yaml, line 4: not valid YAML"):
        run.read_config()


@pytest.mark.parametrize("case", list(CASES))
def test_every_combination_is_one_state_and_a_rerun_finishes_it(finished, tmp_path, case, capsys):
    exp, source = finished
    plant, expected, restart, action = CASES[case]
    run = RunDir(tmp_path / "run")
    shutil.copytree(source, run.root)
    lock = None
    if case == "summary and a live lock":
        lock = RunLock(run.root).acquire()
    elif case == "lock of a live process":
        run.summary.unlink()
        lock = RunLock(run.root).acquire()
    else:
        plant(run)
    state = run.state()
    assert state.kind is expected, (case, state)
    if expected is not RunState.FINISHED:
        assert state.restart is restart, (case, state)
        assert not run.finished()
    if case.startswith("half-written") and "failed.json" not in case and "metrics" not in case:
        assert state.damaged and all(str(run.root) in d for d in state.damaged), state
    if case.startswith("summary, failed.json"):
        assert state.stale_failure
    if lock is not None:
        if expected is RunState.HELD:
            assert f"PID {os.getpid()}" in state.detail
        lock.release()
    before = run.summary.read_bytes() if run.summary.is_file() else None
    capsys.readouterr()
    summary = run_stage(resolve_stage(exp, "train", seed=0), run.root, Intent("continue"))  # a comparison's rerun
    err = capsys.readouterr().err
    assert run.state().kind is RunState.FINISHED and not run.failure.exists()
    assert result(run.root) == result(source)  # the result of the uninterrupted run
    assert {k: v for k, v in summary.items() if k not in VOLATILE} == result(source)
    if action == "reuse":
        assert run.summary.read_bytes() == before  # never rewritten
    else:
        assert "already finished" not in err
    if case.startswith("half-written") and action == "fresh":
        assert f"starting {run.root} afresh" in err  # said, never silent
    # The metrics are those of one uninterrupted run: no line twice, no half line.
    assert metrics(run.root) == metrics(source)
    assert not list(run.root.glob(".*.tmp-*")) and not list(run.checkpoints.glob(".*.tmp-*"))


def test_the_state_names_what_it_read(finished, tmp_path):
    _, source = finished
    run = RunDir(tmp_path / "run")
    shutil.copytree(source, run.root)
    assert str(run.state()) == "finished: summary.json written"
    run.summary.unlink()
    assert str(run.state()) == "resumable: a checkpoint, no summary: a rerun resumes from its last checkpoint"
    _cut(run.last)
    state = run.state()
    assert state.kind is RunState.RESUMABLE and state.restart and "last.pt: damaged or cut off" in state.detail
    _failure(run, time.time())
    assert run.state().detail.startswith("the worker was killed by SIGKILL; a rerun starts afresh")
    assert RunDir(tmp_path / "nothing").state().kind is RunState.PENDING


def test_resume_from_the_command_line_refuses_a_damaged_checkpoint_naming_the_best_weights(finished, tmp_path):
    from longrange.errors import CheckpointError

    exp, source = finished
    run = RunDir(tmp_path / "run")
    shutil.copytree(source, run.root)
    run.summary.unlink()
    _cut(run.last)
    with pytest.raises(CheckpointError, match=r"truncated or corrupt.*best weights so far are intact.*--overwrite"):
        run_stage(resolve_stage(exp, "train", seed=0), run.root, Intent("resume"))


def test_a_fresh_start_killed_after_it_removed_the_old_summary_is_finished_by_the_same_command(finished, tmp_path):
    """``--overwrite`` over a finished run made with other settings removes the summary first (the
    commit point): killed right after, the directory holds a run that is not finished, and running
    the same command again finishes it with the new settings."""
    import subprocess
    import sys

    import yaml

    from longrange.faults import ENV

    exp, source = finished
    run = RunDir(tmp_path / "run")
    shutil.copytree(source, run.root)
    config = tmp_path / "exp.yaml"
    changed = exp.to_dict()
    changed["train"]["lr"] = 0.01
    config.write_text(yaml.safe_dump(changed))
    command = [
        sys.executable,
        "-m",
        "longrange",
        "train",
        "--config",
        str(config),
        "--out",
        str(run.root),
        "--overwrite",
    ]
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src, ENV: "after-clear-summary"}
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    state = run.state()
    assert state.kind is RunState.RESUMABLE and not run.summary.exists()
    env.pop(ENV)
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert run.state().kind is RunState.FINISHED
    assert (
        json.loads(run.summary.read_text())["fingerprint"]
        != json.loads(RunDir(source).summary.read_text())["fingerprint"]
    )
