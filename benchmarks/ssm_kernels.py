"""Kernel generation and whole S4 / S4D layers with each implementation of the SSM-kernel products,
side by side in one run.

Usage: python benchmarks/ssm_kernels.py [--lengths 1024,2048,4096,8192,16384] [--cases s4d-kernel,...]
       [--impls chunked,numba] [--repeats 5] [--threads 1] [--dtype float32] [--device cpu] [--json OUT]
       python benchmarks/ssm_kernels.py --markdown OUT.json   (the tables of docs/performance.md)

Cases (H = 256 channels, state size N = 64, i.e. 32 conjugate pairs, float32 by default):

- ``s4d-kernel``: ``S4D.kernel(L)``, the Vandermonde product with its discretisation;
- ``s4-kernel``: ``S4.kernel(L)`` with ``l_max = L``, the Cauchy sums with the Woodbury identity and
  the inverse FFT;
- ``s4d-layer``: an S4D layer on a (batch, L, 256) input, batch 16 at length 1024;
- ``s4-layer``: an S4 layer (``l_max = L``), batch 8 at length 1024.

The layers keep batch x length constant (batch 16 x 1024 / L, at least 1). Each is timed forward
(under ``torch.no_grad()``) and forward + backward (the backward of the mean square of the output).
The implementations are those of the op each case uses that can run on the device
(``ssm_kernels.available_impls``, without the slow ``ref``, and without Triton's CPU interpreter),
and with Triton also ``triton-float64``: the Triton kernels computing in float64 for float32
inputs (``DEFAULT_CONFIG[...]["float64"]`` of ``longrange/ops/ssm_kernels/triton.py``, the mode as
accurate as the numba kernels; docs/performance.md); ``chunked`` is the PyTorch code S4 and S4D
ran before the fused kernels, and the speed-ups are relative to it.

Each (case, length) is measured in a fresh Python process (``--no-isolate``: all in this one), so
that no measurement inherits the memory allocator's state from another: the PyTorch code's
temporaries of tens of MB are served by fresh, zeroed pages or by an already grown heap depending
on what ran before in the process, which changed its time up to 4x in our runs.

Timing on a shared machine: every implementation runs once untimed (compilation or loading of the
kernels, allocator warm-up), then ``--repeats`` rounds in which the implementations alternate call
by call (in reverse order every other round), so that load from other jobs slows them alike. The
table gives the fastest call (the least disturbed) and the median; the speed-ups are ratios of the
fastest calls, with the ratio of medians beside. Peak memory: one more forward + backward per
implementation (``longrange.bench.measure.PeakMemory``: on CPU the peak resident set size during
the call minus the resident size before it). The largest difference of each implementation's
forward output from ``chunked``'s, relative to the largest entry, is printed as a check.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from longrange.bench.measure import PeakMemory, environment, synchronize
from longrange.layers.s4 import S4
from longrange.layers.s4d import S4D
from longrange.ops import ssm_kernels
from longrange.train.denormals import flushed

CASES = ("s4d-kernel", "s4-kernel", "s4d-layer", "s4-layer")
OP = {"s4d-kernel": "vandermonde", "s4d-layer": "vandermonde", "s4-kernel": "cauchy", "s4-layer": "cauchy"}
#: Batch at length 1024 of the layer cases (batch x length is kept).
BATCH_AT_1024 = {"s4d-layer": 16, "s4-layer": 8}
BASELINE = "chunked"


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def _names(text: str) -> list[str]:
    return [v for v in text.split(",") if v]


def build(case: str, length: int, d_model: int, d_state: int, dtype: torch.dtype, device: torch.device):
    """(module, input or None, batch): the module measured for ``case`` at ``length``."""
    torch.manual_seed(0)
    module = S4D(d_model, d_state) if case.startswith("s4d") else S4(d_model, d_state, l_max=length)
    module = module.to(device=device, dtype=dtype)
    if case.endswith("kernel"):
        return module, None, None
    batch = max(1, BATCH_AT_1024[case] * 1024 // length)
    x = torch.randn(batch, length, d_model, generator=torch.Generator().manual_seed(1), dtype=dtype).to(device)
    return module, x, batch


def runner(case: str, module: torch.nn.Module, x: torch.Tensor | None, length: int) -> Callable[[], torch.Tensor]:
    if x is None:
        return lambda: module.kernel(length)
    return lambda: module(x)


def time_call(
    fn: Callable[[], torch.Tensor], module: torch.nn.Module, device: torch.device, backward: bool
) -> tuple[float, torch.Tensor]:
    """Seconds of one forward (no autograd) or forward + backward call, and the forward's output."""
    module.zero_grad(set_to_none=True)
    synchronize(device)
    start = time.perf_counter()
    if backward:
        out = fn()
        out.square().mean().backward()
    else:
        with torch.no_grad():
            out = fn()
    synchronize(device)
    return time.perf_counter() - start, out.detach()


#: The Triton kernels computing in float64 (timed beside ``triton``, their float32 default).
TRITON_FLOAT64 = "triton-float64"


def impls_for(case: str, device: torch.device, wanted: list[str] | None) -> list[str]:
    op = OP[case]
    impls = [
        i
        for i in ssm_kernels.available_impls(op, device)
        if i != "ref" and not (i == "triton" and device.type == "cpu")
    ]
    if "triton" in impls:
        impls.append(TRITON_FLOAT64)
    if wanted is not None:
        impls = [i for i in impls if i in wanted]
    return sorted(impls, key=lambda i: (i != BASELINE, i))  # the baseline first


@contextmanager
def implementation(op: str, impl: str) -> Iterator[None]:
    """``impl`` runs ``op`` inside the block; ``triton-float64`` is ``triton`` with its kernels
    computing in float64 (every mode of ``DEFAULT_CONFIG``, restored after)."""
    if impl != TRITON_FLOAT64:
        with ssm_kernels.default_impl(op, impl):
            yield
        return
    from longrange.ops.ssm_kernels import triton as ssm_triton

    before = {mode: cfg["float64"] for mode, cfg in ssm_triton.DEFAULT_CONFIG.items()}
    try:
        for cfg in ssm_triton.DEFAULT_CONFIG.values():
            cfg["float64"] = True
        with ssm_kernels.default_impl(op, "triton"):
            yield
    finally:
        for mode, value in before.items():
            ssm_triton.DEFAULT_CONFIG[mode]["float64"] = value


def measure_case(
    case: str, length: int, args: argparse.Namespace, device: torch.device, dtype: torch.dtype
) -> list[dict[str, Any]]:
    module, x, batch = build(case, length, args.d_model, args.d_state, dtype, device)
    fn = runner(case, module, x, length)
    op = OP[case]
    impls = impls_for(case, device, args.impls)
    times: dict[str, dict[str, list[float]]] = {i: {"forward": [], "forward_backward": []} for i in impls}
    outputs: dict[str, torch.Tensor] = {}
    for impl in impls:  # untimed: compilation or loading, allocator warm-up
        with implementation(op, impl):
            _, outputs[impl] = time_call(fn, module, device, backward=True)
    for r in range(args.repeats):
        for impl in impls if r % 2 == 0 else impls[::-1]:
            with implementation(op, impl):
                t_f, _ = time_call(fn, module, device, backward=False)
                t_fb, _ = time_call(fn, module, device, backward=True)
            times[impl]["forward"].append(t_f)
            times[impl]["forward_backward"].append(t_fb)
    rows = []
    base = outputs.get(BASELINE)
    for impl in impls:
        with implementation(op, impl), PeakMemory(device) as mem:
            time_call(fn, module, device, backward=True)
        row: dict[str, Any] = {
            "case": case,
            "length": length,
            "batch": batch,
            "impl": impl,
            "op": op,
            "forward_min_s": min(times[impl]["forward"]),
            "forward_median_s": statistics.median(times[impl]["forward"]),
            "forward_backward_min_s": min(times[impl]["forward_backward"]),
            "forward_backward_median_s": statistics.median(times[impl]["forward_backward"]),
            "peak_mb": mem.peak_mb,
            "memory_method": mem.method,
        }
        if base is not None:
            scale = base.abs().max().item()
            row["max_rel_diff_vs_chunked"] = (outputs[impl].float() - base.float()).abs().max().item() / max(
                scale, 1e-30
            )
        rows.append(row)
    by_impl = {r["impl"]: r for r in rows}
    if BASELINE in by_impl:
        b = by_impl[BASELINE]
        for r in rows:
            for key in ("forward", "forward_backward"):
                r[f"speedup_{key}"] = b[f"{key}_min_s"] / r[f"{key}_min_s"]
                r[f"speedup_{key}_median"] = b[f"{key}_median_s"] / r[f"{key}_median_s"]
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    header = [
        "case",
        "length",
        "batch",
        "impl",
        "fwd s",
        "fwd med",
        "fwd+bwd s",
        "fwd+bwd med",
        "peak MB",
        "speed-up fwd",
        "speed-up fwd+bwd",
        "(medians)",
        "diff",
    ]
    lines = []
    for r in rows:
        lines.append(
            [
                r["case"],
                str(r["length"]),
                "-" if r["batch"] is None else str(r["batch"]),
                r["impl"],
                f"{r['forward_min_s']:.4f}",
                f"{r['forward_median_s']:.4f}",
                f"{r['forward_backward_min_s']:.4f}",
                f"{r['forward_backward_median_s']:.4f}",
                f"{r['peak_mb']:.0f}",
                f"{r['speedup_forward']:.2f}x" if "speedup_forward" in r else "-",
                f"{r['speedup_forward_backward']:.2f}x" if "speedup_forward_backward" in r else "-",
                f"{r['speedup_forward_median']:.2f}x / {r['speedup_forward_backward_median']:.2f}x"
                if "speedup_forward" in r
                else "-",
                f"{r['max_rel_diff_vs_chunked']:.1e}" if "max_rel_diff_vs_chunked" in r else "-",
            ]
        )
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.rjust(w) if i > 3 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *(fmt(c) for c in lines)])


def markdown(rows: list[dict[str, Any]]) -> str:
    """Per case, a Markdown table: lengths down, each implementation's forward + backward seconds
    (fastest call), the speed-ups over the baseline (fastest calls; medians in brackets) and the
    peak memory."""
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = [r for r in rows if r["case"] == case]
        impls = list(dict.fromkeys(r["impl"] for r in mine))
        others = [i for i in impls if i != BASELINE]
        head = ["length", "batch"] + [f"{i} fwd+bwd s" for i in impls]
        head += (
            [f"{i} speed-up fwd+bwd" for i in others]
            + [f"{i} speed-up fwd" for i in others]
            + ["peak MB " + " → ".join(impls)]
        )
        lines = [f"**{case}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for length in dict.fromkeys(r["length"] for r in mine):
            at = {r["impl"]: r for r in mine if r["length"] == length}
            cells = [str(length), "-" if at[impls[0]]["batch"] is None else str(at[impls[0]]["batch"])]
            cells += [f"{at[i]['forward_backward_min_s']:.4f}" for i in impls]
            for key in ("forward_backward", "forward"):
                cells += [
                    f"{at[i][f'speedup_{key}']:.1f}x ({at[i][f'speedup_{key}_median']:.1f}x)"
                    if f"speedup_{key}" in at[i]
                    else "-"
                    for i in others
                ]
            cells.append(" → ".join(f"{at[i]['peak_mb']:.0f}" for i in impls))
            lines.append("| " + " | ".join(cells) + " |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def _isolated(case: str, length: int, argv: list[str] | None) -> list[dict[str, Any]]:
    """The rows of one case and length, measured by this script in a fresh process."""
    argv = list(sys.argv[1:] if argv is None else argv)
    keep, skip = [], False
    for arg in argv:  # drop the options the child gets anew
        if skip:
            skip = False
        elif arg in ("--cases", "--lengths", "--json"):
            skip = True
        elif not arg.startswith(("--cases=", "--lengths=", "--json=")):
            keep.append(arg)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [
            sys.executable,
            __file__,
            *keep,
            "--cases",
            case,
            "--lengths",
            str(length),
            "--no-isolate",
            "--json",
            str(out),
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())["rows"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The script; subnormal floats flushed while it measures, as training runs on a CPU
    (train/denormals.py), and the mode found restored."""
    with flushed("cpu"):
        return _main(argv)


def _main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--lengths",
        type=_ints,
        default=[1024, 2048, 4096, 8192, 16384],
        help="comma-separated (default 1024,...,16384)",
    )
    p.add_argument(
        "--cases", type=_names, default=list(CASES), help=f"comma-separated subset of {','.join(CASES)} (default all)"
    )
    p.add_argument(
        "--impls",
        type=_names,
        default=None,
        help="comma-separated implementations (default: all that run here but ref; with triton also triton-float64)",
    )
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (default 5)")
    p.add_argument(
        "--threads", type=int, default=1, help="torch (and numba) threads (default 1: steadier on a shared machine)"
    )
    p.add_argument("--d-model", type=int, default=256, help="channels H (default 256)")
    p.add_argument("--d-state", type=int, default=64, help="state size N (default 64)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--json", metavar="OUT", help="write the settings, environment and rows as JSON")
    p.add_argument("--no-isolate", action="store_true", help="measure every case and length in this process")
    p.add_argument("--markdown", metavar="JSON", help="print the Markdown tables of a --json file and exit")
    args = p.parse_args(argv)
    if args.markdown:
        with open(args.markdown) as f:
            payload = json.load(f)
        print(markdown(payload["rows"]))
        return payload
    unknown = set(args.cases) - set(CASES)
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; expected some of {', '.join(CASES)}")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    from longrange.ops.ssm_kernels.numba import numba_available, warm_up

    if device.type == "cpu" and numba_available():
        warm_up()
    env = environment(device)
    print(
        f"SSM kernels: H {args.d_model}, N {args.d_state}, {args.dtype}, {device.type}, {torch.get_num_threads()} threads "
        f"({env.get('gpu', env['cpu'])}); fastest and median of {args.repeats} alternating calls per implementation; "
        f"speed-ups relative to {BASELINE} (fastest calls; medians in brackets)",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    for case in args.cases:
        for length in args.lengths:
            case_rows = (
                measure_case(case, length, args, device, dtype) if args.no_isolate else _isolated(case, length, argv)
            )
            rows += case_rows
            print(format_rows(case_rows).split("\n", 2)[-1], flush=True)
    print()
    print(format_rows(rows))
    result = {"settings": vars(args), "environment": env, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
