"""``longrange plan PRESET [--gpu NAME] [--batch N] [--json FILE] [FIELD=VALUE ...]``: a training step of a
preset planned for a GPU, without one (``bench/plan.py``): parameters, peak memory and its parts,
FLOPs and bytes per step, the largest batch that fits, the accumulation the batch needs, and a
lower bound of the step time. Every figure is predicted, not measured.

Exit status: 0 with a plan (also when the preset's own batch needs accumulation: the plan says how
much); 1 when the batch asked for with ``--batch`` does not fit in one step, or no micro-batch fits
at all (the plan is printed and written first).
"""

from __future__ import annotations

import argparse
import sys

#: The GPU planned for when ``--gpu`` is not given.
DEFAULT_GPU = "h100-sxm"


def _gib(n: int | float) -> str:
    from longrange.train.memory import format_bytes

    return format_bytes(n)


def _si(n: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}{unit}"
    return f"{n:.3g} {unit}"


def _seconds(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.3g} h"
    if s >= 60:
        return f"{s / 60:.3g} min"
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def format_plan(plan) -> str:
    """The plan as lines of text."""
    p, gpu = plan.peak_bytes, plan.gpu
    parts = ", ".join(f"{k} {_gib(p[k])}" for k in ("params", "grads", "optimizer", "activations"))
    lines = [
        f"plan of {plan.preset} ({plan.stage}, objective {plan.objective}) on {gpu.name}, {plan.precision}: "
        "predicted, not measured",
        f"  batch            {plan.batch} x {plan.seq_len} (inputs {plan.inputs})",
        f"  parameters       {plan.params:,}",
        f"  peak memory      {_gib(p['total'])} at batch {plan.batch} in one step ({parts})",
        f"  GPU memory       {_gib(plan.usable_bytes)} usable of {_gib(gpu.memory_bytes)}",
        f"  GPU rates        {_si(gpu.bandwidth, 'B/s')}; FP32 {_si(gpu.fp32, 'FLOP/s')}, TF32 tensor "
        f"{_si(gpu.tf32, 'FLOP/s')}, BF16 tensor {_si(gpu.bf16, 'FLOP/s')} (source: {gpu.source})",
        f"  fits             {'yes' if plan.fits else 'no'}"
        + ("" if plan.max_batch is None else f"; largest batch that fits in one step: {plan.max_batch}"),
    ]
    if plan.accumulation is None:
        lines.append("  accumulation     none fits: even a micro-batch of 1 needs more than the GPU has")
    else:
        line = f"  accumulation     {plan.accumulation} (micro-batch {plan.micro_batch}; train.grad_accum={plan.accumulation})"
        if plan.peak_bytes_accumulated:
            line += f", peak {_gib(plan.peak_bytes_accumulated['total'])}"
        lines.append(line)
    lines += [
        f"  per step         {_si(plan.flops_per_step, 'FLOP')}, {_si(plan.bytes_per_step, 'B')} moved",
        f"  step time        >= {_seconds(plan.step_time_lower_bound_s)} (roofline per operation; FLOPs alone "
        f"{_seconds(plan.compute_time_s)}, bytes alone {_seconds(plan.memory_time_s)})",
    ]
    if plan.steps is None:
        lines.append(f"  run time         not counted: {plan.steps_how}")
    else:
        lines.append(
            f"  run time         >= {_seconds(plan.run_time_lower_bound_s)} ({plan.steps:,} steps: "
            f"{plan.steps_how}; evaluation not included)"
        )
    if plan.kernels:
        lines.append(
            "  kernels          "
            + ", ".join(f"{k}: {v}" for k, v in sorted(plan.kernels.items()))
            + " (a GPU run's choice; the fused ones by their fake implementations)"
        )
    return "\n".join(lines)


def _plan(args: argparse.Namespace) -> int:
    from longrange.bench.gpus import find_gpu
    from longrange.bench.plan import plan_stage
    from longrange.experiment.cli import data_settings
    from longrange.experiment.config import resolve
    from longrange.fileio import write_json

    gpu = find_gpu(args.gpu)
    exp = resolve(args.preset, args.config, data_settings(args, args.settings))
    plan = plan_stage(
        exp,
        gpu,
        name=args.preset,
        stage=args.stage,
        objective=args.objective,
        batch=args.batch,
        vocab=args.vocab,
        items=args.items,
    )
    print(format_plan(plan))
    if args.json:
        write_json(args.json, plan.to_dict())
    where = f"{plan.preset} at batch {plan.batch} on {gpu.name}"
    if plan.accumulation is None:
        print(
            f"longrange plan: error: {where} does not fit even one sequence at a time "
            f"({_gib(plan.peak_bytes['total'])} at batch {plan.batch}; {_gib(plan.usable_bytes)} usable)",
            file=sys.stderr,
        )
        return 1
    if not plan.fits:
        message = (
            f"{where} does not fit in one step: {_gib(plan.peak_bytes['total'])} of {_gib(plan.usable_bytes)} "
            f"usable; the largest batch that fits is {plan.max_batch}; train.grad_accum={plan.accumulation} runs "
            f"it in micro-batches of {plan.micro_batch}"
        )
        if args.batch is not None:
            print(f"longrange plan: error: {message}", file=sys.stderr)
            return 1
        print(f"longrange plan: {message}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from longrange.bench.gpus import GPUS
    from longrange.experiment.cli import add_data_args

    p = sub.add_parser(
        "plan",
        help="plan a preset's training step on a GPU without one: memory, FLOPs, largest batch, step time",
        description="Runs the stage's training step on fake tensors (no computation, no memory) and predicts its "
        "peak memory (parameters, gradients, optimizer state, activations), FLOPs and bytes per step, "
        "the largest batch that fits the GPU, the gradient accumulation the batch needs and a roofline "
        "lower bound of the step time. Predicted, not measured: see docs/performance.md.",
    )
    p.add_argument("preset", help="a built-in preset (longrange presets) or a YAML experiment file")
    p.add_argument(
        "--gpu", default=DEFAULT_GPU, metavar="NAME", help=f"the GPU (default {DEFAULT_GPU}): {', '.join(GPUS)}"
    )
    p.add_argument(
        "--batch", type=int, default=None, metavar="N", help="the batch to plan (default the preset's train.batch_size)"
    )
    p.add_argument(
        "--stage",
        choices=("train", "pretrain"),
        default="train",
        help="train (supervised; also finetuning's model) or pretrain (default train)",
    )
    p.add_argument(
        "--objective",
        choices=("causal", "masked"),
        default=None,
        help="the pretraining objective (default the preset's compare.objectives, else the model's natural one)",
    )
    p.add_argument("--config", default=None, help="a YAML file applied on top of the preset")
    p.add_argument(
        "--vocab", type=int, default=None, help="vocabulary size of a token task (instead of loading its data)"
    )
    p.add_argument(
        "--items",
        type=int,
        default=None,
        help="the training set's size, for the run's steps and total "
        "time where train.max_steps is 0 (generated tasks: their n_train)",
    )
    p.add_argument("--json", metavar="FILE", help="write the plan as JSON")
    add_data_args(p)
    p.add_argument(
        "settings", nargs="*", metavar="FIELD=VALUE", help="overrides, e.g. train.precision=bf16 model.d_model=128"
    )
    p.set_defaults(func=_plan)
