"""``longrange demo``: the fair comparison on generated data, with no data on disk.

Its presets (``demo/*``) read a generated short ListOps (``task.generate: {config: short}``),
built on first use under ``OUT/data``. For each model it trains, over :data:`DEMO_SEEDS`,

* from scratch,
* with masked self-pretraining on the training inputs, then finetuning,
* from scratch for as many steps as pretraining plus finetuning (the compute-matched baseline),

and prints the comparison table (mean and 95% CI over seeds) and the verdict computed from the
paired seeds; ``OUT/report.md`` adds the plots and the learned-kernel decay. The setting is the one
``docs/small-scale-spt.md`` selected on the validation split. About 5 minutes on a 2-core CPU.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Sequence

from longrange.experiment.compare import compare
from longrange.experiment.config import resolve

#: The setting of ``benchmarks/small_scale_spt.py`` that the demo runs (its presets repeat it field by field).
DEMO_SETTING = "listops-short-dlr-random-10pct"
DEMO_PRESETS = ("demo/dlr",)
DEMO_SEEDS = (0, 1, 2, 3, 4)


def default_jobs() -> int:
    """Stages at once: 2 workers where there are 2 or more cores (3-8x faster than the in-process run
    with torch's default threads on the busy 2-core machine of the README's timings), else 1 (in process)."""
    return 2 if (os.cpu_count() or 1) >= 2 else 1


def run_demo(out_dir: str | Path = "runs/demo", seeds: Sequence[int] | None = None, jobs: int | None = None,
             overrides: Sequence[str] = ()) -> str:
    """Run the demo into ``out_dir`` and return what it prints: the results table and the verdict.

    ``seeds``: default :data:`DEMO_SEEDS`. ``jobs``: stages at once as worker processes (``compare
    --jobs``; None: :func:`default_jobs`, 1: one after another in this process); the results do not
    depend on it. ``overrides``: ``FIELD=VALUE`` settings applied to every preset."""
    from longrange.experiment.backends import LocalWorkers
    from longrange.report.writer import report_and_verdict

    out = Path(out_dir)
    start = time.time()
    experiments = [resolve(name, overrides=[f"task.data_dir={out / 'data'}", *overrides]) for name in DEMO_PRESETS]
    jobs = default_jobs() if jobs is None else jobs
    compare(experiments, out, seeds=list(DEMO_SEEDS if seeds is None else seeds),
            executor=LocalWorkers(jobs) if jobs > 1 else None)
    text = report_and_verdict(out, kernels=True)
    print(f"\ndemo finished in {(time.time() - start) / 60:.1f} min; runs and report.md in {out}", file=sys.stderr)
    return text
