#!/usr/bin/env python
"""Time the selective scan on a CUDA GPU: the chunked PyTorch scan, the Triton kernels and, when
importable with its CUDA extension, ``mamba_ssm``'s kernel.

Usage (one command; defaults are the thesis' size: batch 64, d 232, n 16, length 1024, bfloat16):

    python benchmarks/gpu_scan.py                  # forward and forward+backward, ratios
    python benchmarks/gpu_scan.py --sweep          # also the Triton kernel settings (block_d, chunk, warps)
    python benchmarks/gpu_scan.py --json benchmarks/results/gpu_scan.json

The inputs are those of an S6 layer in mixed precision: u, delta, z, B (b, n, l) and C in the
benchmark dtype, A, D and delta_bias in float32, softplus on. Each implementation's output and
gradients are also compared with the chunked scan's (largest absolute difference), so that a run
on new hardware doubles as a check. Without CUDA the script exits with a message (status 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

import torch

from longrange import _optional
from longrange.bench.measure import environment, summarize_times, time_calls
from longrange.ops.scan import selective_scan_chunked
from longrange.ops.scan.triton import DEFAULT_CONFIG, _selective_scan_triton, triton_available

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SWEEP = [(bd, chunk, warps) for bd in (1, 2, 4, 8) for chunk in (16, 32, 64) for warps in (2, 4, 8)]


def make_inputs(batch: int, d: int, n: int, length: int, dtype: torch.dtype, device: torch.device, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    r = lambda *s, dt=dtype: torch.randn(*s, generator=g, device=device, dtype=torch.float32).to(dt)  # noqa: E731
    return dict(
        u=r(batch, d, length),
        delta=r(batch, d, length) * 0.5 - 2.0,  # softplus(delta + bias) of the order of 0.01-0.1
        A=-torch.exp(r(d, n, dt=torch.float32) * 0.5 + 1.0),
        B=r(batch, n, length),
        C=r(batch, n, length),
        D=r(d, dt=torch.float32),
        z=r(batch, d, length),
        delta_bias=r(d, dt=torch.float32) * 0.1,
    )


def copy_bandwidth(device: torch.device, nbytes: int = 2**30, repeats: int = 10) -> float:
    """The device's memory bandwidth as a device-to-device copy moves it: bytes read plus bytes
    written per second (the median of ``repeats`` copies of ``nbytes`` after a warm-up)."""
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return 2 * nbytes / times[len(times) // 2]


def scan_bytes(inputs: dict[str, torch.Tensor], kind: str) -> int:
    """The fewest bytes a fused selective scan moves through device memory: the forward reads each
    input once and writes the output; forward + backward also reads them again with the output's
    gradient and writes a gradient of each (the state is never stored: it is recomputed)."""
    size = {k: v.numel() * v.element_size() for k, v in inputs.items()}
    out = size["u"]
    read = sum(size.values())
    if kind == "forward":
        return read + out
    return (read + out) + (read + out) + sum(size.values())  # forward; backward reads inputs + dout; writes grads


def implementations(args) -> dict[str, Callable]:
    impls: dict[str, Callable] = {"chunked": selective_scan_chunked}
    if triton_available("cuda"):
        impls["triton"] = _selective_scan_triton
    if _optional.selective_scan_cuda_fn is not None:
        impls["mamba_ssm"] = _optional.selective_scan_cuda_fn
    return impls


def measure(fn: Callable, inputs: dict, grad_out: torch.Tensor, args, device) -> dict:
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items()}

    def forward():
        with torch.no_grad():
            fn(**leaves, delta_softplus=True)

    def forward_backward():
        out = fn(**leaves, delta_softplus=True)
        out.backward(grad_out)

    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fb = summarize_times(time_calls(forward_backward, warmup=args.warmup, batches=args.iters, device=device))
    peak = torch.cuda.max_memory_allocated(device) - base
    f = summarize_times(time_calls(forward, warmup=args.warmup, batches=args.iters, device=device))
    for v in leaves.values():
        v.grad = None
    out = fn(**leaves, delta_softplus=True)
    out.backward(grad_out)
    return dict(
        forward_ms=f["mean"] * 1e3,
        train_ms=fb["mean"] * 1e3,
        train_peak_mb=peak / 2**20,
        out=out.detach().float(),
        grads={k: v.grad.float() for k, v in leaves.items()},
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--d", type=int, default=232)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--length", type=int, default=1024)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--iters", type=int, default=20, help="timed calls per measurement")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls first (Triton compiles on the first)")
    p.add_argument(
        "--chunked-iters",
        type=int,
        help="timed calls of the chunked scan (default --iters; it takes "
        "100s of ms a call, so fewer keep a long run short)",
    )
    p.add_argument("--sweep", action="store_true", help="time the Triton kernel settings of SWEEP too")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)

    if not torch.cuda.is_available():
        print(
            "gpu_scan.py: no CUDA device; this benchmark times GPU kernels and needs one "
            "(the CPU figures are in `longrange bench --scaling`).",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda")
    dtype = DTYPES[args.dtype]
    inputs = make_inputs(args.batch, args.d, args.n, args.length, dtype, device)
    grad_out = torch.randn(args.batch, args.d, args.length, device=device).to(dtype)
    impls = implementations(args)
    print(
        f"selective scan, batch {args.batch}, d {args.d}, n {args.n}, length {args.length}, {args.dtype}; "
        f"{torch.cuda.get_device_name(device)}; mean of {args.iters} calls after {args.warmup}"
    )
    if "triton" not in impls:
        print("  triton: not importable, skipped")
    if "mamba_ssm" not in impls:
        print("  mamba_ssm: not importable (or its CUDA extension is missing), skipped")

    bandwidth = copy_bandwidth(device)
    bound = {kind: scan_bytes(inputs, kind) / bandwidth * 1e3 for kind in ("forward", "train")}
    print(
        f"device-to-device copy: {bandwidth / 1e12:.2f} TB/s (bytes read + written); the fewest bytes the scan "
        f"moves at that rate: forward {bound['forward']:.3f} ms, forward+backward {bound['train']:.3f} ms"
    )
    rows, failed = {}, {}
    for name, fn in impls.items():
        t0 = time.perf_counter()
        try:
            iters = args.chunked_iters if name == "chunked" and args.chunked_iters else args.iters
            rows[name] = measure(
                fn,
                inputs,
                grad_out,
                argparse.Namespace(**{**vars(args), "iters": iters, "warmup": min(args.warmup, iters)}),
                device,
            )
            rows[name]["iters"] = iters
        except Exception as err:  # e.g. the chunked scan out of memory at 16384: the others still run
            failed[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            print(f"  {name}: failed: {failed[name]}")
            torch.cuda.empty_cache()
            continue
        rows[name]["seconds_total"] = time.perf_counter() - t0
        rows[name]["forward_over_bound"] = rows[name]["forward_ms"] / bound["forward"]
        rows[name]["train_over_bound"] = rows[name]["train_ms"] / bound["train"]
    ref = rows.get("chunked")
    print(
        f"\n{'impl':<12} {'forward ms':>11} {'fwd+bwd ms':>11} {'peak MB':>9} {'/ bound':>8} {'vs chunked':>11} "
        f"{'vs mamba_ssm':>13} {'max|dout|':>10} {'max|dgrad|':>10}"
    )
    for name, r in rows.items():
        vs_chunked = f"{ref['train_ms'] / r['train_ms']:.2f}x" if ref else "-"
        vs_mamba = f"{rows['mamba_ssm']['train_ms'] / r['train_ms']:.2f}x" if "mamba_ssm" in rows else "-"
        d_out = f"{(r['out'] - ref['out']).abs().max().item():.2e}" if ref else "-"
        d_grad = f"{max((r['grads'][k] - ref['grads'][k]).abs().max().item() for k in r['grads']):.2e}" if ref else "-"
        print(
            f"{name:<12} {r['forward_ms']:>11.3f} {r['train_ms']:>11.3f} {r['train_peak_mb']:>9.1f} "
            f"{r['train_over_bound']:>7.1f}x {vs_chunked:>11} {vs_mamba:>13} {d_out:>10} {d_grad:>10}"
        )
    print(
        "(/ bound: fwd+bwd time over the fewest bytes' time; vs X: X's fwd+bwd time / this one's, above 1 is "
        "faster; max|d..|: largest difference from chunked)"
    )

    sweep = []
    if args.sweep and "triton" in impls:
        print(f"\nTriton settings (default {DEFAULT_CONFIG['gpu']}):")
        print(f"{'block_d':>7} {'chunk':>6} {'warps':>6} {'forward ms':>11} {'fwd+bwd ms':>11}")
        for bd, chunk, warps in SWEEP:
            fn = lambda **kw: _selective_scan_triton(**kw, block_d=bd, chunk=chunk, num_warps=warps)  # noqa: E731
            try:
                r = measure(fn, inputs, grad_out, args, device)
            except Exception as e:  # e.g. out of registers or shared memory for a large tile
                print(f"{bd:>7} {chunk:>6} {warps:>6}  failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
                continue
            sweep.append(
                dict(block_d=bd, chunk=chunk, num_warps=warps, forward_ms=r["forward_ms"], train_ms=r["train_ms"])
            )
            print(f"{bd:>7} {chunk:>6} {warps:>6} {r['forward_ms']:>11.3f} {r['train_ms']:>11.3f}")
        best = min(sweep, key=lambda s: s["train_ms"], default=None)
        if best:
            print(f"fastest fwd+bwd: block_d={best['block_d']} chunk={best['chunk']} num_warps={best['num_warps']}")

    if args.json:
        payload = dict(
            settings=vars(args),
            environment=environment(device),
            rows={k: {m: v for m, v in r.items() if m not in ("out", "grads")} for k, r in rows.items()},
            failed=failed,
            copy_bandwidth_bytes_per_s=bandwidth,
            bound_ms=bound,
            bound_note="bytes read and written once at the measured copy bandwidth (scan_bytes)",
            sweep=sweep,
        )
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
