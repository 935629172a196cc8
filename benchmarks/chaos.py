"""Chaos: a comparison grid whose workers (or SLURM jobs) and coordinator are SIGKILLed at random
moments, rerun until done, against the same grid run without interruption.

    python benchmarks/chaos.py                                # 201 stages, 3 kill schedules, 2 local workers
    python benchmarks/chaos.py --stages 1002 --launcher slurm-local --jobs 4 --schedules 1
    python benchmarks/chaos.py --stages 30 --schedules 1      # a quick look

The grid: a tiny Simple-S4D on a tiny generated ListOps (64 training sequences of 8-24 tokens), one
experiment over many seeds, each seed three stages (scratch; masked pretraining; finetuning from
it), so a third of the stages depend on another. Each stage trains 4 steps: the grid measures the
machinery, not the models.

For each kill schedule (a random seed): ``compare`` runs as a process of its own (the
coordinator); while its first ``--kill-runs`` runs last, a killer waits an exponential time
(mean ``--every`` seconds), then SIGKILLs a random live worker (``--launcher local``: a worker
process; ``slurm-local``: a job of submitit's local executor together with its worker, as a node
that is lost or preempted kills them) or, with probability ``--coordinator-share``, the
coordinator itself (its workers run on as orphans, as a coordinator's jobs do on a cluster). Then
``compare`` is run again, as a user would, until it exits 0. The uninterrupted grid is the same
command without kills (with ``--reference-launcher local``, through local workers: a stage's results
do not depend on the launcher, and the reference of a 1,000-stage SLURM grid then costs a fraction of
the CPU of a job per stage).

Reported per schedule: kills (workers or jobs; coordinator), kills that landed after a stage had
written its summary, reruns, and the stages **lost** (not finished at the end), **extra** (a
result outside the plan), **duplicated** (trained to the end twice) and **differing** from the
uninterrupted grid (any field of the summary but its wall time): the last four must be 0. Also the
coordinator's own CPU time and peak memory (its ``getrusage``, without its workers) for the
uninterrupted grid, per stage.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
SRC = HERE.parents[1] / "src"
VOLATILE = ("seconds",)


def experiment(data_dir: Path, seeds: int) -> dict:
    return {
        "label": "chaos",
        "task": {"name": "listops", "options": {"seq_len": 32}, "data_dir": str(data_dir)},
        "model": {
            "block": "simple",
            "primitive": "s4d",
            "n_layers": 1,
            "d_model": 8,
            "d_state": 4,
            "direction": "bidirectional",
        },
        "train": {"batch_size": 16, "epochs": 1, "lr": 0.003, "progress": False, "log_every": 2},
        "compare": {"objectives": ["masked"], "seeds": list(range(seeds)), "compute_matched": False},
    }


# --------------------------------------------------------------------------- the coordinator
def coordinator(out: str, config: str, launcher: str, jobs: int, usage: str) -> int:
    """Run the comparison (this process is the coordinator) and write its own resource use."""
    import resource

    import yaml

    from longrange.experiment.backends import LocalWorkers, SlurmLauncher
    from longrange.experiment.compare import StageFailed, compare
    from longrange.experiment.config import LauncherConfig, experiment_from_dict

    exp = experiment_from_dict(yaml.safe_load(Path(config).read_text()))
    if launcher == "local":
        backend = LocalWorkers(jobs, threads_per_job=1, gpus=[])
    else:
        backend = SlurmLauncher(
            LauncherConfig(kind="slurm", jobs=jobs, gpus_per_job=0, threads_per_job=1, time_min=60),
            cluster="local",
            poll_every=0.2,
        )
    start = time.time()
    rc = 0
    try:
        compare([exp], out, executor=backend)
    except StageFailed as err:
        print(f"chaos: compare ended with: {str(err)[:300]}", file=sys.stderr, flush=True)
        rc = 1
    own = resource.getrusage(resource.RUSAGE_SELF)
    Path(usage).write_text(
        json.dumps(
            {"cpu_s": own.ru_utime + own.ru_stime, "max_rss_mb": own.ru_maxrss / 1024, "wall_s": time.time() - start}
        )
    )
    return rc


# --------------------------------------------------------------------------- killing
def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _descendants(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        for c in _children(p):
            seen.append(c)
            todo.append(c)
    return seen


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Killer(threading.Thread):
    """SIGKILLs random workers (or jobs with their workers) of a running coordinator, and maybe it."""

    def __init__(self, proc: subprocess.Popen, log: Path, rng: random.Random, every: float, coordinator_share: float):
        super().__init__(daemon=True)
        self.proc, self.log, self.rng, self.every, self.share = proc, log, rng, every, coordinator_share
        self.stop = threading.Event()
        self.workers = self.coordinators = 0

    def _targets(self) -> list[int]:
        text = self.log.read_text(errors="replace") if self.log.is_file() else ""
        pids = {int(p) for p in re.findall(r"\(worker \d+ with \d+ thread\(s\), PID (\d+);", text)}
        pids |= {int(p) for p in re.findall(r"submitted \S+: job (\d+)", text)}  # the local executor's job = its PID
        return sorted(p for p in pids if _alive(p))

    def run(self) -> None:
        while not self.stop.wait(self.rng.expovariate(1.0 / self.every)):
            if self.proc.poll() is not None:
                return
            if self.rng.random() < self.share:
                self.proc.send_signal(signal.SIGKILL)
                self.coordinators += 1
                return
            targets = self._targets()
            if not targets:
                continue
            victim = self.rng.choice(targets)
            for pid in [victim, *_descendants(victim)]:  # a job and its worker die together, as on a lost node
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.workers += 1


# --------------------------------------------------------------------------- one grid
def run_grid(
    out: Path,
    config: Path,
    launcher: str,
    jobs: int,
    rng: random.Random | None,
    kill_runs: int,
    every: float,
    share: float,
    max_runs: int = 30,
) -> dict:
    """Run ``compare`` until it exits 0 (killing while the first ``kill_runs`` runs last, if ``rng``)."""
    out.mkdir(parents=True, exist_ok=True)
    kills = {"workers": 0, "coordinator": 0}
    usage = None
    for run in range(1, max_runs + 1):
        log = out / f"coordinator-{run}.log"
        usage_file = out / f"usage-{run}.json"
        cmd = [sys.executable, str(HERE), "--coordinator", str(out), str(config), launcher, str(jobs), str(usage_file)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        killer = None
        if rng is not None and run <= kill_runs:
            killer = Killer(proc, log, rng, every, share)
            killer.start()
        rc = proc.wait()
        if killer is not None:
            killer.stop.set()
            killer.join()
            kills["workers"] += killer.workers
            kills["coordinator"] += killer.coordinators
        if usage_file.is_file():
            usage = json.loads(usage_file.read_text())
        if rc == 0:
            return {"runs": run, "reruns": run - 1, "kills": kills, "usage": usage}
        if "running in another process" in log.read_text(errors="replace"):
            time.sleep(2.0)  # orphans of a killed coordinator still hold stages: let them finish
    raise SystemExit(f"{out}: not finished after {max_runs} runs")


def results(out: Path) -> dict[str, dict]:
    return {
        str(p.parent.relative_to(out)): {k: v for k, v in json.loads(p.read_text()).items() if k not in VOLATILE}
        for p in out.rglob("summary.json")
    }


def audit(out: Path, reference: dict[str, dict]) -> dict:
    """Stages lost, extra, duplicated and differing from the uninterrupted grid."""
    got = results(out)
    plan = [s["id"] for s in json.loads((out / "plan.json").read_text())["stages"]]
    done_lines = {}
    for sid in plan:
        log = out / sid / "stage.log"
        text = log.read_text(errors="replace") if log.is_file() else ""
        done_lines[sid] = text.count(f"worker: {sid} done")
    text = "\n".join(p.read_text(errors="replace") for p in out.glob("coordinator-*.log"))
    return {
        "stages": len(plan),
        "lost": sorted(set(plan) - set(got)),
        "extra": sorted(set(got) - set(plan)),
        "duplicated": sorted(s for s, n in done_lines.items() if n > 1),
        "differing": sorted(s for s in set(plan) & set(got) if got[s] != reference.get(s)),
        "killed_after_summary": text.count("after its run had finished; recorded as finished"),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--coordinator":
        return coordinator(*argv[1:3], argv[3], int(argv[4]), argv[5])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", type=int, default=201, help="stages in the grid (rounded up to a multiple of 3)")
    p.add_argument("--schedules", type=int, default=3, help="kill schedules (random seeds 0..N-1)")
    p.add_argument("--launcher", choices=("local", "slurm-local"), default="local")
    p.add_argument(
        "--reference-launcher",
        choices=("local", "slurm-local"),
        default=None,
        help="the launcher of the uninterrupted grid (default: --launcher; a grid's results do not depend on it)",
    )
    p.add_argument("--jobs", type=int, default=2, help="stages at once")
    p.add_argument("--every", type=float, default=3.0, help="mean seconds between kills")
    p.add_argument("--kill-runs", type=int, default=3, help="runs of compare during which kills happen")
    p.add_argument("--coordinator-share", type=float, default=0.05, help="the share of kills that hit the coordinator")
    p.add_argument("--dir", default="chaos-runs", help="working directory (kept)")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)

    sys.path.insert(0, str(SRC))
    import yaml

    from longrange.data.generate.listops import generate

    root = Path(args.dir)
    data = root / "data"
    if not (data / "listops").is_dir():
        generate(
            data / "listops",
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
    seeds = -(-args.stages // 3)
    config = root / "experiment.yaml"
    config.write_text(yaml.safe_dump(experiment(data.resolve(), seeds)))
    tag = f"{args.launcher}-{3 * seeds}"
    ref_launcher = args.reference_launcher or args.launcher
    ref_dir = root / f"uninterrupted-{ref_launcher}-{3 * seeds}"
    t0 = time.time()
    ref = run_grid(ref_dir, config, ref_launcher, args.jobs, None, 0, args.every, args.coordinator_share)
    reference = results(ref_dir)
    usage = ref["usage"]
    row = {
        "launcher": args.launcher,
        "reference_launcher": ref_launcher,
        "stages": 3 * seeds,
        "jobs": args.jobs,
        "uninterrupted_wall_s": round(time.time() - t0, 1),
        "coordinator_cpu_s": round(usage["cpu_s"], 2),
        "coordinator_cpu_ms_per_stage": round(1000 * usage["cpu_s"] / (3 * seeds), 1),
        "coordinator_max_rss_mb": round(usage["max_rss_mb"], 1),
        "schedules": [],
    }
    print(
        f"uninterrupted ({ref_launcher}): {row['stages']} stages in {row['uninterrupted_wall_s']} s; coordinator {row['coordinator_cpu_s']} s CPU "
        f"({row['coordinator_cpu_ms_per_stage']} ms per stage), peak {row['coordinator_max_rss_mb']} MB",
        flush=True,
    )
    for seed in range(args.schedules):
        out = root / f"chaos-{tag}-{seed}"
        t0 = time.time()
        ran = run_grid(
            out,
            config,
            args.launcher,
            args.jobs,
            random.Random(seed),
            args.kill_runs,
            args.every,
            args.coordinator_share,
        )
        found = audit(out, reference)
        line = {
            "schedule": seed,
            "kills_workers": ran["kills"]["workers"],
            "kills_coordinator": ran["kills"]["coordinator"],
            "killed_after_summary": found["killed_after_summary"],
            "reruns": ran["reruns"],
            "lost": len(found["lost"]),
            "extra": len(found["extra"]),
            "duplicated": len(found["duplicated"]),
            "differing": len(found["differing"]),
            "wall_s": round(time.time() - t0, 1),
            "which": {k: found[k] for k in ("lost", "extra", "duplicated", "differing") if found[k]},
        }
        row["schedules"].append(line)
        print(json.dumps(line), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=1))
    bad = sum(s["lost"] + s["extra"] + s["duplicated"] + s["differing"] for s in row["schedules"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
