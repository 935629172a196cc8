"""``longrange demo``: the fair comparison on a short generated ListOps, with no data on disk.

It generates a ListOps of 8000 training sequences of 32–128 tokens, trains a small Transformer and a small S4D
from scratch, with masked self-pretraining then finetuning, and from scratch for as many steps
as pretraining plus finetuning, and prints the comparison table. About ten minutes on a 2-core CPU.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from longrange.experiment.compare import compare
from longrange.experiment.config import resolve

DEMO_PRESETS = ("demo/transformer", "demo/s4d")

#: The generated ListOps: small, short, and shallow enough to learn in minutes.
DEMO_LISTOPS = dict(n_train=8000, n_val=500, n_test=1000, min_length=32, max_length=128, max_depth=4, max_args=5, seed=0)


def default_jobs() -> int:
    """Stages at once: 2 workers where there are 2 or more cores (3-8x faster than the in-process run
    with torch's default threads on the busy 2-core machine of the README's timings), else 1 (in process)."""
    return 2 if (os.cpu_count() or 1) >= 2 else 1


def run_demo(out_dir: str | Path = "runs/demo", seeds: list[int] | None = None, jobs: int | None = None) -> str:
    """Run the demo into ``out_dir`` and return the report's Markdown table.

    ``jobs``: stages at once as worker processes (``compare --jobs``; None: :func:`default_jobs`, 1:
    one after another in this process). The results do not depend on it."""
    from longrange.experiment.executors import LocalWorkers
    from longrange.data.generate.listops import generate

    out = Path(out_dir)
    data_dir = out / "data"
    listops = data_dir / "listops"
    start = time.time()
    if not (listops / "basic_test.tsv").is_file():
        print(f"generating a short ListOps into {listops} ...", file=sys.stderr, flush=True)
        generate(listops, quiet=True, **DEMO_LISTOPS)
    experiments = [resolve(name, overrides=[f"task.data_dir={data_dir}"]) for name in DEMO_PRESETS]
    jobs = default_jobs() if jobs is None else jobs
    compare(experiments, out, seeds=seeds, executor=LocalWorkers(jobs) if jobs > 1 else None)
    from longrange.report import write_report

    table = write_report([out], out_dir=out)
    print(f"\ndemo finished in {(time.time() - start) / 60:.1f} min; runs and report.md in {out}", file=sys.stderr)
    return table
