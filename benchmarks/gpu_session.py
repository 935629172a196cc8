#!/usr/bin/env python
"""A first GPU session in one command: every GPU measurement of docs/performance.md in one batch.

    python benchmarks/gpu_session.py --out gpu_session                 # on a CUDA machine
    python benchmarks/gpu_session.py --out gpu_session --only tests,check   # some steps (a part)
    python benchmarks/gpu_session.py --out /tmp/s --device cpu --tiny  # the same steps, tiny, on a CPU
    python benchmarks/gpu_session.py --out /tmp/s --pack $OUT/s.tgz    # also one archive (no data, no checkpoints) after each step

Each step runs in its own subprocess with a timeout; its output goes to ``OUT/logs/<step>.log`` and
its result files under ``OUT/results/``. A step that fails or runs out of time is recorded with its
reason (the end of its log) and the session goes on; steps left out with ``--only`` are recorded
as not run. ``OUT/session.json`` and ``OUT/session.md`` list every step (status, seconds, commands
with their exit codes, result files), the device, the software versions and this command line;
a later part run into the same ``OUT`` updates the steps it runs and keeps the others.

Steps, in the order they run (the most needed first: a session cut short by its ``--budget``
has measured what matters most):

- ``info``: ``longrange info`` and the versions of the tools (nvidia-smi, nvcc);
- ``check``: ``longrange check --device cuda`` (every implementation against its float64 reference);
- ``kernels``: the Triton kernels (selective scan; Vandermonde and Cauchy products) against float64
  references at lengths 1, 7, 64, 1000, 4096 and 16384, float32 and bfloat16 (the complex products:
  float32), the scan with and without an initial state, the z gate and D; and whether two identical
  calls give the same bits (outputs and every gradient);
- ``scan``: ``benchmarks/gpu_scan.py`` at batch 64, d 232, state 16, lengths 1024, 4096 and 16384,
  fp32 and bf16 (forward and forward + backward of the chunked scan, Triton and mamba-ssm where
  its CUDA extension imports; the device's copy bandwidth and each time over the bytes the scan
  must move at that bandwidth);
- ``ssm_kernels``: ``benchmarks/ssm_kernels.py --device cuda`` (S4 and S4D kernels and layers; the
  Triton kernels in float32, their default, and computing in float64, ``triton-float64``);
- ``families``: one training step of a model of each family (the induction-heads presets of the
  Mamba paper's Table 11: Mamba-2, Gated DeltaNet, DeltaNet, GLA, Mamba-3, Hyena, H3, LRU, a
  Mamba-2 + attention hybrid, Mamba and Simple blocks of S6, S4, S4D, DLR, the rotary
  Transformer) at batch 16 x 2048 tokens, fp32 and bf16 autocast: time, tokens/s, peak memory and
  the implementations that ran;
- ``train``: 100 steps (``--train-steps``) of spt/listops presets on generated ListOps of LRA's
  size, bf16 autocast and fp32: steps/s, tokens/s, peak memory and whether the loss falls;
- ``planner``: ``longrange plan PRESET --gpu NAME --batch B --json FILE`` for a few presets, and the
  peak memory of one measured training step at the same batch (``torch.cuda.max_memory_allocated``
  after a warm-up step) beside the plan's ``peak_bytes``;
- ``pathx``: one forward + backward of the spt/path-x S4 and rotary-Transformer models at 16384
  tokens (time, peak memory);
- ``external``: the maintained kernels of the matrix-state ops where installed (mamba-ssm's SSD and
  Mamba-3 kernels, flash-linear-attention's): each probe timed, as it goes (their first use compiles
  and autotunes Triton kernels: on an H100 mamba-ssm's took minutes, so that ``info``, ``check``
  and ``families`` ran out of time waiting on them when mamba-ssm was importable), then
  ``longrange check``'s cases of the usable ones. Run the other steps without those packages on
  the path and this one with them (see docs/performance.md, "On GPUs");
- ``tests``: the test suite on the device (``python -m pytest -q --device cuda``; ``--pytest-args``
  narrows it, e.g. to ``tests/ops tests/layers -x``);
- ``bench``: ``longrange bench --device cuda --full`` (the model table at the thesis' size).

``--device cpu --tiny`` runs every step at tiny sizes on a CPU (Triton in its interpreter; the
steps that need CUDA fail and are recorded so), which is how the test suite tries the session
before a GPU runs it (``tests/bench/test_gpu_session_script.py``). The internal steps are this
script's functions, run as ``python benchmarks/gpu_session.py --step NAME ...``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()

#: The order of the steps, which is the order they run in: the most needed first, so that a
#: session cut short by its ``--budget`` has measured what matters most.
STEPS = (
    "info",
    "check",
    "kernels",
    "scan",
    "ssm_kernels",
    "families",
    "train",
    "planner",
    "pathx",
    "external",
    "tests",
    "bench",
    "placement",
)
#: Seconds each step may run (the ``--timeout-scale`` multiplies them): ceilings, not estimates (on
#: an H100 the steps that finished took 14-81 s); a call with a time limit also gives ``--budget``.
TIMEOUTS = {
    "info": 60,
    "check": 120,
    "kernels": 150,
    "scan": 150,
    "ssm_kernels": 90,
    "families": 120,
    "train": 180,
    "planner": 150,
    "pathx": 60,
    "external": 420,
    "tests": 600,
    "bench": 300,
    "placement": 240,
}
#: A step is not started with fewer seconds than this left of the session's ``--budget``.
MIN_STEP_SECONDS = 20
#: Lengths of the kernel accuracy checks (``--tiny``: the first three).
KERNEL_LENGTHS = (1, 7, 64, 1000, 4096, 16384)
KERNEL_OPS = ("scan", "vandermonde", "cauchy")
SCAN_LENGTHS = (1024, 4096, 16384)
PLAN_PRESETS = ("spt/listops/transformer", "spt/listops/s4", "thesis/scifar/mamba-s6", "thesis/scifar/simple-s4d")
TRAIN_PRESETS = ("spt/listops/transformer", "spt/listops/s4")
PATHX_PRESETS = ("spt/path-x/s4", "spt/path-x/transformer-rotary")
#: One model of each family (the Mamba paper's induction-heads settings, Table 11), the newest
#: first, and a hybrid stack: (label, preset, overrides). Timed at FAMILY_BATCH x FAMILY_SEQ_LEN.
FAMILY_PRESETS = (
    tuple(
        (name, f"mamba/induction-heads/{name}", ())
        for name in ("mamba2", "gated-deltanet", "deltanet", "gla", "mamba3", "hyena", "h3", "lru")
    )
    + (
        ("mamba3 mimo", "mamba/induction-heads/mamba3", ("model.primitive_options.mimo_rank=4",)),
        (
            "hybrid mamba2+attention",
            "mamba/induction-heads/mamba2",
            ("model.layers=[mamba2, attention]", "model.n_layers=2"),
        ),
    )
    + tuple(
        (name, f"mamba/induction-heads/{name}", ())
        for name in ("mamba-s6", "simple-s6", "mamba-s4", "simple-s4", "simple-s4d", "simple-dlr", "attention-rope")
    )
)
FAMILY_BATCH, FAMILY_SEQ_LEN, FAMILY_REPEATS = 16, 2048, 3
#: Overrides that shrink a preset's model and task for ``--tiny``.
TINY_MODEL = (
    "model.n_layers=1",
    "model.d_model=16",
    "model.d_state=4",
    "model.n_heads=2",
    "model.attn_dim=null",
    "model.head_hidden=16",
)


# --------------------------------------------------------------------------------------------
# The session: steps as subprocesses, their records, the summary
# --------------------------------------------------------------------------------------------


@dataclass
class Step:
    """A step: the commands it runs in turn (each an argv list), its timeout for all of them."""

    name: str
    description: str
    commands: list[list[str]]
    timeout: float
    env: dict[str, str] = field(default_factory=dict)


def _python() -> list[str]:
    return [sys.executable]


def _cli(*args: str) -> list[str]:
    """``longrange ARGS`` from this checkout (``python -m longrange``: no installed entry point needed)."""
    return [sys.executable, "-m", "longrange", *args]


def _placement_command(res: Path, tiny: bool, cores: int | None = None) -> list[str]:
    """``benchmarks/grid_jobs.py`` over the placements of the machine's cores (all stages of one
    thread, half the stages of two, a quarter of four; ``compare --jobs auto`` on a machine without
    GPUs is the first): the CPU's grid of small runs, measured on a machine with more cores than
    this project's 2-core one."""
    cores = cores or os.cpu_count() or 1
    shapes = [(cores // t, t) for t in (1, 2, 4) if cores // t >= 1 and (t == 1 or cores // t >= 2)]
    return [
        *_python(),
        str(ROOT / "benchmarks" / "grid_jobs.py"),
        "--max-steps",
        "2" if tiny else "100",
        "--no-sequential",
        "--warmup",
        "--placements",
        ",".join(f"{j}x{t}" for j, t in shapes),
        "--json",
        str(res / "placement.json"),
    ]


def _internal(name: str, args: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, str(SCRIPT), "--step", name, "--out", str(args.out), "--device", args.device]
    if args.tiny:
        cmd.append("--tiny")
    if args.gpu:
        cmd += ["--gpu", args.gpu]
    if getattr(args, "kernel_ops", None):
        cmd += ["--kernel-ops", args.kernel_ops]
    return cmd


def build_steps(args: argparse.Namespace) -> list[Step]:
    """The session's steps for the device and sizes of ``args``."""
    res = Path(args.out) / "results"
    dev, tiny, scale = args.device, args.tiny, args.timeout_scale
    steps = []

    def add(name: str, description: str, commands: list[list[str]], env: dict[str, str] | None = None) -> None:
        steps.append(Step(name, description, commands, TIMEOUTS[name] * scale, env or {}))

    add("info", "versions and what runs where", [_internal("info", args)])
    pytest_args = (
        shlex.split(args.pytest_args) if args.pytest_args is not None else (["tests/ops/test_used.py"] if tiny else [])
    )
    add("check", f"longrange check --device {dev}", [_cli("check", "--device", dev, *(["--quick"] if tiny else []))])
    add(
        "kernels",
        "Triton kernels against float64 references; determinism",
        [_internal("kernels", args)],
        {"TRITON_INTERPRET": "1"} if dev == "cpu" else {},
    )
    scan = []
    for length in (64,) if tiny else SCAN_LENGTHS:
        for dtype in ("fp32", "bf16"):
            size = (
                ["--batch", "2", "--d", "8", "--n", "4", "--iters", "2", "--warmup", "1"]
                if tiny
                else [
                    "--batch",
                    "64",
                    "--d",
                    "232",
                    "--n",
                    "16",
                    "--iters",
                    "10",
                    "--warmup",
                    "3",
                    "--chunked-iters",
                    "3",
                ]
            )
            scan.append(
                [
                    *_python(),
                    str(ROOT / "benchmarks" / "gpu_scan.py"),
                    *size,
                    "--length",
                    str(length),
                    "--dtype",
                    dtype,
                    "--json",
                    str(res / f"scan_{length}_{dtype}.json"),
                ]
            )
    add("scan", "selective scan timings (benchmarks/gpu_scan.py)", scan)
    ssm = [
        *_python(),
        str(ROOT / "benchmarks" / "ssm_kernels.py"),
        "--device",
        dev,
        "--json",
        str(res / "ssm_kernels.json"),
    ]
    if tiny:
        ssm += ["--lengths", "64", "--repeats", "1", "--d-model", "8", "--d-state", "4", "--no-isolate"]
    else:  # one process: CUDA's peak memory is reset per measurement, and each process costs seconds
        ssm += ["--lengths", "1024,4096,16384", "--no-isolate"]
    add("ssm_kernels", "S4 and S4D kernel timings (benchmarks/ssm_kernels.py)", [ssm])
    add("families", "one training step of a model of each family, fp32 and bf16", [_internal("families", args)])
    add("train", "short training runs on generated ListOps, bf16 and fp32", [_internal("train", args)])
    add("planner", "longrange plan against measured peak memory", [_internal("planner", args)])
    add("pathx", "one forward + backward at Path-X's 16384 tokens", [_internal("pathx", args)])
    # Triton's TRITON_CACHE_AUTOTUNING keeps the kernels' autotuning results on disk: on an H200 the
    # SSD kernel's probe took 131 s in a fresh process and 8 s in the next one (the fourth session)
    add(
        "external",
        "the maintained kernels (mamba-ssm, flash-linear-attention): probes timed, checks",
        [_internal("external", args)],
        {"TRITON_CACHE_AUTOTUNING": os.environ.get("TRITON_CACHE_AUTOTUNING", "1")},
    )
    # -v names each test as it finishes (with xdist too), so a step cut short by its timeout still
    # says which tests failed; -rfE lists them again at the end
    add(
        "tests",
        f"python -m pytest -q --device {dev}",
        [[*_python(), "-m", "pytest", "-v", "-rfE", "-p", "no:cacheprovider", "--device", dev, *pytest_args]],
    )
    bench = _cli("bench", "--device", dev, "--json", str(res / "bench.json"))
    bench += (
        ["--models", "transformer", "dlr", "--batch-size", "1", "--length", "32", "--batches", "1", "--warmup", "0"]
        if tiny
        else ["--full"]
    )
    add("bench", f"longrange bench --device {dev}" + ("" if tiny else " --full"), [bench])
    add(
        "placement",
        "the recall demo's grid on the machine's CPU cores: stages at once x threads each",
        [_placement_command(res, tiny)],
    )
    assert [s.name for s in steps] == list(STEPS)
    return steps


def _tail(path: Path, lines: int = 8) -> str:
    text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return "\n".join(text[-lines:])


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a step's processes: this checkout's ``src`` first on the path, unbuffered output."""
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(extra or {}), "PYTHONPATH": path}


def run_step(step: Step, out: Path) -> dict[str, Any]:
    """Run a step's commands in turn (each after the last, whatever its exit), output to its log;
    the record of what ran and how it ended."""
    log = out / "logs" / f"{step.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = _child_env(step.env)
    start, deadline = time.perf_counter(), time.perf_counter() + step.timeout
    commands, status = [], "ok"
    results_before = {p: p.stat().st_mtime for p in (out / "results").glob("**/*") if p.is_file()}
    with open(log, "w") as f:
        for argv in step.commands:
            left = deadline - time.perf_counter()
            record = {"argv": argv, "returncode": None, "seconds": 0.0, "timed_out": False}
            commands.append(record)
            if left <= 0:
                record["timed_out"], status = True, "timeout"
                f.write(f"$ {shlex.join(argv)}\n(not started: the step's {step.timeout:.0f} s were spent)\n")
                continue
            f.write(f"$ {shlex.join(argv)}\n")
            f.flush()
            t0 = time.perf_counter()
            try:
                record["returncode"] = _run_group(argv, f, env, left)
                if record["returncode"] != 0 and status == "ok":
                    status = "failed"
            except subprocess.TimeoutExpired:
                record["timed_out"], status = True, "timeout"
                f.write(f"\n(stopped: the step's timeout of {step.timeout:.0f} s)\n")
            except OSError as err:  # the program could not be started
                record["returncode"], status = -1, "failed" if status == "ok" else status
                f.write(f"\n(could not start: {err})\n")
            record["seconds"] = round(time.perf_counter() - t0, 3)
            f.write(f"(exit {record['returncode']}, {record['seconds']:.1f} s)\n\n")
            f.flush()
    results = sorted(
        str(p.relative_to(out))
        for p in (out / "results").glob("**/*")
        if p.is_file() and results_before.get(p) != p.stat().st_mtime and _belongs(p, step.name)
    )
    record = {
        "name": step.name,
        "description": step.description,
        "status": status,
        "seconds": round(time.perf_counter() - start, 3),
        "timeout_s": step.timeout,
        "log": str(log.relative_to(out)),
        "commands": commands,
        "results": results,
    }
    if status != "ok":
        failed = [c for c in commands if c["timed_out"] or c["returncode"] != 0]
        record["reason"] = (
            f"{len(failed)} of {len(commands)} command(s) "
            f"{'ran out of time' if status == 'timeout' else 'failed'}; end of the log:\n{_tail(log)}"
        )
    return record


def _run_group(argv: list[str], log, env: dict[str, str], timeout: float) -> int:
    """Run ``argv`` in a process group of its own, output to ``log``; at the timeout, stop the whole
    group (a step's own subprocesses too: a ``longrange info`` left running past its step's
    timeout went on writing into the log and using the GPU during the next steps) and raise
    TimeoutExpired."""
    import signal

    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
        raise
    finally:
        if proc.poll() is None:  # interrupted (Ctrl-C): leave nothing behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _belongs(path: Path, step: str) -> bool:
    """Whether a result file is the step's: files are named after their step (``scan_1024_bf16.json``)."""
    name = path.name
    prefixes = {
        "scan": ("scan_",),
        "ssm_kernels": ("ssm_kernels",),
        "bench": ("bench",),
        "planner": ("plan",),
        "kernels": ("kernels",),
        "train": ("train",),
        "pathx": ("pathx",),
        "info": ("info",),
        "families": ("families",),
    }
    return name.startswith(prefixes.get(step, (step,))) or path.parent.name == step


def environment(device: str) -> dict[str, Any]:
    """Device and software versions, and the command line."""
    import torch

    env: dict[str, Any] = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "cwd": os.getcwd(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cpu_count": os.cpu_count(),
    }
    for name in ("triton", "numba", "mamba_ssm", "causal_conv1d", "pykeops", "transformers"):
        try:
            from importlib.metadata import version

            env[name] = version(name.replace("_", "-"))
        except Exception:
            env[name] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu=props.name,
            gpu_memory_bytes=props.total_memory,
            capability=f"{props.major}.{props.minor}",
            cudnn=torch.backends.cudnn.version(),
        )
    for tool, args in (
        ("nvidia-smi", ["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]),
        ("nvcc", ["--version"]),
    ):
        try:
            proc = subprocess.run([tool, *args], capture_output=True, text=True, timeout=30)
            env[tool] = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else None
        except (OSError, subprocess.TimeoutExpired):
            env[tool] = None
    env["device"] = device
    return env


def summary_markdown(summary: dict[str, Any]) -> str:
    env = summary["environment"]
    lines = [
        f"# GPU session ({summary['finished']})",
        "",
        f"Command: `{env['command']}`",
        "",
        f"Device: {env.get('gpu') or env['device']}; torch {env['torch']} (CUDA {env.get('torch_cuda')}), "
        f"triton {env.get('triton')}, numba {env.get('numba')}, mamba-ssm {env.get('mamba_ssm')}, "
        f"Python {env['python']}; nvcc: {env.get('nvcc')}; nvidia-smi: {env.get('nvidia-smi')}",
        "",
        "| step | status | seconds | result files | log |",
        "|---|---|---:|---|---|",
    ]
    for s in summary["steps"]:
        lines.append(
            f"| {s['name']} | {s['status']} | {s.get('seconds', 0):.1f} | {', '.join(s.get('results', [])) or '-'} | "
            f"{s.get('log', '-')} |"
        )
    failed = [s for s in summary["steps"] if s["status"] not in ("ok",)]
    if failed:
        lines += ["", "## Steps that did not succeed", ""]
        for s in failed:
            lines += [f"### {s['name']}: {s['status']}", "", "```", s.get("reason", ""), "```", ""]
    return "\n".join(lines) + "\n"


def run_session(args: argparse.Namespace, steps: list[Step] | None = None) -> dict[str, Any]:
    """Run the selected steps, each after the last whatever its outcome; write the summary after
    each step (a session cut short keeps what it measured). Returns the summary."""
    out = Path(args.out).resolve()
    args.out = str(out)
    (out / "results").mkdir(parents=True, exist_ok=True)
    steps = build_steps(args) if steps is None else steps
    only = set(args.only.split(",")) if args.only else None
    unknown = sorted((only or set()) - {s.name for s in steps})
    if unknown:
        raise SystemExit(
            f"--only: unknown step(s) {', '.join(unknown)}; the steps are {', '.join(s.name for s in steps)}"
        )
    path = out / "session.json"
    earlier = {s["name"]: s for s in json.loads(path.read_text())["steps"]} if path.exists() else {}
    summary = {
        "started": _now(),
        "finished": None,
        "environment": environment(args.device),
        "settings": {
            "device": args.device,
            "tiny": args.tiny,
            "only": args.only,
            "timeout_scale": args.timeout_scale,
            "budget": args.budget,
        },
        "steps": [],
    }
    records: dict[str, dict[str, Any]] = {}
    for step in steps:  # what the summary says before each step has run
        records[step.name] = earlier.get(step.name) or {
            "name": step.name,
            "description": step.description,
            "status": "not run",
            "reason": "not selected (--only)" if only is not None and step.name not in only else "not reached",
        }
    deadline = time.perf_counter() + args.budget if args.budget else None
    for step in steps:
        if only is not None and step.name not in only:
            if step.name not in earlier:
                records[step.name]["reason"] = f"not selected (--only {args.only})"
            continue
        if deadline is not None:
            left = deadline - time.perf_counter()
            if left < MIN_STEP_SECONDS:
                records[step.name] = {
                    "name": step.name,
                    "description": step.description,
                    "status": "not run",
                    "reason": f"the session's --budget of {args.budget:.0f} s was spent",
                }
                _write_summary(out, summary, records)
                continue
            step = Step(step.name, step.description, step.commands, min(step.timeout, left), step.env)
        print(f"[{_now()}] {step.name}: {step.description} (timeout {step.timeout:.0f} s)", flush=True)
        try:
            records[step.name] = record = run_step(step, out)
        except SystemExit:  # SIGTERM (an outer `timeout`): the step's processes are stopped; say so, keep the rest
            records[step.name] = {
                "name": step.name,
                "description": step.description,
                "status": "stopped",
                "reason": "the session was stopped (SIGTERM: an outer timeout?) during this step; end of the log:\n"
                + _tail(out / "logs" / f"{step.name}.log"),
            }
            print(f"[{_now()}] {step.name}: stopped (SIGTERM)", flush=True)
            _write_summary(out, summary, records)
            _pack(args, out)
            raise
        print(f"[{_now()}] {step.name}: {record['status']} in {record['seconds']:.1f} s", flush=True)
        _write_summary(out, summary, records)
        _pack(args, out)
    summary["finished"] = _now()
    _write_summary(out, summary, records)
    _pack(args, out)
    return summary


def _pack(args: argparse.Namespace, out: Path) -> None:
    """``--pack FILE``: the session's folder as one ``.tar.gz``, written atomically after every step,
    without its generated data and the training runs' checkpoints and TensorBoard events (their
    records, metrics and summaries stay). A machine that returns only a few files of a call's output
    folder (the lent GPUs return eight) then returns everything that finished."""
    if not getattr(args, "pack", None):
        return
    import tarfile

    pack = Path(args.pack).resolve()
    pack.parent.mkdir(parents=True, exist_ok=True)
    tmp = pack.with_name(pack.name + ".tmp")

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        if len(parts) > 1 and parts[1] == "data" or info.name.endswith(".tmp"):
            return None
        return None if {"checkpoints", "tensorboard"} & set(parts[2:]) else info

    with tarfile.open(tmp, "w:gz") as tar:
        for path in sorted(out.iterdir()):
            if path.resolve() not in (pack, tmp.resolve()):
                tar.add(path, arcname=f"{out.name}/{path.name}", filter=keep)
    os.replace(tmp, pack)


def _stop_on_sigterm() -> None:
    """Turn SIGTERM (``timeout``'s signal, or a scheduler's) into SystemExit, so that the running
    step's whole process group is stopped (:func:`_run_group`) and the summary and pack are written:
    a session cut from outside once left a step's probe running into the next call on that machine."""
    import signal

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def _write_summary(out: Path, summary: dict[str, Any], records: dict[str, dict[str, Any]]) -> None:
    summary["steps"] = list(records.values())
    summary["finished"] = summary["finished"] or _now()
    (out / "session.json").write_text(json.dumps(summary, indent=1))
    (out / "session.md").write_text(summary_markdown(summary))


def _now() -> str:
    return _dt.datetime.now().isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------------
# Internal steps (run in their own process: --step NAME)
# --------------------------------------------------------------------------------------------


def _write(args: argparse.Namespace, name: str, payload: Any, quiet: bool = False) -> Path:
    """Write a result file atomically (a step killed mid-write leaves the previous version)."""
    path = Path(args.out) / "results" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    os.replace(tmp, path)
    if not quiet:
        print(f"wrote {path}", flush=True)
    return path


def _device(args: argparse.Namespace):
    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available here")
    return device


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_info(args: argparse.Namespace) -> int:
    env = environment(args.device)
    _write(args, "info.json", env)
    print(json.dumps(env, indent=1))
    return subprocess.run(_cli("info"), env=_child_env()).returncode


def _scan_inputs(b: int, d: int, n: int, l: int, seed: int):
    from longrange.ops.checking import random_inputs

    t = random_inputs(
        seed,
        u=(b, d, l),
        delta=(b, d, l),
        A=(d, n),
        B=(b, n, l),
        C=(b, n, l),
        D=(d,),
        z=(b, d, l),
        delta_bias=(d,),
        initial_state=(b, d, n),
    )
    t["A"] = -(t["A"].abs() + 0.2)
    t["delta"] = 0.5 * t["delta"] - 1.0  # softplus(delta + bias) of order 0.1-0.5, as in a model
    return t


#: The scan's variants: which of the optional inputs it gets.
SCAN_VARIANTS = {
    "plain": (),
    "initial_state": ("initial_state",),
    "z_D": ("z", "D"),
    "all": ("initial_state", "z", "D", "delta_bias"),
}


def _bitwise_same(fn: Callable[[], tuple], names: list[str]) -> dict[str, bool]:
    """Whether two calls of ``fn`` (returning outputs and gradients) give the same bits, per tensor."""
    import torch

    first, second = fn(), fn()
    return {name: bool(torch.equal(a, b)) for name, a, b in zip(names, first, second)}


def step_kernels(args: argparse.Namespace) -> int:
    """The Triton scan and SSM-kernel products against float64 references, and their determinism."""
    import torch

    from longrange.ops import ssm_kernels as K
    from longrange.ops.checking import TOLERANCE, compare, random_inputs
    from longrange.ops.scan import selective_scan_chunked, selective_scan_ref
    from longrange.ops.scan.triton import selective_scan_triton

    device = _device(args)
    if device.type == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # Triton's interpreter (read when a kernel is launched)
    lengths = KERNEL_LENGTHS[:3] if args.tiny else KERNEL_LENGTHS
    ops = set(args.kernel_ops.split(",")) if args.kernel_ops else set(KERNEL_OPS)
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    b, d, n = (1, 4, 4) if args.tiny else (2, 16, 16)
    rows, failures = [], 0

    def record(row: dict[str, Any]) -> None:
        nonlocal failures
        row["passed"] = row.get("error") is not None and row["error"] <= row["tol"]
        failures += not row["passed"]
        rows.append(row)
        print(
            f"{row['op']:12s} {row['dtype']:9s} L={row['length']:<6d} {row.get('variant', ''):14s} "
            f"error {row.get('error', float('nan')):.2e} (tol {row['tol']:.0e}) {'ok' if row['passed'] else 'FAIL'}"
            + (f"  {row['exception']}" if "exception" in row else ""),
            flush=True,
        )

    for length in lengths:
        ref_scan = selective_scan_ref if length <= 1000 else selective_scan_chunked  # chunked: float64 too, faster
        for variant, extras in SCAN_VARIANTS.items() if "scan" in ops else ():
            inputs = _scan_inputs(b, d, n, length, seed=length)
            inputs = {k: v for k, v in inputs.items() if k in ("u", "delta", "A", "B", "C") or k in extras}
            keep = tuple(k for k in ("A", "D", "delta_bias", "initial_state") if k in inputs)
            for dname, dtype in dtypes.items():
                row = {
                    "op": "scan",
                    "impl": "triton",
                    "dtype": dname,
                    "length": length,
                    "variant": variant,
                    "shape": f"b={b} d={d} n={n}",
                    "tol": TOLERANCE[dtype],
                    "reference": "selective_scan_ref" if ref_scan is selective_scan_ref else "selective_scan_chunked",
                }
                try:
                    row["error"] = compare(
                        lambda **kw: selective_scan_triton(**kw, delta_softplus=True, return_last_state=True),
                        lambda **kw: ref_scan(**kw, delta_softplus=True, return_last_state=True),
                        inputs,
                        dtype,
                        str(device),
                        keep_float32=keep,
                    )
                except Exception as err:  # recorded, the other cases go on
                    row["exception"] = f"{type(err).__name__}: {err}"
                record(row)
                if variant == "all":
                    rows[-1]["bitwise_repeatable"] = _repeat_scan(inputs, dtype, device, keep)
        # The complex products: float32 (complex64) only.
        H, M = (3, 4) if args.tiny else (16, 32)
        t = random_inputs(length, re=(H, M), im=(H, M), wre=(H, M), wim=(H, M), vre=(H, M), vim=(H, M))
        log_dA = torch.complex(-0.5 - t["re"].abs(), t["im"] * 3.0) * 0.01
        W = torch.complex(t["wre"], t["wim"])
        z = torch.exp(
            torch.complex(
                torch.zeros(length, dtype=torch.float64),
                2 * torch.pi * torch.arange(length, dtype=torch.float64) / max(length, 1),
            )
        ).expand(H, length)
        products = {
            "vandermonde": (
                {"log_dA": log_dA, "W": W},
                lambda **kw: K.vandermonde_kernel(**kw, L=length, impl="triton"),
                lambda **kw: K.vandermonde_kernel_ref(**kw, L=length),
            ),
            "cauchy": (
                {"v": torch.complex(t["vre"], t["vim"]), "z": z.contiguous(), "w": log_dA * 100},
                lambda **kw: K.cauchy(**kw, conj_pairs=True, impl="triton"),
                lambda **kw: K.cauchy_ref(**kw, conj_pairs=True),
            ),
        }
        for op, (inputs, fn, ref) in ((op, p) for op, p in products.items() if op in ops):
            row = {
                "op": op,
                "impl": "triton",
                "dtype": "float32",
                "length": length,
                "variant": "",
                "shape": f"H={H} M={M}",
                "tol": TOLERANCE[torch.float32],
                "reference": f"{op}_ref",
            }
            try:
                row["error"] = compare(fn, ref, inputs, torch.float32, str(device))
                row["bitwise_repeatable"] = _repeat_product(fn, inputs, device)
            except Exception as err:
                row["exception"] = f"{type(err).__name__}: {err}"
            record(row)
            rows.append(
                {
                    "op": op,
                    "dtype": "bfloat16",
                    "length": length,
                    "status": "not applicable",
                    "reason": "complex products compute in float32 (complex64)",
                }
            )
    _write(args, "kernels.json", {"device": str(device), "rows": rows, "failures": failures})
    for row in rows:
        differ = sorted(k for k, same in (row.get("bitwise_repeatable") or {}).items() if not same)
        if "bitwise_repeatable" in row:
            print(
                f"repeat {row['op']:12s} {row['dtype']:9s} L={row['length']:<6d}: "
                + (f"bits differ in {', '.join(differ)}" if differ else "bitwise equal"),
                flush=True,
            )
    print(f"{failures} case(s) above their tolerance")
    return 1 if failures else 0


def _repeat_scan(inputs, dtype, device, keep) -> dict[str, bool]:
    import torch

    from longrange.ops.scan.triton import selective_scan_triton

    base = {k: v.to(device, torch.float32 if k in keep else dtype) for k, v in inputs.items()}
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(base["u"].shape, generator=g).to(device, dtype)

    def call():
        leaves = {k: v.detach().clone().requires_grad_() for k, v in base.items()}
        out, last = selective_scan_triton(**leaves, delta_softplus=True, return_last_state=True)
        (out * weight).float().sum().add(last.float().sum()).backward()
        _sync(device)
        return (out.detach(), last.detach(), *[leaves[k].grad for k in leaves])

    return _bitwise_same(call, ["out", "last_state", *[f"grad_{k}" for k in base]])


def _repeat_product(fn, inputs, device) -> dict[str, bool]:
    import torch

    base = {k: v.to(device, torch.complex64) for k, v in inputs.items()}

    def call():
        leaves = {k: v.detach().clone().requires_grad_() for k, v in base.items()}
        out = fn(**leaves)
        out.abs().sum().backward()
        _sync(device)
        return (out.detach(), *[leaves[k].grad for k in leaves])

    return _bitwise_same(call, ["out", *[f"grad_{k}" for k in base]])


def _gpu_name(args: argparse.Namespace) -> str:
    """The planner's name of this GPU (``--gpu``, else from the device's name)."""
    if args.gpu:
        return args.gpu
    import torch

    from longrange.bench.gpus import find_gpu

    if not torch.cuda.is_available():
        return "h100-sxm"  # a CPU run plans for the default GPU
    name = torch.cuda.get_device_name(0)
    try:
        return find_gpu(name).key
    except Exception:
        return "h200" if "H200" in name else "h100-pcie" if "PCIe" in name else "h100-sxm"


def _tiny_overrides(preset: str) -> list[str]:
    """Overrides that make a preset's model and data tiny (``--tiny``)."""
    from longrange.experiment.config import resolve
    from longrange.studies.grid import lengths_follow

    exp = resolve(preset)
    fields = set(exp.model.to_dict())
    out = [o for o in TINY_MODEL if o.split("=")[0].split(".")[1] in fields]
    if exp.model.primitive in ("mamba2", "mamba3"):  # heads that divide the tiny width
        out.append("model.primitive_options.headdim=8")
    model = exp.model.to_dict()
    tiny = lengths_follow(model, 64)  # long filters (S4's, Hyena's, BaseConv's) built for the tiny length
    if tiny.get("primitive_options") != model.get("primitive_options"):
        out.append("model.primitive_options.l_max=64")
    if tiny.get("layers") != model.get("layers"):
        out.append(f"model.layers={json.dumps(tiny['layers'])}")
    if exp.model.max_len:
        out.append("model.max_len=64")
    if exp.task.name == "listops":
        out.append("task.options.seq_len=64")
    return out


def _measured_step(
    preset: str, overrides: list[str], batch: int, device, seq_len: int | None = None, repeats: int = 1
) -> dict[str, Any]:
    """Peak memory and time of one training step (after one warm-up step) at ``batch``: the median
    of ``repeats`` timed steps on CUDA; the implementations the step ran (``kernels``)."""
    import torch

    from longrange.experiment.config import resolve
    from longrange.experiment.dryrun import prepare_step
    from longrange.ops import used

    exp = resolve(preset, overrides=overrides)
    prepared = prepare_step(
        exp,
        "train",
        device=device,
        batch_size=batch,
        seq_len=seq_len,
        vocab=256 if _needs_vocab(exp) else None,
        generator=torch.Generator(device=device).manual_seed(0) if device.type == "cuda" else None,
    )
    used.reset()
    loss = prepared.step()  # warm-up: optimizer state, kernels compiled
    _sync(device)
    out: dict[str, Any] = {
        "batch": prepared.batch_size,
        "seq_len": prepared.seq_len,
        "loss_finite": bool(torch.isfinite(loss)),
        "params": sum(p.numel() for p in prepared.model.parameters()),
        "kernels": used.kernels(),
    }
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        times = []
        for _ in range(max(repeats, 1)):
            t0 = time.perf_counter()
            loss = prepared.step()
            _sync(device)
            times.append(time.perf_counter() - t0)
        out.update(
            seconds=statistics.median(times),
            times=times,
            peak_bytes=torch.cuda.max_memory_allocated(device),
            method="torch.cuda.max_memory_allocated",
        )
    else:
        from longrange.bench.measure import PeakMemory

        with PeakMemory(device) as mem:
            t0 = time.perf_counter()
            loss = prepared.step()
        out.update(
            seconds=time.perf_counter() - t0,
            peak_bytes=int(mem.peak_mb * 2**20) + _live_bytes(prepared),
            method=f"resident set increase ({mem.method}) plus parameters and optimizer state: a CPU "
            "stand-in, not comparable with the plan",
        )
    out["loss_finite"] = out["loss_finite"] and bool(torch.isfinite(loss))
    return out


def _live_bytes(prepared) -> int:
    state = sum(
        t.numel() * t.element_size()
        for s in prepared.optimizer.state.values()
        for t in s.values()
        if hasattr(t, "numel")
    )
    return state + sum(p.numel() * p.element_size() for p in prepared.model.parameters())


def _needs_vocab(exp) -> bool:
    import longrange.data  # noqa: F401  (registers the tasks)
    from longrange.data.tasks import get_spec
    from longrange.experiment.params import fixed_vocabulary

    spec = get_spec(exp.task.name, **exp.task.options)
    return spec.input_kind == "tokens" and fixed_vocabulary(exp.task.name, exp.task.options) is None


def step_planner(args: argparse.Namespace) -> int:
    """``longrange plan`` for a few presets beside the measured peak of one step at the same batch."""
    from longrange.experiment.config import resolve

    device = _device(args)
    gpu = _gpu_name(args)
    rows, failures = [], 0
    for preset in PLAN_PRESETS:
        overrides = _tiny_overrides(preset) if args.tiny else []
        batch = 2 if args.tiny else None
        row: dict[str, Any] = {"preset": preset, "gpu": gpu, "overrides": overrides}
        plan_file = Path(args.out) / "results" / f"plan_{preset.replace('/', '_')}.json"
        vocab = ["--vocab", "256"] if _needs_vocab(resolve(preset)) else []
        cmd = _cli(
            "plan",
            preset,
            "--gpu",
            gpu,
            "--json",
            str(plan_file),
            *(["--batch", str(batch)] if batch else []),
            *vocab,
            *overrides,
        )
        print(f"$ {shlex.join(cmd)}", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_child_env())
        print(proc.stdout + proc.stderr, flush=True)
        row["plan_command"] = shlex.join(cmd)
        row["plan_exit"] = proc.returncode
        if not plan_file.exists():
            row["plan_error"] = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}, no plan written"])[
                -1
            ]
            failures += 1
            rows.append(row)
            continue
        plan = json.loads(plan_file.read_text())
        row["plan"] = {
            k: plan.get(k)
            for k in (
                "batch",
                "params",
                "peak_bytes",
                "flops_per_step",
                "bytes_per_step",
                "max_batch",
                "accumulation",
                "step_time_lower_bound_s",
            )
        }
        try:
            measured = _measured_step(preset, overrides, int(plan["batch"]), device)
            row["measured"] = measured
            predicted = (plan.get("peak_bytes") or {}).get("total")
            if predicted:
                row["measured_over_predicted"] = measured["peak_bytes"] / predicted
            if plan.get("step_time_lower_bound_s"):
                row["measured_over_time_bound"] = measured["seconds"] / plan["step_time_lower_bound_s"]
        except Exception as err:  # e.g. out of memory: recorded beside the plan
            row["measured_error"] = f"{type(err).__name__}: {err}"
            failures += 1
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "plan"}, indent=1, default=str), flush=True)
    _write(args, "planner.json", {"gpu": gpu, "device": str(device), "rows": rows})
    return 1 if failures else 0


def _train_metrics(run_dir: Path) -> dict[str, Any]:
    from longrange.train.logging import read_metrics

    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["split"] == "train"]
    out: dict[str, Any] = {"log_lines": len(records)}
    if len(records) >= 2:
        first, last = records[0], records[-1]
        out["steps_per_s"] = (last["step"] - first["step"]) / max(last["elapsed"] - first["elapsed"], 1e-9)
        out["loss_first"], out["loss_last"] = first["metrics"]["loss"], last["metrics"]["loss"]
        out["steps"] = last["step"]
        out["loss_falls"] = out["loss_last"] < out["loss_first"]
    return out


def _judge_loss(row: dict[str, Any], warmup: int, tiny: bool) -> bool:
    """Whether a training run's row fails: a loss that is not finite, or one that did not fall over a
    run longer than its learning-rate warmup. A run that ends inside its warmup is too short to judge
    by its loss (the LRA Transformer's 1000 warmup steps: flat over 100 on an H200), as is a tiny
    one; the row says whether it was judged."""
    row["warmup"] = warmup
    row["loss_judged"] = judged = not tiny and row.get("steps", 0) > warmup
    finite = all(math.isfinite(row.get(k, 0.0)) for k in ("loss_first", "loss_last"))
    return not finite or (judged and not row.get("loss_falls", False))


def step_train(args: argparse.Namespace) -> int:
    """``--train-steps`` steps of spt/listops presets on generated LRA-size ListOps, bf16 and fp32."""
    import torch

    from longrange.experiment.config import resolve
    from longrange.experiment.execute import run_stage
    from longrange.experiment.stage import resolve_stage
    from longrange.experiment.taskdata import load_data
    from longrange.train.rundir import Intent

    device = _device(args)
    data_dir = Path(args.out) / "data"
    if args.tiny:
        generate = "{n_train: 64, n_val: 16, n_test: 16, min_length: 16, max_length: 48, max_depth: 3}"
        sizes = ["task.options.seq_len=64", "train.max_steps=4", "train.batch_size=8", "train.log_every=1"]
    else:
        generate = "{n_train: 12000, n_val: 500, n_test: 500}"  # LRA's lengths (500-2000 tokens) and depth
        sizes = [f"train.max_steps={args.train_steps}", "train.log_every=10"]
    rows, failures = [], 0
    for preset in TRAIN_PRESETS:
        for precision in ("bf16", "fp32"):
            overrides = [
                f"task.generate={generate}",
                f"task.data_dir={data_dir}",
                f"train.precision={precision}",
                "train.progress=false",
                "train.loggers=[]",
                *sizes,
                *(_tiny_overrides(preset) if args.tiny else []),
            ]
            run_dir = Path(args.out) / "results" / "train" / f"{preset.replace('/', '_')}_{precision}"
            row: dict[str, Any] = {
                "preset": preset,
                "precision": precision,
                "overrides": overrides,
                "run_dir": str(run_dir),
            }
            try:
                exp = resolve(preset, overrides=overrides)
                data = load_data(exp.task)
                lengths = [len(item["inputs"]) for item in data.train]
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                t0 = time.perf_counter()
                summary = run_stage(resolve_stage(exp, "train"), run_dir, Intent("overwrite"))
                row["seconds"] = time.perf_counter() - t0
                row.update(_train_metrics(run_dir))
                row["batch_size"] = batch = exp.train_config("train").batch_size
                row["mean_tokens_per_sequence"] = statistics.mean(lengths)
                if "steps_per_s" in row:
                    row["tokens_per_s"] = row["steps_per_s"] * batch * row["mean_tokens_per_sequence"]
                if device.type == "cuda":
                    row["peak_bytes"] = torch.cuda.max_memory_allocated(device)
                row["test"] = summary.get("test")
                config = exp.train_config("train")
                failures += _judge_loss(row, config.warmup_steps(config.max_steps), args.tiny)
            except Exception as err:
                row["error"] = f"{type(err).__name__}: {err}"
                row["traceback"] = traceback.format_exc(limit=6)
                failures += 1
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "traceback"}, indent=1, default=str), flush=True)
            # after each run: a step cut by its timeout keeps the runs that finished
            _write(args, "train.json", {"device": str(device), "rows": rows}, quiet=True)
    _write(args, "train.json", {"device": str(device), "rows": rows})
    return 1 if failures else 0


def step_families(args: argparse.Namespace) -> int:
    """One training step of a model of each family (FAMILY_PRESETS) in fp32 and under bf16 autocast:
    time (median of FAMILY_REPEATS after a warm-up), tokens/s, peak memory, the implementations
    that ran. The results file is rewritten after each measurement (a step cut short keeps them)."""
    import torch

    device = _device(args)
    batch, seq_len = (2, 32) if args.tiny else (FAMILY_BATCH, FAMILY_SEQ_LEN)
    rows, failures = [], 0
    for label, preset, extra in FAMILY_PRESETS:
        for precision in ("fp32", "bf16"):
            if args.tiny:  # a stack takes its layers' options in its list, not in model.primitive_options
                stack = any(o.startswith("model.layers=") for o in extra)
                tiny = [o for o in _tiny_overrides(preset) if not (stack and o.startswith("model.primitive_options."))]
                extra = [o.replace("[mamba2,", "[{primitive: mamba2, options: {headdim: 8}},") for o in extra]
            overrides = [*(tiny if args.tiny else []), *extra, f"train.precision={precision}"]
            row: dict[str, Any] = {"family": label, "preset": preset, "precision": precision, "overrides": overrides}
            try:
                row.update(
                    _measured_step(
                        preset, overrides, batch, device, seq_len=seq_len, repeats=1 if args.tiny else FAMILY_REPEATS
                    )
                )
                row["tokens_per_s"] = row["batch"] * row["seq_len"] / row["seconds"]
                failures += not row["loss_finite"]
            except Exception as err:  # recorded; the other families go on
                row["error"] = f"{type(err).__name__}: {err}"
                row["traceback"] = traceback.format_exc(limit=8)
                failures += 1
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            rows.append(row)
            print(
                f"{label:26s} {precision}: "
                + (
                    f"{row['seconds'] * 1e3:9.1f} ms  {row['tokens_per_s']:12.0f} tok/s  "
                    f"peak {row['peak_bytes'] / 2**30:6.2f} GiB  {row['kernels']}"
                    if "error" not in row
                    else row["error"]
                ),
                flush=True,
            )
            _write(
                args,
                "families.json",
                {"device": str(device), "batch": batch, "seq_len": seq_len, "rows": rows},
                quiet=True,
            )
    print(f"{failures} family step(s) failed or gave a non-finite loss")
    return 1 if failures else 0


def step_pathx(args: argparse.Namespace) -> int:
    """One forward + backward of the Path-X S4 and rotary-Transformer models at 16384 tokens."""
    device = _device(args)
    rows, failures = [], 0
    for preset in PATHX_PRESETS:
        overrides = _tiny_overrides(preset) if args.tiny else []
        row: dict[str, Any] = {"preset": preset, "overrides": overrides}
        try:
            row.update(_measured_step(preset, overrides, args.pathx_batch, device, seq_len=64 if args.tiny else None))
        except Exception as err:
            row["error"] = f"{type(err).__name__}: {err}"
            failures += 1
        rows.append(row)
        print(json.dumps(row, indent=1, default=str), flush=True)
    _write(args, "pathx.json", {"device": str(device), "rows": rows})
    return 1 if failures else 0


def step_external(args: argparse.Namespace) -> int:
    """The maintained kernels of the matrix-state ops (:mod:`longrange.ops.matrix_state.external`):
    each one's probe timed (where its package is not installed, or off CUDA, the reason), written
    as it goes; then the check cases (``longrange check``) of the usable ones, on the device."""
    from longrange.check import DTYPES, cases, format_failures, format_table, no_tf32, run_cases
    from longrange.ops.matrix_state import external
    from longrange.ops.matrix_state.dispatch import EXTERNAL

    device = _device(args)
    rows = []
    for op, (package, module, name) in external.SOURCES.items():
        start = time.perf_counter()
        usable = external.kernel(op, device) is not None
        rows.append(
            {
                "op": op,
                "package": package,
                "function": f"{module}.{name}",
                "usable": usable,
                "reason": external.reason(op, device),
                "probe_seconds": time.perf_counter() - start,
            }
        )
        print(f"{op:18s} {rows[-1]['function']}: {rows[-1]['reason']} ({rows[-1]['probe_seconds']:.0f} s)", flush=True)
        _write(args, "external.json", {"device": str(device), "probes": rows}, quiet=True)
    records = {(r["op"], EXTERNAL[r["op"]][0]) for r in rows if r["usable"]}
    if not records:
        print("no maintained kernel is usable here: nothing to check")
        return 0
    selected = [c for c in cases([device.type], list(DTYPES.values())) if c.record in records]
    with no_tf32():
        checked = run_cases(selected)
    print(format_table(checked))
    print("\n".join(format_failures(checked)))
    table = [
        {"op": r.op, "impl": r.impl, "dtype": str(r.dtype), "error": r.error, "tol": r.tol, "passed": r.passed}
        for r in checked
    ]
    _write(args, "external.json", {"device": str(device), "probes": rows, "checks": table})
    return 0 if all(r.passed for r in checked) else 1


INTERNAL: dict[str, Callable[[argparse.Namespace], int]] = {
    "external": step_external,
    "info": step_info,
    "kernels": step_kernels,
    "families": step_families,
    "planner": step_planner,
    "train": step_train,
    "pathx": step_pathx,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", required=True, help="the session's folder (logs, results, session.json / .md)")
    p.add_argument(
        "--device", default="cuda", choices=("cuda", "cpu"), help="cuda (default) or cpu (with --tiny: the dry run)"
    )
    p.add_argument("--tiny", action="store_true", help="tiny sizes everywhere (the test suite's run on a CPU)")
    p.add_argument("--only", help=f"comma-separated steps to run (default all: {','.join(STEPS)})")
    p.add_argument("--gpu", help="the planner's GPU name (default: from the device's name)")
    p.add_argument("--pytest-args", help="arguments of the test step (default: the whole suite; --tiny: one file)")
    p.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every step's timeout")
    p.add_argument(
        "--budget",
        type=float,
        help="seconds for the whole run: no step runs past them, and steps "
        "that would start with less than 20 s left are recorded as not run (e.g. 560 under a 10-minute limit)",
    )
    p.add_argument(
        "--kernel-ops", help=f"the kernels step's ops, comma-separated (default all: {','.join(KERNEL_OPS)})"
    )
    p.add_argument(
        "--train-steps", type=int, default=100, help="steps of each of the train step's four runs (default 100)"
    )
    p.add_argument("--pathx-batch", type=int, default=1, help="batch of the Path-X forward + backward (default 1)")
    p.add_argument(
        "--pack",
        help="also write the session's folder, its generated data left out, as this .tar.gz after every step "
        "(one file for a machine that returns only a few)",
    )
    p.add_argument("--step", choices=sorted(INTERNAL), help=argparse.SUPPRESS)  # run one internal step here
    args = p.parse_args(argv)
    if args.step:
        sys.path.insert(0, str(ROOT / "src"))
        return INTERNAL[args.step](args)
    _stop_on_sigterm()
    summary = run_session(args)
    bad = [s["name"] for s in summary["steps"] if s["status"] not in ("ok", "not run")]
    print(
        f"session: {len(summary['steps']) - len(bad)} step(s) ok or not selected, {len(bad)} not ok"
        + (f" ({', '.join(bad)})" if bad else "")
        + f"; summary in {Path(args.out) / 'session.md'}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
