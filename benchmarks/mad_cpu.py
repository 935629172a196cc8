"""The cost of MAD's protocol on this machine: one training step of each model in MAD's stack at each
task's baseline shape, the figures that fix the CPU protocol's budget (``longrange mad --cpu``).

Usage:
    python benchmarks/mad_cpu.py [--models hyena mamba ...] [--width 128] [--batch-size 128] [--steps 3] [--json OUT]

Per model (``longrange.studies.mad.model_preset``: ``X swiglu X swiglu`` at width 128) and MAD task
(its baseline options: length, vocabulary), the median CPU time of a training step at MAD's batch of
128 and width 128 (or ``--batch-size``, ``--width``) on one thread (``experiment/dryrun.py::prepare_step``, synthetic batches of the task's shape),
after one untimed step; each model in a fresh process. The rule that turns these into the CPU
protocol's budget is in ``longrange.studies.mad.CPU_PROTOCOL`` and docs/recall-protocols.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_MODELS = [
    "mh-attention",
    "hyena",
    "mamba",
    "mh-gated-linear-attention",
    "mamba2",
    "gated-deltanet",
    "deltanet",
    "lru",
    "h3",
    "s4d",
]


def measure(model: str, steps: int, overrides: tuple[str, ...], batch_size: int) -> dict:
    import torch

    from longrange.experiment.dryrun import prepare_step
    from longrange.studies.mad import MAD_TASKS, MadSettings, cell_experiment

    torch.set_num_threads(1)
    settings = MadSettings(models=(model,), levels=("baseline",), overrides=overrides)
    row = {"model": model}
    for task in MAD_TASKS:
        exp = cell_experiment(settings, model, task, "baseline", 5e-4, 0.0)
        prepared = prepare_step(exp, "train", device="cpu", batch_size=batch_size)
        prepared.step()
        times = []
        for _ in range(steps):
            start = time.process_time()
            prepared.step()
            times.append(time.process_time() - start)
        row[task] = statistics.median(times)
        row["parameters"] = sum(p.numel() for p in prepared.model.parameters())
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=128, help="default MAD's 128")
    p.add_argument("--width", type=int, default=128, help="model.d_model (default MAD's 128)")
    p.add_argument("--json", type=Path)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print("ROW " + json.dumps(measure(args.worker, args.steps, (f"model.d_model={args.width}",), args.batch_size)))
        return
    rows = []
    for model in args.models:
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--worker",
                model,
                "--steps",
                str(args.steps),
                "--width",
                str(args.width),
                "--batch-size",
                str(args.batch_size),
            ],
            capture_output=True,
            text=True,
            env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
        )
        line = next((x for x in done.stdout.splitlines() if x.startswith("ROW ")), None)
        row = (
            json.loads(line[4:]) if line else {"model": model, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
        )
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
