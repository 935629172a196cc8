"""The small models of the synthetic studies against the machine's bounds: one training step each.

Usage:
    python benchmarks/small_models.py [--models mamba-s6 simple-s6 ...] [--batch-size 64] [--seq-len 256]
        [--steps 7] [--rounds 2] [--threads 1] [--compile] [--breakdown] [--src OLD_SRC ...] [--json OUT]
        [--markdown OUT]

Every model is a ``demo/recall/<name>`` preset (the recall study's models: 2 layers, width 64;
docs/small-scale-spt.md), its task's length (and long filters' ``l_max``: Hyena's, BaseConv's) set to ``--seq-len``, and one
supervised training step (forward, loss, backward, gradient clipping, AdamW) as a comparison trains
it (``experiment/dryrun.py::prepare_step``) on a synthetic batch of ``--batch-size`` full-length
sequences. Per model the table gives:

* **step**: the median CPU time of a step (``time.process_time``, one thread by default: the time
  the step computed, steady on a shared machine), after two untimed steps;
* **FLOP bound**: the step's floating-point operations (``torch.utils.flop_counter``, which counts
  the matrix products and the toolkit's fused kernels by their registered counts, plus the FFTs at
  5 n log2 n per complex transform and PyTorch's CPU attention kernel by the formula of its CUDA
  kernels: ``longrange.bench.plan.flop_counter``; before the fourteenth round of
  docs/small-models.md the CPU attention kernel was not counted) at the best rate of a 1024 x 1024 float32 ``torch.mm`` measured
  in the same process, and **step / FLOP bound**;
* **traffic bound**: the bytes the step must move at least (the tensors autograd saves, written
  in the forward pass and read in the backward pass, plus the parameters, their gradients and
  AdamW's two moments read and written once) at the best rate of a 64 MiB tensor copy measured in
  the same process, and **step / traffic bound**.

``--compile`` adds the step compiled (``train.compile``) and its compile time (the first two steps
less two eager steps): where it pays, the saving per step times a study's steps exceeds it.

``--plan FILE`` measures a grid's models instead (a study's ``plan.json``, e.g. the MAD screen's in
``benchmarks/results/studies/mad-cpu-screen/``): ``--models`` are labels of its experiments (default:
every label; the first experiment of each), each at its task's own length and, unless
``--batch-size`` is given, its training batch.

``--breakdown`` adds where each step's time goes (``torch.profiler``'s self time per operator over
``--steps`` steps, grouped by :func:`category`): the matrix products, the toolkit's fused kernels
(in eager mode the profiler charges a fused kernel's forward to its autograd node, which is counted
with it), FFTs, PyTorch's attention kernel, copies and layout changes, and the rest (pointwise
operations, reductions, norms, the optimiser's updates); and the rate of the matrix products within
the step (their counted FLOPs over their time) with their time over the whole step's FLOP bound,
which alone says how far a model whose products dominate can come to that bound.

``--src [LABEL=]DIR`` (repeatable) measures the same models with another checkout's ``src`` folder (a
``git worktree`` of an earlier revision) as well: every (model, source) pair runs in its own
process, in rounds that alternate the sources, so that a loaded machine slows both alike; this is
how the "before" and "after" columns of docs/small-models.md were measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The recall study's models (``demo/recall/<name>``), in the order of its tables.
MODELS = [
    "simple-s6",
    "mamba-s6",
    "s4d",
    "dlr",
    "transformer",
    "mamba2",
    "mamba3",
    "gla",
    "deltanet",
    "gated-deltanet",
    "hyena",
    "h3",
    "lru",
    "rwkv",
]


def _rate_mm(threads: int) -> float:
    """GFLOP/s of a 1024 x 1024 float32 ``torch.mm`` (the best of 20: the machine's rate, not its load's)."""
    import torch

    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    times = []
    for _ in range(20):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * 1024**3 / min(times) / 1e9


def _rate_copy() -> float:
    """GB/s of a 64 MiB float32 copy (bytes read plus bytes written; the best of 20)."""
    import torch

    src = torch.randn(16 << 20)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(20):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return 2 * src.numel() * 4 / min(times) / 1e9


def _saved_bytes(step) -> int:
    """Bytes of the distinct tensors autograd saves in one step (forward for backward)."""
    import torch

    seen: dict[tuple[int, int], int] = {}

    def pack(t):
        if t.device.type != "meta" and t.numel():
            seen[(t.untyped_storage().data_ptr(), t.storage_offset())] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(seen.values())


#: ``--breakdown``'s groups of operators, in its table's order.
CATEGORIES = ("matrix products", "fused kernels", "FFTs", "attention kernel", "copies and layout", "the rest")
_PRODUCTS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmv", "aten::mv", "aten::dot"}
_COPIES = {
    "aten::copy_",
    "aten::cat",
    "aten::fill_",
    "aten::zero_",
    "aten::index",
    "aten::index_select",
    "aten::_index_put_impl_",
    "aten::index_add_",
    "aten::clone",
    "aten::stack",
    "aten::_to_copy",
    "aten::constant_pad_nd",
    "aten::embedding_dense_backward",
}


def category(name: str) -> str:
    """The group of :data:`CATEGORIES` of a profiler event's name."""
    if name in _PRODUCTS or name == "longrange::mm_onednn":
        return "matrix products"
    if name.startswith("longrange::") or name.startswith("GeneratedBackwardFor_longrange"):
        return "fused kernels"
    if name.startswith("aten::_fft_"):
        return "FFTs"
    if "scaled_dot_product" in name:
        return "attention kernel"
    if name in _COPIES:
        return "copies and layout"
    return "the rest"


def breakdown(step, steps: int) -> tuple[dict[str, float], float]:
    """Seconds per step of each of :data:`CATEGORIES` (profiler self time over ``steps`` steps), and
    the per-step seconds of every profiled event together."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for event in prof.key_averages():
        totals[category(event.key)] += event.self_cpu_time_total / 1e6 / steps
    return totals, sum(totals.values())


def _product_flops(counts: dict) -> int:
    """The FLOPs of the matrix products among a FlopCounterMode's counts (by operator, every module)."""
    names = {n.removeprefix("aten::") for n in _PRODUCTS} | {"mm_onednn"}
    # keys are operator packets, ``aten.mm`` or ``longrange.mm_onednn``
    return sum(n for op, n in counts.get("Global", {}).items() if str(op).split(".")[1:2] in ([m] for m in names))


def plan_experiments(path: Path) -> dict:
    """The first experiment of each label in a grid's ``plan.json``, by label."""
    from longrange.experiment.plan import Plan

    out: dict = {}
    for exp in Plan.from_dict(json.loads(Path(path).read_text())).experiments:
        out.setdefault(exp.label, exp)
    return out


def recall_experiment(name: str, seq_len: int):
    """The recall study's model ``name`` on its task at ``seq_len``, long filters (Hyena's,
    BaseConv's) built for that length as the studies build them."""
    from longrange.experiment.config import apply_overrides, experiment_from_dict, load_experiment
    from longrange.studies.grid import lengths_follow

    data = apply_overrides(load_experiment(f"demo/recall/{name}"), [f"task.options.seq_len={seq_len}"])
    data["model"] = lengths_follow(data["model"], seq_len)
    return experiment_from_dict(data)


def measure(
    name: str,
    batch_size: int | None,
    seq_len: int,
    steps: int,
    threads: int,
    compile_too: bool,
    plan: Path | None = None,
    breakdown_too: bool = False,
) -> dict:
    """One model's row, measured in this process."""
    import torch

    from longrange.bench.plan import flop_counter
    from longrange.experiment.dryrun import prepare_step

    torch.set_num_threads(threads)
    if plan is not None:  # the grid's experiment, at its task's length
        experiments = plan_experiments(plan)
        if name not in experiments:
            raise SystemExit(f"--plan {plan}: no experiment labelled {name!r}; its labels: {', '.join(experiments)}")
        exp, seq_len = experiments[name], None
    else:
        exp = recall_experiment(name, seq_len)
        batch_size = batch_size or 64
    torch.manual_seed(0)
    prepared = prepare_step(exp, "train", device="cpu", batch_size=batch_size, seq_len=seq_len)
    params = sum(p.numel() for p in prepared.model.parameters())
    for _ in range(2):
        prepared.step()
    # PyTorch's formulas with the FFTs and the CPU attention kernel, which it does not count
    # (longrange.bench.plan.EXTRA_FLOPS); the fused kernels count their own
    with flop_counter() as counter:
        prepared.step()
    flops = counter.get_total_flops()
    product_flops = _product_flops(counter.get_flop_counts())
    saved = _saved_bytes(prepared.step)
    state = 4 * 2 * params * 4  # parameters, gradients, two moments: read and written once each

    def timed(step) -> list[float]:
        out = []
        for _ in range(steps):
            start = time.process_time()
            step()
            out.append(time.process_time() - start)
        return out

    row = {
        "model": name,
        "batch_size": prepared.batch_size,
        "seq_len": prepared.seq_len,
        "parameters": params,
        "flops": flops,
        "traffic_bytes": 2 * saved + state,
        "step_s": statistics.median(timed(prepared.step)),
        "mm_gflops": _rate_mm(threads),
        "copy_gbs": _rate_copy(),
    }
    if breakdown_too:
        row["breakdown_s"], row["profiled_step_s"] = breakdown(prepared.step, steps)
        row["product_flops"] = product_flops
    if compile_too:
        from longrange.train.compile import compile_model

        start = time.perf_counter()
        compile_model(prepared.model, "cpu")
        for _ in range(2):
            prepared.step()
        row["compile_s"] = time.perf_counter() - start - 2 * row["step_s"]
        row["compiled_step_s"] = statistics.median(timed(prepared.step))
    return row


def _worker(args: argparse.Namespace) -> None:
    row = measure(
        args.worker, args.batch_size, args.seq_len, args.steps, args.threads, args.compile, args.plan, args.breakdown
    )
    print("ROW " + json.dumps(row))


def _run(name: str, src: str, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        name,
        *(["--batch-size", str(args.batch_size)] if args.batch_size else []),
        *(["--plan", str(args.plan)] if args.plan else []),
        "--seq-len",
        str(args.seq_len),
        "--steps",
        str(args.steps),
        "--threads",
        str(args.threads),
    ]
    if args.compile:
        cmd.append("--compile")
    if args.breakdown:
        cmd.append("--breakdown")
    env = {
        **os.environ,
        "PYTHONPATH": src,
        "OMP_NUM_THREADS": str(args.threads),
        "NUMBA_NUM_THREADS": str(args.threads),
    }
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in done.stdout.splitlines():
        if line.startswith("ROW "):
            return json.loads(line[4:])
    lines = done.stderr.strip().splitlines() or ["(no output)"]
    # The exception's own line (``ValueError: ...``), not a hint printed after it.
    tail = next(
        (line for line in reversed(lines) if re.match(r"^[\w.]+(Error|Exception|Unsupported):", line)), lines[-1]
    )
    return {"model": name, "error": tail}


def summarise(rows: list[dict], mm_gflops: float, copy_gbs: float) -> dict:
    """Medians over the rounds of one (model, source), with the bounds at the run's best rates."""
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return rows[-1]
    out = dict(ok[0])
    for key in ("step_s", "compiled_step_s", "compile_s", "profiled_step_s"):
        if key in out:
            out[key] = statistics.median(r[key] for r in ok)
    if "breakdown_s" in out:
        out["breakdown_s"] = {c: statistics.median(r["breakdown_s"][c] for r in ok) for c in CATEGORIES}
    out["mm_gflops"], out["copy_gbs"] = mm_gflops, copy_gbs
    out["flop_bound_s"] = out["flops"] / (mm_gflops * 1e9)
    out["traffic_bound_s"] = out["traffic_bytes"] / (copy_gbs * 1e9)
    out["step_over_flop_bound"] = out["step_s"] / out["flop_bound_s"]
    out["step_over_traffic_bound"] = out["step_s"] / out["traffic_bound_s"]
    return out


def markdown(results: dict[str, dict[str, dict]], args: argparse.Namespace, env: dict | None = None) -> str:
    """The table of ``results``; ``env`` (:func:`longrange.bench.measure.environment`) names the machine."""
    sources = list(results)
    size = (
        f"the models of {args.plan}, batch {args.batch_size or 'as planned'} x their tasks' lengths"
        if args.plan
        else f"batch {args.batch_size or 64} x length {args.seq_len}"
    )
    head = f"Training step, {size}, {args.threads} thread(s); times in ms; bound ratios are step / bound.\n\n"
    cols = ["model", "parameters", "GFLOP", "FLOP bound", "traffic bound"]
    for src in sources:
        tag = "" if len(sources) == 1 else f" ({src})"
        cols += [f"step{tag}" if tag else "step", f"/ FLOP bound{tag}", f"/ traffic bound{tag}"]
        if args.compile:
            cols += [f"compiled{tag}", f"compile s{tag}"]
    lines = [head + "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name in args.models:
        first = next((results[s][name] for s in sources if "error" not in results[s][name]), None)
        if first is None:
            lines.append(f"| {name} | " + results[sources[0]][name]["error"] + " |")
            continue
        cells = [
            name,
            f"{first['parameters']:,}",
            f"{first['flops'] / 1e9:.2f}",
            f"{1e3 * first['flop_bound_s']:.1f}",
            f"{1e3 * first['traffic_bound_s']:.1f}",
        ]
        for src in sources:
            r = results[src][name]
            if "error" in r:
                cells += ["error", "", ""] + (["", ""] if args.compile else [])
                continue
            cells += [
                f"{1e3 * r['step_s']:.1f}",
                f"{r['step_over_flop_bound']:.1f}x",
                f"{r['step_over_traffic_bound']:.1f}x",
            ]
            if args.compile:
                cells += [f"{1e3 * r['compiled_step_s']:.1f}", f"{r['compile_s']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    rate = next((r for per in results.values() for r in per.values() if "error" not in r), {})
    lines.append("")
    lines.append(
        f"Rates: the best of every process of the run, torch.mm {rate.get('mm_gflops', 0):.1f} GFLOP/s "
        f"(1024 x 1024, float32), copy {rate.get('copy_gbs', 0):.1f} GB/s (64 MiB, read + write)."
    )
    if env:
        lines.append(f"Measured on {env['cpu']} ({env['cpu_count']} cores), torch {env['torch']}.")
    if args.breakdown:
        lines += ["", *breakdown_markdown(results, args.models)]
    return "\n".join(lines) + "\n"


def breakdown_markdown(results: dict[str, dict[str, dict]], models: list[str]) -> list[str]:
    """``--breakdown``'s table: per (model, source), ms per step of each category (its share of the
    profiled step), and the matrix products' rate and their time over the whole step's FLOP bound."""
    sources = list(results)
    lines = [
        "Where a step's time goes (profiler self time, ms per step, and its share of the profiled step; "
        "the profiler's own cost makes the profiled step longer than the timed one):",
        "",
        "| model | "
        + ("source | " if len(sources) > 1 else "")
        + "profiled step | "
        + " | ".join(CATEGORIES)
        + " | products' GFLOP/s | products / FLOP bound |",
        "|" + "---|" * (len(CATEGORIES) + 4 + (len(sources) > 1)),
    ]
    for name in models:
        for src in sources:
            r = results[src][name]
            if "error" in r or "breakdown_s" not in r:
                continue
            total, parts = r["profiled_step_s"], r["breakdown_s"]
            products = parts["matrix products"]
            rate = r["product_flops"] / products / 1e9 if products else float("nan")
            cells = [name, *([src] if len(sources) > 1 else []), f"{1e3 * total:.1f}"]
            cells += [f"{1e3 * parts[c]:.1f} ({100 * parts[c] / total:.0f}%)" for c in CATEGORIES]
            cells += [f"{rate:.0f}", f"{products / r['flop_bound_s']:.2f}x"]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _source(text: str) -> tuple[str, str]:
    """``--src [LABEL=]DIR`` -> (label, the folder's absolute path); the label defaults to the folder's parent."""
    label, _, path = text.rpartition("=")
    folder = Path(path).resolve()
    if not (folder / "longrange").is_dir():
        raise SystemExit(f"--src {text}: {folder} holds no longrange package (give a checkout's src folder)")
    return label or folder.parent.name, str(folder)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", help="demo/recall/<name> presets, or with --plan its labels (default: all)")
    p.add_argument("--batch-size", type=int, help="sequences per step (default 64; with --plan the planned batch)")
    p.add_argument("--plan", type=Path, help="a grid's plan.json: measure its experiments (see the module docstring)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=7, help="timed steps per process")
    p.add_argument("--rounds", type=int, default=2, help="processes per (model, source), alternating the sources")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--compile", action="store_true", help="also time the compiled step and its compile time")
    p.add_argument(
        "--breakdown", action="store_true", help="also profile where each step's time goes (see the module docstring)"
    )
    p.add_argument(
        "--src",
        action="append",
        default=[],
        metavar="[LABEL=]DIR",
        help="another checkout's src folder to measure too (in the table as LABEL)",
    )
    p.add_argument("--json", type=Path, help="write the raw results here")
    p.add_argument("--markdown", type=Path, help="write the table here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.plan is not None:
        args.plan = args.plan.resolve()
    if args.worker:
        return _worker(args)
    if args.models is None:
        args.models = list(plan_experiments(args.plan)) if args.plan else MODELS
    sources = dict(_source(s) for s in args.src)
    sources["this checkout" if sources else "step"] = str(ROOT / "src")
    labels = list(sources)
    raw: dict[str, dict[str, list[dict]]] = {label: {m: [] for m in args.models} for label in labels}
    for round_ in range(args.rounds):
        for name in args.models:
            for label in labels if round_ % 2 == 0 else labels[::-1]:
                row = _run(name, sources[label], args)
                raw[label][name].append(row)
                print(
                    f"round {round_ + 1} {name} [{label}]: "
                    + (row["error"] if "error" in row else f"{1e3 * row['step_s']:.1f} ms"),
                    flush=True,
                )
    measured = [r for per in raw.values() for rows in per.values() for r in rows if "error" not in r]
    mm_gflops = max((r["mm_gflops"] for r in measured), default=float("nan"))
    copy_gbs = max((r["copy_gbs"] for r in measured), default=float("nan"))
    results = {src: {m: summarise(rows, mm_gflops, copy_gbs) for m, rows in per.items()} for src, per in raw.items()}
    # the bounds' rates, and so the ratios, differ between machines by up to 2x (the FLOP bound's
    # matrix product ran at 102 GFLOP/s on one of this project's CPUs and at 195 on another)
    from longrange.bench.measure import environment

    env = environment()
    text = markdown(results, args, env)
    print(text)
    settings = {
        k: getattr(args, k) for k in ("batch_size", "seq_len", "steps", "rounds", "threads", "compile", "breakdown")
    }
    settings["plan"] = str(args.plan) if args.plan else None
    if args.json:
        payload = {"settings": settings, "environment": env, "results": results, "raw": raw}
        args.json.write_text(json.dumps(payload, indent=1))
    if args.markdown:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
