"""Wall time of the demo's comparison grid run one stage after another vs with local workers.

    python benchmarks/grid_jobs.py                 # the full demo grid (as long as the demo, three times)
    python benchmarks/grid_jobs.py --max-steps 30  # 30 steps per stage (60 for the matched runs): on a busy machine
    python benchmarks/grid_jobs.py --demo listops --epochs 1   # the ListOps demo's grid, 1 epoch per stage

Runs a demo's grid (its presets and seeds; the data generated on first use, once) sequentially in
this process (with torch's default threads, and with one thread) and with ``--jobs`` workers, back to back,
each into a fresh directory, and prints both wall times and the load average around each run (the
timings mean little on a machine busy with other work).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", default="recall", help="which demo's grid (recall, listops)")
    p.add_argument("--epochs", type=int, default=0, help="epochs per stage (0: the demo's own)")
    p.add_argument("--max-steps", type=int, default=0, help="steps per stage (0: by epochs)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--dir", default=None, help="working directory (default: a temporary one, removed)")
    args = p.parse_args()

    from longrange.experiment.backends import InProcess, LocalWorkers
    from longrange.experiment.compare import compare
    from longrange.experiment.config import resolve
    from longrange.experiment.demo import DEMOS

    demo = DEMOS[args.demo]
    root = Path(args.dir or tempfile.mkdtemp(prefix="grid-jobs-"))
    overrides = [f"task.data_dir={root / 'data'}"]
    if args.epochs:
        overrides += [f"train.epochs={args.epochs}", f"pretrain.epochs={args.epochs}"]
    if args.max_steps:
        overrides += [f"train.max_steps={args.max_steps}", f"pretrain.max_steps={args.max_steps}"]
    experiments = [resolve(name, overrides=overrides) for name in demo.presets]
    rows = []
    runs = [
        ("sequential (in process, torch's default threads)", None),
        ("sequential (in process, --threads-per-job 1)", InProcess(1)),
        (f"--jobs {args.jobs} (cores // jobs threads each)", LocalWorkers(args.jobs)),
    ]
    for k, (name, executor) in enumerate(runs):
        out = root / f"run{k}"
        shutil.rmtree(out, ignore_errors=True)
        load = os.getloadavg()[0]
        start = time.time()
        compare(experiments, out, seeds=list(demo.seeds), executor=executor)
        rows.append((name, time.time() - start, load, os.getloadavg()[0]))
    print(
        f"\n{os.cpu_count()} cores; grid: {', '.join(demo.presets)}, epochs {args.epochs or 'as the demo'}"
        + (f", {args.max_steps} steps per stage" if args.max_steps else "")
    )
    print("| run | wall time | load average before / after |\n|---|---:|---|")
    for name, seconds, before, after in rows:
        print(f"| {name} | {seconds / 60:.1f} min | {before:.1f} / {after:.1f} |")
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
