"""A worker or the coordinator killed (SIGKILL) at each named point between two consecutive writes of
a stage's end (``longrange/faults.py``): one rerun of the same comparison finishes the grid, and its
results are those of an uninterrupted grid, bitwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from longrange.experiment.backends import LocalWorkers
from longrange.experiment.compare import StageFailed, compare, stage_statuses
from longrange.experiment.config import experiment_from_dict
from longrange.faults import ENV, POINTS

SRC = str(Path(__file__).resolve().parents[2] / "src")
HERE = str(Path(__file__).resolve().parent)
#: The points a stage's worker passes on a normal run (a fresh start clears no summary).
WORKER_POINTS = [p for p in POINTS if not p.startswith("coordinator-") and p != "after-clear-summary"]
#: Fields of a summary that depend on when it ran, or on the experiment's label.
VOLATILE = ("seconds", "cpu_seconds", "label", "fingerprint", "pretrain")
CONTROL = "kill_at"  # OUT/kill_at/<stage id, / as +>: the point at which that stage's worker dies


def spec(data_dir: str, label: str) -> dict:
    return {
        "label": label,
        "task": {"name": "listops", "options": {"seq_len": 32}, "data_dir": data_dir},
        "model": dict(block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4, direction="bidirectional"),
        "train": {"batch_size": 16, "epochs": 1, "lr": 0.003, "progress": False, "log_every": 2},
        "compare": {"objectives": ["masked"], "seeds": [0], "compute_matched": False},
    }


def results(out: Path) -> dict[str, dict]:
    """Each finished stage's summary, by stage (the experiment's label taken out of the id)."""
    got = {}
    for p in out.rglob("summary.json"):
        parts = p.parent.relative_to(out).parts
        got.setdefault("/".join(parts[2:]), []).append(
            {k: v for k, v in json.loads(p.read_text()).items() if k not in VOLATILE}
        )
    return got


def plant(out: Path, points: dict[str, str]) -> None:
    """The points at which the workers of these stages die (each once)."""
    folder = out / CONTROL
    folder.mkdir(parents=True, exist_ok=True)
    for stage, point in points.items():
        (folder / stage.replace("/", "+")).write_text(point)


def dying_worker(argv: list[str]) -> int:
    """The worker, which kills itself at the point planted for its stage (a file is the channel:
    worker processes start from a server that does not see this process's later environment)."""
    from longrange.experiment.worker import main

    planted = Path(argv[0]) / CONTROL / argv[1].replace("/", "+")
    if planted.is_file():
        os.environ[ENV] = planted.read_text()
        planted.unlink()
    return main(argv)


@pytest.fixture(scope="module")
def reference(tiny_listops_dir, tmp_path_factory):
    """The uninterrupted grid (scratch, masked pretraining, finetuning), in one thread."""
    import torch

    out = tmp_path_factory.mktemp("uninterrupted")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        compare([experiment_from_dict(spec(str(tiny_listops_dir), "ref"))], out)
    finally:
        torch.set_num_threads(threads)
    return {k: v[0] for k, v in results(out).items()}


def test_a_worker_killed_at_any_point_of_a_stage_end_leaves_a_grid_one_rerun_finishes(
    tiny_listops_dir, reference, tmp_path, capsys
):
    """One experiment per point, whose pretraining worker dies there (the finetuning stage after it
    is where a disagreement between two readings of one directory showed)."""
    labels = {point: f"k{i}" for i, point in enumerate(WORKER_POINTS)}
    exps = [experiment_from_dict(spec(str(tiny_listops_dir), label)) for label in labels.values()]
    # (pretraining evaluates no test set: its worker never passes after-test-metrics, finetuning's does)
    stages = {
        point: f"listops/{label}/masked-spt/seed0/{'finetune' if point == 'after-test-metrics' else 'pretrain'}"
        for point, label in labels.items()
    }
    plant(tmp_path, {stage: point for point, stage in stages.items()})
    try:
        compare(exps, tmp_path, executor=LocalWorkers(2, threads_per_job=1, gpus=[], target=dying_worker))
    except StageFailed:
        pass
    err = capsys.readouterr().err
    assert not list((tmp_path / CONTROL).iterdir())  # every planted worker died where it was told
    assert err.count("killed by SIGKILL") == len(WORKER_POINTS)
    # After the summary, the kill does not make the stage a failure: the summary is the commit point.
    statuses = stage_statuses(tmp_path)
    for point in ("after-summary", "after-unlock"):
        stage = stages[point]
        assert (
            f"{stage}: the worker was killed by SIGKILL (out of memory?) after its run had finished; recorded as finished"
            in err
        )
        assert statuses[stage] == "finished" and statuses[stage.replace("pretrain", "finetune")] == "finished"
    for point in ("after-lock", "after-checkpoint", "after-test-metrics", "after-record"):
        assert statuses[stages[point]] == "failed", point

    compare(exps, tmp_path, executor=LocalWorkers(2, threads_per_job=1, gpus=[]))  # one rerun finishes it
    assert set(stage_statuses(tmp_path).values()) == {"finished"}
    got = results(tmp_path)
    assert sorted(got) == sorted(reference)
    for stage, summaries in got.items():
        assert len(summaries) == len(WORKER_POINTS)
        for summary in summaries:
            assert summary == reference[stage], stage  # bitwise: every metric and step count
    assert not list(tmp_path.rglob("failed.json"))


def _coordinator(out: Path, data_dir: str, kill_at: str, worker_points: dict[str, str]) -> subprocess.CompletedProcess:
    """``compare`` with one local worker in a process of its own, killed at ``kill_at``."""
    plant(out, worker_points)
    code = (
        "import sys, json\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "from longrange.experiment.backends import LocalWorkers\n"
        "from longrange.experiment.compare import compare\n"
        "from longrange.experiment.config import experiment_from_dict\n"
        "from test_kill_points import dying_worker, spec\n"
        f"compare([experiment_from_dict(spec({data_dir!r}, 'c'))], {str(out)!r},\n"
        "        executor=LocalWorkers(1, threads_per_job=1, gpus=[], target=dying_worker))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, HERE]), ENV: kill_at}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "kill_at, worker_dies_at", [("coordinator-after-exit", None), ("coordinator-after-failure", "after-record")]
)
def test_the_coordinator_killed_as_it_settles_a_stage_leaves_a_grid_one_rerun_finishes(
    tiny_listops_dir, reference, tmp_path, kill_at, worker_dies_at
):
    out = tmp_path / "out"
    first = "listops/c/masked-spt/seed0/pretrain"
    proc = _coordinator(out, str(tiny_listops_dir), kill_at, {first: worker_dies_at} if worker_dies_at else {})
    assert proc.returncode == -9, proc.stderr  # SIGKILL
    statuses = stage_statuses(out)
    if worker_dies_at is None:  # the first stage's worker finished; its coordinator died as it looked
        assert statuses["listops/c/scratch/seed0"] == "finished" and "held" not in statuses.values()
    else:
        assert (
            statuses[first] == "failed"
            and "killed by SIGKILL" in json.loads((out / first / "failed.json").read_text())["error"]
        )
    compare(
        [experiment_from_dict(spec(str(tiny_listops_dir), "c"))],
        out,
        executor=LocalWorkers(1, threads_per_job=1, gpus=[]),
    )
    assert set(stage_statuses(out).values()) == {"finished"}
    got = results(out)
    assert {k: v[0] for k, v in got.items()} == reference
