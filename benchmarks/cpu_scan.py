"""Forward + backward of the selective scan on CPU: the chunked PyTorch scan against the numba scan
(its channels-last kernels, which S6's inputs take, and its state-vectorised kernels).

Usage: python benchmarks/cpu_scan.py [--threads 2] [--batch 8] [--d 128] [--n 16] [--length 1024]
       [--dtype float32] [--repeats 10] [--json OUT]

S6's inputs (B and C shared by all channels, D, the z gate, delta_bias and softplus) with
standard-normal values, A = -(1 .. n) as S6 initialises it. The implementations run in the same
process, alternating call by call, so that a machine loaded by other work slows both alike; the
figures are medians (and minima) over ``--repeats`` calls after one untimed call each (which
compiles the numba kernels, or loads them from numba's cache). The ratio of the medians is the
speed-up; the ratio of the minima, the least disturbed calls, is printed too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import longrange.ops.scan.numba as numba_scan
from longrange.ops.scan import selective_scan_chunked
from longrange.ops.scan.numba import numba_available, selective_scan_numba
from longrange.train.denormals import flushed


def _numba_states_inner(**kwargs):
    """The numba scan on its state-vectorised kernels (the channels-last ones turned off)."""
    previous = numba_scan.CL_MIN_WIDTH
    numba_scan.CL_MIN_WIDTH = 1 << 30
    try:
        return selective_scan_numba(**kwargs)
    finally:
        numba_scan.CL_MIN_WIDTH = previous


IMPLS = {"chunked": selective_scan_chunked, "numba-states": _numba_states_inner, "numba": selective_scan_numba}


def make_inputs(batch: int, d: int, n: int, length: int, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    return dict(
        u=r(batch, d, length),
        delta=r(batch, d, length),
        A=-torch.arange(1, n + 1, dtype=dtype).expand(d, n).contiguous(),
        B=r(batch, n, length),
        C=r(batch, n, length),
        D=r(d),
        z=r(batch, d, length),
        delta_bias=r(d),
    )


def time_once(fn, inputs: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(forward seconds, forward + backward seconds) of one call with gradients of every input."""
    leaves = {k: v.detach().requires_grad_() for k, v in inputs.items()}
    start = time.perf_counter()
    y = fn(**leaves, delta_softplus=True)
    forward = time.perf_counter() - start
    y.backward(torch.ones_like(y))
    return forward, time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    """The script; subnormal floats flushed while it measures, as training runs on a CPU
    (train/denormals.py), and the mode found restored."""
    with flushed("cpu"):
        return _main(argv)


def _main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="torch (and numba) threads (default 2)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--d", type=int, default=128, help="channels (default 128)")
    p.add_argument("--n", type=int, default=16, help="state size (default 16)")
    p.add_argument("--length", type=int, default=1024)
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--repeats", type=int, default=10, help="timed calls per implementation (default 10)")
    p.add_argument("--json", metavar="OUT", help="write the settings and figures as JSON")
    args = p.parse_args(argv)
    if not numba_available():
        raise SystemExit("numba does not import here; nothing to compare")
    torch.set_num_threads(args.threads)
    inputs = make_inputs(args.batch, args.d, args.n, args.length, getattr(torch, args.dtype))
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in IMPLS}
    for fn in IMPLS.values():  # untimed: compilation or cache loading, allocator warm-up
        time_once(fn, inputs)
    for _ in range(args.repeats):
        for name, fn in IMPLS.items():
            times[name].append(time_once(fn, inputs))
    rows = {}
    for name, ts in times.items():
        rows[name] = {
            "forward_s": statistics.median(t[0] for t in ts),
            "forward_backward_s": statistics.median(t[1] for t in ts),
            "forward_backward_min_s": min(t[1] for t in ts),
        }
    ratio = rows["chunked"]["forward_backward_s"] / rows["numba"]["forward_backward_s"]
    ratio_min = rows["chunked"]["forward_backward_min_s"] / rows["numba"]["forward_backward_min_s"]
    import numba

    from longrange.bench.measure import environment

    env = {
        **environment(torch.device("cpu")),
        "numba": numba.__version__,
        "numba_threading_layer": numba.threading_layer(),
    }
    print(
        f"selective scan, batch {args.batch}, d {args.d}, n {args.n}, length {args.length}, {args.dtype}, "
        f"{torch.get_num_threads()} threads ({env['cpu']}); medians of {args.repeats} alternating calls"
    )
    print(f"{'impl':12s}  {'forward s':>10s}  {'fwd+bwd s':>10s}  {'fwd+bwd min s':>13s}")
    for name, row in rows.items():
        print(
            f"{name:12s}  {row['forward_s']:10.4f}  {row['forward_backward_s']:10.4f}  {row['forward_backward_min_s']:13.4f}"
        )
    print(f"numba is {ratio:.2f}x faster than chunked (forward + backward; {ratio_min:.2f}x on the fastest calls)")
    over_states = rows["numba-states"]["forward_backward_s"] / rows["numba"]["forward_backward_s"]
    print(f"numba's channels-last kernels are {over_states:.2f}x faster than its state-vectorised ones")
    result = {
        "settings": vars(args),
        "rows": rows,
        "speedup": ratio,
        "speedup_min": ratio_min,
        "speedup_over_states_inner": over_states,
        "environment": env,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
