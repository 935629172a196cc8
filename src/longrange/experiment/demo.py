"""``longrange demo``: the fair comparison on generated data, with no data on disk.

Two demos, each a part of a study of ``docs/small-scale-spt.md`` kept field by field:

* ``recall`` (the default): single-query associative recall with 250 and with 1,000 labelled
  sequences, a Transformer and a DLR (diagonal linear RNN) trained from scratch and with causal
  self-pretraining on the inputs of the whole training split, then finetuning, over 3 seeds (presets
  ``demo/recall/transformer`` and ``demo/recall/dlr``; a part of the setting ``ar-small-recall3`` of
  ``benchmarks/recall_spt.py``, whose results were confirmed on fresh seeds): SPT lifts the
  Transformer, and with 1,000 labels the DLR is the better of the two from scratch, the Transformer
  after SPT. About 6 minutes on a 2-core CPU.
* ``listops``: a generated short ListOps, a small DLR trained from scratch, with masked
  self-pretraining, and from scratch with matched compute, over 5 seeds (preset ``demo/dlr``; the
  setting ``listops-short-dlr-random-10pct`` of ``benchmarks/small_scale_spt.py``, where no
  difference was detectable). About 5 minutes.

Each prints the comparison table (mean and 95% CI over seeds), the verdict computed from the paired
seeds per architecture, and the ranking of the architectures under each regime; ``OUT/report.md``
adds the plots.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from longrange.experiment.compare import compare
from longrange.experiment.config import resolve


@dataclass(frozen=True)
class Demo:
    """One demo; its name is its key in :data:`DEMOS`."""

    #: the presets it compares (their ``compare`` sections give the regimes)
    presets: tuple[str, ...]
    seeds: tuple[int, ...]
    #: the study script and the setting the presets repeat
    study: str
    setting: str
    #: the default output directory
    out: str
    #: learned-kernel decay in the report (convolutional models only)
    kernels: bool
    summary: str
    #: why the compared models' sizes differ, where they do (printed instead of a warning)
    sizes: str | None = None


DEMOS: dict[str, Demo] = {
    "recall": Demo(
        ("demo/recall/transformer", "demo/recall/dlr"),
        (0, 1, 2),
        "benchmarks/recall_spt.py",
        "ar-small-recall3",
        "runs/demo",
        False,
        "associative recall with 250 and 1,000 labelled sequences of 20,000: a Transformer and a DLR, "
        "from scratch and with causal self-pretraining on all 20,000 inputs, 3 seeds",
        "the models are the recall study's, at the width (64) where its finding was screened and "
        "confirmed, not matched in parameters (the Transformer has 3.6x the DLR's); the study's "
        "parameter-matched setting ar-small-recall3-pmatch (DLR at width 139, the Transformer's 104k) "
        "finds that the ranking still changes (docs/small-scale-spt.md); `compare --match-params` "
        "matches any comparison",
    ),
    "listops": Demo(
        ("demo/dlr",),
        (0, 1, 2, 3, 4),
        "benchmarks/small_scale_spt.py",
        "listops-short-dlr-random-10pct",
        "runs/demo-listops",
        True,
        "a generated short ListOps with 10% of its labels: a small DLR from scratch, with masked "
        "self-pretraining and with matched compute, 5 seeds",
    ),
}
DEFAULT_DEMO = "recall"

#: The default demo's presets and seeds.
DEMO_PRESETS = DEMOS[DEFAULT_DEMO].presets
DEMO_SEEDS = DEMOS[DEFAULT_DEMO].seeds


def default_jobs() -> int:
    """Stages at once: ``--jobs auto`` (:func:`~longrange.experiment.backends.local.auto_jobs`: one
    per GPU, else one per core with one thread each; 1 runs them in this process)."""
    from longrange.experiment.backends.local import auto_jobs

    return auto_jobs()


def run_demo(
    out_dir: str | Path | None = None,
    seeds: Sequence[int] | None = None,
    jobs: int | str | None = None,
    overrides: Sequence[str] = (),
    which: str = DEFAULT_DEMO,
) -> str:
    """Run a demo into ``out_dir`` and return what it prints: the results table, the verdict and the ranking.

    ``which``: a name of :data:`DEMOS`. ``out_dir``: default the demo's own (``runs/demo``,
    ``runs/demo-listops``). ``seeds``: default the demo's. ``jobs``: stages at once as worker
    processes (``compare --jobs``; None or "auto": :func:`default_jobs`, 1: one after another in this
    process); the results do not depend on it. ``overrides``: ``FIELD=VALUE`` settings applied to
    every preset."""
    from longrange.experiment.backends import LocalWorkers
    from longrange.report.writer import report_and_verdict

    if which not in DEMOS:
        raise ValueError(f"unknown demo {which!r}; known: {', '.join(DEMOS)}")
    demo = DEMOS[which]
    out = Path(demo.out if out_dir is None else out_dir)
    start = time.time()
    print(f"demo {which}: {demo.summary}", file=sys.stderr, flush=True)
    experiments = [resolve(name, overrides=[f"task.data_dir={out / 'data'}", *overrides]) for name in demo.presets]
    jobs = default_jobs() if jobs in (None, "auto") else jobs
    compare(
        experiments,
        out,
        seeds=list(demo.seeds if seeds is None else seeds),
        executor=LocalWorkers(jobs) if jobs > 1 else None,
        size_note=demo.sizes,
    )
    text = report_and_verdict(out, kernels=demo.kernels)
    if demo.sizes:
        text = f"Model sizes: {demo.sizes}.\n\n{text}"
    print(f"\ndemo finished in {(time.time() - start) / 60:.1f} min; runs and report.md in {out}", file=sys.stderr)
    return text
