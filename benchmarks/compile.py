"""Training steps compiled (``train.compile``) against eager, and the Mamba backbone against mamba.py.

Usage:
    python benchmarks/compile.py [--presets demo/s4d demo/transformer demo/dlr thesis/...]
        [--batch-size N] [--steps 5] [--threads 1] [--json OUT]
    python benchmarks/compile.py --mamba-py PATH [--steps 5] [--threads 1] [--profile] [--json OUT]

Presets (default: the demo models and every ``thesis/*`` preset): each preset's supervised training
step as a comparison builds it (``experiment/dryrun.py::prepare_step``: its model, objective,
AdamW groups and precision) on synthetic batches of the task's shape and full length, at the
preset's batch size or ``--batch-size``; token tasks whose vocabulary comes from their data files
(text, retrieval) get ``--vocab`` tokens. One fresh process per preset; in it the same model
steps eagerly and compiled (``train/compile.py``: in place, with the trainer's options), one step
each untimed (the compiled one compiles: its time is reported), then ``--steps`` rounds that
alternate the two, so that a loaded machine slows both alike; ``--stage pretrain`` adds the step
with the (pretraining) objective compiled with the model, which the trainer leaves eager. Figures are medians of the process's
CPU time per step (``time.process_time``; at one thread the time the step computed, steadier than
wall time on a shared machine) with wall-time medians beside them.

``--mamba-py PATH``: the goal of docs/performance.md, a training step (forward, mean-square
loss, backward, AdamW) of the Mamba backbone (4 Mamba blocks with S6, width 128, batch 8 x length
1024, float32) here, eager and compiled, against the same backbone of mamba.py
(github.com/alxndrTL/mamba.py, a PyTorch Mamba with a parallel scan in PyTorch; ``PATH`` is its
checkout, which holds the package ``mambapy``), all three alternating in one process.
``--profile`` adds the operators that take the compiled and the eager step's time (torch.profiler);
the backbone is also timed compiled without the oneDNN matrix products (``train/compile.py``), and
its larger products are timed alone with ``torch.mm`` and with oneDNN.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

DEMO = ["demo/s4d", "demo/transformer", "demo/dlr"]
#: The goal: the compiled Mamba backbone's training step this many times faster than mamba.py's.
GOAL = 20.0
#: The row of a pretraining step with the objective compiled with the model.
WITH_OBJECTIVE = "compiled model and objective"
#: The row of the compiled backbone without the oneDNN matrix products.
NO_ONEDNN = "compiled, PyTorch's products"


def default_presets() -> list[str]:
    from longrange.experiment.config import list_presets

    return DEMO + [p for p in list_presets() if p.startswith("thesis/")]


def _timed(step: Callable[[], Any]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one call."""
    cpu, wall = time.process_time(), time.perf_counter()
    step()
    return time.process_time() - cpu, time.perf_counter() - wall


def _alternate(steps: dict[str, Callable[[], Any]], rounds: int) -> dict[str, dict[str, float]]:
    """Each step once untimed (its first-call seconds reported), then ``rounds`` rounds in turn."""
    first = {name: _timed(step)[1] for name, step in steps.items()}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            times[name].append(_timed(step))
    return {
        name: {
            "cpu_s": statistics.median(t[0] for t in ts),
            "wall_s": statistics.median(t[1] for t in ts),
            "cpu_min_s": min(t[0] for t in ts),
            "first_call_s": first[name],
        }
        for name, ts in times.items()
    }


# --------------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------------


def measure_preset(
    preset: str, batch_size: int | None, vocab: int, rounds: int, stage: str = "train"
) -> dict[str, Any]:
    """One preset's eager and compiled training steps, alternating in this process."""
    from longrange.experiment.config import resolve
    from longrange.experiment.dryrun import prepare_step
    from longrange.experiment.params import fixed_vocabulary
    from longrange.train.compile import Compilation, compile_options, restore
    from longrange.train.step import training_step

    exp = resolve(preset)
    import longrange.data  # noqa: F401  (registers the tasks)
    from longrange.data.tasks import get_spec

    spec = get_spec(exp.task.name, **exp.task.options)
    needs_vocab = spec.input_kind == "tokens" and fixed_vocabulary(exp.task.name, exp.task.options) is None
    kind = None
    if stage == "pretrain":  # the experiment's first compared objective, else the model's natural one
        from longrange.objectives.factory import natural_objective

        kind = (exp.compare.objectives or [natural_objective(exp.model.direction)])[0]
    prepared = prepare_step(
        exp,
        stage,
        kind,
        device="cpu",
        batch_size=batch_size,
        vocab=vocab if needs_vocab else None,
        generator=torch.Generator().manual_seed(0),
    )
    model, objective = prepared.model, prepared.objective
    Compilation(True, "cpu").apply(model)  # as the trainer compiles: the model, in place
    compiled_call = model._compiled_call_impl
    # Pretraining: also the objective compiled with the model (which the trainer does not do).
    with_objective = (
        torch.compile(lambda m, b: objective(m, b), options=compile_options("cpu")) if stage == "pretrain" else None
    )

    def step(compiled: bool, objective_compiled: bool = False) -> None:
        model._compiled_call_impl = compiled_call if compiled else None
        call = with_objective if objective_compiled else objective
        training_step(
            model, call, prepared.batches, prepared.optimizer, prepared.precision, prepared.stage.train.grad_clip
        )

    steps = {"eager": lambda: step(False), "compiled": lambda: step(True)}
    if with_objective is not None:
        steps[WITH_OBJECTIVE] = lambda: step(True, objective_compiled=True)
    rows = _alternate(steps, rounds)
    restore(model)
    extra = {}
    if WITH_OBJECTIVE in rows:
        extra = {
            "with_objective": rows[WITH_OBJECTIVE],
            "objective_gain_cpu": rows["compiled"]["cpu_s"] / rows[WITH_OBJECTIVE]["cpu_s"],
        }
    return {
        "preset": preset,
        "stage": stage,
        "model": f"{exp.model.block}-{exp.model.primitive}",
        "task": exp.task.name,
        "batch": prepared.batch_size,
        "length": prepared.seq_len,
        "objective": prepared.stage.objective,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": vocab if needs_vocab else None,
        "eager": rows["eager"],
        "compiled": rows["compiled"],
        "speedup_cpu": rows["eager"]["cpu_s"] / rows["compiled"]["cpu_s"],
        "speedup_wall": rows["eager"]["wall_s"] / rows["compiled"]["wall_s"],
        "compile_s": rows["compiled"]["first_call_s"],
        **extra,
    }


def run_presets(args: argparse.Namespace) -> dict[str, Any]:
    """Each preset in a fresh process (this script with ``--one``); a failure is recorded, not skipped."""
    rows = []
    for preset in args.presets:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "row.json"
            cmd = [
                sys.executable,
                __file__,
                "--one",
                preset,
                "--steps",
                str(args.steps),
                "--threads",
                str(args.threads),
                "--vocab",
                str(args.vocab),
                "--stage",
                args.stage,
                "--json",
                str(out),
            ]
            if args.batch_size:
                cmd += ["--batch-size", str(args.batch_size)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0 or not out.exists():
                tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
                rows.append({"preset": preset, "error": tail or f"exit code {proc.returncode}"})
                print(f"{preset}: FAILED\n{tail}", flush=True)
                continue
            row = json.loads(out.read_text())
        rows.append(row)
        print(
            f"{preset:32s} eager {row['eager']['cpu_s']:8.3f} s  compiled {row['compiled']['cpu_s']:8.3f} s  "
            f"{row['speedup_cpu']:5.2f}x (wall {row['speedup_wall']:.2f}x)  compile {row['compile_s']:.0f} s"
            + (
                f"  (objective compiled too: {row['with_objective']['cpu_s']:.3f} s)" if "with_objective" in row else ""
            ),
            flush=True,
        )
    return {"rows": rows}


def preset_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| preset | model | stage | batch x length | eager s/step | compiled s/step | speed-up (CPU time) | speed-up (wall) | first compiled step s | objective compiled too: gain |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['preset']} | failed: {r['error'].splitlines()[-1] if r['error'] else ''} | | | | | | | | |"
            )
            continue
        gain = f"{r['objective_gain_cpu']:.2f}x" if "objective_gain_cpu" in r else "-"
        lines.append(
            f"| {r['preset']} | {r['model']} | {r['stage']} ({r['objective']}) | {r['batch']} x {r['length']} | "
            f"{r['eager']['cpu_s']:.3f} | {r['compiled']['cpu_s']:.3f} | **{r['speedup_cpu']:.2f}x** | "
            f"{r['speedup_wall']:.2f}x | {r['compile_s']:.0f} | {gain} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The Mamba backbone against mamba.py
# --------------------------------------------------------------------------------------------


def _import_mamba_py(path: str):
    root = Path(path).resolve()
    if (root / "mamba.py").exists() and root.name == "mambapy":
        root = root.parent
    if not (root / "mambapy" / "mamba.py").exists():
        raise SystemExit(f"--mamba-py {path}: no mambapy/mamba.py there (give the checkout of alxndrTL/mamba.py)")
    sys.path.insert(0, str(root))
    from mambapy.mamba import Mamba, MambaConfig

    return Mamba, MambaConfig


def measure_mamba_py(args: argparse.Namespace) -> dict[str, Any]:
    from longrange.models.backbone import Backbone
    from longrange.models.config import ModelConfig
    from longrange.train.compile import compile_model, compile_options

    Mamba, MambaConfig = _import_mamba_py(args.mamba_py)
    batch, length, width, layers = args.mamba_batch, args.mamba_length, args.mamba_width, args.mamba_layers
    torch.manual_seed(0)
    ours = Backbone(ModelConfig(block="mamba", primitive="s6", n_layers=layers, d_model=width))
    theirs = Mamba(MambaConfig(d_model=width, n_layers=layers))
    x = torch.randn(batch, length, width)
    optimizers = {
        "ours": torch.optim.AdamW(ours.parameters(), 1e-4),
        "theirs": torch.optim.AdamW(theirs.parameters(), 1e-4),
    }
    # The same model compiled without the oneDNN products (PyTorch's own, MKL on CPUs): what they add.
    mkl = copy.deepcopy(ours)
    optimizers["mkl"] = torch.optim.AdamW(mkl.parameters(), 1e-4)
    compile_model(ours, "cpu")
    compiled_call = ours._compiled_call_impl
    mkl.compile(options={k: v for k, v in compile_options("cpu").items() if k != "post_grad_custom_post_pass"})

    def step(which: str) -> None:
        if which == "mamba.py":
            loss, opt = theirs(x).pow(2).mean(), optimizers["theirs"]
        elif which == NO_ONEDNN:
            loss, opt = mkl(x, None).pow(2).mean(), optimizers["mkl"]
        else:
            ours._compiled_call_impl = compiled_call if which == "compiled" else None
            loss, opt = ours(x, None).pow(2).mean(), optimizers["ours"]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    rows = _alternate(
        {name: (lambda name=name: step(name)) for name in ("eager", "compiled", NO_ONEDNN, "mamba.py")}, args.steps
    )
    ratio = rows["mamba.py"]["cpu_s"] / rows["compiled"]["cpu_s"]
    result = {
        "settings": {"batch": batch, "length": length, "width": width, "layers": layers, "dtype": "float32"},
        "parameters": {
            "longrange": sum(p.numel() for p in ours.parameters()),
            "mamba.py": sum(p.numel() for p in theirs.parameters()),
        },
        "rows": rows,
        "ratio_compiled": ratio,
        "ratio_compiled_wall": rows["mamba.py"]["wall_s"] / rows["compiled"]["wall_s"],
        "ratio_compiled_fastest": rows["mamba.py"]["cpu_min_s"] / rows["compiled"]["cpu_min_s"],
        "ratio_eager": rows["mamba.py"]["cpu_s"] / rows["eager"]["cpu_s"],
        "goal": GOAL,
        "goal_met": ratio >= GOAL,
        "mamba_py_commit": _git_commit(args.mamba_py),
    }
    result["matrix_products"] = gemm_rates(width, batch * length)
    if args.profile:
        result["profile"] = {name: _profile(lambda name=name: step(name)) for name in ("compiled", "eager")}
    ours._compiled_call_impl = None
    return result


def gemm_rates(width: int, rows: int, repeats: int = 10) -> list[dict[str, Any]]:
    """GFLOP/s of the backbone's larger float32 products, PyTorch's ``torch.mm`` against oneDNN's
    (:func:`longrange.ops.matmul.mm_onednn`), fastest of ``repeats`` calls each (CPU time)."""
    from longrange.ops.matmul import mm_onednn, onednn_available

    out = []
    inner = 2 * width
    for m, k, n, what in (
        (rows, width, 2 * inner, "in_proj"),
        (rows, inner, width, "out_proj"),
        (2 * inner, rows, width, "in_proj weight gradient (transposed operand)"),
    ):
        a = torch.randn(k, m).t() if "gradient" in what else torch.randn(m, k)
        b = torch.randn(k, n)
        row = {"product": what, "m": m, "k": k, "n": n}
        fns = {"torch.mm": lambda: torch.mm(a, b)}
        if onednn_available():
            fns["oneDNN"] = lambda: mm_onednn(a, b)
        for name, fn in fns.items():
            fn()
            best = min(_timed(fn)[0] for _ in range(repeats))
            row[f"{name}_gflops"] = 2 * m * k * n / best / 1e9
        out.append(row)
    return out


def _git_commit(path: str) -> str | None:
    proc = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True)
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def _profile(step: Callable[[], Any], rounds: int = 3, top: int = 15) -> list[dict[str, Any]]:
    """The operators by their own time over ``rounds`` steps: [{name, calls, self_s_per_step, share}]."""
    from torch.profiler import ProfilerActivity, profile

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(rounds):
            step()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return [
        {
            "name": e.key,
            "calls_per_step": e.count / rounds,
            "self_s_per_step": e.self_cpu_time_total / 1e6 / rounds,
            "share": e.self_cpu_time_total / total,
        }
        for e in events[:top]
    ]


def mamba_py_report(result: dict[str, Any]) -> str:
    s, rows = result["settings"], result["rows"]
    lines = [
        f"Mamba backbone training step: {s['layers']} Mamba-S6 blocks, width {s['width']}, batch {s['batch']} x "
        f"length {s['length']}, {s['dtype']}; CPU seconds per step (medians; wall in brackets)",
        "",
        "| | s/step | wall s/step | mamba.py / this |",
        "|---|---:|---:|---:|",
    ]
    for name in ("mamba.py", "eager", NO_ONEDNN, "compiled"):
        r = rows[name]
        lines.append(
            f"| {'longrange ' + name if name != 'mamba.py' else name} | {r['cpu_s']:.3f} | {r['wall_s']:.3f} | "
            f"{rows['mamba.py']['cpu_s'] / r['cpu_s']:.1f}x |"
        )
    lines.append("")
    lines.append(
        f"compiled: {result['ratio_compiled']:.1f}x faster than mamba.py (CPU time; wall {result['ratio_compiled_wall']:.1f}x, "
        f"fastest steps {result['ratio_compiled_fastest']:.1f}x); eager {result['ratio_eager']:.1f}x; "
        f"goal {result['goal']:.0f}x: {'met' if result['goal_met'] else 'NOT met'}"
    )
    lines += ["", "matrix products, one thread, GFLOP/s (fastest of 10 calls):"]
    lines += [
        f"  {g['product']} ({g['m']} x {g['k']} @ {g['k']} x {g['n']}): torch.mm {g['torch.mm_gflops']:.0f}"
        + (f", oneDNN {g['oneDNN_gflops']:.0f}" if "oneDNN_gflops" in g else "")
        for g in result["matrix_products"]
    ]
    for name, profile in result.get("profile", {}).items():
        lines += ["", f"{name} step, operators by own time (profiler, wall time under the machine's load):", ""]
        lines += [
            f"  {p['share'] * 100:5.1f}%  {p['self_s_per_step'] * 1000:8.1f} ms/step  {p['calls_per_step']:6.1f} calls  {p['name'][:70]}"
            for p in profile
        ]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", help="presets to measure (default: demo/* and thesis/*)")
    p.add_argument("--batch-size", type=int, help="batch of every preset's step (default: each preset's own)")
    p.add_argument(
        "--stage",
        default="train",
        choices=("train", "pretrain"),
        help="the presets' supervised step (default) or their pretraining step (the natural objective)",
    )
    p.add_argument("--vocab", type=int, default=256, help="vocabulary of token tasks whose vocabulary comes from data")
    p.add_argument("--steps", type=int, default=5, help="timed rounds (default 5)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--mamba-py", metavar="PATH", help="a checkout of alxndrTL/mamba.py: the Mamba backbone against it")
    p.add_argument("--mamba-batch", type=int, default=8)
    p.add_argument("--mamba-length", type=int, default=1024)
    p.add_argument("--mamba-width", type=int, default=128)
    p.add_argument("--mamba-layers", type=int, default=4)
    p.add_argument("--profile", action="store_true", help="with --mamba-py: profile the compiled step")
    p.add_argument("--one", metavar="PRESET", help=argparse.SUPPRESS)  # one preset in this process
    p.add_argument("--json", metavar="OUT", help="write the settings, environment and figures as JSON")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from longrange.bench.measure import environment

    if args.one:
        result: dict[str, Any] = measure_preset(args.one, args.batch_size, args.vocab, args.steps, args.stage)
    elif args.mamba_py:
        result = measure_mamba_py(args)
        print(mamba_py_report(result))
    else:
        args.presets = args.presets or default_presets()
        result = run_presets(args)
        print()
        print(preset_table(result["rows"]))
    if not args.one:
        settings = {k: v for k, v in vars(args).items() if k != "one"}
        result = {
            "settings": settings,
            **result,
            "environment": {**environment(torch.device("cpu")), "threads": torch.get_num_threads()},
        }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
