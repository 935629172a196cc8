"""The plan's memory prediction against measurement, on this machine's CPU.

    python benchmarks/plan_cpu_check.py

For the demo models and the thesis' five architectures (6 layers, their widths) at three batch x
length sizes, the peak memory of one training step predicted on fake tensors
(``longrange.bench.plan.measure_step(..., target="cpu")``: the CPU's kernels) and measured on real
CPU tensors from the profiler's allocation events (``measured_cpu_peak``). Also the masked
pretraining step of the demo models, where the prediction selects every position for the loss (an
upper bound) while the real step selects the masked ones. Writes
``benchmarks/results/plan_cpu_check.{json,md}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results" / "plan_cpu_check"
MODELS = {
    "demo/s4d": None,
    "demo/transformer": None,
    "demo/dlr": None,
    "thesis/scifar/mamba-s6": None,
    "thesis/image/mamba-s4d": None,
    "thesis/pathfinder/mamba-s4": None,
    "thesis/text/simple-s4": 116,
    "thesis/scifar/simple-s4d": None,
}
SIZES = [(2, 256), (4, 512), (8, 1024)]


def main() -> int:
    import torch

    import longrange
    from longrange.bench.plan import measure_step, measured_cpu_peak
    from longrange.experiment.config import experiment_from_dict, load_experiment
    from longrange.studies.grid import lengths_follow

    torch.set_num_threads(1)
    rows = []
    cases = [(name, "train", None, b, n) for name in MODELS for b, n in SIZES]
    cases += [(name, "pretrain", "masked", 8, 128) for name in ("demo/s4d", "demo/transformer", "demo/dlr")]
    for name, stage, objective, batch, length in cases:
        data = load_experiment(name)  # S4's kernel (and any long filter) built for the length
        data["model"] = lengths_follow(data["model"], length)
        exp = experiment_from_dict(data)
        vocab = MODELS[name]
        predicted = measure_step(
            exp, stage, objective, micro_batch=batch, seq_len=length, target="cpu", vocab=vocab, count=False
        ).peak["total"]
        measured = measured_cpu_peak(exp, stage, objective, micro_batch=batch, seq_len=length, vocab=vocab)
        rows.append(
            dict(
                preset=name,
                stage=stage,
                objective=objective or "supervised",
                batch=batch,
                length=length,
                predicted=predicted,
                measured=measured,
                ratio=predicted / measured,
            )
        )
        print(
            f"{name} {stage} {batch}x{length}: predicted {predicted / 2**20:.1f} MiB, measured "
            f"{measured / 2**20:.1f} MiB, ratio {predicted / measured:.3f}",
            flush=True,
        )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".json").write_text(
        json.dumps(
            {
                "command": "python benchmarks/plan_cpu_check.py",
                "torch": torch.__version__,
                "longrange": longrange.__version__,
                "threads": 1,
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    lines = [
        "| preset | stage | batch x length | predicted (MiB) | measured (MiB) | predicted / measured |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        stage = r["stage"] if r["stage"] == "train" else f"pretrain ({r['objective']})"
        lines.append(
            f"| {r['preset']} | {stage} | {r['batch']} x {r['length']} | {r['predicted'] / 2**20:.1f} | "
            f"{r['measured'] / 2**20:.1f} | {r['ratio']:.3f} |"
        )
    OUT.with_suffix(".md").write_text(
        "`python benchmarks/plan_cpu_check.py` (CPU, float32, one thread)\n\n" + "\n".join(lines) + "\n"
    )
    print(f"wrote {OUT.with_suffix('.json')} and {OUT.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
