"""The comparison's executors (local workers, SLURM through submitit's local executor) run the same
stages as the in-process run, with the same results; a killed worker's stage resumes; two comparisons
on one output directory never run a stage twice."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from longrange.errors import ConfigError
from longrange.experiment.backends import InProcess, LocalWorkers, SlurmLauncher, auto_jobs, make_backend, usable_cores
from longrange.experiment.compare import StageFailed, compare, stage_statuses
from longrange.experiment.config import LauncherConfig, experiment_from_dict
from longrange.experiment.worker import command as worker_command
from longrange.experiment.worker import environment as worker_env

SRC = str(Path(__file__).resolve().parents[2] / "src")
#: Fields of a summary that depend on when and where it ran, not on what it computed.
VOLATILE = ("seconds", "cpu_seconds")


def tiny(data_dir, label, **train) -> dict:
    return {
        "label": label,
        "task": {"name": "listops", "options": {"seq_len": 32}, "data_dir": str(data_dir)},
        "model": dict(block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4, direction="bidirectional"),
        "train": {"batch_size": 16, "epochs": 1, "lr": 0.003, "progress": False, "log_every": 2, **train},
        "compare": {"objectives": ["masked"], "seeds": [0, 1]},
    }


def grid(data_dir, **train):
    return [experiment_from_dict(tiny(data_dir, label, **train)) for label in ("a", "b")]


def comparable(summaries):
    return [{k: v for k, v in s.items() if k not in VOLATILE} for s in summaries]


def all_summaries(out: Path) -> dict[str, dict]:
    return {
        str(p.parent.relative_to(out)): {k: v for k, v in json.loads(p.read_text()).items() if k not in VOLATILE}
        for p in out.rglob("summary.json")
    }


@pytest.fixture(scope="module")
def reference(tiny_listops_dir, tmp_path_factory):
    """The grid (2 models x 2 seeds: scratch, masked SPT, matched) run in process, one stage after
    another, with one thread (as the workers below: torch's CPU reductions split their work by
    thread, so another thread count can change the last bits of a float)."""
    import torch

    out = tmp_path_factory.mktemp("sequential")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        summaries = compare(grid(tiny_listops_dir), out)
    finally:
        torch.set_num_threads(threads)
    assert len(summaries) == 12
    return out, summaries


def test_local_workers_give_the_sequential_results(tiny_listops_dir, reference, tmp_path, capsys):
    ref_out, ref = reference
    got = compare(grid(tiny_listops_dir), tmp_path, executor=LocalWorkers(2, threads_per_job=1, gpus=[]))
    assert comparable(got) == comparable(ref)  # bitwise: every metric, step count and fingerprint
    assert all_summaries(tmp_path) == all_summaries(ref_out)  # the pretraining stages too
    err = capsys.readouterr().err
    assert "up to 2 at once" in err and "1 thread(s) each" in err
    log = (tmp_path / "listops/a/masked-spt/seed1/finetune/stage.log").read_text()
    assert "running " in log and "worker: listops/a/masked-spt/seed1/finetune done" in log
    # Run again: everything is reused, no worker starts.
    assert comparable(compare(grid(tiny_listops_dir), tmp_path, executor=LocalWorkers(2, gpus=[]))) == comparable(ref)
    assert "started" not in capsys.readouterr().err


def test_submitit_local_executor_runs_stages_through_the_slurm_path(tiny_listops_dir, reference, tmp_path, capsys):
    """The SLURM code path with submitit's local executor (jobs are local processes), dependencies
    included: "a" is a model of the reference grid; "bad" cannot pretrain (its pretraining batch is
    larger than the training set), so its finetune and matched run are skipped, and the rest runs."""
    ref_out, _ = reference
    good = {**tiny(tiny_listops_dir, "a"), "compare": {"objectives": ["masked"], "seeds": [0]}}
    bad = {**good, "label": "bad", "pretrain": {"batch_size": 1000}}
    launcher = SlurmLauncher(
        LauncherConfig(kind="slurm", gpus_per_job=0, time_min=10, threads_per_job=1), cluster="local", poll_every=0.2
    )
    with pytest.raises(
        StageFailed, match=r"1 stage\(s\) failed: listops/bad/masked-spt/seed0/pretrain .*2 stage\(s\) after them"
    ):
        compare([experiment_from_dict(good), experiment_from_dict(bad)], tmp_path, executor=launcher)
    err = capsys.readouterr().err
    assert len(re.findall(r"submitted listops/\S+: job \d+", err)) == 6  # not the two after the failed pretrain
    ref = all_summaries(ref_out)
    got = all_summaries(tmp_path)
    assert sorted(got) == [
        "listops/a/masked-spt/seed0/finetune",
        "listops/a/masked-spt/seed0/pretrain",
        "listops/a/scratch-matched/seed0",
        "listops/a/scratch/seed0",
        "listops/bad/scratch/seed0",
    ]
    for sid, summary in got.items():  # the label is part of a stage's settings (its fingerprint)
        same = ("label", "fingerprint") if "/bad/" in sid else ()
        assert {k: v for k, v in summary.items() if k not in same} == {
            k: v for k, v in ref[sid.replace("/bad/", "/a/")].items() if k not in same
        }, sid
    # The local executor ignores dependencies: this process submits a level once the previous
    # one ended, so the finetune started after its pretrain had finished.
    pre = tmp_path / "listops/a/masked-spt/seed0/pretrain/summary.json"
    assert pre.stat().st_mtime <= (tmp_path / "listops/a/masked-spt/seed0/finetune/stage.log").stat().st_mtime
    failure = json.loads((tmp_path / "listops/bad/masked-spt/seed0/pretrain/failed.json").read_text())
    assert "batch_size 1000 is larger than the training set" in failure["error"] and failure["log"].endswith(
        "stage.log"
    )
    assert stage_statuses(tmp_path)["listops/bad/masked-spt/seed0/finetune"] == "pending"
    assert list((tmp_path / "slurm").iterdir())  # submitit's scripts and logs


def killing_worker(argv: list[str]) -> int:
    """The worker, killed (SIGKILL, no clean-up) right after the pretraining stage's first checkpoint."""
    import signal

    from longrange.experiment.worker import main
    from longrange.train import loop

    save = loop.Trainer._save

    def _save(self, best):
        save(self, best)
        if self.run.dir.root.name == "pretrain" and self.state.step == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    loop.Trainer._save = _save
    return main(argv)


def test_a_killed_worker_resumes_from_its_checkpoint_and_only_missing_stages_run(
    tiny_listops_dir, reference, tmp_path, capsys
):
    ref_out, _ = reference
    exp = experiment_from_dict(
        {**tiny(tiny_listops_dir, "a", checkpoint_every=1), "compare": {"objectives": ["masked"], "seeds": [0]}}
    )

    with pytest.raises(StageFailed, match=r"1 stage\(s\) failed: listops/a/masked-spt/seed0/pretrain"):
        compare([exp], tmp_path, executor=LocalWorkers(2, threads_per_job=1, gpus=[], target=killing_worker))
    assert "killed by SIGKILL" in capsys.readouterr().err
    pretrain = tmp_path / "listops/a/masked-spt/seed0/pretrain"
    assert (pretrain / "checkpoints/last.pt").is_file() and not (pretrain / "summary.json").exists()
    assert stage_statuses(tmp_path)["listops/a/scratch/seed0"] == "finished"

    compare([exp], tmp_path, executor=LocalWorkers(2, threads_per_job=1, gpus=[]))
    err = capsys.readouterr().err
    started = re.findall(r"started (\S+) \(worker", err)
    assert sorted(started) == sorted(
        [
            "listops/a/masked-spt/seed0/pretrain",
            "listops/a/masked-spt/seed0/finetune",
            "listops/a/scratch-matched/seed0",
        ]
    )  # not the finished scratch run
    assert f"resuming {pretrain}" in (pretrain / "stage.log").read_text()
    ref = all_summaries(ref_out)
    for sid, summary in all_summaries(tmp_path).items():
        assert summary == ref[sid], sid  # the resumed stage ends exactly as an uninterrupted one
    lines = (pretrain / "metrics.jsonl").read_text().splitlines()
    assert (
        len(lines)
        == len(set(lines))
        == len((ref_out / "listops/a/masked-spt/seed0/pretrain/metrics.jsonl").read_text().splitlines())
    )


def test_two_compares_on_one_output_never_run_a_stage_twice(tiny_listops_dir, tmp_path, capfd):
    """``compare --jobs 2`` in another process and the sequential compare in this one, at once."""
    import time

    config = tmp_path / "exp.yaml"
    exp = {**tiny(tiny_listops_dir, "a", epochs=3), "compare": {"objectives": ["masked"], "seeds": [0]}}
    config.write_text(yaml.safe_dump(exp))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "longrange.cli", "compare", "--config", str(config), "--out", str(out)]
    other = subprocess.Popen(
        cmd + ["--jobs", "2", "--threads-per-job", "1"],
        env=worker_env(1),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not list(out.rglob("stage.log")) and time.time() < deadline:  # the other one has started a stage
        time.sleep(0.05)
    try:
        compare([experiment_from_dict(exp)], out)
        here = "done"
    except StageFailed as err:
        assert "running in another process" in str(err)
        here = "held"
    _, other_err = other.communicate(timeout=300)
    assert other.returncode == 0 or "running in another process" in other_err, other_err
    text = capfd.readouterr().err + "".join(p.read_text() for p in out.rglob("stage.log"))
    runs = re.findall(r"^(?:running|resuming) (\S+)$", text, flags=re.M)
    assert len(runs) == len(set(runs)) <= 4, runs  # no stage ran twice
    assert here == "held" or other.returncode != 0 or len(runs) == 4
    for metrics in out.rglob("metrics.jsonl"):
        lines = metrics.read_text().splitlines()
        assert len(lines) == len(set(lines)), metrics
    # Whatever was left (stages after one held by the other command) is done by one more run.
    compare([experiment_from_dict(exp)], out)
    assert set(stage_statuses(out).values()) == {"finished"}


def test_launcher_settings_and_errors(tiny_listops_dir, tmp_path, monkeypatch, capsys):
    from longrange.cli import main

    assert isinstance(make_backend(LauncherConfig()), InProcess) and make_backend(LauncherConfig()).threads == 0
    assert make_backend(LauncherConfig(threads_per_job=1)).threads == 1
    workers = make_backend(LauncherConfig(jobs=3, threads_per_job=2))
    assert isinstance(workers, LocalWorkers) and workers.threads == 2
    assert LocalWorkers(2).threads == max(1, usable_cores() // 2)
    assert isinstance(make_backend(LauncherConfig(kind="slurm")), SlurmLauncher)
    with pytest.raises(ConfigError, match="compare.launcher.kind must be one of local, slurm"):
        experiment_from_dict({"compare": {"launcher": {"kind": "pbs"}}})
    with pytest.raises(ConfigError, match=r"compare.launcher.jobz \(did you mean jobs\?\)"):
        experiment_from_dict({"compare": {"launcher": {"jobz": 2}}})
    with pytest.raises(ConfigError, match="--no-wait needs SLURM"):
        SlurmLauncher(LauncherConfig(kind="slurm", wait=False), cluster="local")
    cmd = worker_command(tmp_path, "t/x/scratch/seed0", overwrite=True, threads=3, gpus=4)
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]
    assert cmd[5:] == [
        "-m",
        "longrange.experiment.worker",
        str(tmp_path),
        "t/x/scratch/seed0",
        "--overwrite",
        "--threads",
        "3",
    ]
    assert worker_command(tmp_path, "s")[1:3] == ["-m", "longrange.experiment.worker"]
    env = worker_env(3, gpu="1")
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3" and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == SRC
    # --launcher slurm on a host without SLURM: a clear error before anything is submitted.
    monkeypatch.setenv("PATH", str(tmp_path))
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(tiny(tiny_listops_dir, "a")))  # with its data: missing data is said first
    assert (
        main(["compare", "--config", str(config), "--out", str(tmp_path / "o"), "--launcher", "slurm", "--seeds", "0"])
        == 1
    )
    assert "needs SLURM's sbatch on PATH" in capsys.readouterr().err
    assert main(["compare", "--config", str(config), "--out", str(tmp_path / "o"), "--jobs", "2", "--no-wait"]) == 1
    assert "--no-wait is for --launcher slurm" in capsys.readouterr().err


def test_jobs_auto_is_one_stage_per_gpu_else_per_core_with_one_thread(monkeypatch, capsys):
    from longrange.cli import main
    from longrange.experiment.backends import local

    assert auto_jobs(gpus=["0", "1", "2"]) == 3
    assert auto_jobs(gpus=[]) == usable_cores() >= 1
    monkeypatch.setattr(local, "usable_cores", lambda: 4)
    monkeypatch.setattr(local, "visible_gpus", lambda: [])
    workers = make_backend(LauncherConfig(jobs="auto"))
    assert isinstance(workers, LocalWorkers) and workers.jobs == 4 and workers.threads == 1
    monkeypatch.setattr(local, "usable_cores", lambda: 1)
    assert isinstance(make_backend(LauncherConfig(jobs="auto")), InProcess)  # one core: in this process
    assert experiment_from_dict({"compare": {"launcher": {"jobs": "auto"}}}).compare.launcher.jobs == "auto"
    with pytest.raises(ConfigError, match=r"compare.launcher.jobs must be an integer or 'auto', got 'many'"):
        experiment_from_dict({"compare": {"launcher": {"jobs": "many"}}})
    with pytest.raises(ConfigError, match="compare.launcher.jobs must be >= 1, got 0"):
        experiment_from_dict({"compare": {"launcher": {"jobs": 0}}})
    with pytest.raises(SystemExit):
        main(["compare", "--preset", "demo/recall/s4d", "--jobs", "some"])
    assert "--jobs: expected a number of stages at once or 'auto', got 'some'" in capsys.readouterr().err


class _FakeJob:
    def __init__(self, job_id):
        self.job_id = job_id


class _FakeSlurm:
    """Records what would be submitted to SLURM (no sbatch needed)."""

    def __init__(self):
        self.params, self.submitted, self._array = {}, [], None

    def update_parameters(self, **kw):
        self.params.update(kw)

    def submit(self, fn):
        dep = self.params.get("slurm_additional_parameters", {}).get("dependency")
        if self._array is not None:
            job = _FakeJob(f"{self._array}_{sum(1 for s in self.submitted if s[2].startswith(self._array + '_'))}")
        else:
            job = _FakeJob(str(100 + len(self.submitted)))
        self.submitted.append((fn.stage_id, dep, job.job_id))
        return job

    def batch(self):
        import contextlib

        @contextlib.contextmanager
        def array():
            self._array = str(900 + len(self.submitted))
            yield
            self._array = None

        return array()


@pytest.mark.parametrize("array", [False, True])
def test_slurm_jobs_carry_their_dependencies(tmp_path, monkeypatch, capsys, array):
    """Per-stage jobs wait (afterok) for exactly the stages they need; level arrays wait (afterany)
    for the previous levels; --no-wait returns once submitted and records the job ids."""
    fake = _FakeSlurm()
    monkeypatch.setattr(SlurmLauncher, "_executor", lambda self, out: fake)
    launcher = make_backend(LauncherConfig(kind="slurm", wait=False, array=array))
    exp = experiment_from_dict({**tiny(tmp_path, "a"), "compare": {"objectives": ["masked"], "seeds": [0]}})
    assert compare([exp], tmp_path / "out", executor=launcher) == []
    deps = {sid: dep for sid, dep, _ in fake.submitted}
    ids = {sid: job for sid, _, job in fake.submitted}
    pre, fine = "listops/a/masked-spt/seed0/pretrain", "listops/a/masked-spt/seed0/finetune"
    if not array:
        assert deps == {
            "listops/a/scratch/seed0": None,
            pre: None,
            fine: f"afterok:{ids[pre]}",
            "listops/a/scratch-matched/seed0": f"afterok:{ids[pre]}:{ids[fine]}",
        }
        assert fake.params["slurm_additional_parameters"]["kill-on-invalid-dep"] == "yes"
    else:  # levels: [scratch, pretrain], [finetune], [matched]
        assert deps[pre] is None and deps[fine] == f"afterany:{ids[pre].split('_')[0]}"
        kind, _, after = deps["listops/a/scratch-matched/seed0"].partition(":")
        assert kind == "afterany" and set(after.split(":")) == {ids[pre].split("_")[0], ids[fine].split("_")[0]}
    assert json.loads((tmp_path / "out" / "jobs.json").read_text()) == ids
    assert "longrange compare --status" in capsys.readouterr().err
    from longrange.cli import main

    assert main(["compare", "--status", str(tmp_path / "out")]) == 0
    shown = capsys.readouterr().out
    assert (
        "4 pending" in shown
        and f"SLURM jobs ({tmp_path / 'out' / 'jobs.json'}): listops/a/scratch/seed0 {ids['listops/a/scratch/seed0']}"
        in shown
    )


def test_sbatch_script_has_the_launcher_settings(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)
    settings = LauncherConfig(
        kind="slurm",
        partition="gpu",
        time_min=90,
        gpus_per_job=2,
        cpus_per_job=16,
        mem_gb=64,
        account="proj",
        qos="high",
        extra={"constraint": "a100"},
    )
    launcher = SlurmLauncher(settings)
    ex = launcher._executor(tmp_path)
    ex.update_parameters(slurm_additional_parameters=launcher._extra("afterok:12:13"))
    text = ex._executor._make_submission_file_text("python -m x", "uid")
    for line in (
        "--partition=gpu",
        "--time=90",
        "--gpus-per-node=2",
        "--cpus-per-task=16",
        "--mem=64GB",
        "--account=proj",
        "--qos=high",
        "--constraint=a100",
        "--dependency=afterok:12:13",
        "--kill-on-invalid-dep=yes",
        "--ntasks-per-node=1",
        "--signal=USR2@120",
    ):
        assert f"#SBATCH {line}\n" in text, line


@pytest.mark.slow
def test_a_stage_under_torchrun_runs_once_and_is_then_reused(tiny_listops_dir, tmp_path):
    """What a SLURM job with --gpus-per-job 2 runs, here on 2 CPU processes (gloo): rank 0 decides and writes."""
    from longrange.experiment.plan import plan_grid

    plan = plan_grid([experiment_from_dict(tiny(tiny_listops_dir, "a"))], seeds=[0])
    plan.save(tmp_path)
    stage = "listops/a/scratch/seed0"
    cmd = worker_command(tmp_path, stage, threads=1, gpus=2)
    for attempt in range(2):
        done = subprocess.run(cmd, env=worker_env(1), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert done.stderr.count(f"running {tmp_path / stage}") == (1 if attempt == 0 else 0)
        assert done.stderr.count(f"worker: {stage} done") == 2  # both ranks
    lines = (tmp_path / stage / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(set(lines)) and json.loads((tmp_path / stage / "summary.json").read_text())["steps"] == 4
