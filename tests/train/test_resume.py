"""Resume after SIGKILL continues exactly: same weights and the same metrics as an unbroken run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import torch

from longrange.train import load_checkpoint
from longrange.train.logging import read_metrics

TOY = Path(__file__).with_name("toy.py")
# 48 items / batch 8 = 6 steps per epoch, 3 epochs; step 8 is in the middle of the second epoch
# and is neither a log step nor an evaluation.
CONFIG = {"epochs": 3, "batch_size": 8, "grad_accum": 2, "lr": 0.01, "checkpoint_every": 4, "log_every": 3, "seed": 5}
ARGS = ["--dropout", "0.2", "--noise", "0.1", "--config", json.dumps(CONFIG)]


def _start(run_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(TOY), str(run_dir), *ARGS, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _records(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "elapsed"} for r in read_metrics(run_dir / "metrics.jsonl")]


def test_resume_after_kill_matches_uninterrupted_run(tmp_path):
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    p_whole, p_broken = _start(whole), _start(broken, "--kill-at-step", "8")
    code, err = _finish(p_broken)
    assert code == -signal.SIGKILL, err
    assert load_checkpoint(broken / "checkpoints" / "last.pt")["trainer"]["step"] == 8
    assert max(r["step"] for r in _records(broken)) <= 8
    code, err = _finish(p_whole)
    assert code == 0, err

    code, err = _finish(_start(broken, "--resume"))
    assert code == 0, err

    a = load_checkpoint(whole / "checkpoints" / "last.pt")
    b = load_checkpoint(broken / "checkpoints" / "last.pt")
    assert a["trainer"]["step"] == b["trainer"]["step"] == 18
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
    assert _records(whole) == _records(broken)
    assert {r["split"] for r in _records(whole)} == {"train", "val", "test"}
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (whole, broken))
    assert sa.pop("seconds") > 0 and sb.pop("seconds") > 0  # wall time, summed over the resumed segments
    assert sa.pop("cpu_seconds") > 0 and sb.pop("cpu_seconds") > 0  # and CPU time
    assert sa == sb


def test_resume_without_checkpoint_is_an_error(tmp_path):
    import pytest
    from toy import ToyObjective, toy_setup

    from longrange.data.batch import collate
    from longrange.errors import CheckpointError
    from longrange.train import Trainer

    model, tr, va, _ = toy_setup()
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        Trainer(model, ToyObjective(), tr, va, collate, {"batch_size": 8}, tmp_path / "run", resume=True)


def test_sigterm_mid_epoch_checkpoints_and_resume_matches_an_uninterrupted_run(tmp_path):
    """SIGTERM during step 7 (mid-epoch: no log line, evaluation or periodic checkpoint there): the step
    finishes, last.pt holds step 7, exit 75 with the preemption line; --resume ends as if never stopped."""
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    p_whole, p_stopped = _start(whole), _start(stopped, "--signal-at-step", "7", "--signal", "TERM")
    code, err = _finish(p_stopped)
    assert code == 75, err
    assert "received SIGTERM: stopping after this step with a checkpoint" in err
    assert "preempted at step 7 of 18, its checkpoint written; `--resume` continues" in err
    assert load_checkpoint(stopped / "checkpoints" / "last.pt")["trainer"]["step"] == 7
    assert not (stopped / ".lock").exists()
    code, err = _finish(p_whole)
    assert code == 0, err
    code, err = _finish(_start(stopped, "--resume"))
    assert code == 0, err
    a = load_checkpoint(whole / "checkpoints" / "last.pt")
    b = load_checkpoint(stopped / "checkpoints" / "last.pt")
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert _records(whole) == _records(stopped)
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (whole, stopped))
    sa.pop("seconds"), sb.pop("seconds"), sa.pop("cpu_seconds"), sb.pop("cpu_seconds")
    assert sa == sb


def test_sigterm_during_the_last_step_still_stops_and_resume_finishes(tmp_path):
    """A stop asked for during the last step (its final evaluation and checkpoint) is not lost: the run
    ends preempted at step 18 of 18 with no summary, so a comparison stops there instead of going on
    to its next stage; --resume then writes the summary an uninterrupted run writes."""
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    p_whole, p_stopped = _start(whole), _start(stopped, "--signal-at-step", "18", "--signal", "TERM")
    code, err = _finish(p_stopped)
    assert code == 75, err
    assert "preempted at step 18 of 18, its checkpoint written" in err
    assert not (stopped / "summary.json").exists()
    assert _finish(p_whole)[0] == 0
    code, err = _finish(_start(stopped, "--resume"))
    assert code == 0, err
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (whole, stopped))
    sa.pop("seconds"), sb.pop("seconds"), sa.pop("cpu_seconds"), sb.pop("cpu_seconds")
    assert sa == sb


def test_sigusr1_stops_too_and_a_second_signal_stops_at_once(tmp_path):
    code, err = _finish(_start(tmp_path / "usr1", "--signal-at-step", "5", "--signal", "USR1"))
    assert code == 75 and "received SIGUSR1" in err and "preempted at step 5 of 18" in err, err
    assert load_checkpoint(tmp_path / "usr1" / "checkpoints" / "last.pt")["trainer"]["step"] == 5
    code, err = _finish(_start(tmp_path / "twice", "--signal-at-step", "5", "--signals", "2"))
    assert code == 128 + signal.SIGTERM and "received SIGTERM again: stopping at once" in err, err
    last = tmp_path / "twice" / "checkpoints" / "last.pt"
    assert load_checkpoint(last)["trainer"]["step"] == 4  # the periodic checkpoint before; none at step 5
    assert not (tmp_path / "twice" / ".lock").exists()


def test_ctrl_c_checkpoints_in_process_and_resume_matches(tmp_path):
    """Ctrl-C (SIGINT) during step 7: the step finishes, last.pt holds step 7, exit 130 with a line
    that says so (no traceback); --resume ends as if never stopped. Pressed twice: stops at once."""
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    p_whole, p_stopped = _start(whole), _start(stopped, "--signal-at-step", "7", "--signal", "INT")
    code, err = _finish(p_stopped)
    assert code == 130, err
    assert "received Ctrl-C: stopping after this step with a checkpoint (Ctrl-C again stops at once)" in err
    assert "interrupted (Ctrl-C) at step 7 of 18, its checkpoint written; `--resume` continues" in err
    assert "Traceback" not in err
    assert load_checkpoint(stopped / "checkpoints" / "last.pt")["trainer"]["step"] == 7
    assert _finish(p_whole)[0] == 0
    code, err = _finish(_start(stopped, "--resume"))
    assert code == 0, err
    assert _records(whole) == _records(stopped)
    code, err = _finish(_start(tmp_path / "twice", "--signal-at-step", "5", "--signal", "INT", "--signals", "2"))
    assert "received Ctrl-C again: stopping at once" in err and code != 0, err
