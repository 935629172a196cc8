"""Wall time of the demo's comparison grid run one stage after another vs with local workers.

    python benchmarks/grid_jobs.py                 # the full demo grid (as long as the demo, three times)
    python benchmarks/grid_jobs.py --max-steps 30  # 30 steps per stage (60 for the matched runs): on a busy machine
    python benchmarks/grid_jobs.py --demo listops --epochs 1   # the ListOps demo's grid, 1 epoch per stage
    python benchmarks/grid_jobs.py --max-steps 100 --placements 16x1,8x2,4x4 --no-sequential --warmup --json OUT.json

Runs a demo's grid (its presets and seeds; the data generated on first use, once) sequentially in
this process (with torch's default threads, and with one thread) and with ``--jobs`` workers (cores //
jobs threads each), or with each placement of ``--placements`` (JOBSxTHREADS: workers and threads per
worker), back to back, each into a fresh directory (``--warmup``: after an untimed run that generates
the data and fills the kernel caches, which the first timed run would otherwise pay for), and prints the wall times and the load average
around each run (the timings mean little on a machine busy with other work). The stages run on the
CPU (CUDA hidden from them), which is what ``compare --jobs auto`` places on a machine without GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path


def placements(text: str) -> list[tuple[int, int]]:
    """``"16x1,8x2"`` -> [(16, 1), (8, 2)]: workers and threads per worker."""
    out = []
    for item in text.split(","):
        jobs, sep, threads = item.strip().partition("x")
        if not sep or not jobs.isdigit() or not threads.isdigit() or int(jobs) < 1 or int(threads) < 1:
            raise argparse.ArgumentTypeError(
                f"a placement is JOBSxTHREADS with both at least 1, e.g. 8x2; got {item!r}"
            )
        out.append((int(jobs), int(threads)))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demo", default="recall", help="which demo's grid (recall, listops)")
    p.add_argument("--epochs", type=int, default=0, help="epochs per stage (0: the demo's own)")
    p.add_argument("--max-steps", type=int, default=0, help="steps per stage (0: by epochs)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--placements", type=placements, default=None, help="JOBSxTHREADS,... instead of --jobs")
    p.add_argument("--no-sequential", action="store_true", help="leave out the two runs in this process")
    p.add_argument(
        "--warmup",
        action="store_true",
        help="first run the grid once, untimed, at 2 steps per stage with the first placement: the data "
        "generated and the compiled kernels cached before the timed runs, so that the first is not charged for them",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    p.add_argument("--dir", default=None, help="working directory (default: a temporary one, removed)")
    args = p.parse_args(argv)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the stages and their workers on the CPU

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
    runs = (
        []
        if args.no_sequential
        else [
            ("sequential (in process, torch's default threads)", None),
            ("sequential (in process, --threads-per-job 1)", InProcess(1)),
        ]
    )
    if args.placements:
        runs += [(f"--jobs {j} --threads-per-job {t}", LocalWorkers(j, t, gpus=[])) for j, t in args.placements]
    else:
        runs.append((f"--jobs {args.jobs} (cores // jobs threads each)", LocalWorkers(args.jobs, gpus=[])))
    if args.warmup:
        warm = [
            resolve(name, overrides=[*overrides, "train.max_steps=2", "pretrain.max_steps=2"]) for name in demo.presets
        ]
        start = time.time()
        compare(warm, root / "warmup", seeds=list(demo.seeds), executor=runs[0][1])
        print(f"warm-up (untimed in the table): {time.time() - start:.0f} s")
        shutil.rmtree(root / "warmup", ignore_errors=True)
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
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "dir")}
        table = [dict(zip(("run", "seconds", "load_before", "load_after"), r)) for r in rows]
        args.json.write_text(json.dumps({"cores": os.cpu_count(), "settings": settings, "rows": table}, indent=1))
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
