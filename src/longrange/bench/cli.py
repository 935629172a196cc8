"""``longrange bench``: the model table (default), ``--scaling`` and ``--generation``.

The functions behind the command return rows (dicts); this module only parses options, formats the
rows as a text table and writes the optional JSON (``{"mode", "settings", "rows", ...}``) and PNG.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from longrange.errors import ConfigError

Column = tuple[str, str, Callable[[Any], str]]


def _f(fmt: str) -> Callable[[Any], str]:
    return lambda v: "-" if v is None else format(v, fmt)


def format_table(rows: list[dict[str, Any]], columns: list[Column], key: str) -> str:
    """A fixed-width text table; a row with an ``error`` prints it after its ``key`` cell."""
    header = [h for _, h, _ in columns]
    cells = []
    for r in rows:
        if "error" in r:
            cells.append(None)
        else:
            cells.append([fmt(r.get(k)) if k in r else "-" for k, _, fmt in columns])
    widths = [max([len(h)] + [len(c[i]) for c in cells if c]) for i, h in enumerate(header)]

    def line(vals: list[str]) -> str:
        return "  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(vals, widths)))

    out = [line(header), line(["-" * w for w in widths])]
    for r, c in zip(rows, cells):
        out.append(f"{str(r[key]).ljust(widths[0])}  FAILED: {r['error']}" if c is None else line(c))
    return "\n".join(out)


BENCH_COLUMNS: list[Column] = [
    ("model", "model", str),
    ("params", "params", _f(",d")),
    ("train_s_per_batch", "train s/batch", _f(".3f")),
    ("train_seq_per_s", "train seq/s", _f(".1f")),
    ("train_tok_per_s", "train tok/s", _f(",.0f")),
    ("train_peak_mb", "train MB", _f(".0f")),
    ("infer_seq_per_s", "infer seq/s", _f(".1f")),
    ("infer_tok_per_s", "infer tok/s", _f(",.0f")),
    ("infer_peak_mb", "infer MB", _f(".0f")),
    ("train_speed_pct", "train speed %", _f(".0f")),
    ("train_mem_pct", "train mem %", _f(".0f")),
    ("infer_speed_pct", "infer speed %", _f(".0f")),
    ("infer_mem_pct", "infer mem %", _f(".0f")),
]

SCALING_COLUMNS: list[Column] = [
    ("primitive", "primitive", str),
    ("length", "length", str),
    ("time_s", "s/step", _f(".4f")),
    ("peak_mb", "peak MB", _f(".1f")),
    ("status", "status", str),
]

GENERATION_COLUMNS: list[Column] = [
    ("model", "model", str),
    ("position", "position", str),
    ("step_ms", "step ms/token", _f(".3f")),
    ("step_tok_per_s", "step tok/s", _f(".1f")),
    ("state_kb", "state KB", _f(".1f")),
    ("recompute_ms", "recompute ms/token", _f(".2f")),
    ("speedup", "recompute/step", _f(".1f")),
]


def _names(values: list[str] | None) -> list[str] | None:
    """Model names from ``--models a b`` or ``--models a,b``."""
    if values is None:
        return None
    return [n for v in values for n in v.split(",") if n]


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from err
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="measure training/inference speed and memory, scaling with length, generation speed",
        description=(
            "Measure models on synthetic data (no data loader). Default: training-step and inference "
            "throughput and peak memory of named models, relative to --reference. --scaling: time and "
            "memory of a training step per primitive as the length doubles. --generation: per-token "
            "latency of recurrent generation against recomputing the forward pass."
        ),
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--scaling", action="store_true", help="time/memory per training step against sequence length")
    mode.add_argument("--generation", action="store_true", help="per-token latency of step() generation vs recompute")
    mode.add_argument("--list", action="store_true", help="list the named models and exit")
    p.add_argument(
        "--models",
        nargs="+",
        metavar="NAME",
        help="named models or .yaml/.json model config paths (space or comma separated)",
    )
    p.add_argument("--reference", default="mamba-s6", help="model whose figures are 100%% (default mamba-s6)")
    w = p.add_argument_group("workload")
    w.add_argument("--batch-size", type=int, help="sequences per batch (default 2; scaling and generation 1)")
    w.add_argument("--length", type=int, default=1024, help="sequence length (default 1024)")
    w.add_argument("--channels", type=int, default=3, help="input channels (default 3, Cifar10-numerical)")
    w.add_argument("--batches", type=int, help="timed batches (default 3; --full 200)")
    w.add_argument("--warmup", type=int, help="untimed warm-up batches (default 1; --full 3)")
    w.add_argument("--full", action="store_true", help="the thesis' size: 200 batches of 64 x 1024 x 3")
    w.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    w.add_argument("--precision", default="float32", help="float32 (default), float64, bf16-mixed, fp16-mixed")
    w.add_argument(
        "--threads", type=int, default=1, help="torch threads per measurement process (default 1; 0: torch's default)"
    )
    w.add_argument(
        "--scan-impl",
        default="auto",
        help="selective scan implementation for S6: auto (default), numba, chunked, triton, cuda, ref",
    )
    w.add_argument(
        "--ssm-kernel-impl",
        default="auto",
        help="implementation of the Vandermonde and Cauchy products of S4D, DLR and S4: auto (default), numba, "
        "chunked, triton, ref, pykeops (Cauchy only)",
    )
    w.add_argument("--seed", type=int, default=0)
    w.add_argument(
        "--no-isolate", action="store_true", help="measure in this process instead of a fresh process per model"
    )
    s = p.add_argument_group("--scaling")
    s.add_argument(
        "--primitives", nargs="+", metavar="NAME", help="attention, attention-blocked, s4, s4d, s6, dlr (default all)"
    )
    s.add_argument("--lengths", type=_ints, help="comma-separated lengths (default 256,512,...,16384)")
    s.add_argument(
        "--time-budget", type=float, default=10.0, help="stop a primitive after a step slower than this (s, default 10)"
    )
    s.add_argument(
        "--memory-budget", type=float, default=4096.0, help="stop a primitive above this peak (MB, default 4096)"
    )
    s.add_argument("--unit", default="primitive", help="primitive (alone, default) or block (one-block backbone)")
    s.add_argument("--d-model", type=int, default=128, help="width of the measured primitive (default 128)")
    s.add_argument("--d-state", type=int, default=16, help="state size of the SSMs (default 16)")
    s.add_argument("--block-size", type=int, default=1024, help="block of attention-blocked (default 1024)")
    g = p.add_argument_group("--generation")
    g.add_argument(
        "--positions", type=_ints, default=(64, 1024, 8192), help="positions of the step latency (default 64,1024,8192)"
    )
    g.add_argument("--window", type=int, default=32, help="steps averaged around each position (default 32)")
    g.add_argument("--naive-positions", type=_ints, default=(64, 1024, 8192), help="positions of the recompute latency")
    g.add_argument("--naive-repeats", type=int, default=2, help="timed recompute calls per position (default 2)")
    g.add_argument("--layers", type=int, help="override the models' number of layers")
    g.add_argument("--vocab-size", type=int, default=256, help="token vocabulary (default 256)")
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="OUT", help="write the settings and raw rows as JSON")
    o.add_argument("--plot", metavar="PATH", help="write a PNG chart")
    o.add_argument("--quiet", action="store_true", help="no progress messages")
    p.set_defaults(func=run)


def _progress(args: argparse.Namespace) -> Callable[[str], None] | None:
    if args.quiet:
        return None
    return lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True)


def _write_json(path: str, payload: dict[str, Any], device: str) -> None:
    from longrange.bench.measure import environment, resolve_device

    # The command line, when this process is the ``longrange`` command (not a test or a script).
    invoked = sys.argv[1:2] == ["bench"]
    payload = {**payload, "command": " ".join(["longrange", *sys.argv[1:]]) if invoked else None}
    payload["environment"] = environment(resolve_device(device))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1) + "\n")


def _report_failures(rows: list[dict[str, Any]], key: str) -> int:
    failed = [r for r in rows if "error" in r or str(r.get("status", "")).startswith("failed")]
    for r in failed:
        detail = r.get("error_detail") or r.get("error") or r.get("status")
        print(f"longrange bench: {r[key]} failed:\n{detail}", file=sys.stderr)
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    from longrange.bench import models as bench_models

    if args.list:
        for entry in bench_models.MODELS.values():
            print(f"{entry.name:26s} {entry.note}")
        return 0
    if args.scaling:
        return _run_scaling(args)
    if args.generation:
        return _run_generation(args)
    return _run_table(args)


def _run_table(args: argparse.Namespace) -> int:
    from longrange.bench.models import DEFAULT_MODELS, Workload, run_bench
    from longrange.bench.plots import plot_bench

    fields = dict(
        length=args.length,
        channels=args.channels,
        device=args.device,
        precision=args.precision,
        seed=args.seed,
        threads=args.threads or None,
        scan_impl=args.scan_impl,
        ssm_kernel_impl=args.ssm_kernel_impl,
    )
    for name in ("batch_size", "batches", "warmup"):
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    workload = Workload.full(**fields) if args.full else Workload(**fields)
    rows = run_bench(
        _names(args.models) or DEFAULT_MODELS,
        workload,
        reference=args.reference,
        isolate=not args.no_isolate,
        progress=_progress(args),
    )
    ok = next(r for r in rows if "error" not in r)
    print(
        f"batch {workload.batch_size} x length {workload.length} x {workload.channels} channels; "
        f"{workload.warmup} warm-up + {workload.batches} timed batches; device {ok['device']}, {workload.precision}, "
        f"{ok['threads']} threads; scan {ok['scan_impl']}; SSM kernels {ok['ssm_kernel_impl']}; memory: {ok['memory_method']}; "
        f"% relative to {args.reference}"
    )
    print(format_table(rows, BENCH_COLUMNS, "model"))
    if args.json:
        _write_json(
            args.json,
            {"mode": "bench", "settings": asdict(workload), "reference": args.reference, "rows": rows},
            args.device,
        )
    if args.plot:
        plot_bench(
            rows,
            args.plot,
            args.reference,
            title=f"{workload.batch_size} x {workload.length} x {workload.channels}, {ok['device']}",
        )
    return _report_failures(rows, "model")


def _run_scaling(args: argparse.Namespace) -> int:
    from longrange.bench.plots import plot_scaling
    from longrange.bench.scaling import SCALING_PRIMITIVES, ScalingSettings, growth_label, run_scaling

    if args.models:
        raise ConfigError("--scaling measures primitives: use --primitives, not --models")
    settings = ScalingSettings(
        unit=args.unit,
        d_model=args.d_model,
        d_state=args.d_state,
        block_size=args.block_size,
        batch_size=args.batch_size or 1,
        warmup=1 if args.warmup is None else args.warmup,
        batches=args.batches or 3,
        device=args.device,
        seed=args.seed,
        threads=args.threads or None,
        scan_impl=args.scan_impl,
        ssm_kernel_impl=args.ssm_kernel_impl,
    )
    rows, exponents = run_scaling(
        _names(args.primitives) or SCALING_PRIMITIVES,
        list(args.lengths) if args.lengths else None,
        settings,
        time_budget_s=args.time_budget,
        memory_budget_mb=args.memory_budget,
        isolate=not args.no_isolate,
        progress=_progress(args),
    )
    print(
        f"unit {settings.unit}, d_model {settings.d_model}, d_state {settings.d_state}, batch {settings.batch_size}; "
        f"{settings.warmup} warm-up + {settings.batches} timed steps; budgets {args.time_budget:g} s/step, {args.memory_budget:g} MB; "
        f"scan impl {settings.scan_impl}; SSM kernel impl {settings.ssm_kernel_impl}"
    )
    print(format_table(rows, SCALING_COLUMNS, "primitive"))
    print()
    print("empirical exponent (slope of log time vs log length, upper half of lengths):")
    for p, e in exponents.items():
        print(f"  {p:18s} {'-' if e is None else f'{e:.2f}':>5s}  {growth_label(e)}")
    if args.json:
        _write_json(
            args.json,
            {"mode": "scaling", "settings": asdict(settings), "rows": rows, "exponents": exponents},
            args.device,
        )
    if args.plot:
        plot_scaling(
            rows,
            exponents,
            args.plot,
            title=f"training step, {settings.unit}, d={settings.d_model}, batch {settings.batch_size}",
        )
    return _report_failures(rows, "primitive")


def _run_generation(args: argparse.Namespace) -> int:
    from longrange.bench.generation import GENERATION_MODELS, GenerationSettings, latency_growth, run_generation
    from longrange.bench.plots import plot_generation

    settings = GenerationSettings(
        positions=args.positions,
        window=args.window,
        naive_positions=args.naive_positions,
        naive_repeats=args.naive_repeats,
        batch_size=args.batch_size or 1,
        vocab_size=args.vocab_size,
        n_layers=args.layers,
        device=args.device,
        seed=args.seed,
        threads=args.threads or None,
    )
    rows = run_generation(
        _names(args.models) or GENERATION_MODELS, settings, isolate=not args.no_isolate, progress=_progress(args)
    )
    print(
        f"batch {settings.batch_size}, greedy, window {settings.window} steps per position; recompute: forward over the prefix"
    )
    print(format_table(rows, GENERATION_COLUMNS, "model"))
    first, last = min(settings.positions), max(settings.positions)
    if first != last:
        print()
        print(f"step latency at position {last} / at position {first}:")
        for m, ratio in latency_growth(rows, first, last).items():
            print(f"  {m:18s} {'-' if ratio is None else f'{ratio:.2f}x'}")
    if args.json:
        _write_json(args.json, {"mode": "generation", "settings": asdict(settings), "rows": rows}, args.device)
    if args.plot:
        plot_generation(rows, args.plot, title=f"generation, batch {settings.batch_size}")
    return _report_failures(rows, "model")
