"""Softmax attention on a CPU: the numba kernels against PyTorch's fused kernel, forward and backward.

For each shape (batch, heads, length, head width), causal and not, one process alternates the two
implementations call by call (``longrange.ops.attention.attention`` with ``impl="numba"`` and
``impl="sdpa"``, float32, one thread by default) and reports the median time of a forward and
backward pass and their ratio. The default shapes are MAD's multi-head attention in the CPU
protocol (32 x 16 heads of 4 at length 127) and in MAD's own (heads of 8), the recall study's
Transformer (64 x 4 heads of 16 at length 256) and the demo's length (24). It measured the width
below which ``"auto"`` runs the numba kernels (``NUMBA_MAX_WIDTH``, docs/small-models.md,
"Fourteenth round").

    python benchmarks/attention_cpu.py --json benchmarks/results/attention_cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from longrange.ops.attention import attention
from longrange.train.allocator import keep_freed_memory
from longrange.train.denormals import flushed
from longrange.train.environment import cpu_name

SHAPES = [
    (32, 16, 127, 4),
    (32, 16, 255, 4),
    (32, 16, 127, 8),
    (32, 8, 127, 8),
    (64, 4, 256, 8),
    (64, 4, 256, 16),
    (32, 4, 24, 16),
    (32, 16, 24, 4),
    (8, 4, 1024, 8),
    (8, 4, 1024, 16),
    (32, 4, 127, 32),
]


def _time(impl: str, q, k, v, g, causal: bool) -> float:
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    start = time.perf_counter()
    attention(*leaves, causal, impl=impl).backward(g)
    return time.perf_counter() - start


def measure(shape: tuple[int, int, int, int], causal: bool, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(*shape, generator=gen) for _ in range(4))
    times: dict[str, list[float]] = {"numba": [], "sdpa": []}
    for _ in range(2):  # warm-up: compilation, allocation
        for impl in times:
            _time(impl, q, k, v, g, causal)
    for _ in range(repeats):
        for impl in times:
            times[impl].append(_time(impl, q, k, v, g, causal))
    med = {impl: statistics.median(t) * 1e3 for impl, t in times.items()}
    return {
        "shape": list(shape),
        "causal": causal,
        "numba_ms": round(med["numba"], 3),
        "sdpa_ms": round(med["sdpa"], 3),
        "speedup": round(med["sdpa"] / med["numba"], 3),
    }


def _shape(text: str) -> tuple[int, int, int, int]:
    parts = tuple(int(v) for v in text.lower().split("x"))
    if len(parts) != 4 or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"a shape is BATCHxHEADSxLENGTHxWIDTH of positive integers, got {text!r}")
    return parts


def main(argv: list[str] | None = None) -> list[dict]:
    """The script; subnormal floats flushed while it measures, as training runs on a CPU
    (train/denormals.py), and the mode found restored. Returns the rows."""
    with flushed("cpu"):
        return _main(argv)


def _main(argv: list[str] | None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", type=_shape, default=SHAPES, help="BATCHxHEADSxLENGTHxWIDTH ...")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    try:
        return _measure(args)
    finally:
        torch.set_num_threads(threads)


def _measure(args: argparse.Namespace) -> list[dict]:
    rows = []
    print("| batch x heads x length x width | causal | numba (ms) | sdpa (ms) | numba's speed-up |")
    print("|---|---|---:|---:|---:|")
    for shape in args.shapes:
        for causal in (True, False):
            row = measure(shape, causal, args.repeats)
            rows.append(row)
            print(
                f"| {' x '.join(map(str, shape))} | {'yes' if causal else 'no'} | {row['numba_ms']:.2f} | "
                f"{row['sdpa_ms']:.2f} | {row['speedup']:.2f}x |",
                flush=True,
            )
    if args.json:
        env = {"cpu": cpu_name(), "threads": args.threads, "torch": torch.__version__}
        args.json.write_text(json.dumps({"environment": env, "rows": rows}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
