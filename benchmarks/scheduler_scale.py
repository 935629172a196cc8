"""The coordinator's own cost per stage: ``compare`` over grids of 1,000 to 10,000 stages whose stages
finish at once, so that what is measured is the coordinator alone (planning, the reuse check, reading
each stage's state, scheduling, collecting the results), not training.

    python benchmarks/scheduler_scale.py                       # 1,000 and 10,002 stages
    python benchmarks/scheduler_scale.py --stages 300 --json out.json

Each grid is ``compare`` with a backend whose stages complete when polled, writing the files of a
finished stage (``config.yaml`` and ``summary.json``, as small as a real tiny stage's) so that the
final collection reads real files; then the same ``compare`` again, which reuses every stage (the
rerun after a preemption). Reported: wall and CPU seconds of this process, per stage, and its peak
resident memory. benchmarks/chaos.py measures the same coordinator with real stages and kills.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


class InstantBackend:
    """Stages that finish when polled: writes each stage's config and summary (no training)."""

    submits_ahead = False
    wait = True
    poll_interval = 0.0

    def begin(self, plan, out_dir, intent):
        self.plan, self.out_dir = plan, Path(out_dir)

    def slots(self):
        return 64

    def submit(self, stages, after):
        return {s.id: s for s in stages}

    def poll(self, stage):
        from longrange.experiment.scheduler import Outcome
        from longrange.train.rundir import RunDir

        resolved = self.plan.resolve(stage, self.out_dir)
        run = RunDir(self.out_dir / stage.id)
        run.root.mkdir(parents=True, exist_ok=True)
        config = run.write_config(resolved.config())
        run.write_summary(
            {
                "task": resolved.exp.task.name,
                "label": resolved.exp.label,
                "regime": resolved.regime,
                "stage": stage.stage,
                "seed": stage.seed,
                "metric": "accuracy",
                "higher_is_better": True,
                "best_val": {"accuracy": 0.5},
                "test": {"accuracy": 0.5},
                "steps": 4,
                "params": {"total": 100, "in_primitives": 10},
                "seconds": 0.0,
                "fingerprint": config["fingerprint"],
            }
        )
        return Outcome.DONE

    def cancel(self, handle):
        pass

    def stop(self, handles, interrupted):
        pass

    def end(self, handles):
        pass


def experiment(seeds: int, data_dir: Path) -> dict:
    return {
        "label": "scale",
        "task": {"name": "listops", "options": {"seq_len": 32}, "data_dir": str(data_dir)},
        "model": {"block": "simple", "primitive": "s4d", "n_layers": 1, "d_model": 8, "d_state": 4},
        "train": {"batch_size": 16, "epochs": 1, "progress": False},
        "compare": {"objectives": ["masked"], "seeds": list(range(seeds)), "compute_matched": False},
    }


def measure(stages: int, root: Path) -> dict:
    import contextlib
    import io

    from longrange.experiment.compare import compare
    from longrange.experiment.config import experiment_from_dict

    exp = experiment_from_dict(experiment(-(-stages // 3), root / "data"))
    out = root / f"grid{stages}"
    rows = {}
    for name in ("first run", "rerun (all reused)"):
        t0, c0 = time.perf_counter(), time.process_time()
        with contextlib.redirect_stderr(io.StringIO()):
            summaries = compare([exp], out, executor=InstantBackend())
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        n = len(json.loads((out / "plan.json").read_text())["stages"])
        rows[name] = {
            "stages": n,
            "final": len(summaries),
            "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
            "cpu_ms_per_stage": round(1000 * cpu / n, 2),
        }
    rows["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", default="1000,10002", help="comma-separated grid sizes")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    sys.path.insert(0, str(SRC))
    from longrange.data.generate.listops import generate

    root = Path(tempfile.mkdtemp(prefix="scheduler-scale-"))
    # compare checks that the task's data is there (the stages here read none of it)
    generate(
        root / "data" / "listops",
        n_train=16,
        n_val=4,
        n_test=4,
        min_length=8,
        max_length=24,
        max_depth=3,
        max_args=3,
        seed=0,
        quiet=True,
    )
    results = {}
    try:
        for n in (int(s) for s in args.stages.split(",")):
            results[n] = measure(n, root)
            print(json.dumps({"requested": n, **results[n]}), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
